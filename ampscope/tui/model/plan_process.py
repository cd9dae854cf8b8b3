"""``ampscope plan`` as the dashboard's child: started, followed, stopped, read.

The dashboard never imports torch, so the plan (which measures a step of the user's model)
runs as ``ampscope plan TARGET --model SPEC --json``, a ``ChildProcess``
(``ampscope.tui.model.engine_process``): in a session of its own, registered so that the
dashboard's exit, its SIGTERM or SIGHUP ends it, and told by the kernel to stop if the
dashboard is killed outright. Its stderr lines are the progress; its stdout is the plan,
read when it ends (``ampscope.tui.model.layer_plan.read_outcome``).
"""

from __future__ import annotations

import shlex
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ampscope.tui.model.engine_process import ChildProcess
from ampscope.tui.model.layer_plan import STDOUT_LIMIT, Plan, PlanFault, Target, read_outcome

PLAN_PROGRAM: tuple[str, ...] = (sys.executable, "-m", "ampscope", "plan")
"""The command a plan runs, before its arguments; a test gives a stand-in script."""
PROGRESS_LINES = 200


@dataclass(frozen=True)
class PlanRequest:
    """Which plan: ``fp8`` or ``fp16`` for the model ``FILE:FN`` (or ``MODULE:FN``)."""

    target: Target
    model: str

    def arguments(self) -> list[str]:
        return [self.target, "--model", self.model, "--json"]

    def typed(self) -> str:
        """The command as a user would type it in a terminal."""
        return shlex.join(["ampscope", "plan", *self.arguments()])


class PlanRun:
    """One ``ampscope plan``: ``run()`` once (in a worker) gives its plan or why there is none.

    ``on_progress`` is called with each line of its stderr as it comes.
    """

    def __init__(
        self,
        request: PlanRequest,
        program: Sequence[str] = PLAN_PROGRAM,
        on_progress: Callable[[str], None] | None = None,
    ) -> None:
        self.request = request
        self.progress: deque[str] = deque(maxlen=PROGRESS_LINES)
        self.on_progress = on_progress
        self.started_at: float | None = None
        self.outcome: Plan | PlanFault | None = None
        self._stdout = bytearray()
        self.child = ChildProcess(
            [*program, *request.arguments()],
            on_output=self._output,
            on_stderr=self._said,
            dies_with_parent=True,
            what="ampscope plan",
        )

    def _output(self, line: bytes) -> None:
        if len(self._stdout) <= STDOUT_LIMIT:  # past it, read_plan says it is no plan
            self._stdout.extend(line)

    def _said(self, line: str) -> None:
        self.progress.append(line)
        if self.on_progress is not None:
            self.on_progress(line)

    @property
    def pid(self) -> int | None:
        return self.child.pid

    @property
    def running(self) -> bool:
        return self.outcome is None

    def elapsed_s(self) -> float:
        return 0.0 if self.started_at is None else time.monotonic() - self.started_at

    async def run(self) -> Plan | PlanFault:
        self.started_at = time.monotonic()
        code = await self.child.run()
        lines = list(self.progress)
        if code == 127 and not lines:  # it could not even start: the reason is in the tail
            lines = list(self.child.stderr_tail)
        self.outcome = read_outcome(code, bytes(self._stdout), lines)
        return self.outcome

    def kill_now(self) -> None:
        """SIGKILL its whole group: a plan left half-way keeps nothing worth a grace period."""
        self.child.kill_now()
