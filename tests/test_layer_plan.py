"""The plan screen's model without an app: the plan read and checked, its rows and words."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from ampscope.tui.model import layer_plan

pytestmark = pytest.mark.unit

DATA = Path(__file__).parent / "data"


def raw(target: str = "fp8") -> dict:
    return json.loads((DATA / f"plan-{target}.json").read_text())


def plan(target: str = "fp8") -> layer_plan.Plan:
    return layer_plan.read_plan((DATA / f"plan-{target}.json").read_bytes())


def layer(p: layer_plan.Plan, name: str) -> layer_plan.PlannedLayer:
    return next(one for one in p.layers if one.name == name)


def test_a_plan_is_read_whole() -> None:
    p = plan()
    assert (p.target, p.speed_source, len(p.layers)) == ("fp8", "model", 17)
    assert p.files.preset == "plans/tiny-llama-fp8/plan.toml" and p.files.torchtitan is None
    never_ran = layer(p, "model.layers.1.mlp.spare_proj")
    assert never_ran.gemm is None and never_ran.numerics is None and never_ran.decision == "bf16"
    fp16 = plan("fp16")
    # as 'ampscope plan fp16 --json' writes it: no GPU, no speed (the dashboard once refused it)
    assert fp16.target == "fp16" and fp16.gpu is None and fp16.speed_source is None
    assert {one.decision for one in fp16.layers} == {"fp16", "fp32"}


def cast_of(data: dict, i: int, recipe: str, cast: str) -> dict:
    return data["layers"][i]["numerics"][recipe]["casts"][cast]


Q0 = "layer model.layers.0.self_attn.q_proj"
K0 = "layer model.layers.0.self_attn.k_proj"
O0 = "layer model.layers.0.self_attn.o_proj"


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (
            lambda d: cast_of(d, 0, "rowwise", "input").update(underflow=1.5),
            f"({Q0}, recipe rowwise, cast input)",
        ),
        (
            lambda d: cast_of(d, 1, "tensorwise", "grad_gw").update(nonfinite=-1),
            f"({K0}, recipe tensorwise, cast grad_gw)",
        ),
        (lambda d: d["layers"][3].update(predicted_speedup=0.0), f"predicted_speedup` ({O0})"),
        (
            lambda d: d["layers"][3].update(predicted_speedup=float("inf")),
            f"finite speed-up - at `$.layers[3].predicted_speedup` ({O0})",
        ),
        (lambda d: d["layers"][1]["gemm"].update(M=0), f"gemm.M` ({K0})"),
        (lambda d: d["layers"][1].update(decision="int8"), f"decision` ({K0})"),
        (lambda d: d["layers"][0].pop("decision"), f"`$.layers[0]` ({Q0})"),
        (lambda d: d.update(target="fp4"), "$.target"),
        (lambda d: d.update(speed_source="guessed"), "$.speed_source"),
    ],
)
def test_a_figure_that_cannot_be_refuses_the_plan_and_says_where(change, where) -> None:
    data = raw()
    change(data)
    with pytest.raises(layer_plan.PlanUnreadable) as refused:
        layer_plan.read_plan(json.dumps(data).encode())
    assert where in str(refused.value)


def test_a_relative_error_the_plan_could_not_take_is_no_fault() -> None:
    data = raw()
    data["layers"][0]["numerics"]["rowwise"]["casts"]["input"]["rel_error"] = float("nan")
    assert len(layer_plan.read_plan(json.dumps(data).encode()).layers) == 17  # Python writes NaN


def test_what_a_finished_command_gave() -> None:
    assert isinstance(
        layer_plan.read_outcome(0, (DATA / "plan-fp8.json").read_bytes(), []), layer_plan.Plan
    )
    progress = ["ampscope plan: measuring one step of m.py:make ...", "step 1"]
    refused = layer_plan.read_outcome(
        2, b"", [*progress, "ampscope: --model m.py:make: no such file.", "Accepted: FILE:FN."]
    )
    assert refused == layer_plan.PlanFault(
        "ampscope plan refused", "ampscope: --model m.py:make: no such file.\nAccepted: FILE:FN."
    )
    crashed = layer_plan.read_outcome(
        1, b"", [*progress, "Traceback (most recent call last):", "E: x"]
    )
    assert isinstance(crashed, layer_plan.PlanFault) and crashed.title == "ampscope plan failed"
    assert "exit code 1" in crashed.message and crashed.message.endswith(
        "Traceback (most recent call last):\nE: x"
    )
    killed = layer_plan.read_outcome(-9, b"", [])
    assert isinstance(killed, layer_plan.PlanFault) and "SIGKILL" in killed.message
    assert "out of memory" in killed.message
    garbage = layer_plan.read_outcome(0, b"Loading checkpoint shards: 100%\n", [])
    assert isinstance(garbage, layer_plan.PlanFault) and garbage.title == "No plan to show"
    assert "not JSON" in garbage.message and "Loading checkpoint shards" in garbage.message
    silent = layer_plan.read_outcome(0, b"", [])
    assert isinstance(silent, layer_plan.PlanFault) and "printed nothing" in silent.message


def test_the_cast_that_decided() -> None:
    p = plan()
    # fp8 chosen: the chosen recipe's worst cast, not tensorwise's 61 %
    outlier = layer_plan.deciding_cast(layer(p, "model.layers.0.mlp.down_proj"))
    assert outlier is not None and outlier.recipe == "rowwise_with_gw_hp" and outlier.fits
    assert outlier.cast == "grad_gw" and outlier.words() == "grad_gw 0.14%"
    # kept for speed: the best fitting recipe's worst cast (numerics allowed fp8)
    kept = layer_plan.deciding_cast(layer(p, "model.layers.0.self_attn.k_proj"))
    assert kept is not None and kept.fits and kept.recipe == "rowwise"
    # kept because nothing fits: the least bad recipe, said as not fitting
    data = raw()
    for figures in data["layers"][1]["numerics"].values():
        figures["fits"] = False
        figures["casts"]["grad_gw"]["underflow"] = 0.05
    data["layers"][1]["numerics"]["rowwise"]["casts"]["grad_gw"]["underflow"] = 0.03
    broken = layer_plan.deciding_cast(layer_plan.read_plan(json.dumps(data).encode()).layers[1])
    assert broken is not None and not broken.fits and broken.words() == "grad_gw 3.0%"
    assert layer_plan.band(broken.figures) == "critical"
    # an inf/NaN is worse than any share
    data["layers"][1]["numerics"]["rowwise"]["casts"]["weight"]["nonfinite"] = 2
    worst = layer_plan.worst_cast(
        "rowwise", layer_plan.read_plan(json.dumps(data).encode()).layers[1].numerics["rowwise"]
    )
    assert worst is not None and worst.words() == "weight inf/NaN"
    assert layer_plan.deciding_cast(layer(p, "vision.attn.out_proj")) is None


def test_shares_and_bands_in_words() -> None:
    assert [layer_plan.share(x) for x in (0.0, 0.00004, 0.0004, 0.031, 0.61)] == [
        "0%",
        "<0.01%",
        "0.04%",
        "3.1%",
        "61%",
    ]
    figures = [
        layer_plan.CastFigures(underflow=u, rel_error=0.0, nonfinite=0)
        for u in (0.004, 0.01, 0.03, 0.2)
    ]
    assert [layer_plan.band(f) for f in figures] == ["fine", "warn", "critical", "severe"]


def test_names_are_shortened_from_the_left_and_never_into_another() -> None:
    p = plan()
    names = [one.name for one in p.layers]
    for width in range(4, 40):
        shown = layer_plan.short_names(names, width)
        assert len(set(shown)) == len(names), width  # every layer told apart
        for name, short in zip(names, shown, strict=True):
            assert name == short or (short.startswith("\u2026") and name.endswith("." + short[1:]))
            assert len(short) <= max(width, layer_plan.narrowest_names(names))
    shown = layer_plan.short_names(names, 22)
    assert "\u2026self_attn.q_proj" not in shown  # two layers end so: each keeps its block
    assert "\u20260.self_attn.q_proj" in shown and "lm_head" in shown
    assert "\u20260.mlp.up_proj" in shown  # as short as the others, though more would fit
    assert "model.layers.0.self_attn.q_proj" in layer_plan.short_names(
        names, 31
    )  # whole where it fits
    # a name that is another's tail keeps the part that tells them apart
    assert layer_plan.short_names(["head", "lm.head"], 1) == ["head", "lm.head"]


def test_sort_orders() -> None:
    p = plan()
    assert layer_plan.sort_order(p, "model order") == list(range(17))
    by_speed = [p.layers[i].predicted_speedup for i in layer_plan.sort_order(p, "speed-up")]
    known = [s for s in by_speed if s is not None]
    assert known == sorted(known, reverse=True) and by_speed[-2:] == [None, None]
    by_cast = [
        layer_plan.deciding_cast(p.layers[i]) for i in layer_plan.sort_order(p, "worst cast")
    ]
    flushed = [c.figures.underflow for c in by_cast if c is not None]
    assert flushed == sorted(flushed, reverse=True) and by_cast[-2:] == [None, None]


def test_the_table_fits_its_width_with_every_name_told_apart() -> None:
    p = plan()
    for width, compact in ((76, True), (116, False)):  # 80 and 120 columns, less the chrome
        table = layer_plan.plan_table(p, "model order", width)
        cells = [row for _i, row in table.rows]
        widths = [max(len(h), *(len(r[c]) for r in cells)) + 2 for c, h in enumerate(table.heads)]
        assert sum(widths) <= width, (width, widths)
        names = [row[0] for row in cells]
        assert len(set(names)) == len(names)
        assert ("8k,2k,32000" in cells[-1]) == compact and cells[-1][4] == "fp8 rowwise"
        assert cells[-1][3] == ("0.17%" if compact else "grad_gw 0.17%")  # named under the table
        assert table.heads[3] == ("flushed" if compact else "worst cast")
    narrow = layer_plan.plan_table(p, "model order", 40)
    names = [row[0] for _i, row in narrow.rows]
    assert len(set(names)) == 17  # wider than asked, rather than ambiguous (the table scrolls)


def test_the_words_over_the_table() -> None:
    p = plan()
    assert layer_plan.speed_words(p) == "speed-ups from the roofline model"
    # an fp16 plan predicts no speed: the dashboard once said its were the roofline model's
    assert layer_plan.speed_words(plan("fp16")) == (
        "modules kept in fp32 for fp16's range, no speed-ups predicted"
    )
    assert layer_plan.speed_words(msgspec.structs.replace(p, speed_source="measured")) == (
        "speed-ups measured on it"
    )
    assert layer_plan.count_words(p) == (
        "11 of 17 layers in fp8 (rowwise 10, rowwise_with_gw_hp 1) · bf16: 6"
    )
    assert layer_plan.files_words(p.files) == (
        "files in plans/tiny-llama-fp8: plan.toml (the preset enter trains), module_filter.py "
        "(torchao), plan.json (figures)"
    )
    assert layer_plan.count_words(plan("fp16")) == "2 of 3 layers in fp16 · fp32: 1"
    assert layer_plan.gpu_words({"name": "NVIDIA L4", "sm": 89}) == "NVIDIA L4"


def test_every_string_of_the_plan_is_shown_as_written() -> None:
    data = raw()
    evil = "[red]evil[/] [/x]\x1b[2J"
    data["layers"][0].update(name=evil, reason=evil, kind=evil, recipe=evil)
    data["gpu"] = evil
    data["files"]["preset"] = f"{evil}/plan.toml"
    p = layer_plan.read_plan(json.dumps(data).encode())
    shown_as = "[red]evil[/] [/x]\\x1b[2J"
    table = layer_plan.plan_table(p, "model order", 200)
    assert table.rows[0][1][0] == shown_as and table.rows[0][1][4] == f"fp8 {shown_as}"
    assert layer_plan.gpu_words(p.gpu) == shown_as and shown_as in layer_plan.files_words(p.files)
    detail = layer_plan.detail_lines(p, p.layers[0])
    assert all("\x1b" not in line for line in detail) and detail[1] == shown_as
