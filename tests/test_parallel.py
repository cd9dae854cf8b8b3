"""Several processes without starting any: the [parallel] table, the launch flags, the torchrun
command, and how every rank's figures become the job's."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest
import tomllib

from ampscope.cli.main import build_parser, main
from ampscope.core import events as ev
from ampscope.core import presets
from ampscope.core.presets.parallel import (
    FSDP_DEFAULTS,
    Launch,
    LaunchError,
    fsdp_dtypes,
    make_launch,
    port_in_use,
)
from ampscope.core.presets.run_args import launch_from_args
from ampscope.core.processes.launch import child_env, engine_command

pytestmark = pytest.mark.unit


# ----------------------------------------------------------------------------- the preset


def test_parallel_table_defaults_to_ddp_without_compression() -> None:
    preset = presets.load_preset("amp-bf16")
    assert preset.parallel.strategy == "ddp"
    assert preset.parallel.grad_compression == "none"
    assert fsdp_dtypes("amp-bf16", preset.parallel) == ("bf16", "fp32")


@pytest.mark.parametrize(
    ("precision", "expected"),
    [
        ("fp32", ("fp32", "fp32")),
        ("tf32", ("fp32", "fp32")),
        ("amp-bf16", ("bf16", "fp32")),
        ("amp-fp16", ("fp16", "fp32")),
        ("bf16", ("bf16", "bf16")),
        ("fp16", ("fp16", "fp16")),
        ("fp64", ("fp64", "fp64")),
    ],
)
def test_fsdp2_dtypes_follow_the_precision_unless_set(precision, expected) -> None:
    assert FSDP_DEFAULTS[precision] == expected
    p = presets.load_preset("fp32", [f"precision='{precision}'", "parallel.strategy='fsdp2'"])
    assert fsdp_dtypes(precision, p.parallel) == expected
    if precision.startswith("amp-"):
        p = presets.load_preset(
            "fp32",
            [
                f"precision='{precision}'",
                "parallel.strategy='fsdp2'",
                "parallel.reduce_dtype='bf16'",
            ],
        )
        assert fsdp_dtypes(precision, p.parallel) == (expected[0], "bf16")


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        (["parallel.strategy='fsdp'"], "parallel.strategy", "'ddp' | 'fsdp2'"),
        (["parallel.param_dtype='bf16'"], "parallel.param_dtype", "strategy = 'fsdp2' only"),
        (
            ["parallel.strategy='fsdp2'", "parallel.grad_compression='bf16'"],
            "parallel.grad_compression",
            "strategy = 'ddp' only",
        ),
        (
            ["precision='bf16'", "parallel.strategy='fsdp2'", "parallel.param_dtype='fp32'"],
            "parallel.param_dtype",
            "stores the weights in bf16",
        ),
        (["parallel.grad_compression='int8'"], "parallel.grad_compression", "'none' | 'bf16'"),
        (["parallel.workers=2"], "parallel.workers", "Accepted fields here: strategy"),
    ],
)
def test_parallel_fields_that_do_not_fit_are_refused_by_name(overrides, key, words) -> None:
    with pytest.raises(presets.ConfigError) as caught:
        presets.load_preset("fp32", overrides)
    assert caught.value.key == key
    assert words in str(caught.value)


def test_a_changed_parallel_table_survives_saving() -> None:
    preset = presets.load_preset("amp-fp16", ["parallel.strategy='fsdp2'", "debug.rank=1"])
    text = presets.to_toml(preset)
    assert "[parallel]" in text and 'strategy = "fsdp2"' in text
    again = presets.validate(tomllib.loads(text))
    assert again.parallel == preset.parallel and again.debug.rank == 1
    assert "[parallel]" not in presets.to_toml(presets.load_preset("fp32"))


# ----------------------------------------------------------------------------- the launch


def test_one_machine_uses_a_standalone_rendezvous_on_a_free_port() -> None:
    launch = make_launch(4)
    assert launch.distributed and launch.world_size == 4
    assert launch.torchrun_args() == ["--nproc-per-node", "4", "--standalone"]
    assert not make_launch().distributed and make_launch(1).world_size == 1


def test_several_machines_use_the_endpoint_and_node_rank_given() -> None:
    launch = make_launch(8, 2, 1, "node0:29500", 120)
    assert launch.world_size == 16
    assert launch.torchrun_args() == [
        "--nproc-per-node",
        "8",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--rdzv-endpoint",
        "node0:29500",
        "--rdzv-conf",
        "timeout=120",
    ]
    args = build_parser().parse_args(["run", "fp32", *launch.flags()])
    assert launch_from_args(args) == launch


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        ((0, None, None, None), "--nproc-per-node 0 is out of range"),
        ((2, 2, None, "h:1"), "--nnodes 2 needs --node-rank"),
        ((2, 2, 0, None), "--rdzv-endpoint HOST:PORT"),
        ((2, 2, 2, "h:29500"), "--node-rank 2 is out of range for --nnodes 2. Accepted: 0 to 1"),
        ((2, 2, 0, "h29500"), "is not HOST:PORT"),
        ((2, 2, 0, "h:70000"), "is not HOST:PORT"),
        # torchrun ends on a traceback for each of these: a host it does not read, a port of
        # more than five digits or of digits other than ASCII's
        ((2, 2, 1, "http://node0:29500"), "is not HOST:PORT"),
        ((2, 2, 1, "user@node0:29500"), "is not HOST:PORT"),
        ((2, 2, 1, "node 0:29500"), "is not HOST:PORT"),
        ((2, 2, 1, "h:0029500"), "is not HOST:PORT"),
        ((2, 2, 1, "h:\uff12\uff19\uff15\uff10\uff10"), "is not HOST:PORT"),
        ((2, None, 0, None), "--node-rank only applies to a job on several machines"),
        ((2, None, None, "h:1"), "--rdzv-endpoint only applies"),
    ],
)
def test_launch_flags_that_cannot_work_are_refused(flags, words) -> None:
    with pytest.raises(LaunchError) as caught:
        make_launch(*flags)
    assert words in str(caught.value)


def test_a_bad_launch_flag_is_one_line_and_exit_2(capsys) -> None:
    assert main(["run", "fp32", "--nproc-per-node", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ampscope: --nproc-per-node 0 is out of range")
    assert "Traceback" not in err and err.count("\n") == 1


def test_an_endpoint_torchrun_cannot_read_is_one_line_and_exit_2(capsys) -> None:
    flags = ["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "http://node0:29500"]
    assert main(["run", "fp32", "--nproc-per-node", "2", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ampscope: --rdzv-endpoint 'http://node0:29500' is not HOST:PORT")
    assert "Traceback" not in err and err.count("\n") == 1


def test_the_endpoints_torchrun_reads_are_taken() -> None:
    for endpoint in (
        "node0:29500",
        "my_host.lan:1",
        "10.0.0.1:65535",
        "[::1]:29500",
        "n\u00f6de:80",
    ):
        assert make_launch(2, 2, 1, endpoint).rdzv_endpoint == endpoint


def test_the_dashboard_and_bench_take_the_launch_flags() -> None:
    top = build_parser().parse_args(["--nproc-per-node", "2"])
    assert launch_from_args(top, prefix="top_") == Launch(2)
    bench = build_parser().parse_args(["bench", "fp32", "--nproc-per-node", "3"])
    assert launch_from_args(bench, prefix="top_") == Launch(3)
    both = build_parser().parse_args(["--nproc-per-node", "2", "run", "fp32"])
    assert launch_from_args(both, prefix="top_") == Launch(2)


def test_node_0_finds_its_rendezvous_port_taken_before_launch(capsys) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        taken = make_launch(2, 2, 0, f"127.0.0.1:{port}")
        assert f"port {port} cannot be used" in (port_in_use(taken) or "")
        flags = ["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", f"127.0.0.1:{port}"]
        assert main(["run", "fp32", "--nproc-per-node", "2", *flags]) == 2
        assert f"port {port} cannot be used" in capsys.readouterr().err
    other = make_launch(2, 2, 0, "192.0.2.1:29500")  # TEST-NET: never this machine
    assert "not an address of this machine" in (port_in_use(other) or "")
    assert port_in_use(make_launch(2, 2, 1, f"127.0.0.1:{port}")) is None  # node 1 hosts nothing
    assert port_in_use(make_launch(2)) is None


def test_torchrun_command_starts_the_engine_module_on_every_rank() -> None:
    cmd = engine_command("fp32", ["steps=5"], launch=make_launch(2))
    i = cmd.index("torch.distributed.run")
    assert cmd[i - 1] == "-m"
    assert cmd[i + 1 : i + 4] == ["--nproc-per-node", "2", "--standalone"]
    j = cmd.index("ampscope.engine")
    assert cmd[j - 1] == "-m" and cmd[j + 1] == "fp32" and cmd[-2:] == ["--set", "steps=5"]
    assert "torch.distributed.run" not in engine_command("fp32", launch=make_launch(1))


def test_ranks_share_the_cores_unless_told_otherwise() -> None:
    env = child_env({"PATH": "/bin"}, processes=2)
    assert int(env["OMP_NUM_THREADS"]) >= 1
    assert child_env({"OMP_NUM_THREADS": "7"}, processes=2)["OMP_NUM_THREADS"] == "7"
    assert "OMP_NUM_THREADS" not in child_env({"PATH": "/bin"})


# ----------------------------------------------------------------------------- the ranks


def test_rank_environment_as_torchrun_sets_it() -> None:
    from ampscope.engine.ranks import RankEnv

    assert RankEnv.from_environ({}) == RankEnv()
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    ranks = RankEnv.from_environ({**env, "GROUP_RANK": "1"})
    assert (ranks.rank, ranks.world_size, ranks.local_rank, ranks.node_rank) == (3, 8, 1, 1)
    assert ranks.distributed and not ranks.lead
    assert ranks.device_spec("cuda") == "cuda" and ranks.device_spec("cpu") == "cpu"
    with pytest.raises(presets.ConfigError, match="pins every rank to one GPU"):
        ranks.device_spec("cuda:1")
    with pytest.raises(presets.ConfigError, match="whole numbers"):
        RankEnv.from_environ({"RANK": "x", "WORLD_SIZE": "2"})


def test_more_processes_than_gpus_is_a_user_error() -> None:
    from ampscope.engine import device
    from ampscope.engine.ranks import RankEnv
    from tests.fakes import FakeCuda

    four = FakeCuda(count=4)
    ranks = RankEnv(rank=5, world_size=8, local_rank=5, local_world_size=8)
    with pytest.raises(presets.ConfigError) as caught:
        device.rank_gpu(ranks, four)
    message = str(caught.value)
    assert "--nproc-per-node 8" in message and "torch sees 4 CUDA GPU(s)" in message
    assert "Accepted: --nproc-per-node 1 to 4" in message
    assert (
        device.rank_gpu(RankEnv(rank=3, world_size=4, local_rank=3, local_world_size=4), four) == 3
    )


def figures(rank: int, step: int, ms: float, loss: float = 1.0, scale=(float("nan"),) * 2):
    from ampscope.engine.ranks.link import RankFigures

    values = [loss, 0.5, scale[0], scale[1], float("nan")]
    return RankFigures(rank, step, ms, values, 100 + rank, None, 200 + rank)


def test_steps_come_out_once_every_rank_has_reported_them_in_order() -> None:
    from ampscope.engine.ranks.link import collect

    pending: dict = {}
    # rank 0 has steps 0 and 1 landed, rank 1 only step 0 (a GPU's read-back runs late)
    steps, stop = collect(
        [(False, [figures(0, 0, 5), figures(0, 1, 5)], None), (False, [figures(1, 0, 6)], None)],
        pending,
        2,
    )
    assert [[f.rank for f in s] for s in steps] == [[0, 1]] and steps[0][0].step == 0
    assert not stop
    steps, stop = collect([(False, [], None), (True, [figures(1, 1, 7)], None)], pending, 2)
    assert [s[0].step for s in steps] == [1] and stop  # one rank's stop stops all
    assert pending == {}


def reporter(scaled: bool = False, peak: float | None = 10.0):
    from ampscope.core.records.tally import StepTally
    from ampscope.engine.emitter import EventWriter
    from ampscope.engine.step.metrics import StepReporter

    seen: list[ev.Event] = []
    s = SimpleNamespace(
        policy=SimpleNamespace(use_scaler=scaled),
        workload=SimpleNamespace(step_sizes=lambda step: (8, None, 1.0)),
        flops=SimpleNamespace(per_step=4e9),
        preset=SimpleNamespace(lr=1e-3, grad_zero_every=0),
    )
    stats = StepTally(warmup_steps=0)
    return StepReporter(s, EventWriter(on_event=seen.append), stats, peak), seen, stats


def test_the_job_step_is_the_slowest_rank_over_the_global_batch() -> None:
    rep, seen, stats = reporter()
    rep.report([figures(0, 0, 10.0, loss=2.0), figures(1, 0, 20.0, loss=4.0)])
    step = seen[-1]
    assert isinstance(step, ev.StepEvent)
    assert step.step_ms == 20.0 and step.loss == 3.0  # slowest rank; mean loss
    assert step.samples_per_s == pytest.approx(2 * 8 / 0.020)
    assert step.tflops == pytest.approx(2 * 4e9 / 0.020 / 1e12)
    assert step.mfu == pytest.approx(step.tflops / (2 * 10.0))  # world x peak
    assert step.mem_allocated == 101 and step.mem_peak == 201  # the fullest rank
    assert [(r.rank, r.step_ms, r.loss) for r in step.ranks] == [(0, 10.0, 2.0), (1, 20.0, 4.0)]
    done = stats.done("ok", 4e9, 10.0, samples=8, world_size=2, ranks=stats.rank_done())
    assert done.samples_per_s == pytest.approx(step.samples_per_s) and done.world_size == 2
    assert done.mfu == pytest.approx(step.mfu)
    assert [r.step_ms_median for r in done.ranks] == [10.0, 20.0]


def test_one_process_reports_as_before() -> None:
    rep, seen, _ = reporter()
    rep.report([figures(0, 0, 10.0, loss=2.0)])
    step = seen[-1]
    assert step.ranks is None and step.samples_per_s == pytest.approx(8 / 0.010)


def test_a_skip_on_one_rank_only_is_diverging_replicas() -> None:
    from ampscope.engine.step.metrics import ReplicasDiverged

    rep, _, _ = reporter(scaled=True)
    agree = (1024.0, 512.0)
    rep.report([figures(0, 0, 5, scale=agree), figures(1, 0, 5, scale=agree)])  # both skip: fine
    with pytest.raises(ReplicasDiverged) as caught:
        rep.report([figures(0, 1, 5, scale=(512.0, 256.0)), figures(1, 1, 5, scale=(512.0, 512.0))])
    assert "skipped it on rank(s) 0 but not on rank(s) 1" in str(caught.value)


def test_a_non_finite_loss_on_one_rank_names_it() -> None:
    from ampscope.engine.step.metrics import NonFiniteLoss

    rep, _, _ = reporter()
    with pytest.raises(NonFiniteLoss) as caught:
        rep.report([figures(0, 0, 5, loss=1.0), figures(1, 0, 5, loss=float("inf"))])
    assert caught.value.ranks == [1]


def test_each_rank_takes_its_own_batch_of_the_pool() -> None:
    import torch

    from ampscope.engine.workloads.base import BatchPool

    def pool(rank: int) -> BatchPool:
        p = BatchPool(
            torch.arange(64.0).reshape(32, 2), torch.arange(32), 4, torch.Generator().manual_seed(0)
        )
        p.shard(rank, 2)
        return p

    a, b = pool(0), pool(1)
    for step in range(4):
        assert not torch.equal(a.get(step)[1], b.get(step)[1])
    seen = {int(y) for step in range(4) for p in (a, b) for y in p.get(step)[1]}
    assert len(seen) == 32  # two ranks, four steps: the whole pool, no batch twice


def test_weight_checksum_is_exact_and_order_sensitive() -> None:
    import torch

    from ampscope.engine.step.parallelize import param_checksum

    torch.manual_seed(0)
    a = torch.nn.Linear(4, 3)
    b = torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    assert param_checksum(a) == param_checksum(b)
    with torch.no_grad():
        b.weight[0, 0] = torch.nextafter(b.weight[0, 0], torch.tensor(10.0))  # one ulp
    assert param_checksum(a) != param_checksum(b)
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        b.weight[0, 0], b.weight[0, 1] = a.weight[0, 1].clone(), a.weight[0, 0].clone()
    assert param_checksum(a) != param_checksum(b)
    half = torch.nn.Linear(4, 3).to(torch.bfloat16)
    assert len(param_checksum(half)) == 16


def test_fsdp2_shards_the_outermost_blocks() -> None:
    from ampscope.engine.step.parallelize import shard_units
    from ampscope.engine.workloads.gpt import Gpt
    from ampscope.engine.workloads.mlp import mlp

    gpt = Gpt(vocab=32, seq_len=8, width=16, layers=3, heads=2)
    assert shard_units(gpt) == list(gpt.blocks)
    net = mlp(8, 3, 4)
    assert shard_units(net) == [m for m in net if any(True for _ in m.parameters())]
