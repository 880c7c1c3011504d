#!/usr/bin/env bash
# The single-GPU jobs split over the two GPUs of an nvidia-h200-x2 machine, in one call.
#
#   OUT=/path bash scripts/gpu_pair.sh        (from the repo root)
#
# First the kernel tests (tests_gpu/test_kernels_gpu.py, the -k subset GPU_PAIR_SMOKE_K) on
# GPU 0: a failing group turns its kernels off for both tracks (decode split plan:
# GPU_BACKEND_DECODE_PLAN=0; fused layers: GPU_BACKEND_FUSED=0). Then GPU 0: GPU_PAIR_TRACK0 stages (default: tests bench profile
# validation, bench = GPU_ALL_BENCH or engine, validation = the Qwen replays); GPU 1:
# GPU_PAIR_TRACK1 (default: replay validation = the Azure-conv and Llama validation
# replays, the validation slices GPU_PAIR_VALIDATION1 when set; "none": no track 1, everything on GPU 0, one job at a time, e.g. on a one-GPU
# machine with GPU_PAIR_VALIDATION0="" = every validation slice on GPU 0). Each track is
# `scripts/gpu_all.sh` with its own deadline (GPU_PAIR_BUDGET_S, default 540 s), its own
# engine (GPU_PAIR_ENGINE0/1: eager, piecewise or piecewiseN, default GPU_ALL_ENGINE), the models its
# profile stage profiles (GPU_PAIR_PROFILE0/1, default GPU_ALL_PROFILE or both) and its slices'
# chunk sizes (GPU_PAIR_CHUNKS0/1, default GPU_ALL_CHUNKS or 8192).
# Results: gpu0.tar.gz and gpu1.tar.gz (each track's logs, stage tarballs and status.txt),
# status.txt and kernel_smoke.log: at most 4 files, as the device tool brings back only 8 (call 5 wrote each track's files into OUT and lost its replays).
# A call cut short brings back none of the tracks: keep GPU_PAIR_BUDGET_S under the limit.
set -o pipefail
OUT="${OUT:?set OUT to the folder whose files come back}"
BUDGET_S="${GPU_PAIR_BUDGET_S:-540}"
mkdir -p "$OUT"
rm -rf /tmp/pair0 /tmp/pair1  # a warm machine keeps the last call's files
track() {  # track GPU STAGES...
  local gpu="$1"; shift
  local engine_var="GPU_PAIR_ENGINE$gpu"  # this track's engine (default: GPU_ALL_ENGINE)
  local profile_var="GPU_PAIR_PROFILE$gpu"  # the models its profile stage profiles
  local chunks_var="GPU_PAIR_CHUNKS$gpu"  # its slices' chunk sizes (default GPU_ALL_CHUNKS)
  mkdir -p "/tmp/pair$gpu/out" "/tmp/pair$gpu/tmp"
  CUDA_VISIBLE_DEVICES="$gpu" TMPDIR="/tmp/pair$gpu/tmp" OUT="/tmp/pair$gpu/out" \
    GPU_ALL_ENGINE="${!engine_var:-${GPU_ALL_ENGINE:-eager}}" \
    GPU_ALL_PROFILE="${!profile_var-${GPU_ALL_PROFILE:-llama-3.1-8b qwen2.5-0.5b}}" \
    GPU_ALL_CHUNKS="${!chunks_var:-${GPU_ALL_CHUNKS:-8192}}" \
    GPU_ALL_BUDGET_S="$BUDGET_S" bash "$(dirname "$0")/gpu_all.sh" "$@" \
    > "/tmp/pair$gpu/out/console.log" 2>&1
}
start=$(date +%s)
# The kernels first: a group that fails here is turned off for both tracks.
CUDA_VISIBLE_DEVICES=0 timeout "${GPU_PAIR_SMOKE_S:-150}" "${PYTHON:-python}" -m pytest \
  tests_gpu/test_kernels_gpu.py -rf -k "${GPU_PAIR_SMOKE_K:-skewed or few_long or splits \
  or graph or mixed or fused or rotary or rms or silu}" > "$OUT/kernel_smoke.log" 2>&1
smoke_rc=$?
echo "kernel smoke: pytest rc=$smoke_rc" >> "$OUT/status.txt"
# cut by its limit (rc 124, Triton still compiling) with nothing failed: the kernels stay on
# (the ninth session's call 1 turned them off on such a cut and replayed another engine)
if [ "$smoke_rc" -eq 124 ] && ! grep -q "^FAILED" "$OUT/kernel_smoke.log"; then
  echo "kernel smoke cut by its ${GPU_PAIR_SMOKE_S:-150}s limit, nothing failed: kernels left on" >> "$OUT/status.txt"
elif [ "$smoke_rc" -ne 0 ] && ! grep -q "^FAILED" "$OUT/kernel_smoke.log"; then
  export GPU_BACKEND_FUSED=0 GPU_BACKEND_DECODE_PLAN=0
  echo "kernel tests did not run: GPU_BACKEND_FUSED=0 GPU_BACKEND_DECODE_PLAN=0" >> "$OUT/status.txt"
fi
if grep "^FAILED" "$OUT/kernel_smoke.log" | grep -q "attention\|splits\|graph"; then
  export GPU_BACKEND_DECODE_PLAN=0
  echo "attention tests failed: GPU_BACKEND_DECODE_PLAN=0" >> "$OUT/status.txt"
fi
if grep "^FAILED" "$OUT/kernel_smoke.log" | grep -q "rms\|silu\|rotary\|fused"; then
  export GPU_BACKEND_FUSED=0
  echo "fused kernel tests failed: GPU_BACKEND_FUSED=0" >> "$OUT/status.txt"
fi
BUDGET_S=$(( BUDGET_S - ($(date +%s) - start) ))
read -r -a stages0 <<<"${GPU_PAIR_TRACK0:-tests bench profile validation}"
read -r -a stages1 <<<"${GPU_PAIR_TRACK1:-replay validation}"
GPU_ALL_BENCH="${GPU_ALL_BENCH:-engine}" \
  GPU_ALL_VALIDATION="${GPU_PAIR_VALIDATION0-h200_qwen2.5-0.5b_azure-conv}" \
  track 0 "${stages0[@]}" &
# GPU 1 waits (at most GPU_PAIR_WAIT_S, default 300 s: two profiles of two passes each) for GPU 0's calibration profiles, when track 0 runs
# them: the profile's eager steps are host-bound, and a replay starting beside it (Triton
# compiling, weights drawn) doubled the small-prefill grid points once (13 -> 28 ms).
[ "${stages1[*]}" = none ] || (
  # (a track 1 that profiles too starts at once: the two profiles run side by side)
  if [[ " ${stages0[*]} " == *" profile "* && " ${stages1[*]} " != *" profile "* ]]; then
    for _ in $(seq "${GPU_PAIR_WAIT_S:-300}"); do
      [ -f /tmp/pair0/out/profile.tar.gz ] && break
      sleep 1
    done
  fi
  GPU_ALL_VALIDATION="${GPU_PAIR_VALIDATION1-h200_llama-3.1-8b_azure-code h200_llama-3.1-8b_mooncake-conv}" \
    track 1 "${stages1[@]}"
) &
wait
for gpu in 0 1; do
  [ -d "/tmp/pair$gpu/out" ] || continue
  tar -C "/tmp/pair$gpu/out" -czf "$OUT/gpu$gpu.tar.gz" .
  { echo "## GPU $gpu"; cat "/tmp/pair$gpu/out/status.txt"; } >> "$OUT/status.txt"
done
echo "pair done in $(( $(date +%s) - start ))s" >> "$OUT/status.txt"
cat "$OUT/status.txt"
