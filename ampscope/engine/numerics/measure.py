"""One tensor's numerics in one read: amax, smallest non-zero, and what each format loses.

Every count is a count of magnitudes at or above a boundary. A magnitude's fp32 bit pattern,
read as an integer (sign bit cleared), is ordered as the magnitudes are, NaN above inf; so
"a >= b" is "bits(a) >= bits(b)", exact, and each boundary is an integer (``BOUND_BITS``; the
fp32 values of ``core.numerics.LIMITS``: fp16 overflows from 65520, half its smallest
subnormal rounds to zero), and the counts equal what torch's own casts produce. The fp8
formats' amax-scaled thresholds, which depend on the tensor's amax, are two more boundaries.

Two ways to the same row (``RAW`` floats; ``row_of`` turns it, on the host, into the
``WIDTH`` columns the event is made from), bit-identical (tests/test_numerics.py checks both
against a count per boundary on data with zeros, subnormals, inf and NaN, in every dtype):

- ``device_row``, for a GPU: nothing is read back to the host, so the GPU is never waited
  for. One reduction pass gives the amax and the smallest non-zero; one ``torch.bucketize``
  of the bit patterns against every boundary at once (sorted on the device) and one
  ``index_add_`` into a histogram of len(boundaries) + 1 bins answer every format together
  (``torch.bincount`` would read its input's max back to size its output). A test runs it on
  the meta device, where any read back fails.
- ``host_row``, for a CPU, where reading a value costs no wait: one reduction gives the
  smallest and largest bit patterns, and every boundary at or below the smallest non-zero
  magnitude, or above the largest, is answered by them; only boundaries inside the tensor's
  range take a pass (typically two or three: fp8's zero boundaries and a scaled threshold),
  a numpy comparison and count (torch's, on its threads, for a large tensor when it has
  several). A binary search per element, as bucketize does, or a histogram costs more on a
  CPU than those few passes.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator

import numpy as np
import torch

from ampscope.core.numerics import FORMATS, FP8_KEYS, LIMITS

CHUNK = 1 << 22  # elements read at a time: temporaries stay a few tens of MiB
PARALLEL = 1 << 18  # on a CPU, pieces this large are counted by torch (on all its threads)
ONE_PASS = 1 << 15  # on a CPU, from this size torch's aminmax beats numpy's min and max

# Columns of one measurement row (float64, so that counts stay exact).
NUMEL, NONFINITE, AMAX, MIN_NONZERO, NONZERO = range(5)
OVER = {key: 5 + 2 * i for i, key in enumerate(FORMATS)}
UNDER = {key: 6 + 2 * i for i, key in enumerate(FORMATS)}
SCALED = {key: 5 + 2 * len(FORMATS) + i for i, key in enumerate(FP8_KEYS)}
WIDTH = 5 + 2 * len(FORMATS) + len(FP8_KEYS)

TINY = 2.0**-149  # the smallest fp32 magnitude: "a >= TINY" is "not zero"
MAGNITUDE = 0x7FFFFFFF  # an fp32's bits less its sign
INF_BITS = 0x7F800000  # +inf's bits; a NaN's magnitude bits are above

# What each fp8 format's amax-scaled cast keeps: a >= amax * zero_below / largest.
SCALED_RATIOS = [LIMITS[k].zero_below / LIMITS[k].largest for k in FP8_KEYS]


def _boundaries() -> tuple[list[float], dict[str, int]]:
    named = {"all": 0.0, "nonzero": TINY, "inf": math.inf}  # NaN is counted as inf
    for key, lim in LIMITS.items():
        named[f"over-{key}"] = lim.overflow_at
        named[f"zero-{key}"] = lim.zero_below
    order = sorted(named, key=lambda n: named[n])
    return [named[n] for n in order], {n: i for i, n in enumerate(order)}


def fp32_bits(x: float) -> int:
    """The bit pattern of ``x`` rounded to fp32 (to nearest, ties to even), an integer >= 0
    for x >= 0."""
    return struct.unpack("<i", struct.pack("<f", x))[0]


def fp32_of(bits: int) -> float:
    """The fp32 value of a magnitude's bit pattern (NaN's bits read as inf)."""
    return math.inf if bits >= INF_BITS else struct.unpack("<f", struct.pack("<i", bits))[0]


BOUNDS, AT = _boundaries()
BOUND_BITS = [fp32_bits(b) for b in BOUNDS]  # ascending
CONSTANTS = BOUNDS + SCALED_RATIOS  # put on the device once (a copy per tensor would wait)
# The raw row: magnitudes >= each of BOUNDS, >= each scaled threshold (FP8_KEYS' order),
# then the largest finite magnitude and the smallest non-zero one (inf when none is finite).
KEPT = len(BOUNDS)
RAW_AMAX = KEPT + len(FP8_KEYS)
RAW_LOW = RAW_AMAX + 1
RAW = RAW_LOW + 1


def _bits(piece: torch.Tensor) -> torch.Tensor:
    """|piece| in fp32 as int32 bit patterns: ordered as the magnitudes, NaN above inf."""
    return piece.float().view(torch.int32) & MAGNITUDE


def _pieces(x: torch.Tensor) -> list[torch.Tensor]:
    flat = x.detach().reshape(-1)
    return [flat] if flat.numel() <= CHUNK else list(flat.split(CHUNK))


def measure(x: torch.Tensor, constants: torch.Tensor) -> torch.Tensor:
    """A ``RAW`` row (float64) for ``x`` on x's device, never waiting for a GPU.
    ``constants`` is ``CONSTANTS`` as fp32 on that device."""
    if x.device.type == "cpu":
        return torch.tensor(host_row(x), dtype=torch.float64)
    return device_row(x, constants)


def device_row(x: torch.Tensor, constants: torch.Tensor) -> torch.Tensor:
    """The ``RAW`` row, computed on x's device without reading anything back."""
    pieces = _pieces(x)
    kept = [_bits(p) for p in pieces] if len(pieces) == 1 else None

    def bits() -> Iterator[torch.Tensor]:
        return iter(kept) if kept is not None else (_bits(p) for p in pieces)

    tops, lows = [], []
    for b in bits():
        tops.append(b.view(torch.float32).nan_to_num(0.0, 0.0).amax())
        # bits - 1 wraps zero's to the largest pattern: the minimum is the smallest non-zero's
        lows.append(((b - 1) & MAGNITUDE).amin())
    amax = tops[0] if len(tops) == 1 else torch.stack(tops).amax()
    below_low = lows[0] if len(lows) == 1 else torch.stack(lows).amin()
    low = (below_low.clamp(max=INF_BITS - 1) + 1).view(torch.float32)  # none finite: inf
    scaled = (amax * constants[KEPT:]).view(torch.int32)
    fixed = constants[:KEPT].view(torch.int32)
    bounds, order = torch.cat([fixed, scaled]).sort()
    histogram = torch.zeros(len(bounds) + 1, dtype=torch.float64, device=x.device)
    one = torch.ones((), dtype=torch.float64, device=x.device)
    for b in bits():  # bin i: magnitudes at or above exactly i of the boundaries
        at = torch.bucketize(b, bounds, right=True, out_int32=True)
        histogram.index_add_(0, at, one.expand(at.numel()))
    at_least = sum(p.numel() for p in pieces) - histogram.cumsum(0)[:-1]  # >= bounds[j]
    counts = torch.empty_like(at_least).index_copy_(0, order, at_least)
    return torch.cat([counts, torch.stack([amax, low]).to(torch.float64)])


def _parallel(b: torch.Tensor) -> bool:
    """Whether to count ``b`` with torch, on its several threads: a large tensor while torch
    has them. Otherwise numpy: its comparisons and counts cost half of torch's on one thread,
    and a tenth on a small tensor."""
    return b.numel() >= PARALLEL and torch.get_num_threads() > 1


def _host_bits(piece: torch.Tensor) -> torch.Tensor:
    if _parallel(piece):
        return _bits(piece)
    return torch.from_numpy(np.bitwise_and(piece.float().numpy().view(np.int32), MAGNITUDE))


def _ends(b: torch.Tensor) -> tuple[int, int]:
    """The smallest and largest of ``b``: one torch reduction for a large tensor, numpy's two
    (less overhead) for a small one."""
    if b.numel() < ONE_PASS:
        a = b.numpy()
        return int(a.min()), int(a.max())
    lo, hi = torch.stack(torch.aminmax(b)).tolist()
    return lo, hi


def _count(b: torch.Tensor, at_least: int) -> int:
    """How many of the bit patterns ``b`` (on the CPU) are >= ``at_least`` (>= 1): numpy's
    comparison and count, or torch's, clamped to the two patterns either side and summed
    (two passes a CPU vectorises: torch's comparison's booleans, summed, take three times as
    long)."""
    if not _parallel(b):
        return int(np.count_nonzero(b.numpy() >= at_least))
    below = at_least - 1
    return int(b.clamp(below, at_least).sub_(below).sum(dtype=torch.int32))


def host_row(x: torch.Tensor) -> list[float]:
    """The ``RAW`` row of a tensor on the CPU, as host floats."""
    pieces = _pieces(x)
    kept = [_host_bits(p) for p in pieces] if len(pieces) == 1 else None

    def bits() -> Iterator[torch.Tensor]:
        return iter(kept) if kept is not None else (_host_bits(p) for p in pieces)

    numel = sum(p.numel() for p in pieces)
    ends = [_ends(b) for b in bits()]
    lowest = min(lo for lo, _ in ends)
    highest = max(hi for _, hi in ends)
    nonfinite, top = 0, highest  # top: the largest finite magnitude's bits
    if highest >= INF_BITS:
        nonfinite = sum(_count(b, INF_BITS) for b in bits())
        top = max(int(torch.where(b < INF_BITS, b, 0).max()) for b in bits())
    nonzero, low = numel, lowest  # low: the smallest non-zero magnitude's bits
    if lowest == 0:
        nonzero = sum(_count(b, 1) for b in bits())
        # bits - 1 wraps zero's to the largest pattern: the minimum is the smallest non-zero's
        low = min(int(((b - 1) & MAGNITUDE).min()) for b in bits()) + 1
    amax = fp32_of(top)
    # an fp32 product: exact in a double (24 + 24 bits), rounded once, as the GPU rounds it
    scaled = [fp32_bits(amax * r) for r in SCALED_RATIOS]
    counts = []
    for boundary in BOUND_BITS + scaled:
        if boundary == 0:
            counts.append(numel)
        elif boundary <= low:  # every non-zero magnitude
            counts.append(nonzero)
        elif boundary > highest:
            counts.append(0)
        elif top < boundary <= INF_BITS:  # every inf and NaN, no finite one
            counts.append(nonfinite)
        else:
            counts.append(sum(_count(b, boundary) for b in bits()))
    return [*map(float, counts), amax, fp32_of(low) if nonzero else math.inf]


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
