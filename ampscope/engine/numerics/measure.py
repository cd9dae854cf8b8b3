"""One tensor's numerics on its own device: amax, smallest non-zero, and what each format loses.

Every count is a count of magnitudes at or above a boundary: comparisons of the magnitudes
against each boundary, summed (the fp8 formats' amax-scaled thresholds, which depend on the
tensor's amax, are two more boundaries). Nothing in it reads a
value back to the host, so on CUDA it never waits for the GPU: ``torch.bincount`` would (it
reads the input's min and max to size its output), as would ``nonzero``, ``unique`` or
``.item()``; a test runs it on the meta device, where any such read fails. The boundaries are
exact (fp32 values of ``core.numerics.LIMITS``), so the counts equal what torch's own casts
produce. The device returns a raw row (``RAW``); ``row_of`` turns it, on the host, into the
``WIDTH`` columns the event is made from.
"""

from __future__ import annotations

import math

import torch

from ampscope.core.numerics import FORMATS, FP8_KEYS, LIMITS

CHUNK = 1 << 22  # elements read at a time: temporaries stay a few tens of MiB
SMALL = 1 << 16  # up to this many elements, every boundary in one broadcast comparison

# Columns of one measurement row (float64, so that counts stay exact).
NUMEL, NONFINITE, AMAX, MIN_NONZERO, NONZERO = range(5)
OVER = {key: 5 + 2 * i for i, key in enumerate(FORMATS)}
UNDER = {key: 6 + 2 * i for i, key in enumerate(FORMATS)}
SCALED = {key: 5 + 2 * len(FORMATS) + i for i, key in enumerate(FP8_KEYS)}
WIDTH = 5 + 2 * len(FORMATS) + len(FP8_KEYS)

TINY = 2.0**-149  # the smallest fp32 magnitude: "a >= TINY" is "not zero"

# What each fp8 format's amax-scaled cast keeps: a >= amax * zero_below / largest.
SCALED_RATIOS = [LIMITS[k].zero_below / LIMITS[k].largest for k in FP8_KEYS]


def _boundaries() -> tuple[list[float], dict[str, int]]:
    named = {"all": 0.0, "nonzero": TINY, "inf": math.inf}  # NaN is counted as inf
    for key, lim in LIMITS.items():
        named[f"over-{key}"] = lim.overflow_at
        named[f"zero-{key}"] = lim.zero_below
    order = sorted(named, key=lambda n: named[n])
    return [named[n] for n in order], {n: i for i, n in enumerate(order)}


BOUNDS, AT = _boundaries()
CONSTANTS = BOUNDS + SCALED_RATIOS  # put on the device once (a copy per tensor would wait)
# The raw row the device returns: magnitudes >= each of BOUNDS, >= each scaled threshold
# (FP8_KEYS' order), then the largest finite magnitude and the smallest non-zero one.
KEPT = len(BOUNDS)
RAW_AMAX = KEPT + len(FP8_KEYS)
RAW_LOW = RAW_AMAX + 1
RAW = RAW_LOW + 1


def _magnitudes(piece: torch.Tensor) -> torch.Tensor:
    """|piece| in fp32, NaN as inf (an inf or NaN is one non-finite value either way)."""
    return piece.abs().float().nan_to_num_(nan=math.inf, posinf=math.inf)


def _at_least(a: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """How many of ``a`` are >= each of ``bounds``, as float64 (exact below 2**53): all at
    once for a small tensor (two kernels), one count a boundary for a large one (a comparison
    that size against all of them would leave the caches)."""
    if a.numel() <= SMALL:
        return (a.unsqueeze(0) >= bounds.unsqueeze(1)).sum(1, dtype=torch.float64)
    return torch.stack([torch.count_nonzero(a >= b) for b in bounds]).to(torch.float64)


def measure(x: torch.Tensor, constants: torch.Tensor) -> torch.Tensor:
    """A ``RAW`` row for ``x`` on x's device, without reading anything back to the host.
    ``constants`` is ``CONSTANTS`` as fp32 on that device."""
    flat = x.detach().reshape(-1)
    bounds, ratios = constants[: len(BOUNDS)], constants[len(BOUNDS) :]
    if flat.numel() <= CHUNK:  # one read: amax first, then every boundary at once
        a = _magnitudes(flat)
        amax = a.nan_to_num(posinf=0.0).amax()
        low = torch.where(a > 0, a, math.inf).amin()
        counts = _at_least(a, torch.cat([bounds, amax * ratios]))
        return torch.cat([counts, torch.stack([amax, low]).to(torch.float64)])
    pieces = flat.split(CHUNK)
    counts = torch.zeros(len(BOUNDS), dtype=torch.float64, device=x.device)
    amax = torch.zeros((), dtype=torch.float32, device=x.device)
    low = torch.full((), math.inf, dtype=torch.float32, device=x.device)
    for piece in pieces:
        a = _magnitudes(piece)
        counts += _at_least(a, bounds)
        amax = torch.maximum(amax, a.nan_to_num(posinf=0.0).amax())
        low = torch.minimum(low, torch.where(a > 0, a, math.inf).amin())
    kept = torch.zeros(len(FP8_KEYS), dtype=torch.float64, device=x.device)
    for piece in pieces:  # a second read: the scaled thresholds need the whole tensor's amax
        kept += _at_least(_magnitudes(piece), amax * ratios)
    return torch.cat([counts, kept, torch.stack([amax, low]).to(torch.float64)])


def row_of(raw: list[float]) -> list[float]:
    """The ``WIDTH`` columns of a ``RAW`` row, on the host."""
    inf, nonzero = raw[AT["inf"]], raw[AT["nonzero"]]
    row = [0.0] * WIDTH
    row[NUMEL] = raw[AT["all"]]
    row[NONFINITE] = inf
    row[AMAX] = raw[RAW_AMAX]
    row[MIN_NONZERO] = raw[RAW_LOW]
    row[NONZERO] = nonzero
    for key in FORMATS:
        row[OVER[key]] = raw[AT[f"over-{key}"]] - inf
        row[UNDER[key]] = nonzero - raw[AT[f"zero-{key}"]]
    for i, key in enumerate(FP8_KEYS):  # non-zero values the scaled cast sends to zero
        row[SCALED[key]] = max(nonzero - raw[KEPT + i], 0.0)
    return row
