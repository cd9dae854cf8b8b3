"""Numerics on every step against Hugging Face's ``DebugUnderflowOverflow``, side by side.

One tiny ViT (tests/data/real_models.py's, 16 patches an image; fp32, one thread) is trained
three ways in interleaved blocks of steps: bare;
with ``transformers.debug_utils.DebugUnderflowOverflow`` attached (forward hooks on every
module: each weight's, input's and output's abs min and max, and an inf/NaN check); and with
``ampscope.watch(numerics_every=1)`` (every leaf module's outputs and their gradients and every
parameter's gradient, forward and backward, against fp16, bf16 and both fp8 formats: amax,
smallest non-zero, the shares that overflow and round to zero, the fp8 shares after amax
scaling, and the first inf/NaN). Each
way has its own copy of the model (the Hugging Face hooks stay on the model they are put on),
the same weights and the same batches. A block's time is its mean step; each way's figure is
the median of its blocks. It prints the step times, each against bare, and ampscope's cost over
the Hugging Face tool's, by the wall clock and by this process's CPU time (which other
processes on a shared machine inflate less).

    python benchmarks/numerics_peer.py [--blocks 12] [--block-steps 8] [--threads 1]

Needs ``transformers`` (the test extra). Figures are in docs/numerics.md.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402

VIT = Path(__file__).resolve().parent.parent / "tests" / "data" / "real_models.py"


def real_models() -> ModuleType:
    """tests/data/real_models.py: the ViT (on ``nn.MultiheadAttention``) the tests train."""
    spec = importlib.util.spec_from_file_location("real_models", VIT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--block-steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=96)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    from transformers.debug_utils import DebugUnderflowOverflow

    import ampscope

    models = real_models()
    torch.manual_seed(0)
    base = models.ViT(args.width, args.depth, heads=4)
    images = torch.randn(4, args.batch, models.CHANNELS, models.IMAGE, models.IMAGE)
    labels = torch.randint(models.CLASSES, (4, args.batch))
    tmp = tempfile.TemporaryDirectory()

    def trainer(
        after: Callable[[torch.Tensor], None],
    ) -> tuple[nn.Module, torch.optim.Optimizer, Callable[[int], None]]:
        model = copy.deepcopy(base)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(i: int) -> None:
            loss = nn.functional.cross_entropy(model(images[i % 4]), labels[i % 4])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            after(loss)

        return model, opt, step

    def plain(loss: torch.Tensor) -> None:
        loss.item()  # as a loop that logs its loss does (watch reads it a step late)

    _, _, bare = trainer(plain)
    hf_model, _, hf = trainer(plain)
    DebugUnderflowOverflow(hf_model)
    monitors: list = []
    watched_model, opt, watched = trainer(lambda loss: monitors[0].step(loss))
    monitors.append(
        ampscope.watch(
            watched_model, opt, name="numerics-peer", runs_dir=tmp.name, numerics_every=1
        )
    )
    ways = {"bare": bare, "Hugging Face": hf, "ampscope": watched}
    counters = dict.fromkeys(ways, 0)

    def run(way: str, steps: int) -> tuple[float, float]:
        """Wall and CPU (this process's, every thread) milliseconds a step."""
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            ways[way](counters[way])
            counters[way] += 1
        return (
            (time.perf_counter() - wall) * 1000 / steps,
            (time.process_time() - cpu) * 1000 / steps,
        )

    for way in ways:  # warm-up every path
        run(way, 3)
    means: dict[str, list[tuple[float, float]]] = {w: [] for w in ways}
    for _ in range(args.blocks):
        for way in ways:
            means[way].append(run(way, args.block_steps))
    monitors[0].close()
    sampled = count_numerics(Path(tmp.name))
    tmp.cleanup()
    leaves = sum(1 for m in base.modules() if not any(m.children()))
    print(
        f"tiny ViT (width {args.width}, depth {args.depth}, batch {args.batch}, {leaves} leaf "
        f"modules), fp32, {torch.get_num_threads()} thread(s), {args.blocks} blocks of "
        f"{args.block_steps} steps a way, interleaved; medians of the blocks' mean step"
    )
    wall = {w: statistics.median(m[0] for m in means[w]) for w in ways}
    cpu = {w: statistics.median(m[1] for m in means[w]) for w in ways}
    print(f"  {'':<13} {'wall':>16}   {'CPU':>16}")
    for way in ways:
        print(
            f"  {way:<13} {wall[way]:7.2f} ms x{wall[way] / wall['bare']:.2f}"
            f"   {cpu[way]:7.2f} ms x{cpu[way] / cpu['bare']:.2f}"
        )
    for clock, m in (("wall", wall), ("CPU", cpu)):
        ours, theirs = m["ampscope"] - m["bare"], m["Hugging Face"] - m["bare"]
        print(
            f"  {clock:>4}: ampscope's cost / the Hugging Face tool's = {ours / theirs:.2f} "
            f"(step time x{m['ampscope'] / m['Hugging Face']:.2f})"
        )
    print(f"  numerics events recorded: {sampled} of {counters['ampscope']} steps")


def count_numerics(runs: Path) -> int:
    """The ``numerics`` events in the watched run's record: one a step when every step is."""
    return sum(
        line.startswith('{"type":"numerics"') or '"type": "numerics"' in line
        for path in runs.rglob("events.jsonl")
        for line in path.read_text().splitlines()
    )


if __name__ == "__main__":
    main()
