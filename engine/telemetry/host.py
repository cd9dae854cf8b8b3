"""Host figures from psutil, never raising."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ampscope.engine.telemetry.nvml import W_HOST

# --------------------------------------------------------------------------- host reader


class HostReader:
    """CPU and memory figures from psutil, never raising; each failing field reported once."""

    def __init__(self, psutil_module: Any = None, pid: int | None = None) -> None:
        self._reasons: list[tuple[str, str]] = []
        self.failed: dict[str, str] = {}
        self.psutil = psutil_module
        self.proc: Any = None
        if self.psutil is None:
            try:
                import psutil
            except Exception:  # noqa: BLE001
                self._reasons.append(
                    (
                        W_HOST,
                        "psutil is not installed (pip install psutil); "
                        "CPU and memory figures stay blank.",
                    )
                )
                return
            self.psutil = psutil
        self.proc = self._guard("proc", lambda: self.psutil.Process(pid or os.getpid()))
        self.prime()

    def prime(self) -> None:
        """Start the CPU-percent intervals; the first figures then cover start-to-first-sample."""
        if self.psutil is None:
            return
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
        if self.psutil is None:
            return out
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
