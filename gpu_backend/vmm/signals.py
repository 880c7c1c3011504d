"""Defer SIGINT and SIGTERM while the pool changes driver state and its own record of it.

Why: a Python signal handler runs between two bytecodes, so a Ctrl-C that arrives while
``cuMemMap`` runs raises ``KeyboardInterrupt`` after the driver mapped the memory but before
the pool wrote that down: the pool then no longer knows the mapping, and the next attach
fails with ``CUDA_ERROR_ALREADY_MAPPED`` (or a handle leaks). Inside :func:`defer_signals`
the handlers of SIGINT and SIGTERM only note the signal; when the section ends the original
handlers are back and each noted signal is raised again (``signal.raise_signal``), so a
Ctrl-C still becomes a ``KeyboardInterrupt`` and a default SIGTERM still ends the process,
just after the section and with the pool's record matching the driver.

Rules:

* Handlers are installed only on the main thread (Python runs signal handlers there alone,
  and only there may they be set) and only when no deferral is active already: a nested
  section is part of the outer one, which delivers its signals.
* A signal whose handler is ``SIG_IGN`` or was not set from Python is left alone.
* Off the main thread the section installs nothing, and needs nothing: a signal's Python
  handler runs in the main thread, so it cannot split a worker's driver call from its
  bookkeeping. The main thread's handler may raise there meanwhile (its ``KeyboardInterrupt``
  arrives at once); if it then calls ``close()``, the pool's lock makes it wait until the
  worker's transition has finished.
* Signals that end the process without a Python handler (SIGKILL, or SIGTERM while no
  section is active) cannot be deferred; the driver frees a dead process's memory.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

DEFERRED_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_active = False  # a deferral's handlers are installed (main thread only)


def _deferrable(signum: int) -> bool:
    handler = signal.getsignal(signum)
    return handler is not None and handler is not signal.SIG_IGN


@contextlib.contextmanager
def defer_signals() -> Iterator[None]:
    """Hold SIGINT/SIGTERM until the block ends, then deliver them; see the module docstring."""
    global _active
    if _active or threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        if signum not in pending:
            pending.append(signum)

    saved: list[tuple[int, Any]] = []
    _active = True
    try:
        for signum in DEFERRED_SIGNALS:
            if _deferrable(signum):
                saved.append((signum, signal.signal(signum, note)))
        yield
    finally:
        try:
            _restore(saved)
        finally:
            _active = False
            _deliver(pending)


def _restore(saved: list[tuple[int, Any]]) -> None:
    """Put every saved handler back, even if a signal's handler raises between two of them."""
    if not saved:
        return
    signum, handler = saved[0]
    try:
        signal.signal(signum, handler)
    finally:
        _restore(saved[1:])


def _deliver(pending: list[int]) -> None:
    """Raise each noted signal again under its own handler, all of them even if one raises."""
    if not pending:
        return
    try:
        signal.raise_signal(pending[0])
    finally:
        _deliver(pending[1:])
