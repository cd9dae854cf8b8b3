"""The Machine view: the kept check, one bar per format beside the datasheet, at 80x24 and
120x40; and what it says when no check was kept."""

from __future__ import annotations

import pytest

from ampscope.core.machine import steady, verdicts
from ampscope.core.machine.check import (
    GpuState,
    MachineCheck,
    MatmulFigure,
    check_path,
    host_name,
    load_all,
    save,
    with_datasheet,
)
from ampscope.tui.model.machine_view import bar, view_lines
from ampscope.tui.screens.machine import MachineScreen
from ampscope.tui.screens.presets import PresetsScreen
from tests.helpers import assert_snapshot, run, shown
from tests.test_snapshots import SIZES, app_for, footer, name, settle


def h200_check() -> MachineCheck:
    """An H200 capped at 500 W and running hot: fixed figures, as a snapshot needs."""
    rates = {"fp32": 51.0, "tf32": 372.0, "bf16": 702.0, "fp16": 699.0, "fp8": 1254.0}
    figures = {
        fmt: MatmulFigure(
            tflops=value,
            shape=[8192, 8192, 16384],
            layout="nt",
            rounds=[value * f for f in (0.99, 1.0, 0.98, 0.99, 0.97)],
        )
        for fmt, value in rates.items()
    }
    figures["fp8"].rounds = [1254.0, 900.0, 880.0, 1100.0, 870.0]  # another job came and went
    with_datasheet("NVIDIA H200", "cuda", figures, 500.0)
    check = MachineCheck(
        device="NVIDIA H200",
        kind="cuda",
        matmul=figures,
        memory_gbps=4310.0,
        memory_datasheet_gbps=4800.0,
        memory_what="device-to-device copy",
        h2d_gbps=53.2,
        when="2026-12-01T10:00:00+00:00",
        torch="2.12.0+cu128",
        driver="570.124.06",
        host="gpu-box-7",
        gpu_state=GpuState(
            power_limit_w=500.0,
            power_max_w=700.0,
            throttle=["sw_thermal"],
            pcie_gen=5,
            pcie_width=16,
            pcie_max_gen=5,
            pcie_max_width=16,
        ),
    )
    check.load_average = 0.4
    check.verdicts = verdicts.judge(check)
    return check


@pytest.mark.ui
@pytest.mark.parametrize("size", SIZES)
def test_machine_view_shows_each_format_beside_its_datasheet_and_the_verdicts(size) -> None:
    async def go() -> None:
        app = app_for()
        async with app.run_test(size=size) as pilot:
            await shown(pilot, app, PresetsScreen)
            app.push_screen(
                MachineScreen({"NVIDIA H200": h200_check()}, now=("2.13.0+cu128", "570.124.06"))
            )
            await shown(pilot, app, MachineScreen)
            await settle(pilot)
            text = assert_snapshot(app, name("machine", size))
            for row in ("fp32", "tf32", "bf16", "fp16", "fp8"):
                assert f"\n {row} " in text or f"\n{row} " in text or f"│{row} " in text
            assert "702 of 989 (71 %)" in text  # H200 SXM bf16: measured beside datasheet
            assert "(63 %)  busy 28 %" in text  # fp8's rounds disagreed: not read as a peak
            assert "the best of 5 rounds; 'busy'" in text
            assert "4,310 of 4,800 GB/s (90 %)" in text
            assert "power limit 500 W of 700 W" in text  # the verdicts, at 80x24 too
            assert "SM clock throttled (thermal)" in text
            assert "torch 2.12.0+cu128 (now 2.13.0+cu128)" in text  # a stale check says so
            assert "esc Back" in footer(app)

    run(go())


@pytest.mark.ui
def test_the_presets_key_opens_the_view_and_without_a_check_it_says_what_to_run() -> None:
    async def go() -> None:
        app = app_for()
        async with app.run_test(size=(80, 24)) as pilot:
            await shown(pilot, app, PresetsScreen)
            await pilot.press("c")
            screen = await shown(pilot, app, MachineScreen)
            await settle(pilot)
            body = str(screen.query_one("#machine-body").render())
            assert "No machine check kept for this host yet" in body
            assert "    ampscope doctor --bench" in body
            await pilot.press("escape")
            await shown(pilot, app, PresetsScreen)

    run(go())


@pytest.mark.unit
def test_a_kept_check_on_disk_is_what_the_view_reads() -> None:
    """The screen reads the file ``doctor --bench`` keeps (no torch in the dashboard)."""
    check = h200_check()
    check.host = host_name()
    save(check)
    lines = view_lines(*load_all(), width=76, torch="2.12.0+cu128", driver="570.124.06")
    assert lines[0] == "NVIDIA H200"
    assert not any(line.startswith("! ") for line in lines)  # same torch and driver: not stale
    assert any(line.startswith("bf16  ") and "702 of 989" in line for line in lines)
    assert all(len(line) <= 76 for line in lines)


@pytest.mark.unit
def test_a_cpu_check_shows_gflops_scaled_to_its_fastest_format() -> None:
    figures = {
        "fp32": MatmulFigure(0.02, [1024] * 3),
        "bf16": MatmulFigure(0.04, [1024] * 3),
        "fp16": MatmulFigure(0.001, [512] * 3),
    }
    check = MachineCheck(device="AMD EPYC", kind="cpu", matmul=figures, memory_gbps=7.0)
    check.threads = 2
    check.cpu_units = ["avx512_bf16"]
    check.verdicts = verdicts.judge(check)
    lines = view_lines({"AMD EPYC": check}, None, 76, None, None)
    assert lines[0] == "AMD EPYC, 2 threads"
    bf16 = next(line for line in lines if line.startswith("bf16"))
    fp32 = next(line for line in lines if line.startswith("fp32"))
    assert bf16.endswith(" 40.0") and fp32.endswith(" 20.0")
    assert bf16.count(bar(1, 1, 1)) == 2 * fp32.count(bar(1, 1, 1))
    assert "- bf16 matmul runs at 2x fp32 here, on its AVX512-BF16 units" in lines


@pytest.mark.unit
def test_a_gpu_runs_card_shows_the_datasheet_mfu_and_the_measured_share_within_its_width() -> None:
    from ampscope.tui.model.figures import cards
    from tests.snapshot_runs import gpu_run

    state = gpu_run()
    before = next(c for c in cards(state) if c.key == "tflops")
    assert state.hello is not None
    state.hello.measured_tflops = 760.0  # an H100 that reached 760 of its 989 TFLOP/s
    card = next(c for c in cards(state) if c.key == "tflops")
    tflops, mfu = before.value.split(" · ")
    assert card.value == before.value  # the datasheet's MFU stays where it was
    assert card.sub == f"{float(tflops) / 760.0 * 100:.0f}% of measured peak"
    assert len(card.sub) <= 22 and before.sub.startswith("MFU ")


@pytest.mark.ui
@pytest.mark.parametrize(
    ("field", "bad"),
    [("tflops", float("nan")), ("tflops", float("inf")), ("threads", "two"), ("tflops", 10**400)],
    ids=["nan", "inf", "text-threads", "400-digits"],
)
def test_a_damaged_kept_file_is_a_message_in_the_view_never_a_crash(field, bad) -> None:
    """Before: NaN or inf raised ValueError in the bar, a text thread count TypeError, a
    400-digit figure OverflowError: 'c' on the presets screen ended the dashboard."""
    import json

    check = h200_check()
    check.host = host_name()
    save(check)
    data = json.loads(check_path().read_text())
    entry = data["checks"]["NVIDIA H200"]
    if field == "threads":
        entry["threads"] = bad
    else:
        entry["matmul"]["bf16"]["tflops"] = bad
    check_path().write_text(json.dumps(data))

    async def go() -> None:
        app = app_for()
        async with app.run_test(size=(80, 24)) as pilot:
            await shown(pilot, app, PresetsScreen)
            await pilot.press("c")
            screen = await shown(pilot, app, MachineScreen)
            await settle(pilot)
            body = str(screen.query_one("#machine-body").render())
            assert "NVIDIA H200" in body
            assert "the kept file holds figures that are no measurement, ignored" in body
            assert "ampscope doctor --bench" in body
            assert ("bf16 matmul" in body) is (field != "threads")

    run(go())


@pytest.mark.unit
def test_a_check_handed_over_with_figures_that_are_no_number_is_still_drawn() -> None:
    """The view draws an empty bar for a figure that is no number, and a check it cannot
    draw at all is a sentence naming the command, never an exception."""
    check = h200_check()
    check.matmul["bf16"].tflops = float("nan")
    check.memory_gbps = float("inf")
    lines = view_lines({"NVIDIA H200": check}, None, 76, None, None)
    bf16 = next(line for line in lines if line.startswith("bf16"))
    assert bar(1, 1, 1) not in bf16
    check.threads = "two"  # type: ignore[assignment]
    lines = view_lines({"NVIDIA H200": check}, None, 76, None, None)
    assert lines[0].startswith("the kept check of NVIDIA H200 cannot be shown (TypeError")
    assert "ampscope doctor --bench" in " ".join(lines)


@pytest.mark.unit
def test_a_kept_torch_or_driver_with_escape_codes_is_shown_literally_in_the_warning() -> None:
    """Before: the line saying the check ran on another torch wrote the kept file's torch as
    it was, so an escape code in it reached the terminal raw."""
    check = h200_check()
    check.torch = "\x1b]0;title\x07\x00"
    check.driver = "\x1b[2J"
    lines = view_lines({"NVIDIA H200": check}, None, 76, "2.13.0", "580.1")
    text = "\n".join(lines)
    assert "measured on torch" in text
    assert not [c for c in text if ord(c) < 32 and c != "\n"]
    assert "\\x1b]0;title" in text


@pytest.mark.unit
def test_rounds_near_the_float_limit_are_read_as_a_share_never_an_infinite_spread() -> None:
    """Before: four rounds of 1e308 averaged to inf in the median, the spread was -inf, the
    view said 'busy -inf %' and the figure counted as steady."""
    assert steady.spread([1e308] * 4) == 0.0
    assert steady.spread([1e308, 5e307, 1e308, 5e307]) == pytest.approx(0.25)
    check = h200_check()
    check.matmul["bf16"].rounds = [1e308, 1e308]
    lines = view_lines({"NVIDIA H200": check}, None, 76, None, None)
    bf16 = next(line for line in lines if line.startswith("bf16"))
    assert "inf" not in bf16
