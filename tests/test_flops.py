"""FLOPs per step against torch's own count (FlopCounterMode), and the count the engine reports."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from ampscope.core import events as ev
from ampscope.core.presets import WORKLOAD_SIZES
from ampscope.engine.lifecycle.run import EXIT_OK, run
from ampscope.engine.step.flops import count_train_flops, measure_train_flops
from ampscope.engine.workloads import BUILDERS
from ampscope.engine.workloads.base import TrainingWorkload
from tests.helpers import meta_batch

SHIPPED = [(kind, size) for kind, sizes in WORKLOAD_SIZES.items() for size in sizes]


def reference_count(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """FlopCounterMode over one forward and backward, attention on the math kernel (torch has
    no FLOP formula for the CPU flash kernel; the math kernel is the model-FLOPs convention)."""
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        out = model(x)
        nn.functional.cross_entropy(
            out.reshape(-1, out.shape[-1]).float(), y.reshape(-1)
        ).backward()
    return counter.get_total_flops()


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "size"), SHIPPED)
def test_every_shipped_workload_formula_agrees_with_flop_counter_mode(kind: str, size: str) -> None:
    """Small sizes run for real on the CPU; large ones on the meta device (shapes only)."""
    dims = dict(WORKLOAD_SIZES[kind][size])
    batch_size = dims.pop("batch_size")
    big = size == "large" or kind == "gpt2-124m"  # gpt2-124m has 124M parameters at any size
    device = "meta" if big else "cpu"
    with torch.device(device):
        model = BUILDERS[kind].build_model(dims)
    counted = reference_count(model, *meta_batch(kind, dims, batch_size, device))
    formula = BUILDERS[kind].train_flops(model, dims, batch_size)
    assert formula / counted == pytest.approx(1.0, abs=0.01)


@pytest.mark.unit
def test_the_first_layer_is_charged_no_input_gradient() -> None:
    """A one-layer MLP: forward 2WB, weight gradient 2WB, no gradient for the data."""
    dims = {"width": 64, "layers": 1, "classes": 8}
    model = BUILDERS["mlp"].build_model(dims)
    assert BUILDERS["mlp"].train_flops(model, dims, 32) == 4 * 64 * 8 * 32
    assert reference_count(model, *meta_batch("mlp", dims, 32, "cpu")) == 4 * 64 * 8 * 32


def gpt_small() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor], dict[str, int]]:
    dims = dict(WORKLOAD_SIZES["gpt"]["small"])
    batch_size = dims.pop("batch_size")
    torch.manual_seed(0)
    model = BUILDERS["gpt"].build_model(dims)
    return model, meta_batch("gpt", dims, batch_size, "cpu"), dims


def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return TrainingWorkload.loss(None, output, target)  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_engine_counts_on_the_meta_device_and_leaves_the_model_alone() -> None:
    model, batch, dims = gpt_small()
    before = [p.detach().clone() for p in model.parameters()]
    flops, partial = count_train_flops(model, batch, loss)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert not partial
    assert flops == reference_count(model, *batch)
    assert flops / BUILDERS["gpt"].train_flops(model, dims, 32) == pytest.approx(1.0, abs=0.01)


@pytest.mark.slow
def test_a_count_that_ran_a_kernel_without_a_formula_says_it_is_partial() -> None:
    """On the CPU's default path attention runs the flash kernel, which torch cannot count."""
    model, batch, _ = gpt_small()
    count = measure_train_flops(model, batch, loss, meta=False)
    assert all(p.grad is None for p in model.parameters())
    assert count.partial and count.device == "cpu"
    assert "aten._scaled_dot_product_flash_attention_for_cpu" in count.missing
    assert count.flops < reference_count(model, *batch)  # attention is missing


class HostTensorNet(nn.Module):
    """Keeps a tensor outside its parameters and buffers: no meta copy can run it."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(16)
        self.fc = nn.Linear(16, 4)
        self.offset = torch.ones(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(x + self.offset))


@pytest.mark.unit
def test_a_model_the_meta_device_cannot_run_is_counted_for_real_and_put_back() -> None:
    model = HostTensorNet()
    x, y = torch.randn(8, 16), torch.zeros(8, dtype=torch.long)
    count = measure_train_flops(model, (x, y), loss)
    assert count.device == "cpu" and not count.partial
    assert count.flops == 6 * 16 * 4 * 8  # fc: forward, weight and input gradients
    assert torch.equal(model.norm.running_mean, torch.zeros(16))  # batch norm's stats restored
    assert model.norm.num_batches_tracked.item() == 0
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.slow
def test_hello_carries_the_formula_and_the_count_and_says_which_mfu_uses() -> None:
    seen: list[ev.Event] = []
    overrides = ["workload.kind='cnn'", "device='cpu'", "steps=2", "warmup_steps=1"]
    assert run("fp32", overrides, record=False, on_event=seen.append) == EXIT_OK
    hello = next(e for e in seen if isinstance(e, ev.HelloEvent))
    assert hello.flops_source == "analytic" and hello.flops_per_step == hello.flops_analytic
    assert hello.flops_counted and not hello.flops_counted_partial
    assert hello.flops_analytic / hello.flops_counted == pytest.approx(1.0, abs=0.01)
    assert hello.flops_note and "formula" in hello.flops_note and "meta" in hello.flops_note
    step = next(e for e in seen if isinstance(e, ev.StepEvent))
    half_unit = 0.5e-4  # step_ms is written to 4 decimals; tflops from the unrounded time
    slowest = hello.flops_per_step / (step.step_ms + half_unit) / 1e9
    fastest = hello.flops_per_step / (step.step_ms - half_unit) / 1e9
    assert slowest * (1 - 1e-9) <= step.tflops <= fastest * (1 + 1e-9)
