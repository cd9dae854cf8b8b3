"""A CPU process's memory peak: the kernel's high-water mark, not a reading between steps.

RSS read after a step misses what a step allocates and frees inside itself (activations,
autograd's buffers), about a fifth of the true peak for the CPU GPT. Linux keeps the peak
itself (``VmHWM`` in ``/proc/self/status``), and writing ``5`` to ``/proc/self/clear_refs``
sets it back to the current RSS, so that setup (imports, the FLOP count's meta copy) does
not count. Where either is missing (not Linux, a locked-down ``/proc``) ``HostPeak`` falls
back to the largest RSS it has read itself, and says so.
"""

from __future__ import annotations

from pathlib import Path

import psutil

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")
RESET_PEAK = "5"  # clear_refs: reset the peak RSS (VmHWM) to the current RSS


def read_status(status: Path = STATUS) -> tuple[int | None, int | None]:
    """``(VmRSS, VmHWM)`` in bytes from one read of the status file; None where the kernel
    does not report one."""
    try:
        text = status.read_text()
    except OSError:
        return None, None
    found: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields = rest.split()
            if fields and fields[0].isdigit():
                found[key] = int(fields[0]) * 1024  # the kernel reports kB
    return found.get("VmRSS"), found.get("VmHWM")


def reset_high_water_mark(clear_refs: Path = CLEAR_REFS) -> bool:
    """Start the peak again from the current RSS; False where ``clear_refs`` is not writable."""
    try:
        clear_refs.write_text(RESET_PEAK)
    except OSError:
        return False
    return True


def current_rss() -> int:
    return int(psutil.Process().memory_info().rss)


class HostPeak:
    """This process's RSS and its peak since ``reset``: the kernel's high-water mark where it
    can be reset, else the largest RSS read here (a lower bound: ``exact`` is False)."""

    def __init__(self, status: Path = STATUS, clear_refs: Path = CLEAR_REFS) -> None:
        self.status, self.clear_refs = status, clear_refs
        self.exact = False
        self.largest = 0

    def reset(self) -> None:
        self.exact = (
            reset_high_water_mark(self.clear_refs) and read_status(self.status)[1] is not None
        )
        self.largest = current_rss()

    def read(self) -> tuple[int, int]:
        """``(rss, peak)`` now, in bytes."""
        rss, hwm = read_status(self.status) if self.exact else (None, None)
        rss = rss if rss is not None else current_rss()
        self.largest = max(self.largest, rss)
        return rss, max(hwm, self.largest) if hwm is not None else self.largest
