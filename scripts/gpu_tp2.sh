#!/usr/bin/env bash
# Tensor parallelism of degree 2 on the 2-GPU machine, in one call.
#
#   OUT=/path bash scripts/gpu_tp2.sh        (from the repo root)
#
# Steps (each may fail without stopping the rest; a global deadline, GPU_TP2_BUDGET_S,
# default 530 s, shortens or skips the later ones so the call ends within 9 minutes):
#   tests    the CPU TP tests (gloo, 2 processes) in this environment (GPU_TP2_TESTS=0 skips)
#   smoke    a TP=2 replay of 40 requests on qwen2.5-0.5b with decode CUDA graphs; if it
#            fails, the replays below run eagerly (--no-graphs): NCCL inside graph capture
#            is the one part no CPU test covers (GPU_TP2_SMOKE=0 skips it)
#   replay   llama-3.1-8b, azure-conv, first 300 requests at 2x rate, --no-wait, --tp 2,
#            static then elastic; then qwen2.5-14b the same way if time is left
# Results: at most 5 files: status.txt (environment, exit codes, durations), tests.log,
# replay.log, replay.tar.gz (one folder per run: summary.json with measured.tp_ranks,
# requests/timeline CSVs, steps.csv).
set -o pipefail
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

OUT="${OUT:?set OUT to the folder whose files come back}"
PY="${PYTHON:-python}"
BUDGET_S="${GPU_TP2_BUDGET_S:-530}"
WORK="${TMPDIR:-/tmp}/gpu_tp2"
START_S=$(date +%s)
STATUS="$OUT/status.txt"
mkdir -p "$OUT" "$WORK/replay"

MIN_LEFT_S=40 MARGIN_S=15  # a TP replay needs longer to start than one GPU
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"

{
  echo "gpu_tp2 date=$(date -u +%FT%TZ) budget=${BUDGET_S}s"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1
  nvidia-smi topo -m 2>&1 | head -5
  "$PY" - <<'PYEOF' 2>&1
import platform, torch, torch.distributed as dist
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "gpus", torch.cuda.device_count(), "nccl", dist.is_nccl_available() and
      ".".join(map(str, torch.cuda.nccl.version())), "gloo", dist.is_gloo_available())
PYEOF
} >> "$STATUS"

[ "${GPU_TP2_TESTS:-1}" != 0 ] && run_step "$OUT/tests.log" 90 "$PY" -m pytest tests/test_tp_model.py tests/test_tp_engine.py \
  tests/test_tp_setup.py -q -rs

replay_tp2() {  # replay_tp2 NAME LIMIT_S EXTRA_ARGS...
  local name="$1" limit="$2"; shift 2
  run_step "$OUT/replay.log" "$limit" "$PY" -m gpu_backend replay --tp 2 --trace azure-conv \
    --max-num-seqs 256 --no-wait --out "$WORK/replay/$name" "$@"
  bundle replay
}

GRAPHS=""
if [ "${GPU_TP2_SMOKE:-1}" != 0 ]; then  # 0 skips it (graphs over NCCL ran on 2026-11-30)
  replay_tp2 smoke_qwen2.5-0.5b_static_graphs 120 --model qwen2.5-0.5b --limit 40 --policy static
  if [ "$RC" -ne 0 ] || [ ! -f "$WORK/replay/smoke_qwen2.5-0.5b_static_graphs/summary.json" ]; then
    GRAPHS="--no-graphs"
    echo "graphs smoke failed (rc=$RC): replays run with --no-graphs" >> "$STATUS"
  fi
fi
SUFFIX=$([ -n "$GRAPHS" ] && echo eager || echo graphs)

for model in llama-3.1-8b qwen2.5-14b; do
  for policy in static elastic; do
    replay_tp2 "tp2_${model}_azure-conv_${policy}_${SUFFIX}" 190 --model "$model" \
      --limit 300 --rate-scale 2 --policy "$policy" $GRAPHS
  done
done

echo "done in $(( $(date +%s) - START_S ))s" >> "$STATUS"
ls -la "$OUT" >> "$STATUS"
