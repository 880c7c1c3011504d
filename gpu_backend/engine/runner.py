"""Model runner: host batch -> device tensors -> forward (eager or CUDA graph) -> sampled ids.

Steps with a prefill run eagerly: the host arrays are packed into one pinned staging buffer
and copied to the device in one transfer; with piecewise graphs (piecewise.py) the layers
between attentions replay graphs captured at the step's padded token count. Decode-only steps
replay the CUDA graph of their batch-size bucket (see graphs.py); their inputs are copied
into the graph's static tensors.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from gpu_backend.batch import ForwardBatch
from gpu_backend.engine.device_clock import CompileWatch, DeviceClock, SpanEvents, StepPhases
from gpu_backend.engine.graphs import bucket_for, capture_sizes, pad_decode
from gpu_backend.engine.inputs import SCRATCH_BLOCK_ID, HostBatch
from gpu_backend.engine.piecewise import PiecewiseGraphs
from gpu_backend.model import KVCaches

# (field, dtype) in packing order; int64 fields first keeps every segment 8-byte aligned.
FIELDS = (("input_ids", torch.int64), ("positions", torch.int64), ("slot_mapping", torch.int64),
          ("logits_indices", torch.int64), ("block_tables", torch.int32),
          ("seq_lens", torch.int32), ("query_start_loc", torch.int32))
NP_DTYPES = {torch.int64: np.int64, torch.int32: np.int32}


def _aligned(num_bytes: int) -> int:
    return -(-num_bytes // 8) * 8


class InputCopier:
    """Packs a HostBatch into a pinned staging buffer; one host-to-device copy per step.

    Two buffers are used in turn, each guarded by an event recorded after the copy out of it
    (`copied`): a step can be staged while the previous step's copy is still queued behind
    its forward (steps launched without waiting for the last one's ids, `ModelRunner.launch`),
    and a buffer is written again only once the device has read it.
    """

    NUM_BUFFERS = 2

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._staging = [torch.empty(0, dtype=torch.uint8) for _ in range(self.NUM_BUFFERS)]
        self._read: list[torch.cuda.Event | None] = [None] * self.NUM_BUFFERS
        self._turn = 0  # the buffer the next stage() writes
        self._last = 0  # the buffer the last stage() wrote

    def _buffer(self, num_bytes: int) -> Tensor:
        index = self._turn
        self._last, self._turn = index, (index + 1) % self.NUM_BUFFERS
        read = self._read[index]
        if read is not None:
            read.synchronize()  # the copy out of it has run (at once when it has)
            self._read[index] = None
        staging = self._staging[index]
        if staging.numel() < num_bytes:
            size = max(num_bytes, 2 * staging.numel(), 1 << 16)
            staging = torch.empty(size, dtype=torch.uint8, pin_memory=self.device.type == "cuda")
            self._staging[index] = staging
        return staging

    def copied(self) -> None:
        """The copies out of the last staged buffer are queued: record when they have run."""
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
            self._read[self._last] = event

    def stage(self, batch: HostBatch, feed: Feed | None = None
              ) -> tuple[Tensor, dict[str, Tensor]]:
        """Pack the fields (and a feed's index arrays) into the next pinned buffer: (packed
        bytes, typed views per field)."""
        named = [(name, dt, getattr(batch, name)) for name, dt in FIELDS]
        if feed is not None:
            named += [("feed_rows", torch.int64, feed.rows),
                      ("feed_sources", torch.int64, feed.sources)]
        arrays = [np.ascontiguousarray(a, NP_DTYPES[dt]) for _, dt, a in named]
        offsets = np.cumsum([0] + [_aligned(a.nbytes) for a in arrays]).tolist()
        staging = self._buffer(offsets[-1])
        host = staging.numpy()
        for array, offset in zip(arrays, offsets):
            host[offset:offset + array.nbytes] = array.view(np.uint8).reshape(-1)
        packed = staging[:offsets[-1]]
        views = {name: packed[offset:offset + array.nbytes].view(dt).view(array.shape)
                 for (name, dt, _), array, offset in zip(named, arrays, offsets)}
        return packed, views

    def to_device(self, batch: HostBatch, feed: Feed | None = None) -> ForwardBatch:
        packed, host_views = self.stage(batch, feed)
        device = packed.to(self.device, non_blocking=True)  # the one host-to-device copy
        self.copied()
        base = packed.data_ptr()
        tensors = {name: device[view.data_ptr() - base:][:view.nbytes].view(view.dtype)
                   .view(view.shape) for name, view in host_views.items()}
        if feed is not None:
            feed.apply(tensors["input_ids"], tensors.pop("feed_rows"),
                       tensors.pop("feed_sources"))
        return ForwardBatch(**tensors, max_query_len=batch.max_query_len,
                            max_seq_len=batch.max_seq_len, num_decodes=batch.num_decodes,
                            host_lens=batch.host_lens())


@dataclass(frozen=True)
class Feed:
    """Input ids a step takes from the sampled ids of the step launched before it, still on
    the device (async scheduling): input_ids[rows] = previous[sources]."""
    rows: np.ndarray  # [P] int64 token rows of this step
    sources: np.ndarray  # [P] int64 rows of `previous`
    previous: Tensor  # the launched step's sampled ids, on the device

    def apply(self, input_ids: Tensor, rows: Tensor, sources: Tensor) -> None:
        """Queue the gather on the current stream (`rows`, `sources`: this feed's arrays on
        the device), behind the step that writes `previous` and before the forward."""
        input_ids.index_copy_(0, rows, self.previous.index_select(0, sources)
                              .to(input_ids.dtype))


class DecodeGraphs:
    """One CUDA graph per capture size, sharing one memory pool (largest captured first)."""

    def __init__(self, model: torch.nn.Module, kv_caches: KVCaches, max_num_seqs: int,
                 max_model_len: int, block_size: int, device: torch.device,
                 sizes: Sequence[int] | None = None) -> None:
        self.model, self.kv_caches, self.block_size = model, kv_caches, block_size
        self.sizes = tuple(sizes) if sizes else capture_sizes(max_num_seqs)
        self.max_model_len = max_model_len
        self.table_width = -(-max_model_len // block_size)
        n = self.sizes[-1]
        scratch_slot = SCRATCH_BLOCK_ID * block_size
        self.static = {  # graph inputs, padded rows by default
            "input_ids": torch.zeros(n, dtype=torch.int64, device=device),
            "positions": torch.zeros(n, dtype=torch.int64, device=device),
            "slot_mapping": torch.full((n,), scratch_slot, dtype=torch.int64, device=device),
            "logits_indices": torch.arange(n, dtype=torch.int64, device=device),
            "block_tables": torch.full((n, self.table_width), SCRATCH_BLOCK_ID,
                                       dtype=torch.int32, device=device),
            "seq_lens": torch.ones(n, dtype=torch.int32, device=device),
            "query_start_loc": torch.arange(n + 1, dtype=torch.int32, device=device),
        }
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self.pool = None
        self.capture_s = 0.0

    def _batch(self, size: int) -> ForwardBatch:
        views = {name: (t[:size + 1] if name == "query_start_loc" else t[:size])
                 for name, t in self.static.items()}
        return ForwardBatch(**views, max_query_len=1, max_seq_len=self.max_model_len)

    def capture(self) -> None:
        """Capture every size, largest first, so smaller graphs reuse the shared pool."""
        start = time.perf_counter()
        for size in reversed(self.sizes):
            batch = self._batch(size)
            self.model(batch, self.kv_caches)  # warm-up: compiles kernels outside the capture
            self._sync()
            self.graphs[size] = self._capture_one(batch)
        self._sync()
        self.capture_s = time.perf_counter() - start

    def _capture_one(self, batch: ForwardBatch) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.model(batch, self.kv_caches)  # [size] token ids
        return graph, out

    def _sync(self) -> None:
        if self.static["input_ids"].is_cuda:
            torch.cuda.synchronize()

    def bucket(self, batch: HostBatch) -> int | None:
        if not batch.is_decode_only or not self.graphs:
            return None
        return bucket_for(batch.num_seqs, self.sizes)

    def run(self, batch: HostBatch, size: int, copier: InputCopier,
            feed: Feed | None = None) -> Tensor:
        """Replay the graph of `size`; returns the ids of all `size` rows (padded included).
        `feed`: input ids to take from the last step's ids on the device first."""
        padded = pad_decode(batch, size, self.table_width, self.block_size)
        _, host_views = copier.stage(padded, feed)
        for name, tensor in self.static.items():
            view = host_views[name]
            target = tensor[:view.shape[0]]
            if name == "block_tables":
                target = target[:, :view.shape[1]]  # [size, batch width] of [max, table_width]
            target.copy_(view, non_blocking=True)
        if feed is not None:
            device = self.static["input_ids"].device
            feed.apply(self.static["input_ids"],
                       host_views["feed_rows"].to(device, non_blocking=True),
                       host_views["feed_sources"].to(device, non_blocking=True))
        copier.copied()
        graph, out = self.graphs[size]
        graph.replay()
        return out

    def release(self) -> None:
        self.graphs.clear()
        self.pool = None


class ModelRunner:
    """Runs one HostBatch; returns the sampled ids of its `logits_indices` rows, in order."""

    def __init__(self, model: torch.nn.Module, kv_caches: KVCaches, device: torch.device,
                 graphs: DecodeGraphs | None = None,
                 piecewise: PiecewiseGraphs | None = None) -> None:
        self.model, self.kv_caches, self.device = model, kv_caches, device
        self.graphs, self.piecewise = graphs, piecewise
        self.copier = InputCopier(device)
        self.device_clock = DeviceClock()  # dates each step's end (LaunchedStep.done_t)
        self.compile_watch = CompileWatch() if device.type == "cuda" else None
        self.num_graph_steps = 0
        self.num_eager_steps = 0
        self.num_piecewise_steps = 0
        self.num_compiling_steps = 0
        self._compiles_seen = 0
        self.phases = StepPhases()  # of the last step collected

    def compiled_since_last_call(self) -> bool:
        """Did a kernel compile since the previous call? (Never true without the hook.)"""
        if self.compile_watch is None:
            return False
        count = self.compile_watch.count
        changed, self._compiles_seen = count != self._compiles_seen, count
        if changed:
            self.num_compiling_steps += 1
        return changed

    def execute(self, batch: HostBatch) -> np.ndarray:
        """Sampled token ids [R]; blocks until they are on the host.

        Sets `phases`: how long the host took to enqueue the step (inputs staged and copied,
        graph replayed or every kernel launched) and the device's span from the input copy to
        the sampled ids (CUDA events; NaN on the CPU). A span close to the enqueue time means
        the device waited for the host: a launch-bound step.
        """
        step = self.launch(batch)
        ids = step.collect()
        self.phases = step.phases
        return ids

    def launch(self, batch: HostBatch, after: LaunchedStep | None = None) -> LaunchedStep:
        """Queue the step's work on the device and return without waiting for it: its ids
        come back with `LaunchedStep.collect`. Steps launched one after another run in order
        on the stream, so a step's inputs may be staged while the last one still runs (the
        host work between steps overlaps the device's, as with vLLM's async scheduling); a
        decode graph's output tensor is reused by its next replay, so each step's ids are
        copied out (to pinned memory) behind its forward.

        `after`: the step launched before this one and not collected, whose sampled ids this
        step's `pending_rows` take on the device (async scheduling)."""
        if batch.num_tokens == 0:
            return LaunchedStep(None, None, None, math.nan)
        start = time.perf_counter()
        feed = self._feed(batch, after)
        events = SpanEvents(self.device, self.device_clock)
        events.record_start()
        size = self.graphs.bucket(batch) if self.graphs is not None else None
        if size is not None:
            assert self.graphs is not None
            out = self.graphs.run(batch, size, self.copier, feed)[:batch.num_seqs]
            self.num_graph_steps += 1
        else:
            pieces = (self.piecewise.bucket(batch.num_tokens) if self.piecewise is not None
                      else None)
            if pieces is not None:
                assert self.piecewise is not None
                out = self.piecewise.run(self.copier.to_device(batch, feed), pieces)  # [R]
                self.num_piecewise_steps += 1
            else:
                out = self.model(self.copier.to_device(batch, feed), self.kv_caches)  # [R]
                self.num_eager_steps += 1
        events.record_end()
        if out.is_cuda:
            ids = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
            ids.copy_(out, non_blocking=True)
            events.record_copied()
        else:  # a copy too: a graph's output is overwritten by its next replay
            ids = out.clone()
        rows = batch.logits_indices if size is not None else None
        return LaunchedStep(ids, rows, events, time.perf_counter() - start, out)

    @staticmethod
    def _feed(batch: HostBatch, after: LaunchedStep | None) -> Feed | None:
        if not batch.pending_rows.size:
            return None
        if after is None or after.device_ids is None:
            raise RuntimeError("the step takes input ids from the step launched before it, "
                               "but none was given (`launch(batch, after=...)`)")
        sources = (after.rows[batch.pending_sources] if after.rows is not None
                   else batch.pending_sources)
        return Feed(batch.pending_rows, np.asarray(sources, dtype=np.int64), after.device_ids)


@dataclass
class LaunchedStep:
    """A step queued on the device (`ModelRunner.launch`): its ids, once copied to the host
    (`rows`: a decode graph's rows that sample, None when `ids` are those rows already), and
    the events around it; `events` None for a step with no tokens. `phases` are known once
    collected. `device_ids`: the ids where the forward wrote them, which the next step may
    read (`launch(after=...)`); a decode graph's are overwritten by its next replay, which
    the stream orders after that read. `done_t`: once collected, the host time
    (`time.perf_counter`) at which the device finished the step, dated by the device's timer
    when it ended before the host looked (`DeviceClock`); None on the CPU."""
    ids: Tensor | None
    rows: np.ndarray | None
    events: SpanEvents | None
    enqueue_s: float
    device_ids: Tensor | None = None
    phases: StepPhases = StepPhases()
    done_t: float | None = None

    def collect(self) -> np.ndarray:
        """Block until the step's ids are on the host and return them (and set `phases`)."""
        if self.ids is None or self.events is None:
            return np.zeros(0, dtype=np.int64)
        if self.done_t is None:  # the sync, also for a step whose ids copy is empty
            self.done_t = self.events.wait()
        self.phases = StepPhases(self.enqueue_s, self.events.span_s())
        ids = self.ids.numpy()
        return ids[self.rows] if self.rows is not None else ids
