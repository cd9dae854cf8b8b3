"""A stand-in for ``ampscope plan`` in the plan screen's tests: no torch, a fixed answer.

``python fake_plan.py MODE TARGET --model SPEC --json``, MODE one of:

answer   progress on stderr, the files written under ./plans/, then tests/data/plan-TARGET.json
         (answer=FILE: FILE's plan instead)
refuse   exit 2 with ampscope's one-paragraph message naming the model, after a progress line
crash    a traceback, exit 1
garbage  exit 0 with something that is not a plan
wait     a progress line, then it waits (a minute) to be stopped
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def answer(target: str, model: str, path: Path) -> int:
    print(f"ampscope plan: measuring one step of {model} in fp32 ...", file=sys.stderr)
    print("ampscope plan: casting every layer's tensors with 3 recipes ...", file=sys.stderr)
    plan = json.loads(path.read_text())
    for key, path in plan["files"].items():
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            text = f'name = "plan-{target}"\nprecision = "{target}"\n' if key == "preset" else ""
            Path(path).write_text(text)
    print(f"ampscope plan: wrote {plan['files']['preset']}", file=sys.stderr)
    print(json.dumps(plan))
    return 0


def main(argv: list[str]) -> int:
    mode, target, _model_flag, model, *_rest = argv
    if mode.startswith("answer"):
        _, _, path = mode.partition("=")
        return answer(target, model, Path(path) if path else HERE / f"plan-{target}.json")
    print(f"ampscope plan: measuring one step of {model} in fp32 ...", file=sys.stderr)
    if mode == "refuse":
        print(
            f"ampscope: --model {model}: the file does not exist. Accepted: FILE.py:FUNCTION "
            "or MODULE:FUNCTION.",
            file=sys.stderr,
        )
        return 2
    if mode == "crash":
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    if mode == "garbage":
        print("Loading checkpoint shards: 100%")
        return 0
    time.sleep(60)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
