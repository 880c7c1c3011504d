"""`--trace synthetic` on the command line: arrivals, length distributions and the seed.

    --trace synthetic --synthetic-requests 2000 --synthetic-rate 4 --arrival gamma --cv 2 \
        --prompt-dist lognormal:1000:1.0 --output-dist empirical:azure-conv --seed 7

Length specs: `fixed:N`, `uniform:LOW:HIGH`, `lognormal:MEDIAN:SIGMA[:MAX]`, or
`empirical:TRACE` (a file or bundled name; draws from its prompt column for --prompt-dist and
its output column for --output-dist).
"""

from __future__ import annotations

import argparse

from traces.errors import TraceError
from traces.lengths import LengthDist
from traces.loader import load_trace
from traces.synthetic import synthetic
from traces.trace import Trace

SYNTHETIC = "synthetic"


def add_synthetic_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("synthetic trace (with --trace synthetic)")
    g.add_argument("--synthetic-requests", type=int, default=1000, metavar="N",
                   help="how many requests to generate (default 1000)")
    g.add_argument("--synthetic-rate", type=float, default=2.0, metavar="REQ_PER_S",
                   help="mean arrival rate in requests per second (default 2)")
    g.add_argument("--arrival", choices=("poisson", "gamma", "constant"), default="poisson",
                   help="inter-arrival gaps: exponential (poisson), gamma with --cv, or equal")
    g.add_argument("--cv", type=float, default=1.0, help="coefficient of variation (gamma)")
    g.add_argument("--prompt-dist", default="lognormal:1000:1.0", metavar="SPEC",
                   help="prompt tokens: fixed:N, uniform:LOW:HIGH, lognormal:MEDIAN:SIGMA[:MAX] "
                        "or empirical:TRACE (default lognormal:1000:1.0)")
    g.add_argument("--output-dist", default="lognormal:200:1.0", metavar="SPEC",
                   help="output tokens, in the same forms (default lognormal:200:1.0)")
    g.add_argument("--seed", type=int, default=0,
                   help="seed of the synthetic trace (and, in the GPU engine, of the weights)")


def synthetic_from_args(args: argparse.Namespace) -> Trace:
    return synthetic(
        args.synthetic_requests, args.synthetic_rate, arrival=args.arrival, cv=args.cv,
        prompt=parse_length(args.prompt_dist, "prompt_tokens", "--prompt-dist"),
        output=parse_length(args.output_dist, "output_tokens", "--output-dist"),
        seed=args.seed,
    )


def parse_length(spec: str, column: str, flag: str) -> LengthDist:
    kind, _, rest = spec.partition(":")
    parts = rest.split(":") if rest else []
    try:
        if kind == "fixed" and len(parts) == 1:
            return LengthDist.fixed(int(parts[0]))
        if kind == "uniform" and len(parts) == 2:
            return LengthDist.uniform(int(parts[0]), int(parts[1]))
        if kind == "lognormal" and len(parts) in (2, 3):
            extra = {"max_tokens": int(parts[2])} if len(parts) == 3 else {}
            return LengthDist.lognormal(median=float(parts[0]), sigma=float(parts[1]), **extra)
        if kind == "empirical" and rest:
            return LengthDist.empirical(load_trace(rest), column)
    except ValueError as exc:
        raise TraceError(None, f"{flag} {spec!r}: {exc}",
                         fix="see `--help` for the length specs") from None
    raise TraceError(None, f"{flag} {spec!r} is not a length spec",
                     fix="use fixed:N, uniform:LOW:HIGH, lognormal:MEDIAN:SIGMA[:MAX] or "
                         "empirical:TRACE")
