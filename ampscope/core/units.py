"""Human-readable numbers, shared by the console and the dashboard."""

from __future__ import annotations


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    if ms >= 10:
        return f"{ms:.1f} ms"
    return f"{ms:.2f} ms"


def fmt_num(x: float | None) -> str:
    if x is None:
        return "-"
    for limit, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= limit:
            return f"{x / limit:.3g}{suffix}"
    return f"{x:.3g}"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for limit, suffix in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if abs(n) >= limit:
            return f"{n / limit:.3g} {suffix}"
    return f"{int(n)} B"
