#!/usr/bin/env bash
# The GPU check: every CUDA path of ampscope once, its figures checked, in one 10-minute command.
#
#   bash benchmarks/gpu_check.sh OUTDIR
#
# Writes OUTDIR/log.txt (everything printed), OUTDIR/checks.txt (PASS|FAIL|SKIP name: detail),
# OUTDIR/summary.json (every figure), OUTDIR/gpu-results.md (for docs/gpu-results.md) and the
# run records under OUTDIR/runs/<stage>/. Exits 1 when a check fails, 2 when OUTDIR is not
# empty. docs/gpu-check.md says what each check means and how a lent machine runs this.
#
# Runs from the checkout (PYTHONPATH, no install) with python3 (or $PY). Environment:
#   GPU_CHECK_SMOKE=1        every stage but max-autotune at tiny sizes on the CPU, fewer presets;
#                            GPU-only checks SKIP
#   GPU_CHECK_INJECT_FAIL=1  the tf32 probe is made to fail, so its checks FAIL (exit 1)
#   GPU_CHECK_STAGES=a,b     run only these stages (names below); the others' checks SKIP
#   GPU_CHECK_BUDGET_S=480   seconds for all stages together; a stage gets what is left, and one
#                            that would not get the seconds it needs is not started (SKIP)
#   GPU_CHECK_DRY_RUN=1      run nothing: write every stage's commands to OUTDIR/plan.txt
#   FP8_LAYERS=4             layers of the Llama large in the fp8 stage (16 is the full model)
# shellcheck disable=SC2317  # the stage_* functions are called by name
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:?usage: bash benchmarks/gpu_check.sh OUTDIR}"
PY="${PY:-python3}"

if [ -z "${_GPU_CHECK_LOGGED:-}" ]; then  # once, everything into log.txt as well
  if [ -n "$(ls -A "$out" 2> /dev/null)" ]; then
    echo "gpu_check: OUTDIR '$out' is not empty; its checks would read an earlier run's" \
      "records too. Give a new folder, or empty this one." >&2
    exit 2
  fi
  mkdir -p "$out" && out="$(cd "$out" && pwd)"
  _GPU_CHECK_LOGGED=1 bash "$0" "$out" 2>&1 | tee "$out/log.txt"
  exit "${PIPESTATUS[0]}"
fi

export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
smoke="${GPU_CHECK_SMOKE:-0}"
inject="${GPU_CHECK_INJECT_FAIL:-0}"
dry="${GPU_CHECK_DRY_RUN:-0}"
only="${GPU_CHECK_STAGES:-}"
# A smoke run rehearses on a CPU that other work shares: its stages get four times the limits
# (and the budget) a GPU's have, so that a busy machine slows it without failing it.
slack=1
[ "$smoke" = 1 ] && slack="${GPU_CHECK_SMOKE_SLACK:-4}"
budget="${GPU_CHECK_BUDGET_S:-$((480 * slack))}"
reserve=15  # seconds kept for the checks at the end

# Every command a stage runs goes through x: a dry run writes it to plan.txt instead, one line
# a command (the stage's name, then the words as the shell quotes them).
x() {
  if [ "$dry" = 1 ]; then
    { printf '%s' "${_GPU_CHECK_STAGE:-main}"; printf ' %q' "$@"; echo; } >> "$out/plan.txt"
    return 0
  fi
  "$@"
}
A=(x "$PY" -m ampscope)
CHECK=(x "$PY" "$root/benchmarks/gpu_check.py")
TORCHRUN=(x "$PY" -m torch.distributed.run --standalone --nproc-per-node 1)

# What each stage trains: sizes for an H100/H200, tiny ones on the CPU in smoke mode, where a
# stage runs only the presets its checks need (every preset's GPU command line is validated by
# tests/test_gpu_check_plan.py instead).
if [ "$smoke" = 1 ]; then
  dev=(--set "device='cpu'")
  gpt=("${dev[@]}" --set "workload.size='small'" --set "workload.layers=1" --set "workload.width=32"
    --set "workload.heads=2" --set "workload.seq_len=32" --set "batch_size=8")
  small_gpt=("${gpt[@]}")
  tiny=("${dev[@]}" --set "workload.kind='mlp'" --set "workload.size='small'"
    --set "workload.layers=1" --set "workload.width=32")
  eager=(amp-fp16)  # its GradScaler; the other presets' checks are GPU figures
  compiled=(compile-reduce-overhead)  # one mode: on the CPU its C++ build is the cost
  fp8=(compile-default fp8-tensorwise)
  one_rank=("fsdp2 amp-fp16")
  probes=(tf32)
  doctor=(doctor --json)  # the compile stage is the smoke run's compile on the CPU
  machine=(doctor --bench --quick --bench-device cpu --json)  # small shapes: seconds
  eager_steps=4 compile_steps=4 fp8_steps=4 rank_steps=4 numerics_steps=2 warm=1
  fp8_set=("${gpt[@]}" --set "workload.kind='llama'" --set "workload.kv_heads=1"
    --set "compile='off'" --set "fp8.emulate=true")
  probe_set=("${tiny[@]}")  # eager: a cold C++ compile costs 15 s of CPU, and says nothing of TF32
  compile_set=("${tiny[@]}")
  rank_set=("${tiny[@]}")
  tui_start="amp-bf16 device=cpu workload.kind=mlp workload.size=small steps=100000"
else
  dev=(--set "device='cuda'")
  gpt=("${dev[@]}")
  small_gpt=("${dev[@]}" --set "workload.size='small'")
  tiny=("${dev[@]}" --set "workload.kind='mlp'" --set "workload.size='small'")
  eager=(fp32 tf32 amp-bf16 amp-fp16 amp-fp16-noscale bf16 fp16)
  compiled=(compile-default compile-reduce-overhead)
  fp8=(compile-default fp8-tensorwise fp8-rowwise)
  one_rank=("ddp amp-bf16" "fsdp2 amp-fp16")
  probes=(tf32 fp32)  # the states after which torch's legacy TF32 getters used to raise
  doctor=(doctor --json --try-compile cuda)  # the CPU's first C++ build took it past 75 s
  machine=(doctor --bench --bench-device cuda --json)  # about 6 s of GPU work
  eager_steps=40 compile_steps=40 fp8_steps=30 rank_steps=20 numerics_steps=4 warm=5
  # lr 6e-4: at the presets' 3e-3 the width-2048 Llama's loss rose from 10.8 to 11.3 in 30
  # steps on an H200, compiled amp-bf16 and both fp8 recipes alike
  fp8_set=("${dev[@]}" --set "workload.kind='llama'" --set "workload.size='large'"
    --set "workload.layers=${FP8_LAYERS:-4}" --set "lr=0.0006")
  # A tiny CNN: inductor's convolution templates (which read cudnn.allow_tf32) and its mm
  # templates (the matmul getters) under max-autotune, on few shapes, so autotuning is short.
  probe_set=("${dev[@]}" --set "workload.kind='cnn'" --set "workload.size='small'"
    --set "workload.layers=2" --set "compile='max-autotune-no-cudagraphs'")
  compile_set=("${gpt[@]}")
  rank_set=("${tiny[@]}")
  tui_start="amp-bf16 device=cuda steps=100000"
fi
[ "$inject" = 1 ] && probe_set+=(--set "debug.raise_at_step=2")

# stage NAME CAP NEED: stage_NAME in a fresh bash under a timeout of CAP seconds or what is left
# of the budget, whichever is less (timeout stops its whole process group; engines go with their
# parent). With less than NEED seconds left it is not started. The exit status, seconds, limit,
# CAP and NEED go to stages.tsv, where the checks read them.
stage() {
  local name=$1 cap=$(($2 * slack)) need=$(($3 * slack)) max left t0 rc
  if [ -n "$only" ] && [[ ",$only," != *",$name,"* ]]; then
    return 0
  fi
  if [ "$dry" = 1 ]; then
    echo "# stage $name: at most $cap s, started with $need s or more left" >> "$out/plan.txt"
    _GPU_CHECK_STAGE="$name" bash "$0" "$out"
    return 0
  fi
  left=$((deadline - $(date +%s) - reserve))
  max=$((cap < left ? cap : left))
  if [ "$left" -lt "$need" ]; then
    echo "== $name: not started, $left s of the budget (GPU_CHECK_BUDGET_S=$budget) left and it" \
      "needs $need s; GPU_CHECK_STAGES=$name runs it alone"
    printf '%s\tno-time\t0\t%s\t%s\t%s\n' "$name" "$left" "$cap" "$need" >> "$out/stages.tsv"
    return 0
  fi
  echo "== $name (at most $max s)"
  t0=$(date +%s)
  _GPU_CHECK_STAGE="$name" timeout -k 20 "$max" bash "$0" "$out"
  rc=$?
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - t0))" "$max" "$cap" "$need" \
    >> "$out/stages.tsv"
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
    x nvidia-smi --query-gpu=name,mig.mode.current,power.limit,driver_version,memory.total \
      --format=csv,noheader | tee "$p/nvidia-smi.csv"
  else
    echo "nvidia-smi: not found"
  fi
  local rc=0
  "${CHECK[@]}" imports "$p/imports.json" || rc=1
  "${A[@]}" "${doctor[@]}" > "$p/doctor.json" || rc=1
  cat "$p/doctor.json"
  return "$rc"
}

bench() {  # bench STAGE PRESET... ARGS: one repeat of each, records under runs/STAGE
  local name=$1
  shift
  "${A[@]}" bench "$@" --repeats 1 --runs-dir "$out/runs/$name" --markdown
}

stage_probe() {
  local p rc=0
  for p in "${probes[@]}"; do
    "${A[@]}" run "$p" --steps 4 "${probe_set[@]}" --set warmup_steps=1 \
      --runs-dir "$out/runs/probe" || rc=1
  done
  return "$rc"
}

stage_eager() {
  bench eager "${eager[@]}" --baseline "${eager[0]}" --steps "$eager_steps" "${gpt[@]}" \
    --set "warmup_steps=$warm"
}

stage_compile() {
  bench compile "${compiled[@]}" --baseline "${compiled[0]}" --steps "$compile_steps" \
    "${compile_set[@]}" --set "warmup_steps=$warm"
}

stage_fp8() {
  bench fp8 "${fp8[@]}" --baseline compile-default --steps "$fp8_steps" "${fp8_set[@]}" \
    --set "warmup_steps=$warm"
}

stage_ranks() {  # the several-process path (NCCL, gloo on the CPU) on one rank, then across GPUs
  local gpus=0 s p one rc=0
  if [ "$dry" = 1 ]; then
    gpus="${GPU_CHECK_DRY_RUN_GPUS:-1}"
  elif [ "$smoke" != 1 ]; then
    gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())")
  fi
  mkdir -p "$out/runs/ranks"
  for one in "${one_rank[@]}"; do
    read -r s p <<< "$one"
    "${TORCHRUN[@]}" -m ampscope.engine "$p" --steps "$rank_steps" \
      --set "parallel.strategy='$s'" "${rank_set[@]}" --runs-dir "$out/runs/ranks" \
      | tail -1 | cut -c1-300 || rc=1
  done
  if [ "${gpus:-0}" -ge 2 ]; then  # and across GPUs: NCCL; ShardedGradScaler on DTensors
    for one in "ddp amp-bf16" "fsdp2 amp-fp16"; do
      read -r s p <<< "$one"
      "${A[@]}" run "$p" --nproc-per-node "$gpus" --steps "$rank_steps" "${rank_set[@]}" \
        --set "parallel.strategy='$s'" --runs-dir "$out/runs/ranks" | tail -4 || rc=1
    done
  fi
  return "$rc"
}

stage_dashboard() {
  "${CHECK[@]}" dashboard "$out/dashboard.json" --runs-dir "$out/runs/dashboard" \
    --autostart "$tui_start" -- "$PY" -m ampscope
}

stage_profile() {  # torch.profiler: kernel times from CUPTI on a GPU (no record: no large trace)
  mkdir -p "$out/profile"
  "${A[@]}" profile amp-bf16 --steps 3 --json "${gpt[@]}" --no-record \
    > "$out/profile/profile.json" || return 1
  head -c 600 "$out/profile/profile.json" && echo
}

stage_numerics() {  # every layer's outputs and gradients measured at every step
  mkdir -p "$out/numerics"
  "${A[@]}" numerics amp-fp16 --steps "$numerics_steps" --json "${small_gpt[@]}" \
    --runs-dir "$out/runs/numerics" > "$out/numerics/numerics.json" || return 1
  head -c 600 "$out/numerics/numerics.json" && echo
}

stage_machine() {  # what each format and the memory deliver: doctor --bench beside the datasheet
  mkdir -p "$out/machine"
  "${A[@]}" "${machine[@]}" > "$out/machine/machine.json" || return 1
  head -c 600 "$out/machine/machine.json" && echo
}

stage_max_autotune() {  # the small GPT: its autotuning fits a slot; eager beside it, same sizes
  bench max-autotune amp-bf16 compile-max-autotune --baseline amp-bf16 --steps 40 \
    "${small_gpt[@]}" --set warmup_steps=10
}

if [ -n "${_GPU_CHECK_STAGE:-}" ]; then  # one stage, started by stage() below
  "stage_${_GPU_CHECK_STAGE//-/_}"
  exit $?
fi

made=()  # the cache folders made here, removed at the end
if [ -z "${TORCHINDUCTOR_CACHE_DIR:-}" ] && [ "$dry" != 1 ]; then
  TORCHINDUCTOR_CACHE_DIR="$(mktemp -d /tmp/gpu-check-inductor.XXXXXX)" && made+=("$TORCHINDUCTOR_CACHE_DIR")
fi
if [ -z "${TRITON_CACHE_DIR:-}" ] && [ "$dry" != 1 ]; then
  TRITON_CACHE_DIR="$(mktemp -d /tmp/gpu-check-triton.XXXXXX)" && made+=("$TRITON_CACHE_DIR")
fi
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-}" TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-}"
cleanup() { [ "${#made[@]}" -gt 0 ] && rm -rf -- "${made[@]}"; }
trap cleanup EXIT

start=$(date +%s)
deadline=$((start + budget))
mkdir -p "$out/runs"
echo "ampscope GPU check$([ "$smoke" = 1 ] && echo ' (smoke: CPU, tiny sizes)')$(
  [ "$dry" = 1 ] && echo ' (dry run: commands to plan.txt)') into $out"
echo "budget $budget s; caches in ${TORCHINDUCTOR_CACHE_DIR:-?} and ${TRITON_CACHE_DIR:-?}"
printf '{"smoke": %s, "inject_fail": %s, "stages": "%s", "budget_s": %s}\n' \
  "$([ "$smoke" = 1 ] && echo true || echo false)" \
  "$([ "$inject" = 1 ] && echo true || echo false)" "$only" "$budget" > "$out/mode.json"

# Most telling first, in two calls of the lent machine (docs/gpu-check.md): this order runs
# preflight to numerics in the first (default budget), and fp8 and max-autotune, the two long
# compiles, in a second (GPU_CHECK_STAGES=fp8,max-autotune). CAP is a stage's time limit, NEED
# what it took on an H200 (2026-12-04; preflight and max-autotune estimated: they ran out of
# time there): a stage is not started with less than NEED left of the budget, and its checks
# SKIP saying so. The needs up to machine add up to 430 s of the 465 the budget leaves them
# (machine's 12 s estimated: torch's import, CUDA's start and about 6 s of matmuls and copies).
stage preflight 90 45
stage probe 120 85
stage eager 170 135
stage compile 150 80
stage ranks 60 30
stage dashboard 45 15
stage profile 45 16
stage numerics 40 12
stage machine 45 12
stage fp8 200 155
if [ "$smoke" = 1 ]; then  # max-autotune on a CPU autotunes C++ GEMMs for minutes
  echo "== max-autotune: a GPU stage, left out of the smoke run"
else  # last, on the small GPT: whatever the budget has left, up to its cap
  stage max-autotune 240 150
fi

if [ "$dry" = 1 ]; then
  echo "== dry run: every stage's commands are in $out/plan.txt"
  exit 0
fi
echo "== checks ($(($(date +%s) - start)) s so far)"
"${CHECK[@]}" check "$out"
rc=$?
echo "== done in $(($(date +%s) - start)) s: $out/checks.txt, summary.json, gpu-results.md"
exit "$rc"
