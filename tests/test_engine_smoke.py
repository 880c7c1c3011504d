"""End to end on CPU: the tiny Llama model (torch attention fallback) over a plain-tensor
KV store standing in for the VMM pool. Proves the loop, the recorder and the output files,
and that preemption (recompute) and migration keep every request's tokens intact."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from test_engine_helpers import TINY, TickTimer, tiny_cpu_model, toy_config, toy_core

from gpu_backend.batch import ForwardBatch
from gpu_backend.engine.engine import STEP_COLUMNS
from gpu_backend.engine.memory import kv_caches_of
from gpu_backend.engine.piecewise import PiecewiseGraphs
from gpu_backend.engine.replay import engine_summary, replay, write_outputs
from gpu_backend.engine.runner import DecodeGraphs
from gpu_backend.engine.setup import assemble_engine, plain_store
from sim.core.elastic import DrainStrategy, Policy
from sim.recording.metrics import TIMELINE_COLUMNS
from traces import Request

REQUESTS = [Request(i, 0.5 * i, 12 + 9 * (i % 4), 6 + 4 * (i % 3)) for i in range(10)]
# Three long decodes outgrow 30 base blocks (elastic blocks lent); E waits until A finishes,
# then the drain migrates B's and C's elastic blocks into the base blocks A freed.
MIGRATION = [Request(0, 0.0, 60, 110), Request(1, 0.0, 60, 150), Request(2, 0.0, 60, 180),
             Request(3, 0.0, 60, 20), Request(4, 100.0, 16, 8)]


@pytest.fixture(scope="module")
def model():
    yield from tiny_cpu_model()


def run(model, policy, drain=DrainStrategy.PREEMPT, num_kv_blocks=48, requests=REQUESTS):
    core = toy_core(toy_config(policy, drain), num_kv_blocks)
    engine = assemble_engine(core, model, plain_store(core, "cpu", torch.float32),
                             torch.device("cpu"), None, seed=3)
    engine.mirror.keep_outputs = True
    engine.timer = TickTimer(1.0)
    replay(engine, requests, wait=False)
    return engine


def test_outputs_have_the_simulator_columns(model, tmp_path):
    engine = run(model, Policy.ELASTIC)
    summary = engine_summary(engine, {"note": "cpu"})
    assert summary["num_finished"] == len(REQUESTS)
    write_outputs(tmp_path, engine, summary, "unit", len(REQUESTS))
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["runs"][0]["policy"] == "elastic" and doc["runs"][0]["measured"]["note"] == "cpu"
    with (tmp_path / "timeline_elastic_chunk_64.csv").open() as f:
        header = next(csv.reader(f))
    assert header == ["replica", *TIMELINE_COLUMNS, "reserve_mapped_bytes"]
    with (tmp_path / "requests_elastic_chunk_64.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(REQUESTS) and rows[0]["status"] == "finished"
    with (tmp_path / "steps.csv").open() as f:
        steps = list(csv.DictReader(f))
    assert list(steps[0]) == list(STEP_COLUMNS)
    for row in steps:  # phases: host build and enqueue timed on the CPU; no device events there
        build_s, enqueue_s = float(row["build_s"]), float(row["enqueue_s"])
        assert 0 < build_s < float(row["measured_s"]) and 0 < enqueue_s
        assert row["device_s"] == "nan"
    assert len(steps) == summary["num_engine_steps"]
    for row in steps:  # the longest decode context bounds the sum from below and above
        rows, longest = int(row["num_decode_tokens"]), int(row["max_decode_context"])
        total = int(row["decode_context_tokens"])
        assert (longest == 0) == (rows == 0)
        assert longest <= total <= rows * longest
    assert any(int(r["max_decode_context"]) * int(r["num_decode_tokens"])
               > int(r["decode_context_tokens"]) for r in steps)  # mixed lengths were seen
    # every attach and detach with its phases, in step order, at the steps that lent blocks
    with (tmp_path / "transitions.csv").open() as f:
        moves = list(csv.DictReader(f))
    kinds = [m["kind"] for m in moves]
    assert kinds.count("attach") == summary["num_attach"] > 0
    assert kinds.count("detach") == summary["num_detach"] > 0
    assert kinds == ["attach", "detach"] * (len(kinds) // 2) + ["attach"] * (len(kinds) % 2)
    ids = [int(m["step_id"]) for m in moves]
    assert ids == sorted(ids)
    lent = {int(r["step_id"]): int(r["lent_blocks"]) for r in steps}
    for move in moves:
        total = float(move["total_s"])
        phases = sum(float(move[k]) for k in ("empty_cache_s", "copy_s", "map_s", "unmap_s"))
        assert 0 < phases <= total * (1 + 1e-9) and int(move["handles"]) > 0
        assert (lent[int(move["step_id"])] > 0) == (move["kind"] == "attach")
        assert int(move["freed_bytes"]) == 0  # no torch cache on the CPU


def test_preemption_and_migration_keep_tokens(model):
    reference = run(model, Policy.STATIC, num_kv_blocks=400).mirror.outputs
    assert len(reference) == len(REQUESTS)
    tight = run(model, Policy.STATIC, num_kv_blocks=12)
    assert sum(r.num_preemptions for r in tight.recorder.requests) > 0
    assert tight.mirror.outputs == reference
    overcommit = run(model, Policy.OVERCOMMIT, num_kv_blocks=12)
    finished = {r.request_id for r in overcommit.recorder.requests if r.status.value == "finished"}
    assert {i: reference[i] for i in finished} == {i: overcommit.mirror.outputs[i] for i in finished}


def test_migrated_blocks_keep_their_kv(model):
    reference = run(model, Policy.STATIC, num_kv_blocks=400, requests=MIGRATION).mirror.outputs
    migrated = run(model, Policy.ELASTIC, DrainStrategy.MIGRATE, num_kv_blocks=30,
                   requests=MIGRATION)
    summary = engine_summary(migrated, {})
    assert summary["migrated_bytes"] > 0 and summary["num_preemptions"] == 0
    assert migrated.mirror.outputs == reference
    preempted = run(model, Policy.ELASTIC, DrainStrategy.PREEMPT, num_kv_blocks=30,
                    requests=MIGRATION)
    assert engine_summary(preempted, {})["num_drain_victims"] > 0
    assert preempted.mirror.outputs == reference


class EagerGraph:
    """Stands in for a CUDA graph on CPU: replay re-runs the captured call on the static inputs."""

    def __init__(self, model, batch, caches) -> None:
        self.model, self.batch, self.caches = model, batch, caches
        self.out = model(batch, caches)
        self.num_replays = 0

    def replay(self) -> None:
        self.out.copy_(self.model(self.batch, self.caches))
        self.num_replays += 1


class CpuDecodeGraphs(DecodeGraphs):
    def _capture_one(self, batch):
        graph = EagerGraph(self.model, batch, self.kv_caches)
        return graph, graph.out


def test_decode_graph_wiring_gives_the_eager_tokens(model):
    reference = run(model, Policy.STATIC, num_kv_blocks=12).mirror.outputs
    core = toy_core(toy_config(Policy.STATIC), 12)
    store = plain_store(core, "cpu", torch.float32)
    graphs = CpuDecodeGraphs(model, kv_caches_of(store, TINY.num_layers), 8, 256, 16,
                             torch.device("cpu"))
    graphs.capture()
    engine = assemble_engine(core, model, store, torch.device("cpu"), graphs, seed=3)
    engine.mirror.keep_outputs = True
    engine.timer = TickTimer(1.0)
    replay(engine, REQUESTS, wait=False)
    assert engine.runner.num_graph_steps > 10
    assert sum(g.num_replays for g, _ in graphs.graphs.values()) == engine.runner.num_graph_steps
    assert engine.mirror.outputs == reference


def test_piecewise_graph_wiring_gives_the_eager_tokens(model):
    """Every step with a prompt runs the piecewise path (padded to 16 / 32 / 64 tokens, the
    pieces run eagerly on the CPU): the same tokens as the eager engine, and a padded row
    writes no K/V (a stray write would corrupt another request's blocks)."""
    reference = run(model, Policy.STATIC, num_kv_blocks=12).mirror.outputs
    core = toy_core(toy_config(Policy.STATIC), 12)
    store = plain_store(core, "cpu", torch.float32)
    pieces = PiecewiseGraphs(model, kv_caches_of(store, TINY.num_layers), 64,
                             torch.device("cpu"), sizes=(16, 32, 64))
    pieces.capture()
    assert sorted(pieces.graphs) == [16, 32, 64]
    assert all(len(p) == TINY.num_layers + 1 for p in pieces.graphs.values())
    engine = assemble_engine(core, model, store, torch.device("cpu"), None, seed=3,
                             piecewise=pieces)
    engine.mirror.keep_outputs = True
    engine.timer = TickTimer(1.0)
    replay(engine, REQUESTS, wait=False)
    runner = engine.runner
    assert runner.num_piecewise_steps >= len(REQUESTS)  # every prompt's step at least
    assert runner.num_piecewise_steps + runner.num_eager_steps == sum(
        1 for step in engine.steps if step[2] + step[3] > 0)  # every step with tokens
    assert engine.mirror.outputs == reference


def test_capped_piecewise_graphs_run_longer_steps_fully_eager(model):
    """Graphs up to 16 tokens only (--piecewise-max-tokens 16): a step of more tokens finds
    no size and the runner runs it through the eager model; the tokens stay the eager
    engine's."""
    reference = run(model, Policy.STATIC, num_kv_blocks=12).mirror.outputs
    core = toy_core(toy_config(Policy.STATIC), 12)
    store = plain_store(core, "cpu", torch.float32)
    pieces = PiecewiseGraphs(model, kv_caches_of(store, TINY.num_layers), 16,
                             torch.device("cpu"))
    pieces.capture()
    assert pieces.sizes == (16,)
    engine = assemble_engine(core, model, store, torch.device("cpu"), None, seed=3,
                             piecewise=pieces)
    engine.mirror.keep_outputs = True
    engine.timer = TickTimer(1.0)
    replay(engine, REQUESTS, wait=False)
    with_tokens = [step for step in engine.steps if step[2] + step[3] > 0]
    longer = sum(1 for step in with_tokens if step[2] + step[3] > 16)
    assert longer > 0 and engine.runner.num_eager_steps == longer
    assert engine.runner.num_piecewise_steps == len(with_tokens) - longer
    assert engine.mirror.outputs == reference


def test_piecewise_sizes_and_refusals(model):
    core = toy_core(toy_config(Policy.STATIC), 12)
    caches = kv_caches_of(plain_store(core, "cpu", torch.float32), TINY.num_layers)
    pieces = PiecewiseGraphs(model, caches, 64, torch.device("cpu"), sizes=(32, 16))
    assert pieces.bucket(5) is None  # nothing captured yet: the step runs eagerly
    pieces.capture()
    assert (pieces.bucket(1), pieces.bucket(17), pieces.bucket(32), pieces.bucket(33)) == (
        16, 32, 32, None)
    batch = ForwardBatch(**{name: torch.zeros(20, dtype=torch.int64) for name in
                            ("input_ids", "positions", "slot_mapping", "logits_indices")},
                         block_tables=torch.zeros(1, 2, dtype=torch.int32),
                         seq_lens=torch.tensor([20], dtype=torch.int32),
                         query_start_loc=torch.tensor([0, 20], dtype=torch.int32),
                         max_query_len=20, max_seq_len=20)
    with pytest.raises(ValueError, match="20 tokens cannot run the graphs of size 16"):
        pieces.run(batch, 16)
    with pytest.raises(ValueError, match="KV caches"):
        PiecewiseGraphs(model, caches[:1], 64, torch.device("cpu"))


def test_a_wall_clock_replay_that_compiled_kernels_says_its_early_latencies_include_them():
    from gpu_backend.engine.replay import wall_clock_compiles

    def summary(clock, count):
        return {"measured": {"clock": clock, "num_compiling_steps_retimed": count}}

    said = wall_clock_compiles(summary("wall", 26)) or ""
    assert said.startswith("warning: 26 steps compiled kernels during this wall-clock replay")
    assert "--no-wait" in said
    assert wall_clock_compiles(summary("virtual", 26)) is None  # retimed: nothing queued
    assert wall_clock_compiles(summary("wall", 0)) is None
    assert wall_clock_compiles({}) is None
