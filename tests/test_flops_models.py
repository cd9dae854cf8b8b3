"""The decoders added with ``--model`` (gpt2-124m, llama) and the counter a user's model relies
on, against references nobody here wrote: counts by hand, torch's FlopCounterMode, nanoGPT."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ampscope.core import events as ev
from ampscope.core import presets
from ampscope.engine.lifecycle.run import EXIT_OK, run
from ampscope.engine.step.flops import count_train_flops, measure_train_flops
from ampscope.engine.workloads import BUILDERS


@pytest.mark.unit
def test_counted_flops_of_an_mlp_match_the_count_by_hand() -> None:
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    x, y = torch.randn(32, 16), torch.randint(4, (32,))
    flops, partial = count_train_flops(model, (x, y), F.cross_entropy)
    # forward and weight gradient 2*b*in*out each; an input gradient for the second layer only
    by_hand = 2 * 32 * (2 * 16 * 64 + 3 * 64 * 4)
    assert flops == pytest.approx(by_hand, rel=0.01) and not partial
    assert all(p.grad is None for p in model.parameters())  # counting leaves nothing behind


class Lstm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x)[0].sum(dim=(1, 2))


@pytest.mark.unit
def test_a_heavy_kernel_without_a_formula_makes_the_count_partial() -> None:
    x, y = torch.randn(2, 5, 8), torch.zeros(2)
    found = measure_train_flops(Lstm(), (x, y), F.mse_loss, meta=False)
    assert found.partial and any("rnn" in kernel for kernel in found.missing)


@pytest.mark.unit
def test_a_users_forward_and_inputs_are_counted_on_the_meta_device() -> None:
    """Inputs as a dict of keyword arguments, and a model that returns its own loss."""

    class OwnLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 4)

        def forward(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(self.fc(features), labels)

    inputs = {"features": torch.randn(8, 16), "labels": torch.zeros(8, dtype=torch.long)}
    found = measure_train_flops(
        OwnLoss(), (inputs, None), lambda out, _: out, forward=lambda m, x: m(**x)
    )
    assert found.device == "meta" and found.flops == 2 * 8 * 16 * 4 * 2  # forward, weight grad


def decoder(kind: str, size: str) -> tuple[nn.Module, dict[str, int]]:
    preset = presets.load_preset("fp32", [f"workload.kind='{kind}'", f"workload.size='{size}'"])
    dims, _ = presets.resolve_workload(preset, on_cuda=False)
    with torch.device("meta"):  # a large model costs nothing on the meta device
        return BUILDERS[kind].build_model(dims), dims


@pytest.mark.unit
def test_gpt2_124m_is_nanogpts_size_and_large_llama_about_a_billion() -> None:
    gpt2, dims = decoder("gpt2-124m", "large")
    params = sum(p.numel() for p in gpt2.parameters())  # the head is tied to the embedding
    assert params - dims["seq_len"] * dims["width"] == 123_689_472  # nanoGPT: "123.69M"
    llama, dims = decoder("llama", "large")
    assert 1.0e9 < sum(p.numel() for p in llama.parameters()) < 1.2e9
    head_dim = dims["width"] // dims["heads"]
    wk = llama.layers[0].attn.wk.weight  # type: ignore[index, union-attr]
    assert wk.shape == (dims["kv_heads"] * head_dim, dims["width"])  # grouped-query attention


@pytest.mark.parametrize(
    ("kind", "tiny"),
    [
        ("gpt2-124m", ["workload.layers=2", "workload.width=64", "workload.heads=4"]),
        ("llama", []),
    ],
)
@pytest.mark.slow
def test_the_new_decoders_train_on_the_cpu(kind: str, tiny: list[str]) -> None:
    sets = [f"workload.kind='{kind}'", "device='cpu'", "steps=3", "warmup_steps=1", *tiny]
    if kind == "gpt2-124m":
        sets += ["workload.seq_len=32", "workload.vocab=512", "batch_size=4"]
    seen: list[ev.Event] = []
    assert run("amp-bf16", sets, record=False, on_event=seen.append) == EXIT_OK
    hello = next(e for e in seen if isinstance(e, ev.HelloEvent))
    assert hello.workload == kind and hello.flops_source == "analytic"
    assert hello.flops_analytic == pytest.approx(hello.flops_counted, rel=0.01)
    assert [e.step for e in seen if isinstance(e, ev.StepEvent)] == [0, 1, 2]
