"""`python -m sim`'s runs, one after another, each run's files saved the moment it ends.

    before any run   every configuration is built (a run that cannot fit fails now, not
                     after the others), and --out and --trace-events are claimed
                     (sim.recording.folder): a bad path costs nothing
    during a run     its requests stream to a hidden CSV as they end, its trace events to a
                     hidden file
    when it ends     the CSV takes its name; the timeline CSV, its plots and summary.json
                     (every finished run) are written, each atomically; summary.json last,
                     so a run it lists has all its files
    on Ctrl-C        the run under way is dropped (its hidden files removed); every finished
                     run is on disk, and `Finished.interrupted` says so to the command
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sim.core.engine_config import build_core
from sim.progress import progress_bar
from sim.recording.folder import OutputFolder, claim_file
from sim.recording.metrics import ReplicaRecorder
from sim.recording.outputs import slug, write_timeline_csv
from sim.recording.sinks import RequestCsv, RequestSink
from sim.runner import RecorderFactory, RunResult, RunSpec, simulate
from sim.trace_events import RunEvents, TraceEventsFile, TracingRecorder
from traces import Trace

# What a results folder of `python -m sim` holds (what --overwrite may remove).
RESULT_PATTERNS = ("summary.json", "requests_*.csv", "timeline_*.csv", "*.png", "*.json")


@dataclass(frozen=True)
class Outputs:
    """Where a command's runs go: a claimed folder (or none), plots, a trace-events file."""

    folder: OutputFolder | None = None
    plot: bool = False
    events: TraceEventsFile | None = None


@dataclass
class Finished:
    """The runs that ended (in order) and whether the command was stopped before the rest."""

    results: list[RunResult] = field(default_factory=list)
    planned: list[str] = field(default_factory=list)
    saved: list[str] = field(default_factory=list)  # labels whose files are all written
    interrupted: bool = False


def claim_outputs(out: Path | None, trace_events: Path | None, *, overwrite: bool,
                  plot: bool) -> Outputs:
    """Claim --out and --trace-events before any work; OutputError (one line) if unusable."""
    if plot and out is None:
        raise ValueError("--plot writes PNGs into the --out folder: add --out DIR")
    events = None
    if trace_events is not None:
        claim_file(trace_events, flag="--trace-events", overwrite=overwrite)
    folder = None
    if out is not None:
        folder = OutputFolder.claim(out, flag="--out", overwrite=overwrite,
                                    patterns=RESULT_PATTERNS)
    if trace_events is not None:
        events = TraceEventsFile(trace_events)
    return Outputs(folder, plot, events)


def check_fits(specs: Sequence[RunSpec]) -> None:
    """Build every configuration's core once, so one that cannot run fails before any run."""
    for spec in specs:
        try:
            build_core(spec.engine, spec.profile, spec.engine.vmm_cost(spec.vmm_costs))
        except ValueError as exc:
            raise ValueError(f"{spec.label}: {exc}") from None


def run_all(specs: Sequence[RunSpec], trace: Trace, outputs: Outputs, *,
            show_progress: bool = True, pricing: dict | None = None) -> Finished:
    """Run `specs` in order, saving each as it ends; Ctrl-C stops between or during runs
    and returns what finished."""
    done = Finished(planned=[s.label for s in specs])
    try:
        for spec in specs:
            result = _run_one(spec, trace, outputs, len(done.results), show_progress)
            with _interrupts_deferred():  # a finished run is saved whole, summary.json too
                if pricing is not None:
                    result.summary["pricing"] = pricing
                # what was simulated, every setting (loads with --engine-config)
                result.summary["engine_config"] = spec.engine.to_dict()
                done.results.append(result)
                _save(outputs, done, trace)
                done.saved.append(spec.label)
    except KeyboardInterrupt:
        done.interrupted = True
    finally:
        if outputs.events is not None:
            outputs.events.close()
    return done


@contextlib.contextmanager
def _interrupts_deferred():
    """Ctrl-C inside the block takes effect when it ends, so files are never left half saved."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught and callable(previous):
        previous(signal.SIGINT, None)
    elif caught and previous == signal.SIG_DFL:  # the default: the process ends now
        signal.raise_signal(signal.SIGINT)


def _run_one(spec: RunSpec, trace: Trace, outputs: Outputs, index: int,
             show_progress: bool) -> RunResult:
    with contextlib.ExitStack() as stack:
        sink: RequestSink = _Discard()
        if outputs.folder is not None:
            path = stack.enter_context(outputs.folder.path_for(f"requests_{slug(spec.label)}.csv"))
            sink = RequestCsv(path)
            stack.callback(sink.close)  # closed before the path takes its name
        events = None
        if outputs.events is not None:
            events = outputs.events.start_run(spec.label)
            stack.push(_discard_unless_done(outputs.events, events))
        with progress_bar(spec.label, trace, disabled=not show_progress) as progress:
            result = simulate(spec, trace, progress, _recorders(sink, events))
        if outputs.events is not None and events is not None:
            outputs.events.finish_run(events)
    return result


def _recorders(sink: RequestSink, events: RunEvents | None) -> RecorderFactory:
    def make(replica_id: int, block_size: int) -> ReplicaRecorder:
        if events is not None:
            return TracingRecorder(replica_id, block_size, events, request_sink=sink)
        return ReplicaRecorder(replica_id, block_size, request_sink=sink)

    return make


def _discard_unless_done(file: TraceEventsFile, events: RunEvents):
    def exit_(exc_type, exc, tb) -> bool:
        if exc_type is not None:
            file.discard_run(events)
        return False

    return exit_


class _Discard:
    """Request rows nobody reads (no --out): the recorder then keeps no request states."""

    def write(self, rows: list[tuple]) -> None:
        pass

    def close(self) -> None:
        pass


def _save(outputs: Outputs, done: Finished, trace: Trace) -> None:
    folder = outputs.folder
    if folder is None:
        return
    result = done.results[-1]
    name = slug(result.spec.label)
    with folder.path_for(f"timeline_{name}.csv") as tmp:
        write_timeline_csv(tmp, result.recorders)
    if outputs.plot:
        from sim.plots import plot_latency_cdfs, plot_run

        with folder.path_for(f"timeline_{name}.png") as tmp:
            plot_run(tmp, result)
        with folder.path_for("latency_cdfs.png") as tmp:
            plot_latency_cdfs(tmp, done.results, result.spec.slo)
    folder.write_text("summary.json", json.dumps(summary_document(done, trace), indent=2))


def summary_document(done: Finished, trace: Trace) -> dict:
    """summary.json: the trace, the runs planned, and one entry per finished run."""
    return {"trace": trace.source, "num_trace_requests": len(trace),
            "planned_runs": done.planned, "runs": [r.summary for r in done.results]}
