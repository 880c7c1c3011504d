"""How the engine times a step on the device: the stream's clock on the host's timeline
(DeviceClock), the events around one step (SpanEvents), where its time went (StepPhases), and
the Triton compilations that would spoil a timing (CompileWatch)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch


class CompileWatch:
    """Counts Triton JIT compilations in this process (triton.knobs' post-compile hook).

    An eager step that meets a new kernel variant (a new split count, say) compiles it on
    the host, seconds that are no part of the step; the engine re-runs such a step (the
    forward is idempotent: same KV writes, same ids) and keeps the second timing.
    """

    def __init__(self) -> None:
        self.count = 0
        self.enabled = False
        try:
            from triton import knobs
        except ImportError:
            return
        runtime = getattr(knobs, "runtime", None)
        if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
            return
        previous = runtime.jit_post_compile_hook

        def hook(*args, **kwargs):
            self.count += 1
            return previous(*args, **kwargs) if previous is not None else None

        runtime.jit_post_compile_hook = hook
        self.enabled = True


@dataclass(frozen=True)
class StepPhases:
    """Where one step's time went: host enqueue time and device span (seconds; NaN unknown)."""
    enqueue_s: float = math.nan
    device_s: float = math.nan


class DeviceClock:
    """When work on one stream ended, on the host's clock (`time.perf_counter`).

    An event the host waits on ends about when the wait returns: that pair anchors the
    device's timer to the host's. An event that had ended before the host looked (the host was
    busy launching the next step) is dated from the latest anchor by the device's own timer
    (CUDA events' elapsed time), so its step is stamped when the device finished it, not when
    the host got round to it. The anchor is the latest event waited on in stream order, a step
    old when the host keeps up; the two timers drift apart by parts per million, so a date
    taken from an anchor a second old is off by microseconds."""

    def __init__(self) -> None:
        self._anchor: tuple[float, int, torch.cuda.Event] | None = None
        self._count = 0

    def mark(self) -> tuple[int, torch.cuda.Event]:
        """A timing event recorded on the current stream now, with its place in stream order
        (the first one is waited on at once, to anchor the timers)."""
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self._count += 1
        mark = (self._count, event)
        if self._anchor is None:
            self.ended(mark)
        return mark

    def ended(self, mark: tuple[int, torch.cuda.Event]) -> float:
        """Block until `mark`'s event has run; the host time at which it ran."""
        order, event = mark
        if self._anchor is not None and event.query():
            anchor_t, anchor_order, anchor = self._anchor
            if order >= anchor_order:
                return anchor_t + anchor.elapsed_time(event) * 1e-3
            return anchor_t - event.elapsed_time(anchor) * 1e-3
        event.synchronize()
        ended_t = time.perf_counter()
        if self._anchor is None or order > self._anchor[1]:
            self._anchor = (ended_t, order, event)
        return ended_t


class SpanEvents:
    """Timing events around one step on the current stream (no-ops on the CPU)."""

    def __init__(self, device: torch.device, clock: DeviceClock) -> None:
        self.cuda, self.clock = device.type == "cuda", clock
        self.start: torch.cuda.Event | None = None
        self.end: torch.cuda.Event | None = None
        self.last: tuple[int, torch.cuda.Event] | None = None  # what `wait` waits for

    def record_start(self) -> None:
        if self.cuda:
            self.start = self.clock.mark()[1]

    def record_end(self) -> None:
        if self.cuda:
            self.last = self.clock.mark()
            self.end = self.last[1]

    def record_copied(self) -> None:
        """After the copy of the step's ids to the host was queued: `wait` waits for it."""
        if self.cuda:
            self.last = self.clock.mark()

    def wait(self) -> float | None:
        """Block until the step's work, and the copy of its ids when there is one, is done;
        the host time (`time.perf_counter`) at which the device finished it (None on the
        CPU, where the step ran as it was launched)."""
        if self.last is None:
            return None
        return self.clock.ended(self.last)

    def span_s(self) -> float:
        """Seconds between the two events; call after `wait`."""
        if self.start is None or self.end is None:
            return math.nan
        return self.start.elapsed_time(self.end) * 1e-3
