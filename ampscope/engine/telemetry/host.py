"""Host figures from psutil (15-45 us a call), never raising."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import psutil

from ampscope.engine.telemetry.codes import W_HOST


class HostReader:
    """CPU and memory figures, each failing field reported once. A process in a locked-down
    container may be refused some of them; the others go on.

    ``psutil_module`` replaces psutil (tests).
    """

    def __init__(self, psutil_module: Any = None, pid: int | None = None) -> None:
        self._reasons: list[tuple[str, str]] = []
        self.failed: dict[str, str] = {}
        self.psutil: Any = psutil_module or psutil
        self.proc: Any = self._guard("proc", lambda: self.psutil.Process(pid or os.getpid()))
        self.prime()

    def prime(self) -> None:
        """Start the CPU-percent intervals; the first figures then cover start-to-first-sample."""
        self._guard("cpu_util", lambda: self.psutil.cpu_percent(None))
        if self.proc is not None:
            self._guard("proc_cpu", lambda: self.proc.cpu_percent(None))

    def take_reasons(self) -> list[tuple[str, str]]:
        reasons, self._reasons = self._reasons, []
        return reasons

    def read(self) -> dict[str, Any]:
        out: dict[str, Any] = dict.fromkeys(
            ("cpu_util", "proc_cpu", "proc_rss", "sys_mem_used", "sys_mem_total")
        )
        out["cpu_util"] = self._guard("cpu_util", lambda: float(self.psutil.cpu_percent(None)))
        if self.proc is not None:
            out["proc_cpu"] = self._guard("proc_cpu", lambda: float(self.proc.cpu_percent(None)))
            out["proc_rss"] = self._guard("proc_rss", lambda: int(self.proc.memory_info().rss))
        vm = self._guard("sys_mem", self.psutil.virtual_memory)
        if vm is not None:
            out["sys_mem_total"] = int(vm.total)
            out["sys_mem_used"] = int(vm.total - vm.available)  # what is not available to a new job
        return out

    def _guard(self, field: str, fn: Callable[[], Any]) -> Any | None:
        if field in self.failed:
            return None
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - a telemetry getter must never take the run down
            why = f"{type(exc).__name__}: {exc}"
            self.failed[field] = why
            self._reasons.append(
                (W_HOST, f"Host figure {field} is unavailable ({why}); it stays blank.")
            )
            return None
