"""Pick a preset, edit its main fields (validated as you type), run it or save it."""

from __future__ import annotations

from pathlib import Path

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Input, OptionList, Select, Static

from ampscope.core import presets
from ampscope.core.text import visible
from ampscope.tui.messages import (
    EditedRunRequested,
    PlanRequested,
    RunRequested,
    SweepRequested,
)
from ampscope.tui.model.preset_draft import REPEAT_CHOICES, PresetDraft, model_spec
from ampscope.tui.screens.installed import LIVE_RUN_SCREEN
from ampscope.tui.screens.preset_form import PresetForm, PresetList
from ampscope.tui.widgets.key_bar import KeyBar

TOOL_BINDINGS = [
    # the tools a preset is chosen with: formats, memory, what this machine delivers
    Binding("f", "formats", "Formats", id="presets.formats"),
    Binding("p", "memory", "Memory plan", id="presets.memory"),
    Binding("c", "app.show_machine", "Machine check", id="presets.machine"),
    Binding("l", "plan", "Layer plan", id="presets.plan"),
]

MARK_HELP = "Mark for sweep (again: unmark), then move down to the next preset"
"""The help's words for m: the move down is what surprises (m m m marks three in a row)."""


class PresetsScreen(Screen):
    """The first screen: the list, the form (a ``PresetDraft`` holds what it means) and the
    sweep queue. Runs are asked of the app (messages); ``read_only`` offers none."""

    HELP_TITLE = "Presets"
    HELP = (
        "A preset is a training run: a precision (fp32, tf32, bf16, fp16, AMP with or without "
        "loss scaling), a torch.compile mode and a workload. Pick one on the left; its fields on "
        "the right can be edited (a value that cannot run is refused with the reason). Run it "
        "and the Run view opens. Up and down move in the list, tab and shift+tab between the "
        "list and the fields, esc leaves a field."
    )
    BINDINGS = [
        Binding("r", "run", "Run", id="presets.run"),
        # shown only while a field has the letters (the bar shows one key per action)
        Binding("enter", "run", "Run", id="presets.run-enter"),
        Binding("escape", "leave_field", "Done editing", id="form.leave"),
        Binding("s", "save", "Save as", id="presets.save"),
        Binding("m", "mark", "Mark for sweep", id="presets.mark", tooltip=MARK_HELP),
        Binding("w", "sweep", "Run sweep", id="presets.sweep"),
        # one shows (check_action): it names the current count, pressing it moves to the next
        *(
            Binding("x", f"repeats({n})", f"Repeats: {n}", id="presets.repeats")
            for n in REPEAT_CHOICES
        ),
        Binding("h", "history", "History", id="presets.history"),
        *TOOL_BINDINGS,
        Binding("v", "view_run", "Live run", id="presets.live-run"),
        # one of the two shows (check_action): the toggle names the current state
        Binding("d", "toggle_detach(True)", "Detached: off", id="presets.detach"),
        Binding("d", "toggle_detach(False)", "Detached: ON", id="presets.detach"),
        Binding("q", "app.quit", "Quit", id="quit"),
    ]

    def __init__(self, runs_dir: Path, read_only: bool = False) -> None:
        super().__init__()
        self.runs_dir = runs_dir
        self.read_only = read_only
        self.detach = False  # runs started from here outlive the dashboard
        self.presets: list[presets.PresetInfo] = []
        self.draft = PresetDraft()
        self.shown_once = False

    @property
    def current(self) -> presets.PresetInfo | None:
        return self.draft.info

    @property
    def form(self) -> PresetForm:
        return self.query_one("#preset-form", PresetForm)

    def compose(self) -> ComposeResult:
        with Horizontal(id="presets-main"):
            yield PresetList(id="preset-list")
            yield PresetForm(id="preset-form")
        yield KeyBar()

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        """The focused field's row lights its label too (the name says which field it is)."""
        for row in self.query(".form-row"):
            row.set_class(event.widget in row.children, "-focused")
        self.refresh_bindings()  # esc 'Done editing' comes and goes with a field's focus

    def on_mount(self) -> None:
        self.reload()
        self.query_one("#preset-list", OptionList).focus()

    def on_screen_resume(self, event: events.ScreenResume) -> None:
        """Back from another screen, the list has the keys (never a field: 'h' is no text).

        Shown for the first time, its widgets took their styles as they mounted, a moment ago:
        Textual's own handler, which runs after this one, need not work them all out again
        before the first screen is drawn (benchmarks/first_paint.py)."""
        if not self.shown_once:
            event.refresh_styles = False
            self.shown_once = True
        self.query_one("#preset-list", OptionList).focus()
        self.refresh_bindings()

    @property
    def editing(self) -> bool:
        focused = self.focused
        return focused is not None and focused.has_class("form-input")

    def action_leave_field(self) -> None:
        self.query_one("#preset-list", OptionList).focus()

    def reload(self, select: str | None = None) -> None:
        self.presets = presets.list_presets()
        self.query_one(PresetList).show(self.presets, self.draft.marked)
        if not self.presets:
            self.query_one("#preset-error", Static).update(
                f"No presets found. Add .toml files to {visible(presets.user_presets_dir())}."
            )
            return
        names = [p.name for p in self.presets]
        index = names.index(select) if select in names else 0
        self.query_one(PresetList).highlighted = index
        self.load(self.presets[index])

    @on(OptionList.OptionHighlighted, "#preset-list")
    def _highlighted(self, event: OptionList.OptionHighlighted) -> None:
        self.show_preset(event.option_id)

    def show_preset(self, name: str | None) -> None:
        info = next((p for p in self.presets if p.name == name), None)
        if info is not None and info is not self.current:
            self.load(info)

    def follow_highlight(self) -> None:
        """The form catches up with the list before a key acts on the preset: keys typed in
        one burst (down, down, r) reach their actions before the list's highlight messages,
        and r ran the preset highlighted before them."""
        name = self.highlighted_name()
        if name is not None:
            self.show_preset(name)

    def highlighted_name(self) -> str | None:
        """The preset the list highlights, which the form may not show yet (a key burst)."""
        options = self.query_one("#preset-list", OptionList)
        if options.highlighted is None:
            return None
        return options.get_option_at_index(options.highlighted).id

    @on(OptionList.OptionSelected, "#preset-list")
    async def _selected(self, event: OptionList.OptionSelected) -> None:
        await self.action_run()

    def load(self, info: presets.PresetInfo) -> None:
        preset = self.draft.load(info)
        if preset is not None:
            spec = model_spec(getattr(self.app, "extra_overrides", []))  # --model's
            self.form.show(info, preset, spec, self.draft.value)
        else:
            self.form.show_unreadable(info)
        self.show_problem()
        self.refresh_bindings()  # l (layer plan) follows the preset's own model

    @on(Input.Changed)
    @on(Select.Changed)
    def _changed(self, event: Input.Changed | Select.Changed) -> None:
        if not self.draft.loaded or event.control.id in (None, "save-name"):
            return
        self.revalidate()

    @on(Input.Submitted, ".form-input")
    async def _submitted(self, event: Input.Submitted) -> None:
        await self.action_run()

    def revalidate(self) -> bool:
        ok = self.draft.update(self.form.values())
        self.show_problem()
        return ok

    def show_problem(self) -> None:
        """Why the form cannot run (its field drawn invalid), and the line under it."""
        self.form.show_state(self.draft.problem, self.draft.problem_key, self.draft.status())

    def show_status(self) -> None:
        self.form.show_state(self.draft.problem, self.draft.problem_key, self.draft.status())

    def action_formats(self) -> None:
        from ampscope.tui.screens.formats import (
            FormatsScreen,  # numpy and ml_dtypes: only when asked
        )

        self.app.push_screen(FormatsScreen())

    def action_memory(self) -> None:
        from ampscope.tui.screens.memory import MemoryScreen

        self.follow_highlight()
        self.app.push_screen(MemoryScreen(self.current.name if self.current else None))

    def plan_model(self) -> str | None:
        """The user's model a layer plan is for: the dashboard's --model, else the preset's."""
        spec = model_spec(getattr(self.app, "extra_overrides", []))
        if spec is None and self.draft.preset is not None:
            spec = self.draft.preset.workload.model
        return spec

    def action_plan(self) -> None:
        """l: which layers to train in fp8 (fp16 from an fp16 preset), from ``ampscope plan``."""
        self.follow_highlight()
        model = self.plan_model()
        if self.read_only:
            return
        if model is None:  # the list had moved on to a preset without a model
            self.app.notify(self.key_note("plan"), title="Layer plan", markup=False)
            return
        precision = self.draft.preset.precision if self.draft.preset is not None else ""
        self.post_message(PlanRequested("fp16" if "fp16" in precision else "fp8", model))

    def runnable(self, title: str) -> bool:
        """The form, validated again; when it cannot run, say why under ``title``."""
        if self.draft.loaded and self.revalidate() and self.draft.preset is not None:
            return True
        self.app.notify(
            visible(self.draft.problem or "This preset cannot run."),
            severity="error",
            title=title,
            markup=False,
        )
        return False

    async def action_run(self) -> None:
        self.follow_highlight()
        if self.current is None:
            return
        if not self.runnable("Not valid"):
            return
        if self.draft.is_edited and self.draft.preset is not None:
            self.post_message(EditedRunRequested(self.draft.preset, detach=self.detach))
        elif self.file_gone(self.current):
            return
        else:
            self.post_message(RunRequested(self.current.name, detach=self.detach))

    def file_gone(self, info: presets.PresetInfo) -> bool:
        """A user preset whose file was removed since the list was read: said, and nothing
        runs (the engine would fail on an unknown name, as a failed run). The form still
        shows it, for ``s`` to save again."""
        if info.source != "user" or info.path.is_file():
            return False
        self.app.notify(
            visible(
                f"{info.name}: its file {info.path} was removed since the list was read, so "
                "nothing was run. s saves the form shown as a preset again."
            ),
            severity="error",
            title="Not run",
            markup=False,
        )
        return True

    def action_save(self) -> None:
        self.follow_highlight()
        if not self.draft.loaded or not self.revalidate() or self.draft.preset is None:
            self.app.notify(
                visible(self.draft.problem or "Nothing to save."), severity="error", markup=False
            )
            return
        from ampscope.tui.screens.save import ask_and_save

        ask_and_save(
            self.app,
            self.draft.preset,
            self.draft.save_suggestion,
            self.read_only,
            lambda name: self.reload(select=name),
        )

    def action_history(self) -> None:
        from ampscope.tui.screens.history import HistoryScreen

        self.app.push_screen(HistoryScreen(self.runs_dir))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "view_run":
            return self.app.is_screen_installed(LIVE_RUN_SCREEN)
        if action == "toggle_detach":
            return not self.read_only and parameters[0] != self.detach
        if action == "leave_field":
            return self.editing
        if action == "sweep":
            return True if len(self.draft.marked) >= 2 else None
        if action == "repeats":  # the one naming the current count, once presets are marked
            return bool(self.draft.marked) and int(str(parameters[0])) == self.draft.repeats
        if action == "plan":
            if self.read_only:
                return None
            # keys in one burst (down l): the list is ahead of the form, so l asks again
            # once the form has caught up (action_plan), not of the preset left behind
            return True if self.plan_model() is not None or self.behind_highlight() else None
        return True

    def behind_highlight(self) -> bool:
        """Whether the form still shows another preset than the list highlights."""
        name = self.highlighted_name()
        return name is not None and self.current is not None and name != self.current.name

    def key_note(self, action: str) -> str:
        return {
            "view_run": "no run has been watched yet",
            "leave_field": "no field has the focus",
            "sweep": "mark two or more presets with m first",
            "repeats": "mark presets with m first",
            "toggle_detach": "this dashboard is read-only",
            "plan": "this dashboard is read-only"
            if self.read_only
            else "it plans your own model: start with --model FILE:FN",
        }.get(action, "")

    def action_toggle_detach(self, detach: bool) -> None:
        """Runs started while on outlive the dashboard ('ampscope attach' finds them)."""
        self.detach = detach
        self.refresh_bindings()

    def action_view_run(self) -> None:
        if self.app.is_screen_installed(LIVE_RUN_SCREEN):
            self.app.push_screen(LIVE_RUN_SCREEN)

    def action_mark(self) -> None:
        """Add the highlighted preset, as the form shows it, to the sweep queue, or take it out."""
        self.follow_highlight()
        info = self.current
        if info is None:
            return
        marking_edits = info.name not in self.draft.marked and self.draft.is_edited
        if marking_edits and not self.runnable("Not marked"):
            return
        self.draft.toggle_mark()
        options = self.query_one("#preset-list", OptionList)
        index = options.highlighted
        self.reload(select=info.name)
        if index is not None and index + 1 < options.option_count:
            options.highlighted = index + 1
        self.show_status()
        self.refresh_bindings()

    def action_repeats(self, shown: int) -> None:
        """x: the next number of interleaved rounds the marked presets run."""
        self.draft.next_repeats()
        self.show_status()
        self.refresh_bindings()

    async def action_sweep(self) -> None:
        queue = self.draft.take_sweep()
        if queue is None:
            return
        self.reload(select=self.current.name if self.current else None)
        self.post_message(SweepRequested(queue, self.draft.repeats, self.sweep_declined))

    def sweep_declined(self) -> None:
        self.draft.untake_sweep()
        self.reload(select=self.current.name if self.current else None)
        self.refresh_bindings()
