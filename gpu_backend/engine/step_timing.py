"""How a profile times one engine step: alone, as a synchronous engine runs it
(`time_step`), launched back to back, as async scheduling runs a stream of them
(`time_step_ahead`), and every shape of a grid in passes (`measure_grid`)."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

from gpu_backend.engine.shapes import StepShape


def time_step(runner, build, warmup: int, repeat: int) -> dict[str, float]:
    """Medians over `repeat` runs of `runner.execute(build())` (seconds): `measured_s`, the
    whole step, host batch built as the engine builds it in a replay (GpuEngine._run), and
    its phases as a replay's steps.csv records them (`build_s`, `enqueue_s`, `device_s`)."""
    for _ in range(warmup):
        runner.execute(build())
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        batch = build()
        built = time.perf_counter()
        runner.execute(batch)  # ends with the sampled ids on the host (a sync)
        phases = getattr(runner, "phases", None)
        runs.append((time.perf_counter() - start, built - start,
                     getattr(phases, "enqueue_s", math.nan), getattr(phases, "device_s", math.nan)))
    columns = zip(*runs)
    return {name: statistics.median(values)
            for name, values in zip(("measured_s", "build_s", "enqueue_s", "device_s"), columns)}


def time_step_ahead(runner, build, warmup: int, repeat: int) -> dict[str, float]:
    """The step launched back to back, as async scheduling runs a stream of them: each one
    built and launched (`runner.launch`) before the one before it is collected. `ahead_s`:
    the median time between consecutive steps' ends on the device (the period of the
    stream, the host's build and launch hidden where the device is the longer);
    `ahead_device_s`: the median device span of those steps, which holds no wait for the
    host where the launches ran ahead of the device (seconds; NaN where the runner reports
    no end times, as on the CPU). `warmup` steps are launched first and not counted."""
    ends: list[float] = []
    spans: list[float] = []
    launched = None
    for index in range(warmup + repeat + 1):
        step = runner.launch(build())
        if launched is not None:
            launched.collect()
            if index > warmup:  # the steps after the warm-up, each ended before `step`'s
                ends.append(math.nan if launched.done_t is None else launched.done_t)
                spans.append(launched.phases.device_s)
        launched = step
    launched.collect()
    periods = [b - a for a, b in zip(ends, ends[1:])]
    return {"ahead_s": statistics.median(periods) if periods else math.nan,
            "ahead_device_s": statistics.median(spans) if spans else math.nan}


def measure_grid(shapes: list[StepShape], measure: Callable[[StepShape], dict[str, float]],
                 passes: int = 2) -> list[dict]:
    """`measure(shape)` of every shape, `passes` times, every other pass in reverse order: a
    drift of the host's speed through the grid (the same short split steps enqueued 1 ms
    apart in two profiles on one H200) then weighs every point alike, and a
    linear drift cancels. Per shape: the median over passes of each timing, and the passes'
    whole-step times (`passes_measured_s`) in measuring order."""
    if passes < 1:
        raise ValueError(f"passes={passes}: time the grid at least once")
    runs: list[list[dict[str, float]]] = [[] for _ in shapes]
    forward = list(range(len(shapes)))
    for index in range(passes):
        for i in forward if index % 2 == 0 else forward[::-1]:
            runs[i].append(measure(shapes[i]))
    return [{**{key: statistics.median(r[key] for r in point) for key in point[0]},
             "passes_measured_s": [r["measured_s"] for r in point]} for point in runs]
