"""Model FLOPs checked against references nobody here wrote: counts by hand and torch's own
FlopCounterMode (on the math attention path, or the meta device for the large sizes)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from ampscope.core import config as cfg
from ampscope.core import events as ev
from ampscope.engine.flops import count_flops, count_train_flops
from ampscope.engine.run import EXIT_OK, run
from ampscope.engine.workloads.gpt import lm_flops
from ampscope.engine.workloads.gpt2 import Gpt2
from ampscope.engine.workloads.llama import Llama

pytestmark = pytest.mark.unit


def test_counted_flops_of_an_mlp_match_the_count_by_hand() -> None:
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    x, y = torch.randn(32, 16), torch.randint(4, (32,))
    flops, partial = count_train_flops(model, (x, y), F.cross_entropy)
    # forward and weight gradient 2*b*in*out each; an input gradient for the second layer only
    by_hand = 2 * 32 * (2 * 16 * 64 + 3 * 64 * 4)
    assert flops == pytest.approx(by_hand, rel=0.01) and not partial
    assert all(p.grad is None for p in model.parameters())  # counting leaves nothing behind


def attention_step(q: torch.Tensor) -> None:
    F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()


def test_attention_on_the_cpu_flash_kernel_is_counted_as_on_the_math_path() -> None:
    q = torch.randn(2, 4, 64, 16, requires_grad=True)
    with FlopCounterMode(display=False) as stock:  # torch's default CPU kernel: no formula
        attention_step(q)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as math_path:
        attention_step(q)
    ours = count_flops(lambda: attention_step(q))
    assert stock.get_total_flops() == 0  # the gap ampscope's counter fills
    assert ours.flops == pytest.approx(math_path.get_total_flops(), rel=0.01)
    assert ours.flops == 12 * 2 * 4 * 64 * 64 * 16 and not ours.partial


def test_a_heavy_op_without_a_formula_makes_the_count_partial() -> None:
    lstm = nn.LSTM(8, 16, batch_first=True)
    x = torch.randn(2, 5, 8)
    found = count_flops(lambda: lstm(x)[0].sum().backward())
    assert found.partial and any("rnn" in op for op in found.uncounted)
    assert "partial: no formula for aten." in found.note


def decoder(kind: str, size: str) -> tuple[nn.Module, dict[str, int], int, str]:
    preset = cfg.load_preset("fp32", [f"workload.kind='{kind}'", f"workload.size='{size}'"])
    dims, batch = cfg.resolve_workload(preset, on_cuda=False)
    big = kind == "gpt2-124m" or size == "large"
    device = "meta" if big else "cpu"  # a large model costs nothing on the meta device
    with torch.device(device):
        if kind == "llama":
            model: nn.Module = Llama(
                dims["vocab"],
                dims["seq_len"],
                dims["width"],
                dims["layers"],
                dims["heads"],
                dims["kv_heads"],
            )
        else:
            model = Gpt2(
                dims["vocab"], dims["seq_len"], dims["width"], dims["layers"], dims["heads"]
            )
    return model, dims, batch, device


@pytest.mark.parametrize(
    ("kind", "size"),
    [("gpt2-124m", "small"), ("gpt2-124m", "large"), ("llama", "small"), ("llama", "large")],
)
def test_a_decoders_flop_formula_matches_flopcountermode(kind: str, size: str) -> None:
    model, dims, batch, device = decoder(kind, size)
    idx = torch.randint(dims["vocab"], (batch, dims["seq_len"]), device=device)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        logits = model(idx)
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx.reshape(-1)).backward()
    formula = lm_flops(model, dims, batch * dims["seq_len"])
    assert counter.get_total_flops() == pytest.approx(formula, rel=0.01)


def test_gpt2_124m_is_nanogpts_size_and_large_llama_about_a_billion() -> None:
    gpt2, dims, _, _ = decoder("gpt2-124m", "large")
    params = sum(p.numel() for p in gpt2.parameters())  # the head is tied to the embedding
    assert params - dims["seq_len"] * dims["width"] == 123_689_472  # nanoGPT: "123.69M"
    llama, dims, _, _ = decoder("llama", "large")
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
def test_the_new_decoders_train_on_the_cpu(kind: str, tiny: list[str]) -> None:
    sets = [f"workload.kind='{kind}'", "device='cpu'", "steps=3", "warmup_steps=1", *tiny]
    if kind == "gpt2-124m":
        sets += ["workload.seq_len=32", "workload.vocab=512", "batch_size=4"]
    seen: list[ev.Event] = []
    assert run("amp-bf16", sets, record=False, on_event=seen.append) == EXIT_OK
    hello = next(e for e in seen if isinstance(e, ev.HelloEvent))
    assert hello.workload == kind and hello.flops_source == "formula"
    assert [e.step for e in seen if isinstance(e, ev.StepEvent)] == [0, 1, 2]
