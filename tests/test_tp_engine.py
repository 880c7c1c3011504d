"""TP=2 replay on CPU (gloo, 2 processes, plain-tensor KV store): the same per-request
tokens and scheduler decisions as TP=1, synchronously and under async scheduling, identical
clocks on both ranks although each rank measures different step times, and an OOM on one rank
failing the step on every rank."""

from __future__ import annotations

import argparse
import csv
import json
import pickle
from pathlib import Path

import pytest
import torch
from test_engine_helpers import TINY, TickTimer, toy_config, toy_core
from test_engine_smoke import MIGRATION, REQUESTS

from gpu_backend.engine.replay import replay
from gpu_backend.engine.setup import assemble_engine, plain_store
from gpu_backend.model import build_model
from gpu_backend.tp.group import TpGroup, spawn_ranks
from gpu_backend.tp.launch import finish_rank
from gpu_backend.tp.setup import assemble_tp_engine, tp_plain_store
from gpu_backend.tp.shard import build_tp_model
from sim.core.elastic import DrainStrategy, Policy

pytestmark = pytest.mark.skipif(not torch.distributed.is_gloo_available(),
                                reason="torch.distributed has no gloo backend in this build")

# name -> (policy, drain, base KV blocks, requests, step of a fake OOM on rank 1 or None,
# async scheduling)
SCENARIOS = {
    "preempt": (Policy.STATIC, DrainStrategy.PREEMPT, 12, REQUESTS, None, False),
    "migrate": (Policy.ELASTIC, DrainStrategy.MIGRATE, 30, MIGRATION, None, False),
    "elastic-oom": (Policy.ELASTIC, DrainStrategy.PREEMPT, 30, REQUESTS, 6, False),
    "async-migrate": (Policy.ELASTIC, DrainStrategy.MIGRATE, 30, MIGRATION, None, True),
    "async-preempt": (Policy.STATIC, DrainStrategy.PREEMPT, 12, REQUESTS, None, True),
}
DECISION_FIELDS = (0, 2, 3, 4, 5, 7, 8, 10, 11, 12)  # all but start_s, measured_s, mapped bytes


class OomAfterForward:
    """Runs the forward (its collectives included), then raises on call number `fail_at`:
    an OOM after the last collective, which the other rank only learns from the flag."""

    def __init__(self, runner, fail_at: int | None) -> None:
        self.runner, self.fail_at, self.calls = runner, fail_at, 0
        self.graphs = None

    def execute(self, batch):
        ids = self.runner.execute(batch)
        self.calls += 1
        if self.calls == self.fail_at:
            raise MemoryError("injected out of memory")
        return ids


def result(engine) -> dict:
    return {"outputs": engine.mirror.outputs, "steps": engine.steps,
            "num_real_oom": engine.num_real_oom,
            "statuses": {r.request_id: r.status.value for r in engine.recorder.requests},
            "preemptions": sum(r.num_preemptions for r in engine.recorder.requests),
            "attach": len(engine.elastic.attach_latencies_s)}


def replay_rank(group: TpGroup, out_dir: str) -> None:
    torch.set_num_threads(1)  # two ranks on one CPU: tiny matmuls, no oversubscription
    model = build_tp_model(TINY, group, "cpu", torch.float32, attention_backend="torch",
                           max_position=256, seed=1)
    results = {}
    for name, (policy, drain, blocks, requests, fail_at, ahead) in SCENARIOS.items():
        core = toy_core(toy_config(policy, drain, async_scheduling=ahead), blocks)
        engine = assemble_tp_engine(core, model, tp_plain_store(core, 2), group, seed=3)
        if not ahead:  # an async step is launched and collected apart: no execute to wrap
            engine.runner = OomAfterForward(engine.runner,
                                            fail_at if group.rank == 1 else None)
        engine.mirror.keep_outputs = True
        # rank 1 measures 2 s steps, rank 0 1 s (an async step reads the timer twice)
        engine.timer = TickTimer((1.0 + group.rank) / (2.0 if ahead else 1.0))
        replay(engine, requests, wait=False)
        results[name] = result(engine)
    results["summary"] = tp2_core_outputs(group, model, out_dir)
    with open(f"{out_dir}/rank{group.rank}.pkl", "wb") as f:
        pickle.dump(results, f)


def tp2_core_outputs(group: TpGroup, model, out_dir: str) -> dict | None:
    """A core planned for TP=2 (per-GPU KV bytes halve, so more elastic blocks), replayed
    and written by rank 0 as `python -m gpu_backend replay --tp 2` does."""
    core = toy_core(toy_config(Policy.ELASTIC, tensor_parallel_size=2), 30)
    engine = assemble_tp_engine(core, model, tp_plain_store(core, 2), group, seed=3)
    engine.timer = TickTimer(1.0)
    replay(engine, REQUESTS, wait=False)
    args = argparse.Namespace(trace="unit", format=None, limit=None, window=None,
                              rate_scale=1.0, seed=0, out=f"{out_dir}/replay")
    memory = {"rank": group.rank, "activation_peaks": {"64": 100 + group.rank}}
    return finish_rank(group, engine, memory, {"note": "cpu"}, args, core.config, "unit",
                       len(REQUESTS))


def reference(model, name: str) -> dict:
    policy, drain, blocks, requests, fail_at, ahead = SCENARIOS[name]
    core = toy_core(toy_config(policy, drain, async_scheduling=ahead), blocks)
    engine = assemble_engine(core, model, plain_store(core, "cpu", torch.float32),
                             torch.device("cpu"), None, seed=3)
    if not ahead:
        engine.runner = OomAfterForward(engine.runner, fail_at)
    engine.mirror.keep_outputs = True
    # the slower rank's step: what the TP clock advances by
    engine.timer = TickTimer(1.0 if ahead else 2.0)
    replay(engine, requests, wait=False)
    return result(engine)


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tp_replay")
    spawn_ranks(replay_rank, 2, str(out), backend="gloo")
    return out


@pytest.fixture(scope="module")
def ranks(out_dir) -> list[dict]:
    return [pickle.loads((out_dir / f"rank{r}.pkl").read_bytes()) for r in range(2)]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_tp2_replay_matches_tp1(ranks, name):
    model = build_model(TINY, "cpu", torch.float32, attention_backend="torch",
                        max_position=256, seed=1)
    want = reference(model, name)
    for got in (r[name] for r in ranks):
        assert got["outputs"] == want["outputs"]
        assert got["statuses"] == want["statuses"]
        assert (got["preemptions"], got["attach"], got["num_real_oom"]) == (
            want["preemptions"], want["attach"], want["num_real_oom"])
        assert [tuple(s[i] for i in DECISION_FIELDS) for s in got["steps"]] == \
               [tuple(s[i] for i in DECISION_FIELDS) for s in want["steps"]]
    if name == "preempt":
        assert want["preemptions"] > 0
    if name in ("migrate", "async-migrate"):
        assert want["attach"] > 0
    if name == "async-preempt":
        assert want["preemptions"] > 0
    if name == "elastic-oom":
        assert want["num_real_oom"] == 1


def test_clock_is_identical_on_both_ranks(ranks):
    for name in SCENARIOS:
        steps0, steps1 = ranks[0][name]["steps"], ranks[1][name]["steps"]
        assert [s[1] for s in steps0] == [s[1] for s in steps1]  # start_s
        assert [s[6] for s in steps0] == [s[6] for s in steps1]  # measured_s: the MAX
        # every run step lasted the slower rank's 2 s; under async scheduling a step launched
        # on an idle engine reads that rank's timer once before it is collected: 1 s
        want = {1.0, 2.0} if SCENARIOS[name][5] else {2.0}
        assert {s[6] for s in steps0 if s[5]} == want


def test_rank0_writes_the_replay_outputs(ranks, out_dir):
    assert ranks[1]["summary"] is None
    doc = json.loads((out_dir / "replay" / "summary.json").read_text())
    run = doc["runs"][0]
    assert run["tensor_parallel_size"] == 2 and run["num_finished"] == len(REQUESTS)
    measured = run["measured"]
    assert [r["rank"] for r in measured["tp_ranks"]] == [0, 1]
    assert measured["tp_activation_peak_bytes_max"] == 101 and measured["note"] == "cpu"
    with (out_dir / "replay" / "steps.csv").open() as f:
        steps = list(csv.DictReader(f))
    assert len(steps) == run["num_engine_steps"]
    assert (out_dir / "replay" / "requests_elastic_chunk_64.csv").exists()
