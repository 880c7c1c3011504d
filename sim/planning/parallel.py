"""Map a picklable function over items on the local cores or a Ray cluster, with a progress bar.

Local: ``concurrent.futures.ProcessPoolExecutor`` (one worker runs in-process, no pool).
Ray: the same function becomes a Ray task; ``address="local"`` starts a single-node Ray
instance on this machine (Ray >= 2.10 removed ``local_mode``, so this is Ray's local
mode), anything else is passed to ``ray.init(address=...)``. Ray is an optional extra and
is imported only when asked for.

One item's trouble is that item's alone. `iter_outcomes` yields an `Outcome` per item as it
ends, in the order they end: its value, or why it has none:

    it raised       the exception, caught in the worker, with where it was raised
    worker lost     local: a worker process that dies (killed, out of memory) breaks the
                    whole pool; the items that were in flight in it (running, or queued
                    for a worker) are run again one at a time in a pool of their own, so
                    that a death is pinned on its item, and an item whose worker died alone
                    more than `max_retries` times is given up. The pool's break counts for
                    none of them: it cannot tell the item that died from one that had not
                    started.
                    Ray: tasks are retried `max_retries` times by Ray itself; a task lost
                    after that is reported with Ray's reason.

A Ctrl-C stops the workers (they ignore SIGINT themselves, so they print nothing) and
reaches the caller as KeyboardInterrupt. `run_parallel` keeps the old contract: values in
item order, or a RuntimeError naming the first item that failed.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import signal
import sys
import traceback
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

MAX_MESSAGE = 300
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
RAY_MISSING = ("--ray needs Ray, an optional extra: pip install 'elastic-kv[ray]' "
               "(or pip install ray)")


@dataclass(frozen=True)
class Executor:
    """Where work runs: ``workers`` local processes (None: all cores) or a Ray address.
    ``max_retries``: how often an item whose worker died while it ran alone is run again."""

    workers: int | None = None
    ray_address: str | None = None
    show_progress: bool = True
    max_retries: int = 2

    def __post_init__(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")

    @property
    def num_workers(self) -> int:
        return self.workers or os.cpu_count() or 1


@dataclass(frozen=True)
class Outcome:
    """What one item gave: `value`, or `error` saying why it has none."""

    index: int
    value: Any = None
    error: str | None = None


def run_parallel(fn: Callable[[Any], Any], items: Sequence, executor: Executor,
                 label: str = "runs") -> list:
    """[fn(item) for item in items], spread as ``executor`` says; RuntimeError if any fails."""
    results: list = [None] * len(items)
    for outcome in iter_outcomes(fn, items, executor, label):
        if outcome.error is not None:
            raise RuntimeError(f"{label}: item {outcome.index + 1} of {len(items)} failed: "
                               f"{outcome.error}")
        results[outcome.index] = outcome.value
    return results


def iter_outcomes(fn: Callable[[Any], Any], items: Sequence, executor: Executor,
                  label: str = "runs") -> Iterator[Outcome]:
    """One Outcome per item, as each ends (see the module docstring)."""
    with _progress(label, len(items), executor.show_progress) as advance:
        if executor.ray_address is not None:
            source = _ray_outcomes(fn, items, executor)
        elif executor.num_workers == 1 or len(items) <= 1:
            source = (call(fn, i, item) for i, item in enumerate(items))
        else:
            source = _pool_outcomes(fn, items, executor)
        for outcome in source:
            advance()
            yield outcome


def call(fn: Callable[[Any], Any], index: int, item: Any) -> Outcome:
    """fn(item) as an Outcome: an exception it raises becomes the outcome's error."""
    try:
        return Outcome(index, fn(item))
    except Exception as exc:  # noqa: BLE001 -- every failure of an item is reported, not raised
        return Outcome(index, error=describe_exception(exc))


def describe_exception(exc: BaseException, where: bool = True) -> str:
    """`Type: message (at file.py:line in function)`, one line of at most MAX_MESSAGE
    characters of message (`where`: name the place it was raised)."""
    text = ANSI_ESCAPE.sub("", str(exc)).strip()
    if not where:  # another system's error (Ray's): its first line, not its traceback
        text = text.splitlines()[0] if text else ""
    message = " ".join(text.split()) or "(no message)"
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE - 3] + "..."
    frames = traceback.extract_tb(exc.__traceback__)
    place = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno} in " \
            f"{frames[-1].name})" if frames and where else ""
    return f"{type(exc).__name__}: {message}{place}"


# ------------------------------------------------------------------------------------ local
def _pool_outcomes(fn, items: Sequence, executor: Executor) -> Iterator[Outcome]:
    pending = deque(range(len(items)))
    suspects: deque[int] = deque()  # in flight when a worker died: each is run alone next
    deaths: Counter[int] = Counter()  # deaths of each item's worker while it ran alone
    while pending or suspects:
        if not suspects:
            suspects.extend((yield from _pool_round(fn, items, pending, executor.num_workers)))
            continue
        index = suspects.popleft()
        outcome = _run_alone(fn, index, items[index])
        if outcome is not None:
            yield outcome
            continue
        deaths[index] += 1
        if deaths[index] > executor.max_retries:
            yield Outcome(index, error=f"its worker process died each of the {deaths[index]} "
                                       "times it ran alone (killed, or out of memory)")
        else:
            suspects.append(index)


def _pool_round(fn, items: Sequence, pending: deque[int], num_workers: int):
    """Run `pending` in one pool, no more items at once than workers; return the items that
    were in flight when a worker died (running, or still queued for a worker)."""
    with _pool(min(num_workers, len(pending))) as pool:
        in_flight: dict[Future, int] = {}
        lost: list[int] = []
        while (pending and not lost) or in_flight:
            while pending and not lost and len(in_flight) < num_workers:
                index = pending.popleft()
                in_flight[pool.submit(call, fn, index, items[index])] = index
            finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
            for future in finished:
                index = in_flight.pop(future)
                try:
                    yield future.result()
                except BrokenProcessPool:
                    lost.append(index)
        return lost


def _run_alone(fn, index: int, item: Any) -> Outcome | None:
    """The item in a pool of one worker; None if that worker died."""
    with _pool(1) as pool:
        try:
            return pool.submit(call, fn, index, item).result()
        except BrokenProcessPool:
            return None


@contextlib.contextmanager
def _pool(num_workers: int) -> Iterator[ProcessPoolExecutor]:
    """A process pool whose workers ignore Ctrl-C; if the caller stops early (Ctrl-C, or
    it stops reading), the workers are ended instead of waited for."""
    pool = ProcessPoolExecutor(max_workers=num_workers, initializer=_ignore_sigint)
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        for process in multiprocessing.active_children():
            process.terminate()
        raise
    pool.shutdown(wait=True)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# -------------------------------------------------------------------------------------- ray
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


def _ray_outcomes(fn, items: Sequence, executor: Executor) -> Iterator[Outcome]:
    """Ray tasks of `call` (so an exception comes back as an outcome and is not retried);
    Ray reruns a task whose worker died up to `max_retries` times."""
    assert executor.ray_address is not None
    init_ray(executor.ray_address, executor.workers)
    ray = ray_module()
    task = ray.remote(max_retries=executor.max_retries)(call)
    refs = {task.remote(fn, i, item): i for i, item in enumerate(items)}
    pending = list(refs)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    yield ray.get(ref)
                except ray.exceptions.RayError as exc:
                    yield Outcome(refs[ref], error=f"lost on Ray after {executor.max_retries} "
                                                   f"retries: {describe_exception(exc, False)}")
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise


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
