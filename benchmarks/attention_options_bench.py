"""attention_options' timing harness: device, wall and host-launch timers, the soft timeout
per option, and Bench, which runs each option, checks and times it and records its row."""

from __future__ import annotations

import fnmatch
import signal
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from attention_options_builders import Option, scale_of
from attention_options_cases import (
    TOLERANCE,
    Chunk,
    Decodes,
    Heads,
    Sizes,
    attention_flops,
    chunk_error,
    decode_error,
    first_line,
    tile_name,
)
from attention_options_report import format_row
from attention_options_split import LseOp

from gpu_backend.engine.attention_profile import device_ms as profile_device_ms
from gpu_backend.env import write_result

OPTION_TIMEOUT_S = 75.0  # one option (compiles included) is abandoned past this
BUSY_CYCLES = 20_000_000  # ~10 ms of GPU sleep queued while the host launch is timed
QUEUE_AHEAD_CYCLES = 10_000_000  # ~5 ms of GPU sleep queued before each device-timed call


class ContextLost(RuntimeError):
    """The CUDA context failed (a kernel faulted): nothing after it can run."""


@contextmanager
def soft_timeout(seconds: float) -> Iterator[None]:
    """TimeoutError raised in this thread once `seconds` pass (at the next Python bytecode:
    a call stuck inside C returns first; the hard limit covers that)."""
    def expire(signum, frame):
        raise TimeoutError(f"abandoned after {seconds:.0f} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def device_ms(fn: Callable[[], object], reps: int = 20, warmup: int = 3) -> float:
    """Median device milliseconds of fn() by CUDA events, with ~5 ms of GPU sleep queued
    before each call instead of the engine profile's ~0.5: SPLIT's half dozen launches keep
    the host busy up to ~0.75 ms, and the GPU must not wait for them inside the timed span."""
    return profile_device_ms(fn, reps, warmup, queue_cycles=QUEUE_AHEAD_CYCLES)


def wall_ms(fn: Callable[[], object], reps: int = 1) -> float:
    """Host milliseconds of fn() (the CPU check, where there are no CUDA events)."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def host_ms(fn: Callable[[], object], reps: int = 20) -> float:
    """Host milliseconds to launch fn() while the GPU is still busy with queued sleep (so
    the call cannot wait on the GPU unless it synchronises, which then shows)."""
    fn()
    times = []
    for _ in range(reps):
        torch.cuda._sleep(BUSY_CYCLES)
        start = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - start))
        torch.cuda.synchronize()
    return statistics.median(times)


@dataclass
class Bench:
    """What every measurement shares: shapes, sizes, timers, the rows so far."""
    heads: Heads
    sizes: Sizes
    out: Path | None
    env: dict
    rows: list[dict] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    lse_op: LseOp | None = None
    cudnn_probe: dict = field(default_factory=dict)
    flashinfer_probe: dict = field(default_factory=dict)
    only: tuple[str, ...] = ()  # run only options whose names match one of these patterns

    @property
    def cuda(self) -> bool:
        return self.heads.device == "cuda"

    def timer(self, fn: Callable[[], object]) -> float:
        return device_ms(fn) if self.cuda else wall_ms(fn)

    def skip_reason(self, option: Option) -> str | None:
        if option.needs_cuda and not self.cuda:
            return "skipped: needs CUDA"
        if time.perf_counter() - self.started > self.sizes.budget_s:
            return f"skipped: the run's {self.sizes.budget_s:.0f} s budget is spent"
        if option.needs_frontend and not self.cudnn_probe.get("ok"):
            return self.cudnn_probe.get("error") or "cuDNN frontend probe failed"
        if option.flashinfer:
            probe = self.flashinfer_probe.get(option.flashinfer, self.flashinfer_probe)
            if not probe.get("ok"):
                return probe.get("error") or "FlashInfer probe failed"
        return None

    def check_context(self) -> None:
        if not self.cuda:
            return
        try:
            torch.cuda.synchronize()
        except RuntimeError as error:
            raise ContextLost(first_line(error)) from error

    def attempt(self, base: dict, option: Option, work: Callable[[], dict]) -> dict | None:
        """Run `work` for `option` and record its row; a failure records its first line.
        An option that `only` leaves out is neither run nor recorded (None)."""
        if self.only and not any(fnmatch.fnmatchcase(option.name, p) for p in self.only):
            return None
        row = {**base, "option": option.name, "note": option.note,
               "block_size": option.block_size or self.heads.block_size}
        reason = self.skip_reason(option)
        if reason:
            row["error"] = reason
        else:
            try:
                with soft_timeout(OPTION_TIMEOUT_S):
                    row.update(work())
            except Exception as error:  # noqa: BLE001 - every failure is a result here
                row["error"] = first_line(error)
                self.check_context()
        if row.get("max_abs_err") is not None:
            row["correct"] = row["max_abs_err"] <= TOLERANCE[self.heads.dtype]
        self.record(row)
        return row

    def record(self, row: dict) -> None:
        self.rows.append(row)
        print(format_row(row), flush=True)
        self.save()

    def result(self) -> dict:
        return {"env": self.env, "heads": {**self.heads.__dict__, "dtype": str(self.heads.dtype)},
                "sizes": {k: (v if k != "tiles" else [tile_name(t) for t in v])
                          for k, v in self.sizes.__dict__.items()},
                "lse_op": self.lse_op.name if self.lse_op else None,
                "cudnn_probe": self.cudnn_probe, "flashinfer_probe": self.flashinfer_probe,
                "rows": self.rows,
                "elapsed_s": time.perf_counter() - self.started}

    def save(self) -> Path | None:
        """Rewritten after every row, so a run cut short keeps what it measured."""
        if self.out is None and not self.cuda:
            return None
        return write_result(self.result(), self.out, "attention_options", self.env["gpu"])


def measure_chunks(bench: Bench, option: Option, chunks: Sequence[Chunk]) -> dict:
    """Build, check and time `option` on each chunk: device ms summed, the worst error."""
    total_ms, worst, each = 0.0, 0.0, []
    flops = 0.0
    for chunk in chunks:
        fn = option.build(chunk)
        worst = max(worst, chunk_error(chunk, fn(), bench.sizes.check_rows, scale_of(chunk)))
        ms = bench.timer(fn)
        each.append(ms)
        total_ms += ms
        flops += attention_flops(chunk.length, chunk.prefix, bench.heads)
    return {"ms": total_ms, "tflops": flops / total_ms / 1e9, "max_abs_err": worst,
            "chunk_ms": each if len(each) > 1 else None,
            "host_ms": host_ms(fn) if bench.cuda else None}  # the last chunk's launch


def measure_mixed(bench: Bench, option: Option, chunk: Chunk, decodes: Decodes) -> dict:
    """A mixed step's attention (decode rows and chunk; the chunk's output None where an
    option runs the decode rows alone): checked, device-timed, host launch timed."""
    fn = option.build(chunk, decodes)
    rows_out, chunk_out = fn()
    err = decode_error(decodes, chunk.prompt.layer, rows_out, scale_of(chunk))
    flops = 4.0 * bench.heads.head_dim * bench.heads.num_heads * decodes.context * len(
        decodes.q)
    if chunk_out is not None:
        err = max(err, chunk_error(chunk, chunk_out, bench.sizes.check_rows, scale_of(chunk)))
        flops += attention_flops(chunk.length, chunk.prefix, bench.heads)
    ms = bench.timer(fn)
    return {"ms": ms, "tflops": flops / ms / 1e9, "max_abs_err": err,
            "host_ms": host_ms(fn) if bench.cuda else None}
