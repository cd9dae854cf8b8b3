"""Per-layer numerics against an independent reference: torch's own casts, in a plain hook loop."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import ml_dtypes
import pytest
import torch

from ampscope.core import events as ev
from ampscope.core.numerics import LIMITS, choose_modules, derive_limits, group_names
from ampscope.engine.numerics.probe import NumericsProbe

DATA = Path(__file__).parent / "data" / "planted_numerics.py"
DTYPES = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "e4m3": torch.float8_e4m3fn,
    "e5m2": torch.float8_e5m2,
}


def planted(factory: str):
    spec = importlib.util.spec_from_file_location("planted_numerics", DATA)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ctx = type("Ctx", (), {"seed": 0, "batch_size": 32})()
    return getattr(module, factory)(ctx)


def reference_counts(t: torch.Tensor) -> dict[str, tuple[float, float]]:
    """(overflow, underflow) shares as torch's casts make them: inf/NaN from a finite value,
    0 from a non-zero one (e4m3, which has no inf, as ml_dtypes casts it)."""
    t = t.detach().float()
    out = {}
    for key, dtype in DTYPES.items():
        if key == "e4m3":  # torch's cast saturates at 448: ml_dtypes' gives NaN, as the format
            cast = torch.from_numpy(t.numpy().astype(ml_dtypes.float8_e4m3fn).astype("float32"))
        else:
            cast = t.to(dtype).float()
        over = (~torch.isfinite(cast) & torch.isfinite(t)).sum().item()
        under = ((cast == 0) & (t != 0)).sum().item()
        out[key] = (over / t.numel(), under / t.numel())
    return out


def tensors(out):
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (tuple, list)):
        for item in out:
            yield from tensors(item)
    elif isinstance(out, dict):
        for item in out.values():
            yield from tensors(item)


def reference_step(model, x, y) -> dict[tuple[str, str], list[torch.Tensor]]:
    """One step with a plain hook loop keeping every output and output gradient."""
    kept: dict[tuple[str, str], list[torch.Tensor]] = {}
    handles = []
    for name, module in model.named_modules():
        if not name or any(module.children()):
            continue

        def hook(mod, inp, out, name=name):
            for t in tensors(out):
                kept.setdefault((name, "forward"), []).append(t.detach().clone())
                if t.requires_grad:
                    t.register_hook(
                        lambda g, name=name: kept.setdefault((name, "backward"), []).append(
                            g.detach().clone()
                        )
                    )

        handles.append(module.register_forward_hook(hook))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    for h in handles:
        h.remove()
    return kept


def probe_step(model, x, y) -> ev.NumericsEvent:
    got: list[ev.Event] = []
    probe = NumericsProbe(model, torch.device("cpu"), got.append, every=1)
    probe.begin(0, torch.full((), math.nan))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    probe.end(0)
    probe.poll(wait=True)
    assert len(got) == 1 and isinstance(got[0], ev.NumericsEvent), got
    return got[0]


@pytest.mark.unit
@pytest.mark.parametrize("factory", ["make_overflow", "make_underflow"])
def test_shares_match_torch_casts(factory):
    work = planted(factory)
    model = work.model
    x, y = work.batches[0]
    torch.manual_seed(0)
    kept = reference_step(model, x, y)
    model.zero_grad()
    event = probe_step(model, x, y)
    by_name = {m.name: m for m in event.modules}
    checked = 0
    for (name, which), pieces in kept.items():
        whole = torch.cat([p.reshape(-1).float() for p in pieces])
        want = reference_counts(whole)
        entry = by_name[name].activation if which == "forward" else by_name[name].gradient
        assert entry.numel == whole.numel(), (name, which)
        assert entry.amax == pytest.approx(whole.abs().max().item(), rel=1e-6)
        for key, (over, under) in want.items():
            share = entry.formats[key]
            assert abs(share.overflow - over) <= 0.01, (name, which, key, share, over)
            assert abs(share.underflow - under) <= 0.01, (name, which, key, share, under)
            checked += 1
    assert checked >= 40
    planted_layer = by_name["trunk.boost"].activation if factory == "make_overflow" else None
    if planted_layer is not None:  # the planted layer is seen, and only bf16 holds it
        assert planted_layer.formats["fp16"].overflow > 0.3
        assert planted_layer.formats["bf16"].overflow == 0
    else:
        tiny = by_name["head.tiny"].activation
        assert tiny.formats["fp16"].underflow > 0.9
        assert tiny.formats["bf16"].underflow == 0
        assert tiny.formats["e4m3"].scaled_underflow < 0.1  # amax scaling rescues it


@pytest.mark.unit
def test_the_written_out_limits_are_those_real_casts_give():
    assert {key: derive_limits(key) for key in LIMITS} == LIMITS


@pytest.mark.unit
def test_boundaries_are_where_torch_rounds():
    """Values either side of every limit, cast by torch: the limits say which side loses."""
    for key, dtype in DTYPES.items():
        lim = LIMITS[key]
        for value, lost in (
            (lim.overflow_at, True),
            (float(torch.nextafter(torch.tensor(lim.overflow_at), torch.tensor(0.0))), False),
            (lim.zero_below, False),
            (float(torch.nextafter(torch.tensor(lim.zero_below), torch.tensor(0.0))), True),
        ):
            if key == "e4m3":
                cast = torch.tensor([float(ml_dtypes.float8_e4m3fn(value))])
            else:
                cast = torch.tensor([value]).to(dtype).float()
            overflowed = not torch.isfinite(cast).item()
            zeroed = cast.item() == 0
            assert (overflowed or zeroed) == lost, (key, value)


@pytest.mark.unit
def test_tuple_dict_none_outputs_are_measured_and_the_rest_skipped():
    work = planted("make_overflow")
    x, y = work.batches[0]
    event = probe_step(work.model, x, y)
    pair = next(m for m in event.modules if m.name == "pair")
    assert pair.activation.numel == 2 * x.shape[0] * 16  # y and extra["skip"]; None skipped


@pytest.mark.unit
def test_a_probe_failure_is_one_warning_and_training_goes_on(monkeypatch):
    import ampscope.engine.numerics.probe as probe_mod

    def broken(t, bounds):
        raise RuntimeError("no kernel for this")

    monkeypatch.setattr(probe_mod, "measure", broken)
    work = planted("make_overflow")
    x, y = work.batches[0]
    got: list = []
    probe = NumericsProbe(work.model, torch.device("cpu"), got.append, every=1)
    probe.begin(0, torch.full((), math.nan))
    loss = torch.nn.functional.cross_entropy(work.model(x), y)
    loss.backward()
    probe.end(0)
    probe.poll(wait=True)
    assert [e.code for e in got] == ["numerics-failed"]
    assert "no kernel for this" in got[0].message
    assert not probe.wants(1)


@pytest.mark.unit
def test_many_modules_stay_bounded_and_every_kind_is_kept():
    names = [f"blocks.{i}.{part}" for i in range(5000) for part in ("attn", "mlp")] + ["head"]
    chosen = choose_modules(names, cap=256)
    assert len(chosen) == 256
    assert {"blocks.0.attn", "blocks.0.mlp", "head"} <= set(chosen)
    labels = [label for label, _ in group_names(names[:24] + ["head"])]
    assert labels == ["blocks.0-11.attn", "blocks.0-11.mlp", "head"]
