"""One tensor's numerics on its own device: amax, smallest non-zero, and what each format loses.

Every count comes from one bucketize and one bincount over the magnitudes (plus two
comparisons for the fp8 formats' amax-scaled thresholds, which depend on the tensor), so a
tensor is read a few times, not once per format. The boundaries are exact (fp32 values of
``core.numerics.LIMITS``), so the counts equal what torch's own casts produce.
"""

from __future__ import annotations

import math

import torch

from ampscope.core.numerics import FORMATS, FP8_KEYS, LIMITS

CHUNK = 1 << 22  # elements read at a time: temporaries stay a few tens of MiB

# Columns of one measurement row (float64, so that counts stay exact).
NUMEL, NONFINITE, AMAX, MIN_NONZERO, NONZERO = range(5)
OVER = {key: 5 + 2 * i for i, key in enumerate(FORMATS)}
UNDER = {key: 6 + 2 * i for i, key in enumerate(FORMATS)}
SCALED = {key: 5 + 2 * len(FORMATS) + i for i, key in enumerate(FP8_KEYS)}
WIDTH = 5 + 2 * len(FORMATS) + len(FP8_KEYS)

TINY = 2.0**-149  # the smallest fp32 magnitude: "a >= TINY" is "not zero"


def _boundaries() -> tuple[list[float], dict[str, int]]:
    named = {"nonzero": TINY, "inf": math.inf}
    for key, lim in LIMITS.items():
        named[f"over-{key}"] = lim.overflow_at
        named[f"zero-{key}"] = lim.zero_below
    order = sorted(named, key=lambda n: named[n])
    return [named[n] for n in order], {n: i for i, n in enumerate(order)}


BOUNDS, AT = _boundaries()


def measure(x: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """A ``WIDTH`` row for ``x`` on x's device. ``bounds`` is ``BOUNDS`` as fp32 there."""
    x = x.detach()
    flat = x.reshape(-1)
    hist = torch.zeros(len(BOUNDS) + 1, dtype=torch.int64, device=x.device)
    amax = torch.zeros((), dtype=torch.float32, device=x.device)
    low = torch.full((), math.inf, dtype=torch.float32, device=x.device)
    chunks = flat.split(CHUNK)
    for piece in chunks:
        a = piece.abs().float().nan_to_num_(nan=math.inf, posinf=math.inf)
        hist += torch.bincount(torch.bucketize(a, bounds, right=True), minlength=len(BOUNDS) + 1)
        finite = a.masked_fill(a == math.inf, 0.0)
        amax = torch.maximum(amax, finite.max())
        low = torch.minimum(low, torch.where(finite > 0, finite, math.inf).min())
    at_least = hist.flip(0).cumsum(0).flip(0)[1:]  # at_least[j]: magnitudes >= BOUNDS[j]
    row = torch.zeros(WIDTH, dtype=torch.float64, device=x.device)
    inf, nonzero = at_least[AT["inf"]], at_least[AT["nonzero"]]
    row[NUMEL] = flat.numel()
    row[NONFINITE] = inf
    row[AMAX] = amax
    row[MIN_NONZERO] = low
    row[NONZERO] = nonzero
    for key in FORMATS:
        row[OVER[key]] = at_least[AT[f"over-{key}"]] - inf
        row[UNDER[key]] = nonzero - at_least[AT[f"zero-{key}"]]
    thresholds = torch.stack([amax * (LIMITS[k].zero_below / LIMITS[k].largest) for k in FP8_KEYS])
    kept = torch.zeros(len(FP8_KEYS), dtype=torch.int64, device=x.device)
    for piece in chunks:  # a second read only for tensors over one chunk
        a = (
            a
            if len(chunks) == 1
            else piece.abs().float().nan_to_num_(nan=math.inf, posinf=math.inf)
        )
        kept += (a.unsqueeze(0) >= thresholds.unsqueeze(1)).sum(1)
    for i, key in enumerate(FP8_KEYS):  # nonzero values the scaled cast sends to zero
        row[SCALED[key]] = (nonzero - kept[i]).clamp(min=0)
    return row
