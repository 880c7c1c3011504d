"""Prefill and mixed-step attention: the candidate kernels side by side on one GPU.

The engine's attention runs our Triton paged kernel (gpu_backend/kernels). This times each
way the engine could run a prefill or mixed step's attention, per layer, on the device alone
(CUDA events, median; Llama-3.1-8B heads: 32 query, 8 KV, head_dim 128, bf16; a pool of
16-token blocks in shuffled order):

1. one pass, prompts of 4,096 / 8,192 / 16,384 tokens: our kernel (its prefill tile, and a
   short sweep of tiles at 16,384); torch SDPA with each backend forced, with GQA and with
   K/V heads expanded beforehand (the copy not timed); the aten cuDNN and flash ops that also
   return the log-sum-exp; FA2 varlen; compiled FlexAttention with a causal block mask;
   cuDNN's own SDPA over the paged pool (cuDNN frontend, `cudnn` package); FlashInfer's
   batch prefill over the paged pool in place, its fa3 (Hopper) and fa2 kernels.
2. chunked: the 16,384-token prompt in chunks of 2,048 and 8,192 over its cached prefix, the
   sum over chunks (and the whole prompt as one chunk, the same code path): ours; SPLIT, the
   chunk's own keys (causal square) through an SDPA op with LSE plus the prefix keys either
   gathered from the pool then the same op, or our kernel over the paged prefix, merged by
   their LSEs (gather and merge timed; SPLIT's steps also timed one by one); FA2 varlen and
   cuDNN (dense K/V, bottom-right causal) on the gathered prefix + chunk; FlexAttention on
   gathered keys padded to the prompt (one compile per chunk size); cuDNN paged with a
   bottom-right causal mask; FlashInfer paged; ours, cuDNN paged and FlashInfer over the
   pool re-paged in 64-token blocks.
3. mixed: a 2,048-token chunk (prefix 0 and 8,192) beside 64 decodes of 1,024 keys: ours in
   one launch and in two (decode rows through the decode path, then the chunk), the two best
   other options of 2 on the pool's own blocks with the decode rows through our decode path,
   cuDNN paged and FlashInfer each in one ragged call, and the decode rows alone (the
   floor); device time and the host's time to launch the call while the GPU is busy; and
   FlashInfer's plan of the step (host time, once per step for every layer).

Every option is checked against a float32 reference on sampled query rows (every row of a
small shape); one over the tolerance is reported wrong and never ranked. One that fails
records the first line of its error and the run goes on; the cuDNN frontend and each
FlashInfer backend are first tried in a child process so that a fault there cannot take the
run's CUDA context with it (FlashInfer's child also builds its kernels: about 90 s for fa3 and
40 s for fa2 on 16 cores the first time, then loaded from its cache).

Targets: prefill attention within 1.2x of SDPA cuDNN's one pass on the same shape; the chunk
penalty (sum over chunks of 2,048 / one pass of 16,384) at most ~2% beyond the decode work.

Measured (H200, torch 2.11+cu130, triton 3.6, cuDNN 9.19, frontend 1.23; per layer, 16,384
tokens, two runs): SDPA cuDNN one pass 3.29-3.35 ms (GQA native, LSE free); ours 6.0 ms one
pass (5.2 with a 256x128 or 256x64 tile), 6.6-6.7 ms in chunks of 2,048; SPLIT (cuDNN square
+ gathered prefix + merge) 1.12-1.14x SDPA's one pass at chunk 2,048 (square 0.66, gather
0.16, prefix 2.85, merge 0.11 ms) and 1.03-1.04x at 8,192; cuDNN paged 1.19-1.21x one pass,
1.33-1.35x at 2,048 on 16-token blocks, 1.06-1.07x and 1.20-1.21x on 64-token blocks. Beside
64 decodes, a 2,048 chunk over 8,192 cached: ours 1.04 ms, SPLIT + our decode launch 0.60 ms
(the decode rows alone 0.08), but SPLIT's eager launches take the host ~1 ms.
FlashInfer 0.7.4 (H200, 2026-12-06): fa3 over the pool's 16-token blocks in place 3.64 ms one
pass (1.08x), 3.96 ms in chunks of 2,048 (1.18x; 1.085x its own one pass), the same on 64-token
blocks; fa2 6.24 ms one pass; beside 64 decodes, the 2,048 chunk over 8,192 cached through fa3
and our decode launch 0.63 ms, fa3 in one ragged call 0.87 ms; fa3's plan 0.7-1.0 ms of host.
Our tiles on an H100 80GB HBM3 (2026-12-06, `--only 'ours*,sdpa cudnn*'`): 5.91 ms one pass,
6.63 ms in chunks of 2,048 (SDPA cuDNN 3.33 ms); longest first 5.95 / 6.49 ms; 256x128 w8 s2
5.19 / 6.12 ms, 5.13 / 6.12 ms longest first.

Each chunked option's chunk times are also split into a fixed cost per launch and a rate over
the pairs (least squares over the chunks), beside its one pass's rate: on every kernel the
chunking cost is the fixed part (docs/engine.md, "The kernels' chunking cost is a fixed cost per
launch"); `--report RESULT` prints a saved result's report with it.

Usage:
    python benchmarks/attention_options.py [--out PATH]   # CUDA GPU, about 2 minutes
    python benchmarks/attention_options.py --smoke        # CPU: tiny shapes, Triton's
                                                          # interpreter, CUDA-only options skipped
    python benchmarks/attention_options.py --report RESULT  # a saved result's report, no GPU
The cuDNN frontend options need `pip install --no-deps nvidia-cudnn-frontend==1.23.0` (it
loads the libcudnn torch ships), the FlashInfer options `pip install 'elastic-kv[flashinfer]'`
and nvcc; without them they record the error. `--only` runs the options its patterns name.
"""

from __future__ import annotations

import os
import sys

if "--smoke" in sys.argv:  # the interpreter must be chosen before triton is first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse  # noqa: E402
import datetime  # noqa: E402
import faulthandler  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attention_options_bench import Bench, ContextLost  # noqa: E402
from attention_options_builders import Option  # noqa: E402
from attention_options_cases import (  # noqa: E402
    FULL,
    LLAMA_8B,
    SMOKE,
    TINY,
    Chunk,
    Decodes,
    Heads,
    Sizes,
    attention_flops,
    best_options,
    causal_pairs,
    check_rows,
    chunk_error,
    chunk_penalties,
    chunk_starts,
    decode_error,
    launch_split,
    make_prompt,
    reference_rows,
)
from attention_options_report import (  # noqa: E402
    add_ratios,
    print_report,
    print_saved_report,
    sdpa_cudnn_ms,
)
from attention_options_sections import run_all  # noqa: E402
from attention_options_split import LseOp, split  # noqa: E402
from attention_options_vendors import (  # noqa: E402
    FLASHINFER_BACKENDS,
    probe_cudnn,
    probe_flashinfer,
)

from gpu_backend.env import device_environment, versions  # noqa: E402

__all__ = [  # what launch_timeline.py and the tests import from this script
    "SMOKE", "Bench", "Chunk", "Decodes", "Heads", "LseOp", "Option", "add_ratios",
    "attention_flops", "best_options", "causal_pairs", "check_rows", "chunk_error",
    "chunk_penalties", "chunk_starts", "decode_error", "launch_split", "main", "make_prompt",
    "reference_rows", "split",
]

HARD_LIMIT_S = 330.0  # the process dumps its stacks and exits past this (results so far kept)
FLASHINFER_BUILD_S = 420.0  # FlashInfer's JIT may build this long per backend (not in the above)


# ----------------------------------------------------------------------------- probes

def run_probe(flags: Sequence[str], what: str, timeout_s: float) -> dict:
    """This script re-run with `flags` in a child process; its last output line (JSON)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *flags]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"{what} probe still running after {timeout_s:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"ok": False, "error": f"{what} probe exited {proc.returncode}: {tail}"}
    return json.loads(lines[-1])


# ----------------------------------------------------------------------------- main

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON path (default benchmarks/results/attention_options_<gpu>"
                             ".json on a GPU; none for --smoke)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes on CPU through Triton's interpreter")
    parser.add_argument("--only", default="",
                        help="comma-separated shell patterns of option names: run only the "
                             "options named by one (e.g. 'flashinfer*,sdpa cudnn*,ours'); "
                             "SPLIT's op is then picked among those run")
    parser.add_argument("--flashinfer-build-s", type=float, default=FLASHINFER_BUILD_S,
                        help="how long FlashInfer's probe may build its kernels, per backend "
                             "(default %(default)s s; a second run loads them from its cache)")
    parser.add_argument("--report", type=Path, default=None, metavar="RESULT",
                        help="print the report of a saved result (its chunk penalties computed "
                             "again from its rows) and run nothing")
    parser.add_argument("--probe-cudnn", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--probe-flashinfer", choices=FLASHINFER_BACKENDS,
                        help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def run_env(smoke: bool) -> dict:
    """The result's environment: the device and library versions, the command, the date."""
    env = ({"gpu": "cpu-smoke", **versions()} if smoke else device_environment())
    env["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    env["command"] = "python benchmarks/attention_options.py " + " ".join(sys.argv[1:])
    env["measured_on"] = datetime.date.today().isoformat()
    return env


def report_and_save(bench: Bench, sizes: Sizes) -> None:
    """The rows' ratios and chunk penalties added, the report printed and the result saved
    where the bench has a path."""
    add_ratios(bench.rows)
    res = bench.result()
    res["chunk_penalties"] = chunk_penalties(bench.rows, sizes.prompts[-1],
                                             sdpa_cudnn_ms(bench.rows, sizes.prompts[-1]))
    print_report(res)
    path = bench.save()
    if path is not None:
        path.write_text(json.dumps(res, indent=2))
        print(f"wrote {path}")


def run_benchmark(args: argparse.Namespace) -> None:
    """Every section on the GPU (tiny shapes on the CPU with --smoke), the vendors' probes
    first, under the hard time limit; the report printed and the result saved."""
    heads, sizes = (TINY, SMOKE) if args.smoke else (LLAMA_8B, FULL)
    flashinfer_probe = ({b: run_probe(["--probe-flashinfer", b], f"FlashInfer {b}",
                                      args.flashinfer_build_s) for b in FLASHINFER_BACKENDS}
                        if heads.device == "cuda" else {"ok": False, "error": "needs CUDA"})
    faulthandler.dump_traceback_later(HARD_LIMIT_S * (4 if args.smoke else 1), exit=True)
    torch.manual_seed(0)
    bench = Bench(heads, sizes, args.out, run_env(args.smoke),
                  only=tuple(part.strip() for part in args.only.split(",") if part.strip()))
    bench.cudnn_probe = (run_probe(["--probe-cudnn"], "cuDNN frontend", 150.0) if bench.cuda
                         else {"ok": False, "error": "needs CUDA"})
    bench.flashinfer_probe = flashinfer_probe
    try:
        run_all(bench)
    except ContextLost as error:
        print(f"stopped: the CUDA context failed ({error}); rows so far are kept")
    report_and_save(bench, sizes)
    faulthandler.cancel_dump_traceback_later()


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.report is not None:
        print_saved_report(args.report)
        return
    if args.probe_cudnn:
        print(json.dumps(probe_cudnn()))
        return
    if args.probe_flashinfer:
        print(json.dumps(probe_flashinfer(args.probe_flashinfer)))
        return
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("attention_options needs a CUDA GPU; --smoke runs tiny shapes on the CPU")
    run_benchmark(args)


if __name__ == "__main__":
    main()
