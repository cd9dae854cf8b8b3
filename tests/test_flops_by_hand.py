"""The ops whose FLOPs ampscope takes from torch's counter, each against a count by hand.

A multiply-add is 2 FLOPs. Each gradient of a linear op (input, weight) repeats every
multiply-add of its forward once, so one forward and backward costs 3x the forward, 2x
where the input needs no gradient (the data).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import ampscope
from ampscope.engine.step.flops import measure_train_flops


def summed(output: torch.Tensor, _target: object) -> torch.Tensor:
    return output.float().sum()


def conv_macs(n: int, c_out: int, c_in: int, groups: int, kernel: int, out_hw: int) -> int:
    """Multiply-adds of a square conv's forward: every output point of every output channel
    sums its group's c_in/groups channels over the kernel window."""
    return n * c_out * out_hw * out_hw * (c_in // groups) * kernel * kernel


def count(model: nn.Module, x: torch.Tensor) -> float:
    return measure_train_flops(model, [x, None], summed).flops


@pytest.mark.unit
@pytest.mark.parametrize(
    ("c_in", "c_out", "groups", "stride"),
    [(8, 16, 1, 1), (16, 16, 16, 1), (16, 32, 4, 2), (12, 12, 3, 3)],
    ids=["plain", "depthwise", "grouped-strided", "grouped-stride3"],
)
def test_a_conv_costs_three_forwards_whatever_its_groups_and_stride(
    c_in: int, c_out: int, groups: int, stride: int
) -> None:
    n, hw, k = 2, 12, 3
    conv = nn.Conv2d(c_in, c_out, k, stride=stride, padding=1, groups=groups)
    x = torch.randn(n, c_in, hw, hw, requires_grad=True)  # an inner layer: input gradient too
    out_hw = (hw + 2 - k) // stride + 1
    by_hand = 3 * 2 * conv_macs(n, c_out, c_in, groups, k, out_hw)
    assert count(conv, x) == by_hand


N, C, HW, K = 4, 16, 10, 3


def depthwise_block() -> tuple[nn.Module, torch.Tensor, int]:
    """A depthwise conv then a pointwise one, its data, and the hand count of a step."""
    net = nn.Sequential(nn.Conv2d(C, C, K, padding=1, groups=C), nn.Conv2d(C, C, 1))
    x = torch.randn(N, C, HW, HW)  # the data: no input gradient for the first layer
    return net, x, 2 * (2 * DEPTHWISE_MACS + 3 * conv_macs(N, C, C, 1, 1, HW))


DEPTHWISE_MACS = conv_macs(N, C, C, C, K, HW)


@pytest.mark.unit
def test_a_depthwise_net_is_not_charged_its_channels_times_over() -> None:
    """torch's own counter charges the depthwise conv's weight gradient as a dense conv's, C
    times over (3.05x the hand count for the block); ampscope's count is the hand count."""
    net, x, by_hand = depthwise_block()
    assert count(net, x) == by_hand
    with FlopCounterMode(display=False) as torch_counter:
        net(x).sum().backward()
    assert torch_counter.get_total_flops() == by_hand + (C - 1) * 2 * DEPTHWISE_MACS
    assert torch_counter.get_total_flops() / by_hand == pytest.approx(3.05, abs=0.005)


@pytest.mark.unit
def test_watch_count_flops_counts_a_depthwise_net_by_hand() -> None:
    net, x, by_hand = depthwise_block()
    assert ampscope.count_flops(lambda: net(x).sum().backward()) == by_hand


@pytest.mark.unit
def test_a_watched_depthwise_loop_counts_its_first_step_by_hand(tmp_path: Path) -> None:
    """``count_flops=True``: the figure TFLOP/s and MFU of a watched loop are computed from."""
    net, x, by_hand = depthwise_block()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    with ampscope.watch(net, opt, runs_dir=tmp_path, count_flops=True) as mon:
        for _ in range(2):
            opt.zero_grad()
            loss = net(x).sum()
            loss.backward()
            opt.step()
            mon.step(loss)
    assert mon.flops_per_step == by_hand


@pytest.mark.unit
@pytest.mark.parametrize("groups", [1, 4])
def test_a_transposed_conv_costs_three_forwards(groups: int) -> None:
    """A transposed conv's forward scatters every input point over the kernel window."""
    n, c_in, c_out, hw, k, stride = 2, 8, 12, 5, 3, 2
    deconv = nn.ConvTranspose2d(c_in, c_out, k, stride=stride, groups=groups)
    x = torch.randn(n, c_in, hw, hw, requires_grad=True)
    forward_macs = n * c_in * hw * hw * (c_out // groups) * k * k
    assert count(deconv, x) == 3 * 2 * forward_macs


class Attention(nn.Module):
    def __init__(self, mask: torch.Tensor | None, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        self.register_buffer("mask", mask)  # a buffer, as a model keeps its mask
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        k, v = q * self.scale, q * 2
        return nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=self.mask, is_causal=self.causal
        )


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["none", "bool-mask", "float-mask", "causal"])
def test_attention_with_a_mask_is_charged_the_full_square(kind: str) -> None:
    """Two batched matmuls forward (QK^T, PV), four backward; a mask or causality does not
    change what the math kernel multiplies (the model-FLOPs convention)."""
    b, h, s, d = 2, 3, 16, 8
    mask = {
        "bool-mask": torch.rand(s, s) > 0.3,
        "float-mask": torch.randn(s, s),
    }.get(kind)
    q = torch.randn(b, h, s, d, requires_grad=True)
    per_matmul = 2 * b * h * s * s * d
    assert count(Attention(mask, kind == "causal"), q) == 6 * per_matmul


class Einsum(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 6, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bij,bjk->bik", x, self.w)


@pytest.mark.unit
def test_an_einsum_costs_its_batched_matmul() -> None:
    x = torch.randn(4, 7, 6, requires_grad=True)
    forward = 2 * 4 * 7 * 6 * 5
    assert count(Einsum(), x) == 3 * forward
    assert math.isclose(count(Einsum(), x.detach()), 2 * forward)
