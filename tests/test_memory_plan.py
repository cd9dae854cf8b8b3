"""The training-memory planner: anchors, parsing, exact parameter counts, and a real measurement."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ampscope.cli.main import main
from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.memory import measured
from ampscope.core.memory import plan as memory_plan
from tests import helpers
from tests.helpers import ROOT, engine_env


@pytest.mark.unit
@pytest.mark.parametrize(
    "regime,optimizer,train,inference",
    [
        ("fp32", "adamw", 16, 4),
        ("tf32", "adamw", 16, 4),
        ("amp-bf16", "adamw", 16, 2),
        ("amp-fp16", "adamw", 16, 2),
        ("mixed-fp16", "adamw", 16, 2),
        ("bf16", "adamw", 8, 2),
        ("fp16", "adamw", 8, 2),
        ("fp8", "adamw", 16, 1),
        ("fp64", "adamw", 32, 8),
        ("fp32", "sgd", 8, 4),  # weights + grads, no state
        ("fp32", "sgd-momentum", 12, 4),
        ("bf16", "sgd", 4, 2),
        ("mixed-fp16", "sgd", 8, 2),  # fp16 w + g, fp32 master
    ],
)
def test_bytes_per_parameter_anchors(regime, optimizer, train, inference):
    p = memory_plan.plan_regime(1_000, regime, optimizer)
    assert p.train_bpp == train and p.inference_bpp == inference
    assert p.static == 1_000 * train and p.inference_total == 1_000 * inference


@pytest.mark.unit
def test_amp_adds_transient_casts_only_to_the_total():
    p = memory_plan.plan_regime(10**9, "amp-bf16")
    assert p.train_bpp == 16 and p.cast_bpp == 2
    assert p.train_total == p.static + 2 * 10**9


@pytest.mark.unit
@pytest.mark.parametrize(
    "text,count",
    [
        ("7B", 7_000_000_000),
        ("7e9", 7_000_000_000),
        ("125M", 125_000_000),
        ("1.3b", 1_300_000_000),
        ("350k", 350_000),
        ("123456", 123_456),
        ("1_000", 1_000),
    ],
)
def test_parse_count(text, count):
    assert memory_plan.parse_count(text) == count


@pytest.mark.unit
@pytest.mark.parametrize("bad", ["banana", "7X", "", "-5", "0"])
def test_parse_count_rejects(bad):
    with pytest.raises(memory_plan.PlanError, match="parameter count"):
        memory_plan.parse_count(bad)


@pytest.mark.unit
def test_activation_formula():
    """The engine's GPT block: per layer s*b*h*(2R + 14C), then the final LayerNorm and head.

    (Korthikanti et al.'s 34*s*b*h + 5*a*s^2*b counted dropout masks this block lacks and
    the s^2 scores that the engine's SDPA kernels never store.)
    """
    shape = memory_plan.Shape(layers=2, hidden=64, heads=4, seq=128, batch=8)
    sbh = 128 * 8 * 64
    assert memory_plan.saved_activation_bytes(shape) == sbh * (
        2 * (2 * 2 + 14 * 2) + 2 + 2
    )  # 16-bit
    assert memory_plan.saved_activation_bytes(shape, 4) == 2 * memory_plan.saved_activation_bytes(
        shape
    )  # fp32 doubles it
    # autocast: bf16 compute, fp32 residual stream (2 LayerNorm inputs a layer, and the last)
    assert memory_plan.saved_activation_bytes(shape, 2, 4) == sbh * (2 * (2 * 4 + 14 * 2) + 4 + 2)
    amp = memory_plan.plan_regime(1000, "amp-bf16", shape=shape)
    assert amp.activations == memory_plan.saved_activation_bytes(shape, 2, 4)


@pytest.mark.unit
def test_logits_are_four_buffers_at_the_backward_peak():
    """logits (compute dtype) + fp32 log-softmax + its incoming and outgoing gradients."""
    shape = memory_plan.Shape(layers=1, hidden=64, heads=4, seq=128, batch=8, vocab=1000)
    logits = 128 * 8 * 1000
    assert memory_plan.plan_regime(1000, "bf16", shape=shape).logits == 14 * logits
    assert memory_plan.plan_regime(1000, "amp-bf16", shape=shape).logits == 14 * logits
    assert memory_plan.plan_regime(1000, "fp32", shape=shape).logits == 16 * logits


@pytest.mark.unit
def test_train_total_adds_up_its_columns():
    shape = memory_plan.Shape(layers=12, hidden=768, heads=12, seq=1024, batch=16, vocab=32768)
    for p in memory_plan.plan(136_091_136, memory_plan.REGIMES, "adamw", shape):
        parts = (p.weights, p.grads, p.master, p.optimizer_state, p.cast_copies)
        assert p.train_total == sum(parts) + p.activations + p.logits


@pytest.mark.unit
def test_fits_uses_ninety_percent():
    gib = 1 << 30
    assert "H100" in memory_plan.fits(int(72 * gib)) and "H100" not in memory_plan.fits(
        int(72.1 * gib)
    )


@pytest.mark.unit
def test_gpt_preset_param_count_matches_the_model():
    from ampscope.engine.workloads.gpt import Gpt

    wl = memory_plan.workload_from_preset("fp32", on_cuda=False)
    d = wl.dims
    model = Gpt(d["vocab"], d["seq_len"], d["width"], d["layers"], d["heads"])
    assert wl.params == sum(p.numel() for p in model.parameters())
    assert wl.shape is not None and wl.shape.batch == wl.batch


@pytest.mark.unit
def test_mlp_and_cnn_param_counts_match_the_models():
    from ampscope.engine.workloads.cnn import Cnn
    from ampscope.engine.workloads.mlp import mlp

    wl = memory_plan.workload_from_preset("mlp-demo", on_cuda=False)
    d = wl.dims
    assert wl.params == sum(
        p.numel() for p in mlp(d["width"], d["layers"], d["classes"]).parameters()
    )
    wl = memory_plan.workload_from_preset("cnn-amp-bf16", on_cuda=True)
    d = wl.dims
    model = Cnn(d["width"], d["layers"], d["classes"], d["image_size"])
    assert wl.params == sum(p.numel() for p in model.parameters())


MEASURE = r"""
import gc, json, psutil, torch
from ampscope.engine.workloads.mlp import mlp
torch.manual_seed(0)
proc = psutil.Process()
x, y = torch.randn(8, 2048), torch.randint(0, 16, (8,))
warm = mlp(64, 2, 16)  # touch the autograd and optimizer code paths first
o = torch.optim.AdamW(warm.parameters()); torch.nn.functional.cross_entropy(warm(x[:, :64]), y).backward(); o.step()
del warm, o; gc.collect()
before = proc.memory_info().rss
model = mlp(2048, 4, 16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(2):
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
grown = proc.memory_info().rss - before  # weights, grads, m and v are all alive here
print(json.dumps({"params": sum(p.numel() for p in model.parameters()), "grown": grown}))
"""


@pytest.mark.subprocess
def test_prediction_matches_a_real_cpu_training_step():
    """Predicted static memory (fp32 AdamW: weights + grads + m + v) vs a measured CPU process.

    On the CPU the only measure is process RSS, which includes the Python and torch runtime
    (hundreds of MB). So a fresh process warms up torch on a tiny model, reads RSS, then builds
    a 12.6M-parameter MLP (width 2048, the model dominates: 16 B/param = 201 MB) and runs two
    AdamW steps with a batch of 8 (activations: kilobytes). The RSS growth at the moment all
    four copies are alive must be within 35% of the planner's figure. glibc's mmap threshold
    is pinned: left dynamic, freed optimizer temporaries stayed in the heap and in RSS on some
    runs (286 MB against 202 MB, seen under load).
    """
    out = subprocess.run(
        [sys.executable, "-c", MEASURE],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**engine_env(), "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)},
        timeout=120,
        check=True,
    )
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["params"] == memory_plan.mlp_params(2048, 4, 16)
    predicted = memory_plan.plan_regime(data["params"], "fp32").static
    assert data["grown"] == pytest.approx(predicted, rel=0.35), (data, predicted)


@pytest.mark.subprocess
def test_run_record_comparison(recorded_runs, tmp_path, capsys, monkeypatch):
    """--run on a real (tiny) CPU run: the prediction, and no ratio against process RSS.

    The record holds RSS (the runtime included, ~300 MB) and the RSS read before the model
    was built, so the growth from it is compared, never RSS itself (the old output divided
    RSS by tensor memory: "measured / predicted = 106").
    """
    run_dir = next(recorded_runs.iterdir())
    c = measured.compare_run(run_dir)
    assert c.regime == "fp32" and c.params == memory_plan.mlp_params(256, 4, 16)
    assert c.measured_peak and c.compared and c.compared < c.measured_peak
    assert "RSS" in c.measured_what and "RSS growth" in c.compared_what
    assert main(["memory", "--run", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "RSS growth" in out and "compared / predicted" not in out  # too small to compare
    assert "so this RSS growth is mostly the process's, not the model's" in out
    assert main(["memory", "--run", str(tmp_path)]) == 2
    # by its name, as 'ampscope runs' lists it
    monkeypatch.setenv("AMPSCOPE_RUNS_DIR", str(recorded_runs))
    capsys.readouterr()
    assert main(["memory", "--run", run_dir.name]) == 0
    assert "RSS growth since before the model was built" in capsys.readouterr().out
    assert main(["memory", "--run", "no-such-run"]) == 2
    assert "no run record 'no-such-run'" in capsys.readouterr().err


def fake_record(tmp_path, device: str, peak: int, rss_before: int | None = None):
    """A GPT run record written by hand: its hello and its done, nothing else."""
    conf = {
        "precision": "amp-bf16",
        "batch_size": 4,
        "workload": {"kind": "gpt", "layers": 2, "width": 64, "heads": 4, "seq_len": 32}
        | {"vocab": 512},
    }
    run_dir = tmp_path / f"run-{device}"
    run_dir.mkdir()
    hello = helpers.hello(config=conf, device=device, param_count=0, rss_before_model=rss_before)
    done = ev.empty_done("ok")
    done.mem_peak = peak
    (run_dir / records.EVENTS_FILE).write_bytes(ev.encode(hello) + ev.encode(done))
    return run_dir


@pytest.mark.unit
def test_run_comparison_sets_tensor_memory_beside_tensor_memory(tmp_path, capsys):
    gib = 1 << 30
    cuda = measured.compare_run(fake_record(tmp_path, "cuda:0", gib))
    assert cuda.compared == gib and cuda.ratio == pytest.approx(gib / cuda.predicted)
    assert "max_memory_allocated" in cuda.compared_what
    assert cuda.params == memory_plan.gpt_params(512, 32, 64, 2)  # from the shape: none recorded
    assert any("SDPA flash" in n for n in cuda.notes)
    cpu = measured.compare_run(fake_record(tmp_path, "cpu", 700 << 20, rss_before=400 << 20))
    assert cpu.compared == 300 << 20 and "RSS growth" in cpu.compared_what
    assert main(["memory", "--run", str(tmp_path / "run-cpu")]) == 0
    out = capsys.readouterr().out
    assert "RSS growth since before the model was built" in out
    assert "not compared: the plan (" in out  # 166,528 parameters: the process's own growth


@pytest.mark.unit
def test_memory_run_on_a_model_record_names_the_users_model(tmp_path, capsys) -> None:
    """A --model run is recorded as the user's model, not as the preset's GPT, and
    `memory --run` says so (it said "no transformer shape for a gpt workload")."""
    from ampscope.engine.lifecycle.run import EXIT_OK, run

    sets = [helpers.model_set(helpers.user_model(tmp_path)), "device='cpu'", "steps=2"]
    assert run("fp32", sets, runs_dir=tmp_path / "runs") == EXIT_OK
    (run_dir,) = (tmp_path / "runs").iterdir()
    capsys.readouterr()
    assert main(["memory", "--run", str(run_dir)]) == 0
    out = capsys.readouterr().out
    # its activations measured from the model file, not a GPT's formula nor left out
    assert "activations: what autograd saves in one step of the model" in out, out
    assert "gpt" not in out


@pytest.mark.unit
def test_cli_params_banana(capsys):
    assert main(["memory", "--params", "banana"]) == 2
    err = capsys.readouterr().err
    assert "banana" in err and "7B" in err and "Traceback" not in err


@pytest.mark.subprocess
def test_cli_params_banana_subprocess():
    out = subprocess.run(
        [sys.executable, "-m", "ampscope", "memory", "--params", "banana"],
        cwd=ROOT,
        env=engine_env(),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "banana" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.unit
def test_cli_json_and_text(capsys):
    assert main(["memory", "--params", "7B", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    by = {r["regime"]: r for r in data["regimes"]}
    assert by["fp32"]["train_bpp"] == 16 and by["bf16"]["train_bpp"] == 8
    assert "B200" in by["bf16"]["fits_train"] and "T4" not in by["fp32"]["fits_train"]
    assert main(["memory", "--preset", "amp-bf16", "--device", "cpu", "--flash"]) == 0
    out = capsys.readouterr().out
    assert "activ." in out and "KV cache" in out
    # One attention model, named; --flash (now the only model) is still accepted.
    assert main(["memory", "--preset", "amp-bf16", "--device", "cpu"]) == 0
    assert capsys.readouterr().out == out and "SDPA flash" in out and "logits" in out
    assert main(["memory", "--layers", "2"]) == 2
    assert main(["memory"]) == 2


@pytest.mark.unit
def test_readme_gives_the_large_gpt_s_parameter_counts():
    """hello.param_count for the large GPT, and the matmul weights the FLOP count uses."""
    wl = memory_plan.workload_from_preset("fp32", on_cuda=True)
    d = wl.dims
    matmuls = d["layers"] * 12 * d["width"] ** 2 + d["width"] * d["vocab"]
    readme = " ".join((ROOT / "docs/presets.md").read_text().split())
    assert f"{wl.params:,} parameters" in readme and "~110M-parameter" not in readme
    assert f"{matmuls / 1e6:.1f}M in its matmul weights" in readme


@pytest.mark.unit
def test_gpus_that_cannot_run_a_format_never_fit_it(capsys):
    """fp8 needs compute capability 8.9 and bf16 8.0: a V100 'fitting' either misleads."""
    plan = {r.regime: r for r in memory_plan.plan(10**6)}
    for old in ("V100-16", "T4"):
        assert old in plan["fp32"].fits_train
        assert old not in plan["bf16"].fits_train and old not in plan["amp-bf16"].fits_train
    for pre_ada in ("V100-32", "T4", "A10", "A100-80"):
        assert pre_ada not in plan["fp8"].fits_train and pre_ada not in plan["fp8"].fits_inference
    assert "L4" in plan["fp8"].fits_train and "A100-80" in plan["bf16"].fits_train
    assert main(["memory", "--params", "1M"]) == 0
    out = capsys.readouterr().out
    assert "x = cannot run the format" in out


@pytest.mark.unit
def test_at_80_columns_the_tables_fold_into_whole_columns_and_notes_break_between_words(
    capsys, monkeypatch
):
    """At 80 columns the 163-column table once wrapped in the terminal, each row's cells
    running on under the next regime's, and the notes broke words ("amp-bf1 / 6's")."""
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["memory", "--params", "7B"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 80
    heads = [line for line in lines if line.startswith("regime ")]
    assert len(heads) >= 2  # the regime column leads every block
    assert any("weights" in h for h in heads) and any("TRAIN" in h for h in heads)
    train = next(h for h in heads if "TRAIN" in h)
    fp32 = lines[lines.index(train) + 1]
    assert fp32.startswith("fp32 ") and "104 GiB" in fp32  # the row's own cells, aligned
    assert "amp-bf1" not in "\n".join(lines).replace("amp-bf16", "")


@pytest.mark.unit
def test_to_a_pipe_each_regime_stays_one_line(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["memory", "--params", "7B"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len([line for line in lines if line.startswith("regime ")]) == 1
    row = next(line for line in lines if line.startswith("fp32 "))
    assert "26.1 GiB" in row and "104 GiB" in row
