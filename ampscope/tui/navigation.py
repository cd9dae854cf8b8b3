"""Every screen from the command palette (ctrl+p), and the ways the app opens each one.

A mixin of the app: the palette's commands and the ``show_*`` methods they call, apart from
the screen stack's rules and the run manager's listener in ``ampscope.tui.app``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from textual.app import App, SystemCommand
from textual.screen import Screen

from ampscope.tui.messages import PlanRequested
from ampscope.tui.screens.installed import LIVE_RUN_SCREEN
from ampscope.tui.screens.presets import PresetsScreen

if TYPE_CHECKING:
    from ampscope.core.records import RunRecord

# Each screen's module is loaded when it is first shown: the first screen does not wait for
# the others (benchmarks/first_paint.py).


class Navigation(App):
    runs_dir: Path
    read_only: bool
    plan_program: Sequence[str] | None = None
    """How the plan screen runs ``ampscope plan`` (None: this Python's ``-m ampscope plan``; a
    test's app gives a stand-in script)."""

    def tell(self, message: str, *, error: bool = False, title: str = "") -> None:
        raise NotImplementedError

    def action_help(self) -> None:
        raise NotImplementedError

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The palette reaches every screen; 'Keys' opens the help of the screen below."""
        yield SystemCommand("Keys and help", "Every key of this screen (also ?)", self.action_help)
        if any(isinstance(s, PresetsScreen) for s in self.screen_stack):
            yield SystemCommand("Presets", "Pick, edit and run a preset", self.show_presets)
        if self.is_screen_installed(LIVE_RUN_SCREEN):
            yield SystemCommand("Live run", "Back to the run last watched", self.show_live_run)
        yield SystemCommand("History", f"Runs in {self.runs_dir}", self.show_history)
        yield SystemCommand("Compare the last sweep", "Its runs side by side", self.show_sweep)
        yield SystemCommand("Number formats", "What each format stores", self.show_formats)
        yield SystemCommand("Memory plan", "Memory per precision regime", self.show_memory)
        yield SystemCommand(
            "Machine check",
            "What this machine measured per format (doctor --bench)",
            self.action_show_machine,
        )
        for command in super().get_system_commands(screen):
            if command.title not in ("Keys", "Quit"):
                yield command
        yield SystemCommand(
            "Quit", "Stop the run this dashboard started, then quit", self.action_quit
        )

    def show_presets(self) -> None:
        while len(self.screen_stack) > 1 and not isinstance(self.screen, PresetsScreen):
            self.pop_screen()

    def show_live_run(self) -> None:
        if self.is_screen_installed(LIVE_RUN_SCREEN) and self.screen is not self.get_screen(
            LIVE_RUN_SCREEN
        ):
            self.push_screen(LIVE_RUN_SCREEN)

    def show_history(self) -> None:
        from ampscope.tui.screens.history import HistoryScreen

        self.push_screen(HistoryScreen(self.runs_dir))

    def show_sweep(self) -> None:
        """The last sweep's runs side by side, its records read off the UI thread."""
        from ampscope.tui.screens.history import latest_sweep_runs, off_ui_thread

        off_ui_thread(self, lambda: latest_sweep_runs(self.runs_dir), self._show_sweep)

    def _show_sweep(self, found: tuple[list[RunRecord], bool] | None) -> None:
        if found is None or not found[0]:
            self.tell("No sweep recorded yet: mark presets with m on the Presets screen, then w.")
            return
        from ampscope.tui.screens.compare import CompareScreen

        runs, repeated = found
        self.push_screen(CompareScreen(runs, repeated=repeated))

    def show_formats(self) -> None:
        from ampscope.tui.screens.formats import FormatsScreen

        self.push_screen(FormatsScreen())

    def show_memory(self) -> None:
        from ampscope.tui.screens.memory import MemoryScreen

        self.push_screen(MemoryScreen(None))

    def on_plan_requested(self, message: PlanRequested) -> None:
        """``l`` on the Presets or Numerics screen: the layer plan of the user's model."""
        if self.read_only:
            self.tell("A read-only dashboard starts no plan: run 'ampscope plan' in a terminal.")
            return
        from ampscope.tui.model.layer_plan import as_target
        from ampscope.tui.model.plan_process import PLAN_PROGRAM, PlanRequest
        from ampscope.tui.screens.plan import PlanScreen

        request = PlanRequest(as_target(message.target), message.model)
        self.push_screen(PlanScreen(request, self.plan_program or PLAN_PROGRAM))

    def action_show_machine(self) -> None:
        """``c`` on the presets screen, and the palette: what doctor --bench kept."""
        from ampscope.tui.screens.machine import MachineScreen

        self.push_screen(MachineScreen())
