"""The memory planner: bytes per parameter and totals per precision regime, and which GPUs fit."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import DataTable, Input, Label, Select, Static

from ampscope.core import presets
from ampscope.core.memory import plan as memory_plan
from ampscope.core.text import visible
from ampscope.core.units import fmt_bytes
from ampscope.tui.model.preset_draft import model_spec
from ampscope.tui.screens.tool import ESC_BINDINGS, ToolScreen
from ampscope.tui.text import literal
from ampscope.tui.widgets.key_bar import KeyBar
from ampscope.tui.widgets.tables import (
    CELL_PADDING,
    TABLE_CHROME,
    column_widths,
    fill,
    off_edges,
)
from ampscope.tui.widgets.text_field import TextField

OPTIMIZERS = ("adamw", "sgd-momentum", "sgd")
HEADS = (
    "regime",
    "B/param",
    "TRAIN",
    "INFER",
    "smallest GPU",
    "weights",
    "grads",
    "master",
    "optim.",
    "casts",
    "activ.",
    "logits",
)
"""The totals and the GPU first: what a narrow terminal shows before it scrolls to the rest."""


class MemoryScreen(ToolScreen):
    FIELDS = (Input, Select)
    HELP_TITLE = "Memory plan"
    HELP = (
        "How much memory training and inference take per precision regime, for a parameter "
        "count (125M, 7B, 1.5e9) or the highlighted preset's model, and the smallest GPU that "
        "fits. Type a count and press enter; tab reaches the optimizer."
    )
    BINDINGS = [
        *ESC_BINDINGS,
        Binding("escape", "back", "Back", id="memory.back"),
        Binding("q", "app.quit", "Quit", id="quit"),
    ]

    def __init__(self, preset: str | None = None) -> None:
        super().__init__()
        self.preset = preset
        self.workload: memory_plan.PlannedModel | None = None
        self.model_spec = ""  # a --model dashboard's model
        self.model_params: int | None = None
        self.measured: memory_plan.MeasuredStep | None = None  # the model's activations, one step
        self.plan: list[memory_plan.RegimePlan] = []
        self.widths: list[int] = []  # the table's columns, padding included
        self.keys: list[str] = []

    def compose(self) -> ComposeResult:
        with Horizontal(id="memory-inputs"):
            yield Label("parameters", classes="form-label")
            yield TextField(value="125M", id="memory-params", compact=True)
            yield Label("optimizer", classes="form-label")
            yield Select(
                [(o, o) for o in OPTIMIZERS],
                value="adamw",
                allow_blank=False,
                id="memory-optimizer",
                compact=True,
            )
        yield Label("", id="memory-error", classes="error", markup=False)
        yield Static("", id="memory-title")
        yield DataTable(id="memory-table", zebra_stripes=True)
        yield Static("", id="memory-more")
        yield Static("", id="memory-notes")
        yield KeyBar()

    def on_mount(self) -> None:
        self.watch(self.query_one(DataTable), "scroll_x", lambda _x: self.show_more(), init=False)
        spec = model_spec(getattr(self.app, "extra_overrides", []))
        if spec:  # a --model dashboard plans the user's model, as `ampscope memory --model`
            self.model_spec = spec
            self.query_one("#memory-title", Static).update(literal(f"counting {spec} ..."))
            self.run_worker(partial(self.count_model, spec), thread=True, exit_on_error=False)
        elif self.preset:
            try:
                workload = memory_plan.workload_from_preset(self.preset, on_cuda=True)
            except (presets.ConfigError, memory_plan.PlanError, KeyError) as exc:
                self.query_one("#memory-error", Label).update(visible(str(exc)))
            else:
                self.workload = workload
                self.query_one("#memory-params", Input).value = str(workload.params)
        self.recompute()

    @on(Input.Submitted, "#memory-params")
    @on(Select.Changed, "#memory-optimizer")
    def recompute(self) -> None:
        text = self.query_one("#memory-params", Input).value
        try:
            params = memory_plan.parse_count(text)
        except memory_plan.PlanError as exc:
            self.query_one("#memory-error", Label).update(visible(str(exc)))
            return
        if self.model_params is not None and params == self.model_params:
            title = f"model {self.model_spec}: {params:,} parameters"
            self.show(params, None, title, self.measured)
        elif self.workload is not None and params == self.workload.params:
            self.show(params, self.workload.shape, f"preset {self.preset} at its GPU size")
        else:
            self.show(params, None, f"{text.strip()} parameters")

    def show(
        self,
        params: int,
        shape: memory_plan.Shape | None,
        title: str,
        measured: memory_plan.MeasuredStep | None = None,
    ) -> None:
        self.query_one("#memory-error", Label).update("")
        optimizer = str(self.query_one("#memory-optimizer", Select).value)
        plan = memory_plan.plan(params, optimizer=optimizer, shape=shape, measured=measured)
        self.plan = plan
        self.keys = [r.regime for r in plan]
        self.fit_table()
        self.query_one("#memory-title", Static).update(
            literal(
                f"{title}, {optimizer}"
                + (
                    f" · {memory_plan.ATTENTION}"
                    if shape
                    else f" · activations {measured.how}"
                    if measured
                    else " · no transformer shape: activations not counted"
                )
            )
        )
        train = (
            "TRAIN: weights, master and optimizer state, plus the larger of the model's two "
            "measured peaks: forward and backward (casts, activations, logits: everything else "
            "they hold, the gradients made by then in it) and the optimizer step (gradients and "
            "its temporaries)"
            if measured is not None and shape is None
            else "TRAIN adds weights to logits (gradients included, though freed before each "
            "forward: the measured peak is up to that much lower)"
        )
        self.query_one("#memory-notes", Static).update(
            f"B/param: bytes per parameter, training/inference. {train}. A GPU fits when the total is <= {memory_plan.FIT_FRACTION:.0%} of its "
            "memory. G, M: GiB, MiB. casts: AMP's transient 16-bit weight copies; logits: the loss's four "
            "logit-sized buffers at the start of backward; inference ignores the KV cache. "
            "Smallest GPU: the listed GPU with the least memory that fits training and can run "
            "the format (bf16 needs compute capability 8.0, fp8 8.9); +N: that many larger ones "
            "fit too."
        )

    def count_model(self, spec: str) -> None:
        """In a thread: the model's parameter count and one step's activations from
        ``ampscope memory --model`` (the dashboard never imports torch), then the plan."""
        command = [sys.executable, "-m", "ampscope", "memory", "--model", spec, "--json"]
        measured = None
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
            answer = json.loads(done.stdout) if done.returncode == 0 else {}
            params = int(answer["params"]) if answer else None
            if answer.get("measured"):
                measured = memory_plan.MeasuredStep(**answer["measured"])
        except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError):
            params, done = None, None
        error = done.stderr if done else ""
        self.app.call_from_thread(self.model_counted, params, error, measured)

    def model_counted(
        self, params: int | None, error: str, measured: memory_plan.MeasuredStep | None = None
    ) -> None:
        if params is None:
            said = error.strip() or f"the model {self.model_spec} could not be counted"
            self.query_one("#memory-error", Label).update(visible(said, 400))
            return
        self.model_params, self.measured = params, measured
        self.query_one("#memory-params", Input).value = str(params)
        self.recompute()

    def fit_table(self) -> None:
        """Every column: in full where they fit, compact (``19.1G``) where that makes them
        fit, else compact and scrolling sideways (the regime stays), and a line says which
        columns are off the edge."""
        table = self.query_one(DataTable)
        room = self.size.width - TABLE_CHROME
        rows = plan_rows(self.plan, compact=False)
        if table_width(rows) > room:
            rows = plan_rows(self.plan, compact=True)
        fill(table, HEADS, rows, 1 << 20, keys=self.keys)  # never drops a column
        table.fixed_columns = 1
        self.widths = [w + CELL_PADDING for w in column_widths(HEADS, rows)]
        self.call_after_refresh(self.show_more)

    def show_more(self) -> None:
        """Name the columns the table's edges cut, on either side of what shows now."""
        table = self.query_one(DataTable)
        room = table.scrollable_content_region.width
        left, right = off_edges(HEADS, self.widths, table.scroll_x, room)  # the regime stays
        sides = [f"← {', '.join(left)}" if left else "", f"→ {', '.join(right)}" if right else ""]
        more = self.query_one("#memory-more", Static)
        more.display = bool(left or right)
        more.update(f"more columns {'  '.join(s for s in sides if s)} (← → in the table)")

    def on_resize(self) -> None:
        if self.plan:
            self.fit_table()


def plan_rows(plan: list[memory_plan.RegimePlan], compact: bool) -> list[list[str]]:
    """The table's cells; ``compact``: sizes as ``519M``/``19.1G`` and the GPU as ``L4 24G``."""
    size = compact_bytes if compact else fmt_bytes
    return [
        [
            r.label,
            f"{r.train_bpp}/{r.inference_bpp}",
            size(r.train_total),
            size(r.inference_total),
            smallest_fit(r.fits_train, compact),
            *(
                size(n)
                for n in (
                    r.weights,
                    r.grads,
                    r.master,
                    r.optimizer_state,
                    r.cast_copies,
                    r.activations,
                    r.logits,
                )
            ),
        ]
        for r in plan
    ]


def table_width(rows: list[list[str]]) -> int:
    return sum(w + CELL_PADDING for w in column_widths(HEADS, rows))


def compact_bytes(n: float | None) -> str:
    """``fmt_bytes`` without the space and the ``iB``: 519 MiB is ``519M``, 0 B is ``0``."""
    text = fmt_bytes(n)
    number, _, unit = text.partition(" ")
    if not unit:
        return text  # "-" and the like
    return number if unit == "B" else number + unit[0]


def smallest_fit(names: list[str], compact: bool = False) -> str:
    """The GPU with the least memory among those that fit (every larger one fits too)."""
    sizes = dict(memory_plan.GPUS)
    if not names:
        return "none (shard it)" if compact else "none listed (shard it, or use a smaller batch)"
    first = min(names, key=lambda n: sizes.get(n, 0))
    more = f" +{len(names) - 1}" if len(names) > 1 else ""
    unit = "G" if compact else " GiB"
    return f"{first} {sizes.get(first, 0):g}{unit}{more}"
