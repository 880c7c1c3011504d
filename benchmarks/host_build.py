"""Host time the GPU engine spends building each step's arrays (`RequestMirror.build`), on CPU.

    .venv/bin/python benchmarks/host_build.py [--out FILE]

Replays time this with every step (`GpuEngine._run`), and so does the calibration profile:
a fit that leaves it out misses it. Decode batches of 1-256 sequences at a
1,024-token context, and a mixed step (a 512-token chunk beside decodes), built from the
calibration grid's own step descriptions (`gpu_backend.engine.shapes.engine_step`). Prints the
median time per build and a least-squares fixed + per-sequence cost; writes JSON. The GPU
host's CPU is what counts for replays: this measures the machine it runs on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

from benchmarks.sim_speed import machine  # noqa: E402
from gpu_backend.engine.shapes import decode_shape, engine_step, mixed_shape  # noqa: E402

BATCHES = (1, 8, 32, 64, 128, 256)
CONTEXT = 1024
LONG_CONTEXT = 8192  # the profile grid's 256 x 8k point: 131k blocks in one step
VOCAB = 128256  # Llama-3.1-8B
RESULT = Path(__file__).resolve().parent / "results" / "host_build_cpu.json"


def build_seconds(shape, repeat: int = 200) -> float:
    num_blocks = 1 << 20
    mirror, out = engine_step(shape, 16, num_blocks, VOCAB)
    for _ in range(10):
        mirror.build(out, num_blocks)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        mirror.build(out, num_blocks)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args()
    rows = [{"kind": "decode", "num_seqs": b, "context": CONTEXT,
             "seconds": build_seconds(decode_shape(b, CONTEXT))} for b in BATCHES]
    rows += [{"kind": "decode", "num_seqs": b, "context": LONG_CONTEXT,
              "seconds": build_seconds(decode_shape(b, LONG_CONTEXT))} for b in (64, 256)]
    rows += [{"kind": "mixed", "num_seqs": b + 1, "context": CONTEXT,
              "seconds": build_seconds(mixed_shape(512, 2048, b, CONTEXT))} for b in (8, 64)]
    decode = [r for r in rows if r["kind"] == "decode" and r["context"] == CONTEXT]
    per_seq, fixed = np.polyfit([r["num_seqs"] for r in decode], [r["seconds"] for r in decode], 1)
    result = {"machine": machine(), "rows": rows,
              "decode_fit": {"fixed_s": float(fixed), "per_seq_s": float(per_seq)}}
    for r in rows:
        print(f"{r['kind']:>7} {r['num_seqs']:>4} x {r['context']:>5}: {r['seconds'] * 1e6:8.1f} us")
    print(f"decode build = {fixed * 1e6:.1f} us + {per_seq * 1e6:.2f} us per sequence")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
