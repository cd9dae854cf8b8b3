"""The GPU check's verdicts on what an H200 would leave behind, forged: CI never sees a GPU,
and the lent machine's 15 minutes must not be spent finding a wrong threshold or a typo in a
rule. A good run passes every check; each fault fails its own check, and only that one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gpu_check_forge import (
    add_run,
    both,
    edit,
    failures,
    file,
    gpu_check,
    gpu_outdir,
    machine_json,
    numerics_json,
    profile_json,
    smi,
    stage_rc,
)

pytestmark = pytest.mark.unit


def test_a_good_h200_run_passes_every_check(tmp_path: Path, capsys) -> None:
    out = gpu_outdir(tmp_path)
    assert gpu_check.cmd_check(out) == 0, capsys.readouterr().out
    lines = (out / "checks.txt").read_text().splitlines()
    assert [ln for ln in lines if not ln.startswith("PASS")] == [
        "SKIP fsdp2 amp-fp16 on 2+ GPUs: 1 GPU here: the 1-rank fsdp2 amp-fp16 run covers the path"
    ]
    text = "\n".join(lines)
    assert "PASS peak row: NVIDIA H200 (700.0 W, MIG Disabled)" in text
    assert "PASS MFU amp-bf16: 33.0% (plausible: 15%-70%)" in text
    assert "PASS fp32 compile probe: fp32 cnn compiled (max-autotune-no-cudagraphs)" in text
    assert "PASS compile-max-autotune beats eager: 3.0 ms against amp-bf16 eager 9.0 ms" in text
    assert "PASS profile amp-bf16: device timing, 15.0 ms a step over 3 steps" in text
    assert "PASS numerics amp-fp16: 3 of 3 modules over 4 steps (tok, blocks.0.qkv, head" in text
    assert (
        "PASS fp8-rowwise speed: 60.0 ms against compiled amp-bf16 70.0 ms (1.17x; at least" in text
    )
    results = (out / "gpu-results.md").read_text()
    for heading in ("## Checks", "## eager", "## compile", "## max-autotune", "## fp8", "## ranks"):
        assert heading in results
    assert "| fp8-tensorwise |" in results and "| amp-fp16 fsdp2 x1 |" in results
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["runs"]) == 20
    figures = {(r["stage"], r["preset"]): r for r in summary["runs"]}
    assert figures[("eager", "amp-bf16")]["done"]["mfu"] == 0.33
    assert summary["profile"]["timing"] == "device" and summary["numerics"]["modules_total"] == 3


MIG_SMI = "NVIDIA H200, Enabled, [N/A], 580.95, 143771 MiB"
TWO_GPUS = f"{'NVIDIA H200, Disabled, 700.00 W, 580.95, 143771 MiB'}\n" * 2


@pytest.mark.parametrize(
    ("fault", "failed"),
    [
        (edit("eager", "amp-bf16", mfu=0.9), "MFU amp-bf16"),
        (edit("eager", "amp-bf16", mfu=0.05), "MFU amp-bf16"),
        (edit("eager", "tf32", ms=260.0), "step time order"),
        (edit("compile", "compile-default", ms=50.0), "compile-default beats eager"),
        (edit("max-autotune", "compile-max-autotune", ms=9.5), "compile-max-autotune beats eager"),
        (edit("compile", "compile-reduce-overhead", recompiles=1), "reduce-overhead graphs"),
        (edit("compile", "compile-reduce-overhead", cudagraph_skips=2), "reduce-overhead graphs"),
        (edit("fp8", "fp8-tensorwise", ms=75.0), "fp8-tensorwise faster"),
        (edit("fp8", "fp8-rowwise", final=7.3), "fp8-rowwise final loss"),
        (edit("fp8", "fp8-rowwise", ms=84.0), "fp8-rowwise speed"),  # 0.83x of 70 ms
        (edit("eager", "amp-bf16", note="H200 NVL dense bf16 datasheet peak"), "peak row"),
        (smi("NVIDIA H100 80GB HBM3, Disabled, 700.00 W, 580.95, 81559 MiB"), "peak row"),
        (edit("eager", "amp-bf16", device_name="NVIDIA H200 MIG 3g.71gb"), "peak row"),
        (edit("eager", "amp-bf16", power=None), "sys telemetry"),
        (edit("eager", "amp-fp16-noscale", zeros=0.0), "noscale grad zeros"),
        (edit("eager", "amp-fp16", skipped=9), "amp-fp16 finite"),
        (edit("compile", "compile-default", warnings=["recompile"]), "warnings"),
        (edit("eager", "fp32", warnings=["nvml-field-unsupported"]), "warnings"),  # a whole GPU
        (edit("eager", "bf16", final=11.0), "loss falls"),
        (edit("probe", "fp32", status="failed"), "fp32 compile probe"),
        (stage_rc("eager", "124"), "stage eager"),
        (file("doctor", "cuda_available", value=False), "doctor"),
        (file("doctor", "compile", "cuda", value={"ok": False, "why": "no Python.h"}), "doctor"),
        (file("doctor", value=None), "doctor"),
        (
            file("imports", "modules", "textual", value={"ok": False, "error": "No module"}),
            "imports",
        ),
        (file("imports", "ampscope_from_checkout", value=False), "imports"),
        (file("dashboard", "problems", value=["nothing drawn naming amp-bf16"]), "dashboard"),
        (file("dashboard", value=None), "dashboard"),
        (smi(TWO_GPUS.strip()), "fsdp2 amp-fp16 on 2+ GPUs"),
        (
            add_run("ranks", "fp16", ms=10.0, strategy="fsdp2", world=2, checksums=["a1", "b2"]),
            "torchrun fsdp2 fp16 x2",
        ),
        (file("profile", value=profile_json(timing="cpu")), "profile amp-bf16"),
        (file("profile", value=profile_json(matmul="fp32")), "profile amp-bf16"),
        (file("profile", "classes", "matmul", value=0.9), "profile amp-bf16"),
        (file("profile", value=None), "profile amp-bf16"),
        (file("numerics", value=numerics_json(names=("tok", ""))), "numerics amp-fp16"),
        (file("numerics", "modules", 0, "gradient", "formats", value={}), "numerics amp-fp16"),
        (edit("numerics", "amp-fp16", status="failed"), "numerics amp-fp16"),
    ],
)
def test_each_fault_fails_its_own_check_alone(tmp_path: Path, fault, failed: str) -> None:
    out = gpu_outdir(tmp_path, fault)
    assert gpu_check.cmd_check(out) == 1
    assert failures(out) == {failed}


@pytest.mark.parametrize(
    ("fault", "passed"),
    [
        (
            both(
                smi(MIG_SMI),
                edit(
                    "eager",
                    "amp-bf16",
                    device_name="NVIDIA H200 MIG 3g.71gb",
                    peak=989.4 * 60 / 132,
                    note="H200 SXM dense bf16 datasheet peak scaled to this MIG slice's 60 of "
                    "132 multiprocessors",
                    warnings=["nvml-field-unsupported"],  # a slice's NVML: some figures blank
                ),
            ),
            "NVIDIA H200 (? W, MIG Enabled)",
        ),
        (  # an SXM board whose administrator capped it at 600 W is still an SXM board
            smi("NVIDIA H200, Disabled, 600.00 W, 580.95, 143771 MiB"),
            "NVIDIA H200 (600.0 W, MIG Disabled): 'H200 SXM dense",
        ),
        (
            both(
                smi("NVIDIA H200 NVL, Disabled, 600.00 W, 580.95, 143771 MiB"),
                edit(
                    "eager",
                    "amp-bf16",
                    device_name="NVIDIA H200 NVL",
                    peak=836.0,
                    note="H200 NVL dense bf16 datasheet peak",
                ),
            ),
            "NVIDIA H200 NVL (600.0 W, MIG Disabled): 'H200 NVL dense",
        ),
    ],
)
def test_the_peak_row_of_a_mig_slice_a_capped_sxm_board_and_an_nvl_board_passes(
    tmp_path: Path, fault, passed: str
) -> None:
    out = gpu_outdir(tmp_path, fault)
    gpu_check.cmd_check(out)
    assert f"PASS peak row: {passed}" in (out / "checks.txt").read_text()
    assert failures(out) == set()


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA H200",
        "NVIDIA H200 NVL",
        "NVIDIA H100",
        "NVIDIA H100 80GB HBM3",
        "NVIDIA H100 PCIe",
        "NVIDIA H100 NVL",
        "NVIDIA H100-PCIE-80GB",
    ],
)
@pytest.mark.parametrize("power", [None, 300.0, 350.0, 400.0, 450.0, 600.0, 700.0])
def test_the_boards_the_check_expects_are_the_ones_the_engine_picks(
    name: str, power: float | None
) -> None:
    """The check and ampscope.core.machine.hardware.identify decide the board alike: a name that says
    NVL or PCIe decides; only a bare H100 at 400 W or less reads as PCIe."""
    from ampscope.core.machine import hardware

    gpu = hardware.identify(name, power)
    assert gpu is not None
    assert gpu.model.split()[1] == gpu_check.figures.board(name, power)


def test_a_stage_the_budget_had_no_time_for_skips_with_its_checks(tmp_path: Path, capsys) -> None:
    out = gpu_outdir(tmp_path, stage_rc("max-autotune", "no-time"))
    for run in (out / "runs" / "max-autotune").iterdir():
        for f in run.iterdir():
            f.unlink()
        run.rmdir()
    assert gpu_check.cmd_check(out) == 0, capsys.readouterr().out
    text = (out / "checks.txt").read_text()
    note = (
        "not started: 12 s of GPU_CHECK_BUDGET_S were left and it needs 40 s "
        "(GPU_CHECK_STAGES=max-autotune runs it alone)"
    )
    assert f"SKIP stage max-autotune: {note}" in text
    assert f"SKIP compile-max-autotune beats eager: stage max-autotune {note}" in text


def test_a_stage_whose_time_the_budget_cut_says_so_when_it_times_out(tmp_path: Path) -> None:
    out = gpu_outdir(tmp_path, stage_rc("fp8", "124"))
    tsv = (
        (out / "stages.tsv").read_text().replace("fp8\t124\t30\t120\t120", "fp8\t124\t90\t90\t150")
    )
    (out / "stages.tsv").write_text(tsv)
    gpu_check.cmd_check(out)
    text = (out / "checks.txt").read_text()
    assert "FAIL stage fp8: timed out after 90 s, cut from its 150 s by GPU_CHECK_BUDGET_S" in text


def test_a_stage_that_timed_out_says_so(tmp_path: Path) -> None:
    out = gpu_outdir(tmp_path, stage_rc("fp8", "124"))
    gpu_check.cmd_check(out)
    text = (out / "checks.txt").read_text()
    assert "FAIL stage fp8: timed out after 120 s" in text


def test_interim_checks_after_a_stage_judge_what_ran_and_wait_for_the_rest(
    tmp_path: Path, capsys
) -> None:
    """A command killed at its 10-minute limit still leaves the checks of the stages it ran."""
    out = gpu_outdir(tmp_path, lambda spec, files: files.update(stages={"preflight": "0"}))
    for stage in (
        "probe",
        "eager",
        "compile",
        "max-autotune",
        "fp8",
        "ranks",
        "profile",
        "numerics",
    ):
        for run in (out / "runs" / stage).iterdir():
            for f in run.iterdir():
                f.unlink()
            run.rmdir()
    (out / "dashboard.json").unlink()
    assert gpu_check.cmd_check(out, interim_after="preflight") == 0
    assert capsys.readouterr().out == ""  # the script's log shows only the final checks
    lines = (out / "checks.txt").read_text().splitlines()
    assert lines[0] == "# interim: written after stage preflight; later stages not yet run"
    assert "PASS stage preflight: 30 s of at most 120 s" in lines
    assert "SKIP stage eager: not yet run (interim checks, after stage preflight)" in lines
    assert failures(out) == set()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interim_after"] == "preflight"
    assert "Interim: written after stage preflight" in (out / "gpu-results.md").read_text()
    # the final call, once every stage has run, writes no interim line
    gpu_check.cmd_check(out)
    assert not (out / "checks.txt").read_text().startswith("#")
    assert "Interim" not in (out / "gpu-results.md").read_text()


def test_the_import_report_gives_versions_of_packages_without_a_version_attribute(
    tmp_path: Path, capsys
) -> None:
    """pynvml, rich and textual_plotext have no ``__version__``; the report read "?" for them."""
    import importlib.metadata

    gpu_check.cmd_imports(tmp_path / "imports.json")
    modules = json.loads((tmp_path / "imports.json").read_text())["modules"]
    assert modules["pynvml"]["version"] == importlib.metadata.version("nvidia-ml-py")
    assert modules["textual_plotext"]["version"] == importlib.metadata.version("textual-plotext")
    assert all(m["version"] != "?" for m in modules.values() if m["ok"]), modules


def test_notes_are_no_warnings(tmp_path: Path) -> None:
    """A compiled run says, as a note, that it measures no per-layer numerics; a user's loader
    that starts again says so too: neither is a warning the check fails on."""
    out = gpu_outdir(
        tmp_path, edit("compile", "compile-default", warnings=["numerics-off", "epoch"])
    )
    assert gpu_check.cmd_check(out) == 0
    assert failures(out) == set()


def test_the_results_name_torch_and_the_gpu_when_doctor_or_preflight_left_nothing(
    tmp_path: Path,
) -> None:
    """On the H200 doctor ran out of time (an empty doctor.json) and the second call ran no
    preflight: the results said 'torch None, Python None' and 'no GPU named by nvidia-smi'."""
    out = gpu_outdir(tmp_path / "a", file("doctor", value=None))
    gpu_check.cmd_check(out)
    assert "; torch 2.11.0+cu130, Python" in (out / "gpu-results.md").read_text()
    out = gpu_outdir(tmp_path / "b")
    (out / "preflight" / "nvidia-smi.csv").unlink()
    (out / "preflight" / "doctor.json").unlink()
    gpu_check.cmd_check(out)
    header = (out / "gpu-results.md").read_text().splitlines()[2]
    assert "NVIDIA H200 (from its runs); torch 2.11.0+cu130" in header, header


def test_the_machine_checks_hold_an_h200_to_what_it_delivered_before(tmp_path: Path) -> None:
    """bf16 under 700 TFLOP/s or a copy under 3.5 TB/s fails its own check, and only that."""
    good = gpu_outdir(tmp_path / "good")
    gpu_check.cmd_check(good)
    text = (good / "checks.txt").read_text()
    assert "PASS machine bf16: 752 TFLOP/s (at least 700 on an H200)" in text
    assert "PASS machine copy: 4,310 GB/s (at least 3,500 on an H200)" in text

    def slow(spec, files) -> None:
        files["machine"] = machine_json(bf16=520.0, copy_gbps=2900.0)

    bad = gpu_outdir(tmp_path / "bad", slow)
    assert gpu_check.cmd_check(bad) == 1
    assert failures(bad) == {"machine bf16", "machine copy"}

    def no_fp8(spec, files) -> None:
        files["machine"]["matmul"].pop("fp8")

    missing = gpu_outdir(tmp_path / "missing", no_fp8)
    gpu_check.cmd_check(missing)
    assert failures(missing) == {"machine check"}
