"""The trace slice a GPU run replayed: which requests of which trace, as its summary records
them, so that the simulation replays the very same requests."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from traces import Trace, load_trace
from traces.bundled import BUNDLED

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class TraceSlice:
    """Which requests of which trace a run replayed (the GPU summary records it)."""

    trace: str
    format: str | None = None
    limit: int | None = None
    window_s: tuple[float, float] | None = None
    rate_scale: float = 1.0
    num_requests: int | None = None  # what the GPU run replayed, to check the slice against

    def load(self) -> Trace:
        trace = load_trace(_resolve_trace(self.trace), self.format, window_s=self.window_s,
                           limit=self.limit, rate_scale=self.rate_scale)
        if self.num_requests is not None and len(trace) != self.num_requests:
            raise ValueError(
                f"the trace slice ({self.describe()}) has {len(trace)} requests but the GPU run "
                f"replayed {self.num_requests}; pass the replay's --trace/--limit/--window/"
                f"--rate-scale to compare")
        return trace

    def describe(self) -> str:
        return (f"{self.trace}, limit {self.limit}, window {self.window_s}, "
                f"rate x{self.rate_scale:g}")

    def to_dict(self) -> dict:
        return {"trace": self.trace, "format": self.format, "limit": self.limit,
                "window_s": list(self.window_s) if self.window_s else None,
                "rate_scale": self.rate_scale, "num_requests": self.num_requests}


def trace_slice(summary: dict, override: TraceSlice | None = None) -> TraceSlice:
    """The trace slice recorded in a GPU summary; `override` (from flags) wins if given."""
    expected = summary.get("num_trace_requests")
    expected = int(expected) if expected is not None else None
    if override is not None:
        return replace(override, num_requests=expected)
    trace = summary.get("trace_path") or summary.get("trace")
    if not trace:
        raise ValueError("the GPU summary does not record its trace; pass --trace (and "
                         "--limit/--window/--rate-scale as used for the replay)")
    window = summary.get("window_s") or summary.get("window")
    if isinstance(window, str):
        start, _, end = window.partition(":")
        window = (float(start or 0), float(end or "inf"))
    limit = summary.get("limit", summary.get("trace_limit"))
    rate_scale = float(summary.get("rate_scale") or 1.0)
    if limit is None and not window and "rate_scale" not in summary and expected is not None:
        # gpu_backend records only the trace file and its request count; a run of the first
        # N requests (--limit N) is the one slice that count pins down, checked on load.
        limit = expected
    return TraceSlice(str(trace), summary.get("trace_format") or summary.get("format"),
                      int(limit) if limit is not None else None,
                      tuple(window) if window else None, rate_scale, expected)


def _resolve_trace(name: str) -> str:
    """A recorded trace path that exists here (or under the repository, as a slice's own
    trace is named), else the bundled trace with that file name."""
    if Path(name).is_file() or name.strip().lower() in BUNDLED:
        return name
    if (REPO_ROOT / name).is_file():
        return str(REPO_ROOT / name)
    for bundled_name, path in BUNDLED.items():
        if Path(name).name == path.name:
            return bundled_name
    return name  # load_trace says plainly that it is missing
