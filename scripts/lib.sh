# Shared by the device scripts (sourced, not run): a deadline-aware step runner and bundling.
# The caller sets OUT, WORK, STATUS, BUDGET_S and START_S; MIN_LEFT_S (skip a step with less
# time left, default 20) and MARGIN_S (seconds kept back for the rest, default 10) are optional.

left_s() { echo $(( BUDGET_S - ($(date +%s) - START_S) )); }

# run_step LOG LIMIT_S CMD...: run CMD under min(LIMIT_S, time left), append to LOG; sets RC
run_step() {
  local log="$1" limit="$2"; shift 2
  local left; left=$(left_s)
  if [ "$left" -lt "${MIN_LEFT_S:-20}" ]; then
    echo "SKIPPED (deadline): $*" | tee -a "$log"; echo "skip $*" >> "$STATUS"; RC=124; return 0
  fi
  local margin="${MARGIN_S:-10}"
  [ "$limit" -gt $(( left - margin )) ] && limit=$(( left - margin ))
  echo "=== $(date +%T) [limit ${limit}s] $*" | tee -a "$log"
  local t0; t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$log"
  RC=$?
  echo "rc=$RC $(( $(date +%s) - t0 ))s  $*" | tee -a "$log" >> "$STATUS"
  return 0
}

bundle() {  # bundle STAGE: tar the stage's result folder into $OUT/STAGE.tar.gz
  [ -d "$WORK/$1" ] && tar -C "$WORK/$1" -czf "$OUT/$1.tar.gz" . 2>/dev/null
  return 0
}

# The single-GPU validation slices: NAME MODEL TRACE LIMIT RATE_SCALE SECONDS (static and
# elastic are replayed for each, SECONDS at most per replay: the small model's replay runs
# ~10k steps, host-bound). gpu_all.sh's validation stage replays them (its replay stage adds
# h200_llama-3.1-8b_azure-conv, CONV_RUN); collect_pair.sh compares them.
CONV_RUN="h200_llama-3.1-8b_azure-conv llama-3.1-8b azure-conv 300 2 170"
VALIDATION_RUNS=(
  "h200_llama-3.1-8b_azure-code llama-3.1-8b azure-code 150 2 150"
  "h200_llama-3.1-8b_mooncake-conv llama-3.1-8b mooncake-conv 40 1 150"
  "h200_qwen2.5-0.5b_azure-conv qwen2.5-0.5b azure-conv 300 2 240"
  "h200_qwen2.5-0.5b_azure-code qwen2.5-0.5b azure-code 150 2 180"
  "h200_qwen2.5-0.5b_mooncake-conv qwen2.5-0.5b mooncake-conv 40 1 180"
  "h200_llama-3.2-3b_azure-conv llama-3.2-3b azure-conv 300 2 170"
  "h200_llama-3.2-3b_azure-code llama-3.2-3b azure-code 150 2 150"
  "h200_llama-3.2-3b_mooncake-conv llama-3.2-3b mooncake-conv 40 1 150"
)
