#!/usr/bin/env bash
# Every GPU job of the project in one script, for one call on the device machine.
#
#   OUT=/path bash scripts/gpu_all.sh [STAGE ...]   (from the repo root; default: all)
#
# Stages (each may fail without stopping the rest; each log is tee'd to $OUT/<stage>.log;
# `all` runs them in the order tests, profile, replay, bench):
#   tests    python -m pytest tests_gpu -v (vmm, kernels, engine; GPU_ALL_TESTS_S, default 300 s)
#   bench    benchmarks/vmm_latency.py, kernel_bench.py, engine_bench.py (eager_gap.py: "gap")
#   profile  calibration JSON for llama-3.1-8b and qwen2.5-0.5b (GPU_ALL_PROFILE: a subset, or
#            llama-3.2-3b)
#   replay   azure-conv, first 300 requests at 2x rate, --no-wait, static and elastic (8B)
# Results come back as at most 8 files: four logs, three tarballs (bench, profile, replay)
# and status.txt (environment, per-stage exit codes and durations). A global deadline
# (GPU_ALL_BUDGET_S, default 560 s) shortens the later stages so the call ends in time;
# `all` runs the quick variants of the benchmarks.
# GPU_ALL_POLICIES: the policies each slice replays, in order (default "static elastic").
# GPU_ALL_CHUNKS: the chunk sizes each validation slice replays (default 8192; e.g. "2048 8192"
# for the reports' gain of elastic over a smaller chunk; a chunk other than 8192 goes in a
# <policy>_chunk_<n> folder).
# GPU_ALL_ENGINE=piecewise: the profiles and replays run with --piecewise-graphs, their
# results named with a _piecewise suffix (calibration_MODEL_piecewise.json, replay_piecewise,
# validation/NAME_piecewise), so they sit beside the eager engine's. piecewiseN (e.g.
# piecewise512): graphs up to N tokens (--piecewise-max-tokens N), suffix _piecewiseN.
set -o pipefail
export PYTHONUNBUFFERED=1

STAGES=("${@:-all}")
STAGE="${STAGES[*]}"
OUT="${OUT:?set OUT to the folder whose files come back}"
PY="${PYTHON:-python}"
BUDGET_S="${GPU_ALL_BUDGET_S:-560}"
WORK="${TMPDIR:-/tmp}/gpu_all"
START_S=$(date +%s)
STATUS="$OUT/status.txt"
mkdir -p "$OUT" "$WORK"

for stage in "${STAGES[@]}"; do
  case "$stage" in
    tests|bench|profile|replay|validation|all) ;;
    *) echo "usage: OUT=DIR bash scripts/gpu_all.sh [tests|bench|profile|replay|validation|all ...]" >&2
       exit 2 ;;
  esac
done
POLICIES="${GPU_ALL_POLICIES:-static elastic}"  # the replays' order (an order A/B: "elastic static")
CHUNKS="${GPU_ALL_CHUNKS:-8192}"  # the validation slices' chunk sizes (e.g. "2048 8192")
QUICK=""
[ "$STAGE" = all ] && QUICK="--quick"
ENGINE_FLAGS=()
SUFFIX=""
case "${GPU_ALL_ENGINE:-eager}" in
  eager) ;;
  piecewise) ENGINE_FLAGS=(--piecewise-graphs); SUFFIX=_piecewise ;;
  piecewise[0-9]*)  # piecewise graphs up to N tokens, longer steps fully eager
    ENGINE_FLAGS=(--piecewise-graphs --piecewise-max-tokens "${GPU_ALL_ENGINE#piecewise}")
    SUFFIX="_$GPU_ALL_ENGINE" ;;
  *) echo "GPU_ALL_ENGINE: eager, piecewise or piecewiseN, not ${GPU_ALL_ENGINE}" >&2; exit 2 ;;
esac

# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"

environment() {
  {
    echo "stage=$STAGE date=$(date -u +%FT%TZ) budget=${BUDGET_S}s"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
    "$PY" - <<'EOF' 2>&1
import importlib.metadata as md, platform, torch, triton
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "triton", triton.__version__, "cuda-bindings", md.version("cuda-bindings"))
EOF
  } >> "$STATUS"
}

stage_tests() {  # -v: a test cut by the deadline is named in the log (GPU_ALL_TESTS_S, default 300 s)
  run_step "$OUT/tests.log" "${GPU_ALL_TESTS_S:-300}" "$PY" -m pytest tests_gpu -v -rs --durations=20
}

stage_bench() {  # GPU_ALL_BENCH picks the benchmarks (default: vmm kernels engine; or gap)
  local dir="$WORK/bench" log="$OUT/bench.log" wanted=" ${GPU_ALL_BENCH:-vmm kernels engine} "
  mkdir -p "$dir"
  [[ "$wanted" == *" vmm "* ]] && run_step "$log" 180 "$PY" benchmarks/vmm_latency.py --reps 3 \
    --out "$dir/vmm_latency.json"
  [[ "$wanted" == *" kernels "* ]] && run_step "$log" 120 "$PY" benchmarks/kernel_bench.py \
    $QUICK --out "$dir/kernel_bench.json"
  [[ "$wanted" == *" engine "* ]] && run_step "$log" 240 "$PY" benchmarks/engine_bench.py \
    --model llama-3.1-8b $QUICK --out "$dir/engine_bench_llama-3.1-8b.json"
  [[ "$wanted" == *" gap "* ]] && run_step "$log" 150 "$PY" benchmarks/eager_gap.py \
    --out "$dir/eager_gap.json"
  bundle bench
}

# GPU_ALL_PROFILE picks the models (default: llama-3.1-8b qwen2.5-0.5b); GPU_ALL_PROFILE_ARGS adds
# profile flags and GPU_ALL_PROFILE_TAG a name suffix for them, e.g. GPU_ALL_PROFILE_ARGS="--replay-setup
# --max-num-seqs 256 --max-model-len 32768" GPU_ALL_PROFILE_TAG=_replaysetup (the grid on a replay's
# setup: scattered blocks over a large pool) beside the plain profile, not over it.
stage_profile() {
  local dir="$WORK/profile" log="$OUT/profile.log" wanted=" ${GPU_ALL_PROFILE:-llama-3.1-8b qwen2.5-0.5b} "
  local extra=() model limit
  read -r -a extra <<<"${GPU_ALL_PROFILE_ARGS:-}"
  mkdir -p "$dir"
  # two passes over the grid (profile --passes, default 2): about twice a single pass's time
  for model in llama-3.1-8b qwen2.5-0.5b llama-3.2-3b; do
    [[ "$wanted" == *" $model "* ]] || continue
    case "$model" in llama-3.1-8b) limit=240 ;; qwen2.5-0.5b) limit=180 ;; *) limit=200 ;; esac
    run_step "$log" "$limit" "$PY" -m gpu_backend profile --model "$model" \
      --out "$dir/calibration_$model$SUFFIX${GPU_ALL_PROFILE_TAG:-}.json" "${ENGINE_FLAGS[@]}" "${extra[@]}"
  done
  bundle profile
}

run_folder() {  # run_folder POLICY CHUNK: the default chunk's folder keeps the policy's name
  if [ "$2" = 8192 ]; then echo "$1"; else echo "$1_chunk_$2"; fi
}

stage_replay() {
  local dir="$WORK/replay$SUFFIX" log="$OUT/replay.log" model trace limit rate seconds
  mkdir -p "$dir"
  read -r _ model trace limit rate seconds <<<"$CONV_RUN"
  for chunk in $CHUNKS; do
    for policy in $POLICIES; do
      run_step "$log" "$seconds" "$PY" -m gpu_backend replay --trace "$trace" --limit "$limit" \
        --rate-scale "$rate" --model "$model" --policy "$policy" --chunk "$chunk" \
        --max-num-seqs 256 --no-wait --out "$dir/$(run_folder "$policy" "$chunk")" \
        "${ENGINE_FLAGS[@]}"
      bundle "replay$SUFFIX"
    done
  done
}

# validation: the replays `python -m validation compare` turns into the committed reports
# (VALIDATION_RUNS, in lib.sh); GPU_ALL_VALIDATION (names, space-separated) runs a subset.
stage_validation() {
  local log="$OUT/validation.log"
  for line in "${VALIDATION_RUNS[@]}"; do
    read -r name model trace limit rate seconds <<<"$line"
    [ -n "${GPU_ALL_VALIDATION:-}" ] && [[ " $GPU_ALL_VALIDATION " != *" $name "* ]] && continue
    for chunk in $CHUNKS; do
      for policy in $POLICIES; do
        run_step "$log" "$seconds" "$PY" -m gpu_backend replay --trace "$trace" --limit "$limit" \
          --rate-scale "$rate" --model "$model" --policy "$policy" --chunk "$chunk" \
          --max-num-seqs 256 --max-model-len 32768 --no-wait \
          --out "$WORK/validation/$name$SUFFIX/$(run_folder "$policy" "$chunk")" \
          "${ENGINE_FLAGS[@]}"
      done
    done
    bundle validation
  done
}

environment
for stage in "${STAGES[@]}"; do
  case "$stage" in
    all) stage_tests; stage_profile; stage_replay; stage_bench ;;
    *) "stage_$stage" ;;
  esac
done
echo "done in $(( $(date +%s) - START_S ))s" >> "$STATUS"
ls -la "$OUT" >> "$STATUS"
