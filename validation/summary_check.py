"""A GPU run's summary.json read and checked where it is loaded: what validation reads from it
(the run's chunk and policy, every compared metric) must have the right type, so that a
malformed value is an error naming the file and field before any simulation runs, not a bare
conversion error after it. The model and the rest of the configuration are checked where
they are read: config.json by EngineConfig.from_json, an older replay's summary columns by
validation.run_config.legacy_config."""

from __future__ import annotations

import json
from pathlib import Path

from sim.core.elastic import Policy
from validation.metrics import METRICS


def read_summary_json(path: Path) -> dict:
    """The JSON object in `path`; ValueError naming the file (and the line and column where
    it is not JSON) otherwise."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON at line {exc.lineno}, column {exc.colno} "
                         f"({exc.msg}); write it again with the replay") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot be read ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: holds a JSON {type(data).__name__}, not the summary object "
                         f"gpu_backend replay writes")
    runs = data.get("runs")
    if runs is not None and not (isinstance(runs, list)
                                 and all(isinstance(r, dict) for r in runs)):
        raise ValueError(f"{path}: field runs must be a list of run objects")
    return data


def check_summary(summary: dict, path: Path) -> None:
    """ValueError naming `path` and the field where the one run's `summary` (its runs entry
    merged with the top level) has a value validation cannot read."""
    chunk = summary.get("chunk")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0:
        raise ValueError(f"{path}: field chunk is {chunk!r}; it must be the run's "
                         f"max_num_batched_tokens, a positive integer")
    if summary.get("policy") is not None:  # the run's label, whatever config.json holds
        try:
            Policy.parse(str(summary["policy"]))
        except ValueError as exc:
            raise ValueError(f"{path}: field policy: {exc}") from None
    _check_metrics(summary, path)
    measured = summary.get("measured")
    if measured is not None and not isinstance(measured, dict):
        raise ValueError(f"{path}: field measured must be an object")
    _check_number(path, "measured.kv_tokens", (measured or {}).get("kv_tokens"))
    for key in ("num_trace_requests", "block_size"):
        _check_number(path, key, summary.get(key), integer=True)


def _check_metrics(summary: dict, path: Path) -> None:
    """Every compared metric a number or null, and each latency object given with the
    percentiles compared (one left out would drop out of the comparison unseen)."""
    for _, key, sub, _ in METRICS:
        value = summary.get(key)
        if sub is not None and value is not None:
            if not isinstance(value, dict):
                raise ValueError(f"{path}: field {key} is {value!r}; it must be an object of "
                                 f"percentiles ({_subs(key)}, ...)")
            if sub not in value:  # null is kept: no request finished to measure it
                raise ValueError(f"{path}: field {key}.{sub} is missing; {key} must hold the "
                                 f"percentiles compared ({_subs(key)}): write it again with "
                                 "the replay")
            key, value = f"{key}.{sub}", value[sub]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"{path}: field {key} is {value!r}; it must be a number")


def _subs(key: str) -> str:
    """The percentiles of summary key `key` that validation compares, e.g. "p50, p99"."""
    return ", ".join(sub for _, k, sub, _ in METRICS if k == key and sub is not None)


def _check_number(path: Path, key: str, value, *, integer: bool = False) -> None:
    """ValueError naming `path` and field `key` unless `value` is None or a number >= 0 (an
    integer where `integer`)."""
    kind = int if integer else int | float
    if value is not None and (isinstance(value, bool) or not isinstance(value, kind)
                              or value < 0):
        raise ValueError(f"{path}: field {key} is {value!r}; it must be "
                         f"{'an integer' if integer else 'a number'} >= 0")
