"""How long the planner takes to answer on the Azure conv trace, and what it answers.

    .venv/bin/python benchmarks/plan_speed.py [--workers 2] [--full-trace] [--before-tree DIR]

Two questions, each run as the command a user types (a fresh process, so start-up counts),
timed in wall seconds and in CPU seconds of the command and its workers:

    fleet   "Llama-3.1-70B on H100-80GB, Azure conv at 4x: how many GPUs for TTFT p99 < 2 s,
            TP4 or TP8?"  python -m sim plan fleet --model llama-3.1-70b --gpu h100 --tp 4,8
                              --trace azure-conv --rate-scale 4 --slo-ttft 2
    plan    the chunk plan for one model and GPU:  python -m sim plan --model llama-3.1-8b
                              --gpu h200 --trace azure-conv

Both search on the trace's busiest 4,000 requests by default (the output says so);
`--full-trace` also runs each on every request, to compare time and answer. `--before-tree`
names another checkout of the project (e.g. `git worktree add /tmp/base <commit>`): the plan
command runs there too and the ratio of the two times is printed. The target for each
question is 30 s on a 2-core machine; a shared machine's other load shows as wall time above
CPU time / workers.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 30.0
FLEET = ["plan", "fleet", "--model", "llama-3.1-70b", "--gpu", "h100", "--tp", "4,8",
         "--trace", "azure-conv", "--rate-scale", "4", "--slo-ttft", "2"]
PLAN = ["plan", "--model", "llama-3.1-8b", "--gpu", "h200", "--trace", "azure-conv"]


def timed(args: list[str], cwd: Path) -> tuple[float, float, dict | None, str]:
    """(wall s, CPU s, the --json output or None, stderr's last line) of `python -m sim args`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "sim", *args, "--json", "--no-progress"],
                          cwd=cwd, capture_output=True, text=True)
    wall_s = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    try:
        out = json.loads(done.stdout)
    except json.JSONDecodeError:
        out = None
    last = (done.stderr.strip().splitlines() or [""])[-1]
    return wall_s, cpu_s, out, last


def fleet_answer(out: dict | None) -> str:
    if out is None:
        return "no answer (see stderr)"
    answer = out["answer"]["line"] if out["answer"] else "no configuration meets the targets"
    ups = "; ".join(f"runner-up {i}: {u['line']}" for i, u in enumerate(out["runners_up"], 1))
    return f"{answer}{'; ' + ups if ups else ''} [{out['num_runs']} runs]"


def plan_answer(out: dict | None) -> str:
    if out is None:
        return "no answer (see stderr)"
    if out.get("nothing_sustains"):
        return f"nothing sustains the load; fleet: {out.get('fleet_replicas')} replicas"
    gains = out["elastic_gain_pct"]
    return (f"pick chunk {out['pick_chunk']}, elastic pick {out['elastic_pick_chunk']}, "
            f"elastic pays: {out['elastic_pays']} (max-rate gain "
            f"{gains.get('max_rate_req_s')})")


def report(name: str, args: list[str], workers: int, cwd: Path = ROOT) -> float:
    command = ["python -m sim", *args, "--workers", str(workers)]
    wall_s, cpu_s, out, last = timed([*args, "--workers", str(workers)], cwd)
    answer = fleet_answer(out) if args[:2] == ["plan", "fleet"] else plan_answer(out)
    print(f"{name}: {wall_s:6.1f} s wall, {cpu_s:6.1f} s CPU "
          f"({wall_s / TARGET_S:.2f}x the {TARGET_S:g} s target)\n    {' '.join(command)}"
          f"\n    answer: {answer}")
    if out is None:
        print(f"    stderr: {last}")
    elif out.get("stretch"):
        print(f"    {out['stretch']}")
    return wall_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--full-trace", action="store_true",
                        help="also answer both questions on every request")
    parser.add_argument("--before-tree", type=Path, default=None, metavar="DIR",
                        help="another checkout to time the plan command in, for the ratio")
    args = parser.parse_args()
    fleet_s = report("fleet", FLEET, args.workers)
    plan_s = report("plan ", PLAN, args.workers)
    if args.full_trace:
        full_fleet_s = report("fleet, every request", [*FLEET, "--full-trace"], args.workers)
        full_plan_s = report("plan, every request ", [*PLAN, "--full-trace"], args.workers)
        print(f"stretch vs every request: fleet {full_fleet_s / fleet_s:.1f}x faster, "
              f"plan {full_plan_s / plan_s:.1f}x faster")
    if args.before_tree is not None:
        before_s, _, _, _ = timed([*PLAN, "--workers", str(args.workers)], args.before_tree)
        print(f"plan in {args.before_tree}: {before_s:.1f} s wall; this tree is "
              f"{before_s / plan_s:.1f}x faster")


if __name__ == "__main__":
    main()
