"""Map a picklable function over items on the local cores or a Ray cluster, with a progress bar.

Local: ``concurrent.futures.ProcessPoolExecutor`` (one worker runs in-process, no pool).
Ray: the same function becomes a Ray task; ``address="local"`` starts a single-node Ray
instance on this machine (Ray >= 2.10 removed ``local_mode``, so this is Ray's local
mode), anything else is passed to ``ray.init(address=...)``. Ray is an optional extra and
is imported only when asked for. Results always come back in item order.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

RAY_MISSING = ("--ray needs Ray, an optional extra: pip install 'elastic-kv[ray]' "
               "(or pip install ray)")


@dataclass(frozen=True)
class Executor:
    """Where work runs: ``workers`` local processes (None: all cores) or a Ray address."""

    workers: int | None = None
    ray_address: str | None = None
    show_progress: bool = True

    def __post_init__(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")

    @property
    def num_workers(self) -> int:
        return self.workers or os.cpu_count() or 1


def run_parallel(fn: Callable[[Any], Any], items: Sequence, executor: Executor,
                 label: str = "runs") -> list:
    """[fn(item) for item in items], spread as ``executor`` says."""
    with _progress(label, len(items), executor.show_progress) as advance:
        if executor.ray_address is not None:
            return _run_ray(fn, items, executor, advance)
        if executor.num_workers == 1 or len(items) <= 1:
            results = []
            for item in items:
                results.append(fn(item))
                advance()
            return results
        return _run_pool(fn, items, executor.num_workers, advance)


def _run_pool(fn, items: Sequence, num_workers: int, advance: Callable[[], None]) -> list:
    results: list = [None] * len(items)
    with ProcessPoolExecutor(max_workers=min(num_workers, len(items))) as pool:
        futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            advance()
    return results


def ray_module():
    """Import Ray or say how to get it."""
    try:
        import ray
    except ImportError:
        raise RuntimeError(RAY_MISSING) from None
    return ray


def init_ray(address: str, num_cpus: int | None = None) -> None:
    """Connect to ``address`` (or start a local instance for "local") unless connected."""
    ray = ray_module()
    if ray.is_initialized():
        return
    if address == "local":
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                 log_to_driver=False)
    else:
        ray.init(address=address, log_to_driver=False)


def _run_ray(fn, items: Sequence, executor: Executor, advance: Callable[[], None]) -> list:
    assert executor.ray_address is not None
    init_ray(executor.ray_address, executor.workers)
    ray = ray_module()
    task = ray.remote(fn)
    refs = [task.remote(item) for item in items]
    index = {ref: i for i, ref in enumerate(refs)}
    results: list = [None] * len(items)
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            results[index[ref]] = ray.get(ref)
            advance()
    return results


@contextlib.contextmanager
def _progress(label: str, total: int, enabled: bool) -> Iterator[Callable[[], None]]:
    """Yield an ``advance()`` callback; the bar (stderr) shows only on a terminal."""
    if not enabled or total <= 1 or not (sys.stderr.isatty() or os.environ.get("SIM_PROGRESS") == "1"):
        yield lambda: None
        return
    bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   transient=True, console=Console(stderr=True))
    task = bar.add_task(label, total=total)
    with bar:
        yield lambda: bar.advance(task)
