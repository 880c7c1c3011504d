#!/usr/bin/env bash
# The single-GPU jobs split over the two GPUs of an nvidia-h200-x2 machine, in one call.
#
#   OUT=/path bash scripts/gpu_pair.sh        (from the repo root)
#
# GPU 0: tests, the engine benchmark, the calibration profiles, then the Qwen validation
# replays; GPU 1: the Azure-conv replays and the Llama validation replays. Each track is
# `scripts/gpu_all.sh` with its own deadline (GPU_PAIR_BUDGET_S, default 540 s). Results:
# gpu0.tar.gz and gpu1.tar.gz (each track's logs, tarballs and status.txt), status.txt and
# fused_smoke.log (the fused-kernel GPU tests, run first).
set -o pipefail
OUT="${OUT:?set OUT to the folder whose files come back}"
BUDGET_S="${GPU_PAIR_BUDGET_S:-540}"
mkdir -p "$OUT"
track() {  # track GPU STAGES...
  local gpu="$1"; shift
  mkdir -p "/tmp/pair$gpu/out" "/tmp/pair$gpu/tmp"
  CUDA_VISIBLE_DEVICES="$gpu" TMPDIR="/tmp/pair$gpu/tmp" OUT="/tmp/pair$gpu/out" \
    GPU_ALL_BUDGET_S="$BUDGET_S" bash "$(dirname "$0")/gpu_all.sh" "$@" \
    > "/tmp/pair$gpu/out/console.log" 2>&1
}
start=$(date +%s)
# The fused layer kernels first: if they fail here, both tracks run the torch layers instead.
CUDA_VISIBLE_DEVICES=0 timeout 120 "${PYTHON:-python}" -m pytest tests_gpu/test_kernels_gpu.py -q \
  -k "rms or silu or rotary or fused" 2>&1 | tail -5 > "$OUT/fused_smoke.log"
if ! grep -q " passed" "$OUT/fused_smoke.log" || grep -q "failed\|error" "$OUT/fused_smoke.log"; then
  export GPU_BACKEND_FUSED=0
  echo "fused kernels failed their smoke test: GPU_BACKEND_FUSED=0" >> "$OUT/status.txt"
fi
BUDGET_S=$(( BUDGET_S - ($(date +%s) - start) ))
GPU_ALL_BENCH=engine GPU_ALL_VALIDATION=h200_qwen2.5-0.5b_azure-conv \
  track 0 tests bench profile validation &
GPU_ALL_VALIDATION="h200_llama-3.1-8b_azure-code h200_llama-3.1-8b_mooncake-conv" \
  track 1 replay validation &
wait
for gpu in 0 1; do
  tar -C "/tmp/pair$gpu/out" -czf "$OUT/gpu$gpu.tar.gz" .
  { echo "## GPU $gpu"; cat "/tmp/pair$gpu/out/status.txt"; } >> "$OUT/status.txt"
done
echo "pair done in $(( $(date +%s) - start ))s" >> "$OUT/status.txt"
cat "$OUT/status.txt"
