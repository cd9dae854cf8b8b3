#!/usr/bin/env bash
# The GPU check: every CUDA path of ampscope once, its figures checked, in one 10-minute command.
#
#   bash benchmarks/gpu_check.sh OUTDIR
#
# Writes OUTDIR/log.txt (everything printed), OUTDIR/checks.txt (PASS|FAIL|SKIP name: detail),
# OUTDIR/summary.json (every figure), OUTDIR/gpu-results.md (for docs/gpu-results.md) and the
# run records under OUTDIR/runs/<stage>/. Exits 1 when a check fails. docs/gpu-check.md says
# what each check means and how a lent machine runs this.
#
# Runs from the checkout (PYTHONPATH, no install) with python3 (or $PY). Environment:
#   GPU_CHECK_SMOKE=1        every stage at tiny sizes on the CPU; GPU-only checks SKIP
#   GPU_CHECK_INJECT_FAIL=1  the tf32 probe is made to fail, so one check FAILs (exit 1)
#   GPU_CHECK_STAGES=a,b     run only these stages (names below); the others' checks SKIP
#   GPU_CHECK_BUDGET_S=555   seconds for all stages together; a stage gets what is left
#   FP8_LAYERS=4             layers of the Llama large in the fp8 stage (16 is the full model)
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:?usage: bash benchmarks/gpu_check.sh OUTDIR}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
PY="${PY:-python3}"

if [ -z "${_GPU_CHECK_LOGGED:-}" ]; then  # once, everything into log.txt as well
  _GPU_CHECK_LOGGED=1 bash "$0" "$@" 2>&1 | tee "$out/log.txt"
  exit "${PIPESTATUS[0]}"
fi

export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$(mktemp -d /tmp/gpu-check-inductor.XXXXXX)}"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$(mktemp -d /tmp/gpu-check-triton.XXXXXX)}"
smoke="${GPU_CHECK_SMOKE:-0}"
inject="${GPU_CHECK_INJECT_FAIL:-0}"
only="${GPU_CHECK_STAGES:-}"
budget="${GPU_CHECK_BUDGET_S:-555}"
reserve=15  # seconds kept for the checks at the end
start=$(date +%s)
deadline=$((start + budget))
A=("$PY" -m ampscope)
CHECK=("$PY" "$root/benchmarks/gpu_check.py")

# What each stage trains: sizes for an H100/H200, tiny ones on the CPU in smoke mode.
if [ "$smoke" = 1 ]; then
  dev=(--set "device='cpu'")
  gpt=("${dev[@]}" --set "workload.size='small'" --set "workload.layers=1" --set "workload.width=32"
    --set "workload.heads=2" --set "workload.seq_len=32" --set "batch_size=8")
  tiny=("${dev[@]}" --set "workload.kind='mlp'" --set "workload.size='small'")
  eager_steps=8 compile_steps=5 fp8_steps=8 rank_steps=6 warm=2
  fp8_set=("${gpt[@]}" --set "workload.kind='llama'" --set "workload.kv_heads=1"
    --set "compile='off'" --set "fp8.emulate=true")
  probe_set=("${tiny[@]}" --set "compile='default'")
  rank_set=("${tiny[@]}")
  compile_set=("${tiny[@]}")  # two cold compiles of an MLP: 20-30 s each on two cores
  tui_start="amp-bf16 device=cpu workload.kind=mlp workload.size=small steps=100000"
else
  dev=(--set "device='cuda'")
  gpt=("${dev[@]}")
  tiny=("${dev[@]}" --set "workload.size='small'")
  eager_steps=40 compile_steps=40 fp8_steps=40 rank_steps=20 warm=5
  fp8_set=("${dev[@]}" --set "workload.kind='llama'" --set "workload.size='large'"
    --set "workload.layers=${FP8_LAYERS:-4}")
  probe_set=("${tiny[@]}" --set "compile='max-autotune-no-cudagraphs'")
  rank_set=("${tiny[@]}")
  compile_set=("${gpt[@]}")
  tui_start="amp-bf16 device=cuda steps=100000"
fi
[ "$inject" = 1 ] && probe_set+=(--set "debug.raise_at_step=2")

# stage NAME MAX_S: stage_NAME under a timeout of MAX_S or the time left, whichever is less,
# in a fresh bash (timeout stops its whole process group; engines go with their parent). The
# exit status and seconds go to stages.tsv, where the checks read them.
stage() {
  local name=$1 max=$2 left t0 rc
  if [ -n "$only" ] && [[ ",$only," != *",$name,"* ]]; then
    return 0
  fi
  left=$((deadline - $(date +%s) - reserve))
  [ "$max" -gt "$left" ] && max=$left
  if [ "$max" -lt 10 ]; then
    echo "== $name: not run, the check's time (GPU_CHECK_BUDGET_S=$budget) is spent"
    printf '%s\tnot-run\t0\t0\n' "$name" >> "$out/stages.tsv"
    return 0
  fi
  echo "== $name (at most $max s)"
  t0=$(date +%s)
  _GPU_CHECK_STAGE="$name" timeout -k 20 "$max" bash "$0" "$out"
  rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - t0))" "$max" >> "$out/stages.tsv"
  [ "$rc" -ne 0 ] && echo "== $name: exit $rc" && sleep 2  # a killed engine lets go of the GPU
  # Checks so far, so that a command killed at its limit still leaves them.
  "${CHECK[@]}" check "$out" --interim-after "$name" > /dev/null 2>&1
  return 0
}

stage_preflight() {
  local p="$out/preflight"
  mkdir -p "$p"
  echo "python: $("$PY" --version 2>&1) at $(command -v "$PY")"
  echo "cc: $(command -v cc || echo none)" | tee "$p/cc.txt"
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,mig.mode.current,power.limit,driver_version,memory.total \
      --format=csv,noheader | tee "$p/nvidia-smi.csv"
  else
    echo "nvidia-smi: not found"
  fi
  "${CHECK[@]}" imports "$p/imports.json" || return 1
  "${A[@]}" doctor --json --try-compile > "$p/doctor.json" || return 1
  cat "$p/doctor.json"
}

bench() {  # bench STAGE PRESET... ARGS: one repeat of each, records under runs/STAGE
  local name=$1
  shift
  "${A[@]}" bench "$@" --repeats 1 --runs-dir "$out/runs/$name" --markdown
}

one_rank() {  # one_rank STRATEGY PRESET: the several-process path (NCCL or gloo) on one rank
  mkdir -p "$out/runs/ranks"
  "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 -m ampscope.engine "$2" \
    --steps "$rank_steps" --set "parallel.strategy='$1'" "${rank_set[@]}" \
    --runs-dir "$out/runs/ranks" | tail -1 | cut -c1-300
}

stage_ranks() {
  local gpus=0 s
  [ "$smoke" = 1 ] || gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())")
  local rc=0
  one_rank ddp amp-bf16 || rc=1
  one_rank fsdp2 amp-bf16 || rc=1
  one_rank fsdp2 amp-fp16 || rc=1  # ShardedGradScaler and AdamW on DTensors, one rank
  if [ "${gpus:-0}" -ge 2 ]; then  # and across GPUs
    for s in ddp fsdp2; do
      for p in amp-bf16 amp-fp16; do
        "${A[@]}" run "$p" --nproc-per-node "$gpus" --steps "$rank_steps" "${rank_set[@]}" \
          --set "parallel.strategy='$s'" --runs-dir "$out/runs/ranks" | tail -4 || rc=1
      done
    done
  fi
  return "$rc"
}

stage_probe() {
  "${A[@]}" run tf32 --steps 4 "${probe_set[@]}" --set warmup_steps=1 --runs-dir "$out/runs/probe"
}

stage_eager() {
  bench eager fp32 tf32 amp-bf16 amp-fp16 amp-fp16-noscale bf16 fp16 --baseline fp32 \
    --steps "$eager_steps" "${gpt[@]}" --set "warmup_steps=$warm"
}

stage_compile() {
  bench compile compile-default compile-reduce-overhead --baseline compile-default \
    --steps "$compile_steps" "${compile_set[@]}" --set "warmup_steps=$((warm - 2))"
}

stage_fp8() {
  bench fp8 compile-default fp8-tensorwise fp8-rowwise --baseline compile-default \
    --steps "$fp8_steps" "${fp8_set[@]}" --set "warmup_steps=$warm"
}

stage_dashboard() {
  "${CHECK[@]}" dashboard "$out/dashboard.json" --runs-dir "$out/runs/dashboard" \
    --autostart "$tui_start" -- "${A[@]}"
}

stage_max_autotune() {
  bench max-autotune compile-max-autotune --steps 25 "${gpt[@]}" --set warmup_steps=10
}

if [ -n "${_GPU_CHECK_STAGE:-}" ]; then  # one stage, started by stage() below
  "stage_${_GPU_CHECK_STAGE//-/_}"
  exit $?
fi

rm -f "$out/stages.tsv" "$out/checks.txt"
mkdir -p "$out/runs"
echo "ampscope GPU check$([ "$smoke" = 1 ] && echo ' (smoke: CPU, tiny sizes)') into $out"
echo "budget $budget s; caches in $TORCHINDUCTOR_CACHE_DIR and $TRITON_CACHE_DIR"
printf '{"smoke": %s, "inject_fail": %s, "stages": "%s", "budget_s": %s}\n' \
  "$([ "$smoke" = 1 ] && echo true || echo false)" \
  "$([ "$inject" = 1 ] && echo true || echo false)" "$only" "$budget" > "$out/mode.json"

stage preflight 90
stage probe 120
stage eager 180
stage compile 180
stage fp8 200
stage ranks 100
stage dashboard 60
if [ "$smoke" = 1 ]; then  # max-autotune on a CPU autotunes C++ GEMMs for minutes
  echo "== max-autotune: a GPU stage, left out of the smoke run"
else  # last, with its own timeout: the longest compile, given whatever time is left
  stage max-autotune 240
fi

echo "== checks ($(($(date +%s) - start)) s so far)"
"${CHECK[@]}" check "$out"
rc=$?
echo "== done in $(($(date +%s) - start)) s: $out/checks.txt, summary.json, gpu-results.md"
exit "$rc"
