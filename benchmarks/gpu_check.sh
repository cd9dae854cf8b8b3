#!/usr/bin/env bash
# The GPU check, for a machine with a CUDA GPU: every preset for a few dozen steps, NVML live,
# MFU, the compile modes, and the instrumentation overhead on CUDA. Prints a report and keeps
# the run records (small: a few hundred KB) for replays.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]      (default: gpu_check/)
#
# Budget: about 8 minutes on an H100/H200, most of it compiling. Needs torch with CUDA (and
# torchao, ampscope[fp8], for the fp8 section, which writes docs/fp8_gpu_check.md).
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

echo "== fp8 (torchao) against amp-bf16, all compiled, on the large model(s)"
# Speedup and final-loss difference go to docs/fp8_gpu_check.md, beside the bench tables.
fp8_steps="${FP8_STEPS:-150}"
fp8_doc="docs/fp8_gpu_check.md"
if python -c "import torchao" 2>/dev/null; then
  kinds="gpt"
  python -c "from ampscope.core.config import WORKLOAD_SIZES as w; raise SystemExit('llama' not in w)" \
    && kinds="gpt llama"
  {
    echo "# fp8 on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
    echo
    echo "$(date -u +%Y-%m-%d), torch $(python -c 'import torch; print(torch.__version__)'), torchao" \
      "$(python -c 'from importlib.metadata import version; print(version("torchao"))')," \
      "$fp8_steps steps, warm-up 15. compile-default is amp-bf16 compiled; MFU of fp8 rows is" \
      "against the fp8 dense peak (twice bf16's), so compare step time and speedup, not MFU."
  } > "$fp8_doc"
  for kind in $kinds; do
    echo "== fp8: $kind"
    { echo; echo "## $kind, size large"; echo; } >> "$fp8_doc"
    timeout 900 python -m ampscope bench compile-default fp8-tensorwise fp8-rowwise \
      --baseline compile-default --steps "$fp8_steps" --set warmup_steps=15 \
      --set "workload.kind='$kind'" --set "workload.size='large'" \
      --runs-dir "$out/runs" --markdown | tee -a "$fp8_doc"
  done
  cp "$fp8_doc" "$out/fp8.md"
else
  echo "torchao is not installed: pip install 'ampscope[fp8]' to run the fp8 comparison" \
    | tee "$out/fp8.md"
fi

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
