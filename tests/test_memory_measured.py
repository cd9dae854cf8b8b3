"""The memory planner against torch.profiler's allocator bytes for one real training step.

The reference is independent of the planner: every CPU allocation and free during one
steady-state step (optimizer state already made), as torch.profiler(profile_memory=True)
records them, summed in time order; the peak of that running sum plus the tensors alive
before the step (weights and AdamW state) is the step's peak tensor memory. The step is the
engine's: its GPT workload and loss, autocast for AMP, model.to(bf16) for pure bf16, AdamW,
gradient clipping, zero_grad(set_to_none=True).
"""

from __future__ import annotations

import math

import pytest

from ampscope.core.memory import plan

torch = pytest.importorskip("torch")

# (layers, width, heads, seq_len, vocab, batch): the CPU preset's GPT (the logits dominate)
# and a deeper, longer-sequence one with a small vocabulary (the activations dominate).
SIZES = {
    "small": (2, 64, 4, 64, 1024, 32),
    "deep": (4, 128, 4, 128, 256, 8),
}
REGIMES = ("fp32", "amp-bf16", "bf16")


def measured_peak(
    regime: str, layers: int, width: int, heads: int, seq: int, vocab: int, batch: int
) -> int:
    from torch.profiler import ProfilerActivity, profile

    from ampscope.engine.workloads import build_workload

    dims = {"layers": layers, "width": width, "heads": heads, "seq_len": seq, "vocab": vocab}
    workload = build_workload("gpt", dims, batch, torch.device("cpu"), seed=0)
    model = workload.model
    if regime == "bf16":
        model.to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    x, y = workload.batch(0)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=regime == "amp-bf16"):
            output = model(x)
            loss = workload.loss(output, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # AdamW makes its state in the first step
    alive = sum(
        t.numel() * t.element_size()
        for p in model.parameters()
        for t in (p, *optimizer.state[p].values())
    )
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    allocations = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    running = peak = 0
    for event in sorted(allocations, key=lambda e: e.start_ns()):
        running += event.nbytes()
        peak = max(peak, running)
    assert abs(running) < 64 * 1024, "the step should free what it allocates"
    return alive + peak


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("regime", REGIMES)
def test_planner_within_ten_percent_of_a_measured_training_step(regime: str, size: str) -> None:
    layers, width, heads, seq, vocab, batch = SIZES[size]
    dims = {"layers": layers, "width": width, "heads": heads, "seq_len": seq, "vocab": vocab}
    wl = plan.workload_from("gpt", dims, batch, regime)
    planned = plan.plan_regime(wl.params, regime, "adamw", wl.shape)
    measured = measured_peak(regime, layers, width, heads, seq, vocab, batch)
    error = planned.train_total / measured - 1
    # TRAIN counts the gradients, which do not exist yet at the backward peak: without them
    # the planner must be close to exact, so the only gap left is the documented one.
    without_grads = (planned.train_total - planned.grads) / measured - 1
    print(
        f"{regime} {size}: planned {planned.train_total:,} measured {measured:,} "
        f"({error:+.1%}; {without_grads:+.1%} without the grads)"
    )
    assert abs(error) <= 0.10, (planned, measured)
    assert abs(without_grads) <= 0.03, (planned, measured)
