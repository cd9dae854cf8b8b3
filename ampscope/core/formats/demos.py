"""Ready-made demonstrations a lecturer can step through."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ampscope.core.formats.catalog import FORMATS, convert, shortest_repr
from ampscope.core.presets.suggest import did_you_mean

# ---------------------------------------------------------------------------------------------
# Demonstrations a lecturer can read aloud


@dataclass
class DemoResult:
    name: str
    title: str
    lines: list[str]
    data: dict[str, Any]


def _fmt(x: float, key: str = "fp64") -> str:
    return shortest_repr(x, key)


def demo_fp16_overflow() -> DemoResult:
    inputs = [65504.0, 65519.0, 65520.0, 65536.0, 100000.0]
    fp16 = {v: convert(v, "fp16") for v in inputs}
    bf16 = {v: convert(v, "bf16") for v in inputs}
    lines = [
        "fp16 has 5 exponent bits: its largest finite value is (2 - 2^-10) * 2^15 = 65504.",
        "Between 32768 and 65536, fp16 values are 32 apart, so 65504 is followed by 65536 - "
        "which fp16 cannot hold.",
    ]
    for v in inputs:
        lines.append(
            f"  {v:>8g} -> fp16 {_fmt(fp16[v], 'fp16'):>6}    bf16 {_fmt(bf16[v], 'bf16')}"
        )
    lines += [
        "65519 still rounds down to 65504. 65520 sits exactly halfway to 65536; ties go to the",
        "even neighbour, 65536, which is past the top: it becomes inf. So does anything larger.",
        "bf16 keeps fp32's 8 exponent bits: it stores these easily, only less precisely.",
        "In training this is an activation or a loss that grows too big: one inf, then NaN everywhere.",
    ]
    data = {
        "max": FORMATS["fp16"].max,
        "fp16": {repr(k): v for k, v in fp16.items()},
        "bf16": {repr(k): v for k, v in bf16.items()},
        "first_inf": 65520.0,
    }
    return DemoResult("fp16-overflow", "fp16 overflows at 65520", lines, data)


def demo_fp16_underflow() -> DemoResult:
    grads = [1e-8, 1e-7, 1e-6]
    keys = ("fp32", "bf16", "fp16")
    table = {g: {k: convert(g, k) for k in keys} for g in grads}
    f16 = FORMATS["fp16"]
    lines = [
        f"fp16's smallest subnormal is 2^-24 = {f16.smallest_subnormal:.3g}; "
        f"its smallest normal is 2^-14 = {f16.smallest_normal:.3g}.",
        "A gradient of 1e-8 is below half of the smallest subnormal, so fp16 stores 0:",
        "the update it carried is lost, silently.",
    ]
    for g in grads:
        row = table[g]
        rel16 = abs(row["fp16"] - g) / g
        lines.append(
            f"  grad {g:g}:  fp32 {row['fp32']:.4g}   bf16 {row['bf16']:.4g}   "
            f"fp16 {row['fp16']:.4g}  (fp16 error {rel16:.0%})"
        )
    lines += [
        "bf16 has fp32's exponent range (down to about 9e-41) and keeps all three, 3 digits deep.",
        "1e-7 survives in fp16 only as a subnormal, 19% off. This is why fp16 training needs",
        "a loss scale (see --demo loss-scale) and bf16 training does not.",
    ]
    data = {
        "grad": 1e-8,
        "fp16": table[1e-8]["fp16"],
        "bf16": table[1e-8]["bf16"],
        "fp32": table[1e-8]["fp32"],
        "table": {repr(g): row for g, row in table.items()},
    }
    return DemoResult(
        "fp16-underflow", "A 1e-8 gradient vanishes in fp16, not in bf16", lines, data
    )


def demo_bf16_precision() -> DemoResult:
    a = convert(1 + 2**-8, "bf16")
    b = convert(1 + 2**-7, "bf16")
    c = convert(1 + 2**-8, "fp16")
    w = convert(convert(1.0, "bf16") + convert(1e-3, "bf16"), "bf16")
    lines = [
        "bf16 keeps 7 mantissa bits: next to 1.0 the values are 2^-7 = 0.0078125 apart.",
        f"  1 + 2**-8 in bf16 = {_fmt(a, 'bf16')}   (exactly halfway; ties go to the even neighbour, 1)",
        f"  1 + 2**-7 in bf16 = {_fmt(b, 'bf16')}",
        f"  1 + 2**-8 in fp16 = {_fmt(c, 'fp16')}   (fp16 has 10 mantissa bits)",
        f"  a weight of 1.0 plus an update of 0.001, in bf16: {_fmt(w, 'bf16')}",
        "Small updates to large weights vanish. That is why pure-bf16 training keeps",
        "fp32 master weights (AMP) or uses stochastic rounding / Kahan summation.",
    ]
    data = {"1+2**-8": a, "1+2**-7": b, "fp16 1+2**-8": c, "1+0.001": w, "eps": FORMATS["bf16"].eps}
    return DemoResult("bf16-precision", "1 + 2**-8 == 1 in bf16", lines, data)


SUM_FORMATS = ("fp64", "fp32", "fp16", "bf16", "fp8-e4m3fn", "fp8-e5m2")


def demo_sum_tenth(count: int = 10_000) -> DemoResult:
    """Add 0.1 ``count`` times in each float format, rounding after every add (numpy scalars)."""
    exact = count / 10
    results: dict[str, float] = {}
    keys = [k for k in SUM_FORMATS if k in FORMATS]
    if "fp4-e2m1" in FORMATS:
        keys.append("fp4-e2m1")
    for key in keys:
        dt = FORMATS[key].dtype
        step = dt(0.1)
        total = dt(0)
        for _ in range(count):
            total = total + step  # numpy rounds each sum back to the format
        results[key] = float(total)
    errors = {k: abs(v - exact) for k, v in results.items()}
    order = sorted(results, key=lambda k: errors[k])
    lines = [
        f"Adding 0.1 to a running total {count} times; the exact answer is {exact:g}.",
        "Each format rounds after every add, as a sequential loop (or a naive reduction) does.",
    ]
    lines.append(f"  {'format':<11} {'total':<13} {'error':<11} 0.1 is stored as")
    for key in keys:  # a row fits 80 columns: a lecture's terminal
        lines.append(
            f"  {FORMATS[key].label:<11} {results[key]:<13.10g} {errors[key]:<11.4g} "
            f"{_fmt(convert(0.1, key), key)}"
        )
    lines += [
        "Once the total is big enough that 0.1 is less than half the gap between neighbours,",
        "adding it changes nothing: fp16 stops at 256, bf16 at 32. This is why accumulators",
        "(matmul sums, loss sums, optimizer state) are kept in fp32.",
    ]
    data = {"exact": exact, "count": count, "results": results, "errors": errors, "order": order}
    return DemoResult("sum-0.1", f"Summing 0.1 {count} times", lines, data)


def demo_loss_scale(scale: float = 2.0**16) -> DemoResult:
    grads = [1e-8, 1e-7, 1e-6, 1e-4]
    rows = []
    for g in grads:
        plain = convert(g, "fp16")
        scaled = convert(g * scale, "fp16")
        back = convert(scaled / scale, "fp32")  # unscale_ works on fp32 master gradients
        rows.append(
            {
                "grad": g,
                "fp16": plain,
                "scaled_fp16": scaled,
                "unscaled_fp32": back,
                "rel_error_plain": abs(plain - g) / g,
                "rel_error_scaled": abs(back - g) / g,
            }
        )
    big = convert(2.0 * scale, "fp16")
    lines = [
        f"Multiply the loss by S = 2^{int(math.log2(scale))} = {scale:g}: every gradient is S times larger,",
        "so it lands in fp16's normal range. Divide by S again in fp32 before the optimizer step.",
        "  gradient  fp16 as is  fp16 of grad*S  unscaled in fp32  error: as is -> scaled",
    ]
    for r in rows:  # a row fits 80 columns: a lecture's terminal
        lines.append(
            f"  {r['grad']:<9g} {r['fp16']:<11.4g} {r['scaled_fp16']:<15.4g} "
            f"{r['unscaled_fp32']:<17.4g} {r['rel_error_plain']:.0%} -> {r['rel_error_scaled']:.2%}"
        )
    lines += [
        f"The price: a gradient of 2 scaled by S is {2 * scale:g}, past 65504: fp16 makes it {big:g}.",
        "GradScaler then skips that step and halves S; after 2000 good steps it doubles S again.",
    ]
    data = {"scale": scale, "rows": rows, "overflow_example": {"grad": 2.0, "scaled_fp16": big}}
    return DemoResult("loss-scale", "Loss scaling rescues small fp16 gradients", lines, data)


DEMOS: dict[str, tuple[str, Callable[[], DemoResult]]] = {
    "fp16-overflow": ("65504 is fp16's max; 65520 rounds to inf", demo_fp16_overflow),
    "fp16-underflow": ("a 1e-8 gradient vanishes in fp16 but not in bf16", demo_fp16_underflow),
    "bf16-precision": ("1 + 2**-8 == 1 in bf16; small updates vanish", demo_bf16_precision),
    "sum-0.1": ("add 0.1 ten thousand times in each float format", demo_sum_tenth),
    "loss-scale": ("a 2**16 loss scale brings 1e-8 back into fp16's range", demo_loss_scale),
}


def run_demo(name: str) -> DemoResult:
    try:
        return DEMOS[name][1]()
    except KeyError:
        hint = did_you_mean(name, DEMOS)
        raise KeyError(f"unknown demo '{name}'.{hint} Demos: {', '.join(DEMOS)}.") from None
