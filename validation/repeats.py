"""The same replay measured again: how far the measurement itself moves.

A replay's latencies depend on the machine's state as well as on its configuration. On two
H200 machines the host CPU ran a fixed pure-Python loop in 7 ms and in 9-14 ms
(`benchmarks/host_noise.py`), and every launch-bound step moves with it: replays of one run
differ by up to 9% in TPOT p50 (Llama-3.1-8B, Azure code) and 18% in TTFT p50 (Qwen2.5-0.5B,
Azure conv) in validation/evidence/. A model error is only meaningful beside that.

`python -m validation compare --repeat-dir DIR` (repeatable) reads other replays of the same
runs: every run of DIR whose policy and chunk match a compared run must have replayed the same
configuration and trace slice (else a clear error names both folders and the field). For each
run and metric the report lists every measured value and the largest deviation of a repeat
from the compared replay, and the median of that over runs; `python -m validation table` lists
the medians per report. The report also sets the model against the median of every replay
of a run (`errors_against_median`), a measured value with less of the host's noise in it;
the targets themselves are judged against the compared replay.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from validation.compare import metric_values, relative_error
from validation.runs import RunSummary

REPEAT_METRICS = ("ttft_p50_s", "tpot_p50_s", "throughput_tok_s", "ttft_p99_s")
# What a repeat must share with the replay it repeats (summary.json keys).
SAME_CONFIGURATION = ("model", "gpu", "policy", "chunk", "drain", "tensor_parallel_size",
                      "max_num_seqs", "block_size", "max_model_len", "trace_path", "limit",
                      "window_s", "rate_scale", "seed", "num_requests", "enable_prefix_caching")


def check_same_configuration(run: RunSummary, repeat: RunSummary) -> None:
    for key in SAME_CONFIGURATION:
        a, b = run.summary.get(key), repeat.summary.get(key)
        if a != b:
            raise ValueError(
                f"{repeat.path / 'summary.json'}: {key} is {b!r} but the replay it repeats "
                f"({run.path / 'summary.json'}) has {a!r}; a repeat must replay the same "
                f"configuration and trace slice (pass only such folders to --repeat-dir)")


def repeat_rows(runs: Sequence[RunSummary],
                repeats: Sequence[tuple[str, Sequence[RunSummary]]]
                ) -> list[dict]:
    """One row per run and metric: the compared replay's value, each repeat's, and the largest
    |repeat / replay - 1|. `repeats`: (name, runs) per repeat folder; a repeat without a run
    of the same policy and chunk is left out of that run's rows."""
    rows = []
    for run in runs:
        matches = []
        for name, others in repeats:
            same = [o for o in others if o.label == run.label]
            if len(same) > 1:
                raise ValueError(f"repeat {name}: {len(same)} replays of {run.label} "
                                 f"({', '.join(str(o.path) for o in same)}); keep one")
            if same:
                check_same_configuration(run, same[0])
                matches.append((name, same[0]))
        if not matches:
            continue
        values = metric_values(run.summary)
        for metric in REPEAT_METRICS:
            value = values[metric]
            others = [(name, metric_values(o.summary)[metric]) for name, o in matches]
            deviations = [abs(v / value - 1.0) for _, v in others
                          if v is not None and value not in (None, 0.0)]
            every = [value, *(v for _, v in others)]
            median = float(np.median(every)) if None not in every else None
            rows.append({"run": run.label, "metric": metric, "value": value,
                         "repeats": [{"name": name, "value": v} for name, v in others],
                         "max_deviation": max(deviations) if deviations else None,
                         "median": median, "num_replays": len(every)})
    return rows


def errors_against_median(rows: Sequence[dict], predicted: dict[str, dict[str, float | None]]
                          ) -> dict:
    """The model against the median of every replay of each run (the compared one and its
    repeats): a measured value with less of the host's noise in it than one replay.
    `predicted`: run label -> metric -> predicted value. Per run and metric the relative
    error (`rows`), and per metric the median over runs of |error| (`median_abs`)."""
    out = []
    for r in rows:
        pred = predicted.get(r["run"], {}).get(r["metric"])
        median = r.get("median")
        out.append({"run": r["run"], "metric": r["metric"], "predicted": pred,
                    "median": median, "num_replays": r.get("num_replays"),
                    "relative_error": relative_error(pred, median)})
    return {"rows": out, "median_abs": median_abs_errors(out)}


def median_abs_errors(rows: Sequence[dict]) -> dict[str, float | None]:
    """Per metric, the median over rows of |relative_error| (None: no row has one)."""
    return _median_per_metric(rows, "relative_error", abs)


def median_deviation(rows: Sequence[dict]) -> dict[str, float | None]:
    """Per metric, the median over runs of the largest deviation of a repeat."""
    return _median_per_metric(rows, "max_deviation")


def _median_per_metric(rows: Sequence[dict], key: str,
                       transform: Callable[[float], float] = float) -> dict[str, float | None]:
    """Per metric of REPEAT_METRICS, the median of transform(row[key]) over the rows that
    have one (None where none has)."""
    out: dict[str, float | None] = {}
    for metric in REPEAT_METRICS:
        found = [transform(r[key]) for r in rows if r["metric"] == metric and r[key] is not None]
        out[metric] = float(np.median(found)) if found else None
    return out
