"""A progress bar for runs longer than a second: simulated time reached and requests done."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from traces import Trace

SHOW_AFTER_S = 1.0


@contextlib.contextmanager
def progress_bar(label: str, trace: Trace, *, disabled: bool = False) -> Iterator:
    """Yield a `progress(simulated_s, num_finished)` callback, or None when disabled.

    The bar appears only once a run has taken SHOW_AFTER_S of wall time, so short runs print
    nothing extra; it writes to stderr, keeping stdout for tables and JSON.
    """
    if disabled or not sys.stderr.isatty() and not _forced():
        yield None
        return
    span_s = float(trace.arrival_s[-1]) if len(trace) else 0.0
    bar = Progress(TextColumn("{task.description}"), BarColumn(),
                   TextColumn("{task.fields[sim]} simulated, {task.fields[done]} requests done"),
                   TimeElapsedColumn(), transient=True)
    start = time.perf_counter()
    task = None

    def update(simulated_s: float, num_finished: int) -> None:
        nonlocal task
        if task is None:
            if time.perf_counter() - start < SHOW_AFTER_S:
                return
            bar.start()
            task = bar.add_task(label, total=max(span_s, 1e-9), sim="0 s", done=0)
        bar.update(task, completed=min(simulated_s, span_s), sim=f"{simulated_s:,.0f} s",
                   done=f"{num_finished:,}/{len(trace):,}")

    try:
        yield update
    finally:
        if task is not None:
            bar.stop()


def _forced() -> bool:
    import os

    return os.environ.get("SIM_PROGRESS") == "1"
