#!/usr/bin/env bash
# The GPU check, for a machine with a CUDA GPU: every preset for a few dozen steps, NVML live,
# MFU, the compile modes, and the instrumentation overhead on CUDA. Prints a report and keeps
# the run records (small: a few hundred KB) for replays.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]      (default: gpu_check/)
#
# Budget: about 8 minutes on an H100/H200, most of it compiling, plus a minute or two for the
# several-process runs (all GPUs found, or one rank under torchrun on a single GPU). Needs
# torch with CUDA (and torchao, ampscope[fp8], for the fp8 section, which writes
# docs/fp8_gpu_check.md).
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
echo "== several processes (torchrun): DDP, FSDP2, the NCCL compression hook, scaling"
gpus=$(python -c "import torch; print(torch.cuda.device_count())")
if [ "${gpus:-0}" -ge 2 ]; then
  n="$gpus"
  for extra in "" "--set parallel.strategy=fsdp2" "--set parallel.grad_compression=bf16"; do
    # shellcheck disable=SC2086
    python -m ampscope run amp-bf16 --nproc-per-node "$n" --steps "$steps" --set warmup_steps=10 \
      --runs-dir "$out/runs" $extra 2>&1 | tail -16 | tee -a "$out/ranks.txt"
  done
  python -m ampscope run amp-fp16 --nproc-per-node "$n" --steps "$steps" --set warmup_steps=10 \
    --set parallel.strategy=fsdp2 --runs-dir "$out/runs" 2>&1 | tail -16 | tee -a "$out/ranks.txt"
  python benchmarks/scaling.py amp-bf16 --nproc "$n" --steps 40 | tee "$out/scaling.txt"
else
  echo "one GPU: more processes than GPUs must be refused (exit 2), then one rank under torchrun"
  python -m ampscope run amp-bf16 --nproc-per-node 2 --steps 5 2>&1 | tee "$out/ranks.txt"
  echo "exit ${PIPESTATUS[0]} (expected 2)" | tee -a "$out/ranks.txt"
  for extra in "" "--set parallel.strategy='fsdp2'" "--set parallel.grad_compression='bf16'"; do
    # the same code path as on eight GPUs: NCCL, DDP or FSDP2, the step exchange, on one rank
    # shellcheck disable=SC2086
    python -m torch.distributed.run --standalone --nproc-per-node 1 -m ampscope.engine amp-bf16 \
      --steps "$steps" --runs-dir "$out/runs" $extra | tail -1 | cut -c1-400 | tee -a "$out/ranks.txt"
  done
fi

echo "report in $out/"
