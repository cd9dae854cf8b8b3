"""The Profile screen: where a run's step goes, as a bar chart of classes, from its latest
``profile`` event. ``p`` on the Run view asks the running engine for one (a request file in the
run folder, taken between steps) and opens this screen, which waits for the answer.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Static

from ampscope.core import events as ev
from ampscope.core import profiles
from ampscope.core.text import visible
from ampscope.core.units import fmt_ms
from ampscope.tui.model.run_state import RunState
from ampscope.tui.model.source import RunSource
from ampscope.tui.screens import SCREENS_CSS
from ampscope.tui.widgets.key_bar import KeyBar

DEFAULT_STEPS = profiles.DEFAULT_STEPS
ASK = "ask"
SHOW = "show"
NO = "no"


def profile_offer(state: RunState, read_only: bool = False) -> tuple[str, str]:
    """What ``p`` can do for this run: ask its engine, show the profile its record holds, or
    nothing, with the reason. A ``read_only`` view (``ampscope serve``'s) never asks: a request
    would make the live run profile itself, and read-only means no effect on a run."""
    hello = state.hello
    if hello is not None and hello.source == "watch":
        return NO, (
            "a watched loop cannot be profiled from here: ampscope does not run its steps "
            "(run the model with 'ampscope profile --model', or torch.profiler in the loop)"
        )
    if state.read_only or state.finished:
        if state.profile is not None:
            return SHOW, ""
        return NO, "the run has ended; a profile is taken of a running engine (restart it, then p)"
    if read_only:
        if state.profile is not None:
            return SHOW, ""
        return NO, "this view is read-only: it shows a profile the run took, and asks for none"
    if hello is None:
        return NO, "the run has not started training yet"
    if not hello.run_dir:
        return NO, "this run keeps no record, and the request goes through its folder"
    return ASK, ""


def read_only_view(app: object) -> bool:
    """Whether ``app`` is a served viewer, which has no effect on any run."""
    return bool(getattr(app, "read_only", False))


def ask_engine(state: RunState, steps: int = profiles.DEFAULT_STEPS) -> str | None:
    """Leave the request for the run's engine; the reason when it cannot be left."""
    assert state.hello is not None
    folder = state.hello.folder()
    assert folder is not None
    try:
        profiles.ask_to_profile(folder, steps)
    except OSError as exc:
        return f"the request cannot be written in {state.hello.run_dir}: {exc.strerror or exc}"
    return None


class ProfileScreen(Screen):
    CSS_PATH = SCREENS_CSS
    HELP_TITLE = "Profile"
    HELP = (
        "Where the step goes, from torch.profiler over a few steps of the running engine: each "
        "class's share of the measured step time (kernel time on a GPU, idle where no kernel "
        "ran; CPU op time on a CPU), the ops with the most self time, and what would help "
        "most. The Chrome trace is kept in the run folder (it opens in Perfetto)."
    )
    BINDINGS = [
        Binding("p", "again", "Profile again", id="profile.again"),
        Binding("escape", "back", "Back", id="profile.back"),
        Binding("q", "app.quit", "Quit", id="quit"),
    ]

    def __init__(
        self, source: RunSource, waiting_for: int | None = None, before: object = None
    ) -> None:
        super().__init__()
        self.source = source
        self.waiting_for = waiting_for  # steps asked for, until a new profile arrives
        self.before = before  # the profile shown before the request (not the answer)

    def compose(self) -> ComposeResult:
        yield Static("", id="profile-body", markup=False)
        yield KeyBar()

    def on_mount(self) -> None:
        self.refresh_view()
        self.set_interval(0.5, self.refresh_view, name="profile-redraw")

    @property
    def profile(self) -> ev.ProfileEvent | None:
        found = self.source.state.profile
        return None if found is self.before and self.waiting_for else found

    def refresh_view(self) -> None:
        if not self.is_attached:
            return
        state, profile = self.source.state, self.profile
        if profile is not None and self.waiting_for:
            self.waiting_for = None
            self.refresh_bindings()
        body = self.query_one("#profile-body", Static)
        width = max(40, self.size.width - 2)
        if profile is None:
            body.update(Text(waiting_text(state, self.waiting_for)))
        else:
            body.update(chart(profile, state.label, width, self.size.height - 2))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "again":
            if profile_offer(self.source.state, read_only_view(self.app))[0] != ASK:
                return False
            return None if self.waiting_for else True
        return True

    def key_note(self, action: str) -> str:
        return "a profile is on its way" if action == "again" else ""

    def action_again(self) -> None:
        problem = ask_engine(self.source.state)
        if problem:
            self.app.notify(visible(problem), severity="error", markup=False)
            return
        self.before, self.waiting_for = self.source.state.profile, profiles.DEFAULT_STEPS
        self.refresh_view()
        self.refresh_bindings()

    def action_back(self) -> None:
        self.app.pop_screen()


def waiting_text(state: RunState, steps: int | None) -> str:
    name = visible(state.label or "the run")
    if state.finished:
        return f"{name} ended before its profile came back."
    return (
        f"Profiling the next {steps or profiles.DEFAULT_STEPS} steps of {name}\u2026\n\n"
        "The engine takes the request between two steps (within half a second); the "
        "profiled steps run slower than the others, by the profiler's own cost."
    )


def chart(profile: ev.ProfileEvent, title: str, width: int, height: int) -> Text:
    """The split as bars, the top ops as fit, the advice and the trace: within ``height``."""
    whose = "kernel time" if profile.timing == "device" else "CPU op time"
    last = profile.step + profile.steps - 1
    out = Text()
    out.append(f"{visible(title)}: steps {profile.step}-{last}, ", style="bold")
    out.append(f"{fmt_ms(profile.step_ms)}/step ({whose})\n\n", style="bold")
    rows = profiles.split_rows(profile)
    name_w = 26
    bar_w = max(10, width - name_w - 10)
    for name, share, cls in rows:
        name = visible(name)  # a class and its formats as a record names them
        out.append(f"{name[:name_w]:<{name_w}} {share:>4.0%} ")
        out.append("\u2588" * max(1, round(share * bar_w)), style=_colour(cls))
        out.append("\n")
    advice = profiles.advice(profile)
    advice_lines = len(advice) // max(width, 1) + 1
    trace = f"trace: {visible(profile.trace)}" if profile.trace else visible(profile.note or "")
    room = height - 2 - len(rows) - 1 - advice_lines - 2 - (1 if trace else 0)
    if room >= 2:
        out.append("\ntop ops by self time\n", style="bold")
        for op in profile.top_ops[: room - 1]:
            name, room_w = visible(op.name), max(10, width - 24)
            name = name if len(name) <= room_w else name[: room_w - 1] + "\u2026"
            out.append(f"{op.share:>6.1%} {op.calls:>5}x  {name}\n")
    out.append("\n" + advice + "\n", style="bold")
    if trace:
        out.append(trace, style="dim")
    return out


_COLOURS = {
    "matmul": "green",
    "conv": "green",
    "attention": "cyan",
    "elementwise": "yellow",
    "norm_act": "yellow",
    "optimizer": "magenta",
    "loss_scaling": "magenta",
    "data": "red",
    "communication": "blue",
    "memcpy": "blue",
    "idle": "red",
}


def _colour(cls: str) -> str:
    return _COLOURS.get(cls, "white")
