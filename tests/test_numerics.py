"""Per-layer numerics against an independent reference: torch's own casts, in a plain hook loop."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import ml_dtypes
import pytest
import torch

from ampscope.core import events as ev
from ampscope.core.numerics import FORMATS, LIMITS, Limits, choose_modules, group_names
from ampscope.engine.numerics.hooks import NumericsProbe

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
    or an inf/NaN of ``t``'s own when ``t``'s format holds no larger a value than the cast's
    (an fp16 tensor's inf is an fp16 and fp8 overflow, not a bf16 one); 0 from a non-zero one
    (e4m3, which has no inf, as ml_dtypes casts it)."""
    own = torch.finfo(t.dtype).max
    t = t.detach().float()
    out = {}
    for key, dtype in DTYPES.items():
        if key == "e4m3":  # torch's cast saturates at 448: ml_dtypes' gives NaN, as the format
            cast = torch.from_numpy(t.numpy().astype(ml_dtypes.float8_e4m3fn).astype("float32"))
        else:
            cast = t.to(dtype).float()
        counted = torch.isfinite(t) | (torch.finfo(dtype).max <= own)
        over = (~torch.isfinite(cast) & counted).sum().item()
        under = ((cast == 0) & (t != 0)).sum().item()
        out[key] = (over / t.numel(), under / t.numel())
    return out


def reference_scaled_underflow(t: torch.Tensor, key: str) -> float:
    """The share of non-zero values that round to zero once the tensor is scaled by
    largest/amax (its finite amax) and cast by ml_dtypes, as tensorwise fp8 training does."""
    t = t.detach().float()
    finite = t[torch.isfinite(t)]
    amax = finite.abs().max().item() if finite.numel() else 0.0
    if amax == 0.0:
        return 0.0
    dtype = ml_dtypes.float8_e4m3fn if key == "e4m3" else ml_dtypes.float8_e5m2
    scaled = (t * (LIMITS[key].largest / amax)).numpy()
    cast = torch.from_numpy(scaled.astype(dtype).astype("float32"))
    return ((cast == 0) & (t != 0)).sum().item() / t.numel()


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


def probe_step(model, x, y, amp: bool = False) -> ev.NumericsEvent:
    got: list[ev.Event] = []
    probe = NumericsProbe(model, torch.device("cpu"), got.append, every=1)
    probe.begin(0, torch.full((), math.nan))
    with torch.autocast("cpu", torch.float16, enabled=amp):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    probe.end(0)
    probe.poll(wait=True)
    assert len(got) == 1 and isinstance(got[0], ev.NumericsEvent), got
    return got[0]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("factory", "amp"),
    [("make_overflow", False), ("make_underflow", False), ("make_overflow", True)],
)
def test_shares_match_torch_casts(factory, amp):
    """In fp32, and under fp16 autocast, where trunk.boost's output is inf in fp16 itself."""
    work = planted(factory)
    model = work.model
    x, y = work.batches[0]
    torch.manual_seed(0)
    with torch.autocast("cpu", torch.float16, enabled=amp):
        kept = reference_step(model, x, y)
    model.zero_grad()
    event = probe_step(model, x, y, amp)
    by_name = {m.name: m for m in event.modules}
    checked = 0
    scaled_seen: list[float] = []
    for (name, which), pieces in kept.items():
        whole = torch.cat([p.reshape(-1) for p in pieces])
        want = reference_counts(whole)
        entry = by_name[name].activation if which == "forward" else by_name[name].gradient
        assert entry.numel == whole.numel(), (name, which)
        assert entry.dtype == str(whole.dtype).removeprefix("torch."), (name, which)
        finite = whole[torch.isfinite(whole)].float()
        assert entry.amax == pytest.approx(finite.abs().max().item(), rel=1e-6)
        for key, (over, under) in want.items():
            share = entry.formats[key]
            assert abs(share.overflow - over) <= 0.01, (name, which, key, share, over)
            assert abs(share.underflow - under) <= 0.01, (name, which, key, share, under)
            if key in ("e4m3", "e5m2"):
                scaled = reference_scaled_underflow(whole, key)
                assert abs(share.scaled_underflow - scaled) <= 0.01, (name, which, key, scaled)
                scaled_seen.append(scaled)
            checked += 1
    assert checked >= 40 and (amp or max(scaled_seen) > 0)
    planted_layer = by_name["trunk.boost"].activation if factory == "make_overflow" else None
    if planted_layer is not None and amp:  # inf in fp16 itself: fp16's overflow, bf16 unknown
        assert planted_layer.dtype == "float16" and planted_layer.nonfinite > 0
        assert planted_layer.formats["fp16"].overflow == planted_layer.nonfinite / 512
        assert planted_layer.formats["bf16"].overflow == 0
    elif planted_layer is not None:  # the planted layer is seen, and only bf16 holds it
        assert planted_layer.formats["fp16"].overflow > 0.3
        assert planted_layer.formats["bf16"].overflow == 0
    else:
        tiny = by_name["head.tiny"].activation
        assert tiny.formats["fp16"].underflow > 0.9
        assert tiny.formats["bf16"].underflow == 0
        assert tiny.formats["e4m3"].scaled_underflow < 0.1  # amax scaling rescues it


def derive_limits(key: str) -> Limits:
    """The boundaries of ``key`` derived by real casts (ml_dtypes)."""
    import numpy as np

    from ampscope.core.formats import convert, get_format

    def next_up(x: float) -> float:
        return float(np.nextafter(np.float32(x), np.float32(np.inf)))

    fmt = get_format(FORMATS[key])
    largest, smallest = fmt.max, fmt.smallest_subnormal
    step_at_max = 2.0 ** (fmt.max_exponent - fmt.mantissa_bits)
    tie = largest + step_at_max / 2
    overflow_at = tie if not math.isfinite(convert(tie, fmt)) else next_up(tie)
    half = smallest / 2
    zero_below = next_up(half) if convert(half, fmt) == 0 else half
    return Limits(key, largest, smallest, float(np.float32(overflow_at)), zero_below)


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


class Unprintable(RuntimeError):
    def __str__(self):
        raise ZeroDivisionError("its __str__ fails too")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("error", "said"),
    [(RuntimeError("no kernel for this"), "no kernel for this"), (Unprintable(), "str() failed")],
    ids=["runtime-error", "unprintable-error"],
)
def test_a_probe_failure_is_one_warning_and_training_goes_on(monkeypatch, error, said):
    import ampscope.engine.numerics.hooks as probe_mod

    def broken(t):
        raise error

    monkeypatch.setattr(probe_mod, "host_row", broken)
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
    assert said in got[0].message
    assert not probe.wants(1)


@pytest.mark.unit
def test_many_modules_stay_bounded_and_every_kind_is_kept():
    names = [f"blocks.{i}.{part}" for i in range(5000) for part in ("attn", "mlp")] + ["head"]
    chosen = choose_modules(names, cap=256)
    assert len(chosen) == 256
    assert {"blocks.0.attn", "blocks.0.mlp", "head"} <= set(chosen)
    labels = [label for label, _ in group_names(names[:24] + ["head"])]
    assert labels == ["blocks.0-11.attn", "blocks.0-11.mlp", "head"]


@pytest.mark.unit
def test_the_layers_of_a_sequential_are_rows_of_their_own_not_a_repeated_block():
    """nn.Sequential(Linear, GELU, Linear, ...) names its layers 0, 1, 2...: each is its own
    layer (the Numerics view showed them all as one row '0-6')."""
    sequential = [str(i) for i in range(7)]
    assert [label for label, _ in group_names(sequential)] == sequential
    nested = ["net.0", "net.1", "layers.0.fc", "layers.1.fc", "layers.1.act", "head"]
    assert [label for label, _ in group_names(nested)] == [
        "net.0",
        "net.1",
        "layers.0-1.fc",
        "layers.1.act",
        "head",
    ]


@pytest.mark.unit
@pytest.mark.parametrize("numel", [100, 100_000, 5_000_000])
def test_measuring_reads_nothing_back_so_a_gpu_never_waits(numel):
    """On the meta device a tensor has no values: any read of one to the host (``.item()``,
    or ``torch.bincount``, which reads its input's min and max to size its output) raises. A
    sampled step's measuring, its weight checks and its one stacked row all run there."""
    from ampscope.engine.numerics.measure import CONSTANTS, RAW, measure

    meta = torch.device("meta")
    x = torch.empty(numel, dtype=torch.float16, device=meta)
    row = measure(x, torch.tensor(CONSTANTS, dtype=torch.float32, device=meta))
    assert row.shape == (RAW,) and row.device == meta

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).to(meta)
    probe = NumericsProbe(model, meta, lambda e: None, every=1)
    probe.poll = lambda wait=False: None  # the host read, a step later, is not the measuring
    probe.begin(0, torch.full((), math.nan, device=meta))
    model(torch.empty(4, 8, device=meta)).sum().backward()
    probe.end(0)
    assert not probe.failed and len(probe.pending) == 1
    assert probe.pending[0].flat.device == meta


@pytest.mark.unit
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA's sync debug mode needs a GPU")
def test_on_cuda_a_sampled_step_never_waits_for_the_gpu():
    from ampscope.engine.numerics.replay import StepKeeper

    cuda = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()).to(cuda)
    got: list = []
    probe = NumericsProbe(model, cuda, got.append, every=1)
    x = torch.randn(4096, 64, device=cuda) * 1e3
    keeper = StepKeeper(cuda)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        keeper.keep(
            0, x, None
        )  # what every step pays for a rerun: the RNG states, read on the host
        probe.begin(0, torch.full((), math.nan, device=cuda))
        model(x).sum().backward()
        probe.end(0)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    probe.poll(wait=True)
    assert [type(e) for e in got] == [ev.NumericsEvent]


@pytest.mark.parametrize(
    "numel",
    [
        pytest.param(1000, marks=pytest.mark.unit),
        pytest.param(100_000, marks=pytest.mark.unit),
        pytest.param(5_000_000, marks=pytest.mark.slow),  # beyond a chunk: two reads
    ],
)
def test_every_share_and_the_scaled_fp8_shares_match_casts_at_every_size(numel):
    """Magnitudes spread over 2**-40 to 2**20 (zeros, infs and NaNs among them), measured whole
    (a small tensor), a count per boundary (a large one) and in two reads (beyond a chunk)."""
    from ampscope.engine.numerics.measure import CONSTANTS, measure, row_of
    from ampscope.engine.numerics.summary import Slot, module_numerics

    g = torch.Generator().manual_seed(numel)
    x = torch.exp2(torch.rand(numel, generator=g) * 60 - 40)
    x[::7] *= -1
    x[::101] = 0.0
    x[5::997] = math.inf
    x[9::991] = math.nan
    raw = measure(x, torch.tensor(CONSTANTS, dtype=torch.float32)).tolist()
    slot = Slot(0, "forward", row=0, dtype="float32")
    modules, _ = module_numerics(0, [("m", "M", [])], [slot], [row_of(raw)], [], [])
    got = modules[0].activation
    assert got.numel == numel and got.nonfinite == x.isnan().sum() + x.isinf().sum()
    finite = x[torch.isfinite(x)].abs()
    assert got.amax == finite.max().item() and got.min_nonzero == finite[finite > 0].min().item()
    for key, (over, under) in reference_counts(x).items():
        share = got.formats[key]
        assert abs(share.overflow - over) < 1e-9 and abs(share.underflow - under) < 1e-9, key
    for key in ("e4m3", "e5m2"):
        want = reference_scaled_underflow(x, key)
        assert want > 0.1 and abs(got.formats[key].scaled_underflow - want) < 1e-4, key


@pytest.mark.unit
def test_the_written_out_dtype_ranges_are_torchs_and_an_inf_overflows_each_narrower_format():
    from ampscope.core.numerics import DTYPE_LARGEST, overflows_in

    for name, largest in DTYPE_LARGEST.items():
        assert largest == torch.finfo(getattr(torch, name)).max, name
    assert [k for k in LIMITS if overflows_in("float16", k)] == ["fp16", "e4m3", "e5m2"]
    assert [k for k in LIMITS if overflows_in("float32", k)] == list(LIMITS)
    assert not [k for k in LIMITS if overflows_in(None, k)]  # an older record: not known


def counted_per_boundary(x: torch.Tensor) -> list[float]:
    """The ``RAW`` row as it was measured before one read answered every boundary: the
    magnitudes in fp32 (NaN as inf), one comparison and one count per boundary."""
    from ampscope.engine.numerics.measure import BOUNDS, SCALED_RATIOS

    a = x.detach().reshape(-1).abs().float().nan_to_num(nan=math.inf, posinf=math.inf)
    amax = a.nan_to_num(posinf=0.0).amax()
    low = torch.where(a > 0, a, math.inf).amin()
    scaled = [amax * torch.tensor(r, dtype=torch.float32) for r in SCALED_RATIOS]
    bounds = [torch.tensor(b, dtype=torch.float32) for b in BOUNDS] + scaled
    return [float((a >= b).sum()) for b in bounds] + [amax.item(), low.item()]


def awkward_values(numel: int, seed: int) -> torch.Tensor:
    """fp32 magnitudes from the smallest subnormal to beyond every format, both signs, with
    zeros, infs, NaNs and each boundary and its two fp32 neighbours planted among them."""
    from ampscope.engine.numerics.measure import BOUNDS

    g = torch.Generator().manual_seed(seed)
    x = torch.exp2(torch.rand(numel, generator=g) * 280 - 152)
    x[torch.rand(numel, generator=g) < 0.5] *= -1
    x[torch.rand(numel, generator=g) < 0.05] = 0.0
    x[torch.rand(numel, generator=g) < 0.01] = math.inf
    x[torch.rand(numel, generator=g) < 0.01] = -math.inf
    x[torch.rand(numel, generator=g) < 0.01] = math.nan
    finite = torch.tensor([b for b in BOUNDS if 0 < b < math.inf], dtype=torch.float32)
    planted = torch.cat([finite, finite.nextafter(finite * 2), finite.nextafter(finite * 0)])
    places = torch.randint(numel, (min(numel, planted.numel()),), generator=g)
    x[places] = planted[: places.numel()]
    return x


@pytest.mark.unit
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.float8_e5m2]
)
def test_one_read_gives_the_figures_a_count_per_boundary_gave(dtype, monkeypatch):
    """Every way (the CPU's, which lets the tensor's extremes answer most boundaries and
    counts the rest with numpy, or with torch's threads; and the GPU's, one bucketize for all
    of them) gives the very row a comparison and a count per boundary gave, to the bit, on
    awkward data in every dtype, and on tensors that are all zeros, all inf/NaN, one value or
    tiny."""
    from ampscope.engine.numerics import measure
    from ampscope.engine.numerics.measure import CONSTANTS, device_row, host_row

    def threaded(x: torch.Tensor) -> list[float]:
        with monkeypatch.context() as m:  # every piece counted by torch, on "several threads"
            m.setattr(measure, "PARALLEL", 0)
            m.setattr(torch, "get_num_threads", lambda: 4)
            return host_row(x)

    constants = torch.tensor(CONSTANTS, dtype=torch.float32)
    cases = [awkward_values(n, n).to(dtype) for n in (1, 7, 1000, 70_000)]
    cases += [
        torch.zeros(50, dtype=dtype),
        torch.full((9,), math.inf, dtype=dtype),
        torch.full((9,), math.nan, dtype=dtype),
        torch.tensor([0.0, math.inf, -math.nan, 0.0], dtype=torch.float32).to(dtype),
        torch.tensor([2.0**-149, -(2.0**-140), 0.0]).to(dtype),
        torch.tensor([3e38, 1e-45, 65519.0, 65520.0]).to(dtype),
        awkward_values(4096, 3).to(dtype).reshape(64, 64).t(),  # not contiguous
    ]
    for x in cases:
        want = counted_per_boundary(x)
        assert host_row(x) == want, x
        assert threaded(x) == want, x
        assert device_row(x, constants).tolist() == want, x


@pytest.mark.slow
def test_one_read_gives_the_same_figures_beyond_a_chunk():
    from ampscope.engine.numerics.measure import CHUNK, CONSTANTS, device_row, host_row

    x = awkward_values(CHUNK + 12_345, 1)
    want = counted_per_boundary(x)
    assert host_row(x) == want
    assert device_row(x, torch.tensor(CONSTANTS, dtype=torch.float32)).tolist() == want
