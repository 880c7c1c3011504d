#!/usr/bin/env bash
# Put what `scripts/gpu_pair.sh` brought back into the repo, regenerate the reports, print the
# validation table. Run here (not on the GPU machine), from the repo root:
#
#   bash scripts/collect_pair.sh FILES_AT [PYTHON]
#
# FILES_AT "-": copy nothing, only regenerate the reports and the table.
# FILES_AT: the folder holding gpu0.tar.gz, gpu1.tar.gz, status.txt and kernel_smoke.log, or
# the stage tarballs (replay.tar.gz, ...) of a plain `scripts/gpu_all.sh` call. Engines: eager
# (no suffix), piecewise (_piecewise) and capped piecewise (_piecewiseN, GPU_ALL_ENGINE=piecewiseN).
# Copies, when present: the replays (validation/gpu_runs/h200_*), the calibration profiles
# (calibration/), the kernel and engine benchmarks (benchmarks/results/); then runs
# `python -m validation compare` for each single-GPU slice (with --repeat-dir for every earlier
# replay of it under validation/gpu_runs/repeats/NAME/) and `python -m validation table`.
# Check `git diff --stat` and the status file before committing.
set -euo pipefail
SRC="${1:?usage: bash scripts/collect_pair.sh FILES_AT [PYTHON]}"
PY="${2:-${PYTHON:-python}}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
[ "$SRC" = - ] && SRC="$WORK/none"  # nothing to copy: every test below finds no file
# g0, g1: the two tracks of a gpu_pair.sh call; g2: stage tarballs of a plain gpu_all.sh call
mkdir -p "$WORK/g2"
is_stage() {  # is_stage NAME: a stage tarball's name (replay_piecewise512: a capped engine's)
  case "$1" in bench|profile|replay|replay_piecewise*|validation) return 0 ;; esac
  return 1
}
for tarball in "$SRC"/*.tar.gz; do
  [ -f "$tarball" ] && is_stage "$(basename "$tarball" .tar.gz)" && cp "$tarball" "$WORK/g2/"
done
for gpu in 0 1 2; do
  mkdir -p "$WORK/g$gpu"
  [ -f "$SRC/gpu$gpu.tar.gz" ] && tar -xzf "$SRC/gpu$gpu.tar.gz" -C "$WORK/g$gpu"
  for tarball in "$WORK/g$gpu"/*.tar.gz; do
    stage="$(basename "$tarball" .tar.gz)"
    if [ -f "$tarball" ] && is_stage "$stage"; then
      mkdir -p "$WORK/g$gpu/$stage"
      tar -xzf "$tarball" -C "$WORK/g$gpu/$stage"
    fi
  done
done
copy_run() {  # copy_run FROM NAME: a replay folder (static/, elastic/) into validation/gpu_runs
  [ -d "$1" ] || return 0
  rm -rf "validation/gpu_runs/$2"
  cp -r "$1" "validation/gpu_runs/$2"
  find "validation/gpu_runs/$2" -name '*.csv' -exec gzip -9nf {} +  # kept compressed (~1/3)
  echo "replays -> validation/gpu_runs/$2"
}
for gpu in 0 1 2; do
  g="$WORK/g$gpu"
  for run in "$g"/replay "$g"/replay_piecewise*; do  # the replay stage: CONV_RUN's slice
    [ -d "$run" ] && copy_run "$run" "h200_llama-3.1-8b_azure-conv${run#"$g"/replay}"
  done
  for run in "$g"/validation/h200_*; do [ -d "$run" ] && copy_run "$run" "$(basename "$run")"; done
  for cal in "$g"/profile/calibration_*.json; do
    [ -f "$cal" ] && cp "$cal" calibration/ && echo "profile -> calibration/$(basename "$cal")"
  done
  [ -f "$g/bench/kernel_bench.json" ] && cp "$g/bench/kernel_bench.json" \
    benchmarks/results/kernels_nvidia-h200.json && echo "kernel bench -> benchmarks/results/"
  [ -f "$g/bench/eager_gap.json" ] && cp "$g/bench/eager_gap.json" \
    benchmarks/results/eager_gap_nvidia-h200.json && echo "eager gap -> benchmarks/results/"
  [ -f "$g/bench/engine_bench_llama-3.1-8b.json" ] && cp "$g/bench/engine_bench_llama-3.1-8b.json" \
    benchmarks/results/engine_nvidia-h200_llama-3.1-8b.json && echo "engine bench -> benchmarks/results/"
done
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"  # the slices: CONV_RUN, VALIDATION_RUNS
eager=() piecewise=()  # the reports of each engine, for one table each
for line in "$CONV_RUN" "${VALIDATION_RUNS[@]}"; do
  read -r slice model trace limit rate _ <<<"$line"
  for dir in "validation/gpu_runs/$slice" "validation/gpu_runs/$slice"_piecewise*; do
    [ -d "$dir" ] || continue  # the eager engine's replays, then the piecewise graphs' (capped: _piecewiseN)
    name="$(basename "$dir")"
    suffix="${name#"$slice"}"
    rm -rf "validation/reports/$name"
    repeats=()  # earlier replays of the slice, kept under validation/gpu_runs/repeats/NAME/TAG
    for dir in validation/gpu_runs/repeats/"$name"/*/; do
      [ -d "$dir" ] && repeats+=(--repeat-dir "${dir%/}")
    done
    "$PY" -m validation compare --gpu-dir "validation/gpu_runs/$name" \
      --out "validation/reports/$name" --calibration "calibration/calibration_$model$suffix.json" \
      --trace "$trace" --limit "$limit" --rate-scale "$rate" "${repeats[@]}" \
      | grep -v "^simulating"
    if [ -z "$suffix" ]; then eager+=("validation/reports/$name"); else piecewise+=("validation/reports/$name"); fi
  done
done
[ ${#eager[@]} -eq 0 ] || "$PY" -m validation table "${eager[@]}"
[ ${#piecewise[@]} -eq 0 ] || "$PY" -m validation table "${piecewise[@]}"
