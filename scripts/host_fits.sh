#!/usr/bin/env bash
# Cross-trace host fits (no GPU): fit the three per-step host terms on one Llama slice's
# replays (`python -m validation fit --free host`, device efficiencies kept from the grid
# profile), judge each fit on the slices it has not seen, print the table.
#
#   bash scripts/host_fits.sh [PYTHON]      (from the repo root)
#
# Writes calibration/host_fit/llama-3.1-8b_from_azure-{code,conv}.json and the reports
# validation/reports/hostfit-<fitted on>_llama-3.1-8b_<judged on>/ (validation/reports/README.md).
set -euo pipefail
PY="${1:-${PYTHON:-python}}"
G=validation/gpu_runs
for src in code conv; do
  other=$([ "$src" = code ] && echo conv || echo code)
  "$PY" -m validation fit --gpu-dir "$G/h200_llama-3.1-8b_azure-$src" \
    --test-dir "$G/h200_llama-3.1-8b_azure-$other" \
    --calibration calibration/calibration_llama-3.1-8b.json --free host \
    --out "calibration/host_fit/llama-3.1-8b_from_azure-$src.json"
done
judge() {  # judge FITTED_ON SLICE LIMIT RATE_SCALE
  local out="validation/reports/hostfit-$1_llama-3.1-8b_$2"
  rm -rf "$out"
  "$PY" -m validation compare --gpu-dir "$G/h200_llama-3.1-8b_$2" --out "$out" \
    --calibration "calibration/host_fit/llama-3.1-8b_from_azure-$1.json" \
    --trace "$2" --limit "$3" --rate-scale "$4" | grep -v "^simulating"
}
judge code azure-conv 300 2
judge code mooncake-conv 40 1
judge conv azure-code 150 2
judge conv mooncake-conv 40 1
"$PY" -m validation table validation/reports/hostfit-*
