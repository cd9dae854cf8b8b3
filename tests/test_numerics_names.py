"""Layer names a user can tell apart: a Hugging Face Llama's q/k/v/o projections in the
Numerics view and in the table, at every width, shortened from the left and never alike."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from ampscope.core import events as ev
from ampscope.core.numerics.names import FOLD, fold_names
from ampscope.core.numerics.report import NumericsSummary
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.screens.numerics import NumericsScreen
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.screens.run import RunScreen
from tests.helpers import run, shown
from tests.snapshot_runs import FrozenSource, gpu_run

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def llama_events(steps: int = 3) -> list[ev.NumericsEvent]:
    """Numerics of a few steps of a two-layer LlamaForCausalLM from a small config."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from ampscope.engine.numerics.hooks import NumericsProbe

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = transformers.LlamaForCausalLM(config)
    tokens = torch.randint(0, 64, (2, 16))
    got: list[ev.Event] = []
    probe = NumericsProbe(model, torch.device("cpu"), got.append, every=1)
    for step in range(steps):
        probe.begin(step, torch.full((), math.nan))
        model(input_ids=tokens, labels=tokens).loss.backward()
        probe.end(step)
    probe.poll(wait=True)
    return [e for e in got if isinstance(e, ev.NumericsEvent)]


@pytest.mark.unit
def test_folded_names_fit_their_column_and_never_read_alike():
    names = [
        "model.embed_tokens",
        *(f"model.layers.0-1.self_attn.{p}" for p in PROJECTIONS[:4]),
        *(f"model.layers.0-1.mlp.{p}" for p in PROJECTIONS[4:]),
        "model.layers.0-1.post_attention_layernorm",
        "model.norm",
        "lm_head",
        "a.b.proj",
        "c.proj",
        "proj",
    ]
    for width in (8, 12, 20, 26, 40, 60):
        shown = fold_names(names, width)
        assert len(set(shown)) == len(names), shown
        for name, folded in zip(names, shown, strict=True):
            if folded != name:  # an ending of the name, whole dotted parts, no other's ending
                ending = folded.removeprefix(FOLD)
                assert folded.startswith(FOLD) and name.endswith("." + ending)
                others = [n for n in names if n != name]
                assert not [n for n in others if n == ending or n.endswith("." + ending)]
                if len(folded) > width:  # too wide: one part fewer would be another's too
                    shorter = ".".join(ending.split(".")[1:])
                    assert not shorter or [n for n in others if n.endswith("." + shorter)]
    assert fold_names(names, 60) == names  # room for every name: nothing folded
    assert fold_names(names, 26)[1] == "…0-1.self_attn.q_proj"
    assert fold_names(["a.proj", "b.proj", "proj"], 3) == ["a.proj", "b.proj", "proj"]


@pytest.mark.ui
@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
def test_a_llamas_projections_each_have_a_row_of_their_own_in_the_view(size, tmp_path, monkeypatch):
    """Forty sampled steps: at 120 columns every name is whole (the labels take up to half the
    screen); at 80 they lose their first parts, and still no two rows read the same."""
    import msgspec

    monkeypatch.chdir(tmp_path)
    state = gpu_run()
    measured = llama_events(2)
    for step in range(40):
        state.ingest(msgspec.structs.replace(measured[step % 2], step=step))
    grid: list[str] = []

    async def go() -> None:
        app = AmpscopeApp(runs_dir=Path("runs"))
        async with app.run_test(size=size) as pilot:
            await shown(pilot, app, PresetsScreen)
            app.open_run(FrozenSource(state))
            await shown(pilot, app, RunScreen)
            await pilot.press("n")
            screen = await shown(pilot, app, NumericsScreen)
            await pilot.pause()
            grid.append("".join(screen.query_one("#numerics-grid").render().plain))

    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    run(go())
    lines = grid[0].splitlines()[1:]
    rows = [line[: line.index("XX" if "XX" in line else "··")].split() for line in lines]
    labels = [(" ".join(r[:-1]), r[-1]) for r in rows]
    assert len(set(labels)) == len(labels), labels  # every row tells its layer and pass apart
    for proj in PROJECTIONS:
        ours = list(dict.fromkeys(label for label, _ in labels if label.endswith(f".{proj}")))
        assert len(ours) == 1, (proj, labels)  # q, k, v, o: each its own rows
    whole = [label for label, _ in labels if not label.startswith(FOLD)]
    if size[0] == 120:  # the labels take up to half the screen: all whole
        assert len(whole) == len(labels)
    else:  # 40 columns: the longest lose their first parts
        assert ("…0-1.post_attention_layernorm.weight", "grad") in labels
        assert ("model.layers.0-1.self_attn.q_proj", "out") in labels
    assert max(len(line) for line in lines) <= size[0]


@pytest.mark.unit
def test_the_table_folds_names_to_the_terminal_and_prints_them_whole_to_a_pipe():
    from ampscope.cli.numerics import report

    summary = NumericsSummary()
    for e in llama_events(steps=1):
        summary.add(e)
    whole = report(summary, None).splitlines()
    assert any(line.startswith("model.layers.0.self_attn.q_proj ") for line in whole)
    narrow = report(summary, 80).splitlines()
    table = narrow[narrow.index(next(r for r in narrow if r.startswith("module"))) + 1 :]
    rows = [line for line in table if " out " in line or " grad " in line]
    labels = [line.split()[0] + " " + line.split()[1] for line in rows]
    assert len(set(labels)) == len(labels)
    assert "more characters" not in "\n".join(narrow)
    q = [label for label in labels if "q_proj" in label]
    assert q == [
        "…0.self_attn.q_proj out",
        "…0.self_attn.q_proj grad",
        "…0.self_attn.q_proj.weight grad",
        "…1.self_attn.q_proj out",
        "…1.self_attn.q_proj grad",
        "…1.self_attn.q_proj.weight grad",
    ]  # 80 columns leave 18 for names: the shortest endings no other name shares
    widest = max(len(label.split()[0]) for label in labels)  # …0.post_attention_layernorm.weight
    assert {len(line) for line in rows} == {widest + 62}  # every row aligned
    wide = report(summary, 120).splitlines()
    assert ["model.layers.1.self_attn.q_proj.weight", "grad"] in [r.split()[:2] for r in wide]
