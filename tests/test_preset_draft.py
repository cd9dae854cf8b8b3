"""The Presets screen's draft without a screen: load, edit, validate, mark, sweep."""

from __future__ import annotations

import pytest

from ampscope.core import presets
from ampscope.core.comparison import significance
from ampscope.tui.model.preset_draft import FIELDS, REPEAT_CHOICES, PresetDraft


def info(name: str) -> presets.PresetInfo:
    return next(p for p in presets.list_presets() if p.name == name)


def fields(draft: PresetDraft, **changed: str) -> dict[str, str | None]:
    """The form as loaded, with ``changed`` typed over it (dots as double underscores)."""
    out = {}
    for key, _label, _choices in FIELDS:
        value = draft.value(key)
        out[key] = None if value is None else str(value)
    out.update({k.replace("__", "."): v for k, v in changed.items()})
    return out


@pytest.mark.unit
def test_an_edit_that_validates_is_an_edited_preset_and_the_status_says_so() -> None:
    draft = PresetDraft()
    assert draft.load(info("fp32")) is not None and not draft.is_edited
    assert draft.update(fields(draft, steps="60"))
    assert draft.is_edited and draft.preset is not None and draft.preset.steps == 60
    assert draft.status() == "edited: runs as a temporary copy"
    assert draft.save_suggestion == "fp32-custom"  # a shipped preset's copy


@pytest.mark.unit
def test_a_value_that_cannot_run_names_its_field_and_keeps_the_last_valid_edits() -> None:
    draft = PresetDraft()
    draft.load(info("fp32"))
    assert draft.update(fields(draft, steps="60"))
    assert not draft.update(fields(draft, steps="-3"))
    assert draft.preset is None and draft.problem_key == "steps"
    assert draft.problem and "steps" in draft.problem
    assert draft.edited["steps"] == 60  # what a run would take stays the last valid form
    assert not draft.update(fields(draft, lr=""))
    assert draft.problem == "'lr' is empty." and draft.problem_key == "lr"
    assert not draft.update(fields(draft, batch_size="9" * 5000))
    assert draft.problem_key == "batch_size"
    assert draft.status() == ""  # a problem hides the status line


@pytest.mark.unit
def test_marked_presets_sweep_as_marked_with_their_edits_and_the_queue_empties() -> None:
    draft = PresetDraft()
    draft.load(info("fp32"))
    assert draft.toggle_mark()
    draft.load(info("amp-bf16"))
    draft.update(fields(draft, steps="40"))
    assert draft.toggle_mark()
    assert draft.status() == "edited: runs as a temporary copy"  # the form's own state first
    draft.load(info("fp16"))
    assert draft.status() == (
        "sweep queue: fp32, amp-bf16 (steps 40) · 3 runs each, interleaved  (w runs it, x repeats)"
    )
    draft.next_repeats()
    assert draft.repeats == 5
    draft.next_repeats()
    assert draft.repeats == 1
    queue = draft.take_sweep()
    assert queue is not None and queue[0] == "fp32"
    edited = queue[1]
    assert isinstance(edited, presets.Preset) and edited.steps == 40
    assert draft.marked == {} and draft.take_sweep() is None


@pytest.mark.unit
def test_a_marked_sweep_runs_by_default_as_many_rounds_as_a_speed_verdict_needs() -> None:
    assert PresetDraft().repeats == REPEAT_CHOICES[0] == significance.MIN_REPEATS


@pytest.mark.unit
def test_a_preset_that_cannot_be_read_is_not_loaded_and_says_why(tmp_path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("steps = [")
    draft = PresetDraft()
    assert draft.load(presets.PresetInfo("broken", "", broken, "user")) is None
    assert not draft.loaded and draft.problem
