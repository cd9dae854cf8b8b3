#!/usr/bin/env bash
# The GPU check, for a machine with a CUDA GPU: every preset for a few dozen steps, NVML live,
# MFU, the compile modes, and the instrumentation overhead on CUDA. Prints a report and keeps
# the run records (small: a few hundred KB) for replays.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]      (default: gpu_check/)
#
# Budget: about 5 minutes on an H100/H200, most of it compiling. Needs torch with CUDA.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu_check}}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR="$out/inductor-cache"
steps="${STEPS:-60}"

echo "== doctor"
python -m ampscope doctor | tee "$out/doctor.txt"
python -m ampscope doctor --json > "$out/doctor.json"

echo "== the lecture's sweep, $steps steps each"
python -m ampscope bench fp32 tf32 amp-bf16 amp-fp16 amp-fp16-noscale bf16 fp16 \
  --steps "$steps" --set warmup_steps=10 --runs-dir "$out/runs" --markdown | tee "$out/bench.md"

echo "== compile modes on top of amp-bf16"
timeout 600 python -m ampscope bench amp-bf16 compile-default compile-reduce-overhead \
  compile-max-autotune --baseline amp-bf16 --steps "$steps" --set warmup_steps=15 \
  --runs-dir "$out/runs" --markdown | tee "$out/compile.md"

echo "== NVML samples seen by the engine (last run)"
last=$(ls -d "$out"/runs/*/ | grep -v sweep | tail -1)
grep '"type":"sys"' "$last/events.jsonl" | tail -3 | tee "$out/sys_sample.jsonl"
grep '"type":"warning"' "$out"/runs/*/events.jsonl | cut -c1-300 | tee "$out/warnings.txt"

echo "== instrumentation overhead on CUDA"
python benchmarks/overhead.py amp-bf16 --set device=cuda --blocks 8 --block-steps 20 \
  | tee "$out/overhead.txt"
python benchmarks/overhead.py mlp-demo --set device=cuda --set "workload.size='small'" \
  --blocks 8 --block-steps 50 | tee -a "$out/overhead.txt"
echo "report in $out/"
