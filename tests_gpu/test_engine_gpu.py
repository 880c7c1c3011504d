"""The GPU engine on a real device (qwen2.5-0.5b, random bf16 weights). Skipped without CUDA.

Run on the GPU machine: ``python -m pytest tests_gpu/test_engine_gpu.py -q``.
Checks: a short replay per policy completes with graphs and the simulator's outputs; an
elastic run with attach/detach leaves base blocks untouched; migration copies whole blocks
(every layer) on the VMM pool; a real torch.OutOfMemoryError fails the step, not the run;
piecewise graphs give the eager forward's logits and K/V, and a replay through them runs
every step with a prompt as graphs; decode steps launched back to back keep their own ids; a
step collected late is dated when the device finished it; async scheduling gives every request the synchronous engine's tokens; a detach behind the step in flight faults nothing.
"""

from __future__ import annotations

import gc
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from gpu_backend.engine.kv_store import copy_blocks  # noqa: E402
from gpu_backend.engine.memory import dummy_store, kv_caches_of, kv_layout  # noqa: E402
from gpu_backend.engine.piecewise import PiecewiseGraphs  # noqa: E402
from gpu_backend.engine.replay import engine_summary, replay, write_outputs  # noqa: E402
from gpu_backend.engine.runner import DecodeGraphs, InputCopier, ModelRunner  # noqa: E402
from gpu_backend.engine.setup import build_gpu_engine, load_model  # noqa: E402
from gpu_backend.engine.shapes import (  # noqa: E402
    decode_shape,
    host_batch,
    mixed_shape,
    prefill_shape,
)
from gpu_backend.vmm import MIB, ElasticKVPool  # noqa: E402
from sim.core.catalog import get_gpu, get_model  # noqa: E402
from sim.core.elastic import DrainStrategy, Policy  # noqa: E402
from sim.core.engine_config import EngineConfig  # noqa: E402
from sim.core.request import RequestStatus  # noqa: E402
from traces import Request  # noqa: E402

MODEL = get_model("qwen2.5-0.5b")
# 6 long decodes outgrow 160 base blocks (2,560 tokens); short requests arrive meanwhile
REQUESTS = ([Request(i, 0.01 * i, 300, 200) for i in range(6)]
            + [Request(10 + i, 0.5 + 0.2 * i, 100 + 50 * i, 20) for i in range(8)])


def config(policy: Policy, drain: DrainStrategy = DrainStrategy.PREEMPT,
           async_scheduling: bool = False) -> EngineConfig:
    return EngineConfig(MODEL, get_gpu("h200"), max_num_batched_tokens=512, max_num_seqs=16,
                        max_model_len=1024, block_size=16, policy=policy, drain=drain,
                        vmm_handle_bytes=2 * MIB, async_scheduling=async_scheduling)


def build(policy: Policy, drain: DrainStrategy = DrainStrategy.PREEMPT,
          async_scheduling: bool = False, **kwargs):
    return build_gpu_engine(config(policy, drain, async_scheduling), seed=0, max_kv_blocks=160,
                            **kwargs)


def teardown(setup) -> None:
    close = getattr(setup.store, "close", None)
    if close is not None:
        close()
    del setup
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(1.0)


@pytest.mark.parametrize("policy, drain", [
    (Policy.STATIC, DrainStrategy.PREEMPT), (Policy.ELASTIC, DrainStrategy.PREEMPT),
    (Policy.ELASTIC, DrainStrategy.MIGRATE), (Policy.OVERCOMMIT, DrainStrategy.PREEMPT)])
def test_short_replay_per_policy(policy, drain, tmp_path):
    setup = build(policy, drain)
    engine = setup.engine
    replay(engine, REQUESTS, wait=False)
    summary = engine_summary(engine, {})
    write_outputs(tmp_path, engine, summary, "unit", len(REQUESTS))
    statuses = {r.status for r in engine.recorder.requests}
    if policy is Policy.OVERCOMMIT:
        assert statuses <= {RequestStatus.FINISHED, RequestStatus.FAILED_OOM}
    else:
        assert statuses == {RequestStatus.FINISHED}
    assert summary["measured"]["num_graph_steps"] > 0
    assert summary["measured"]["num_eager_steps"] > 0
    assert (tmp_path / "steps.csv").exists()
    if policy is Policy.ELASTIC:
        assert summary["num_attach"] >= 1 and summary["num_detach"] >= 1
        assert summary["reserve_lent_tokens_max"] > 0
        moves = engine.elastic.transitions  # written to transitions.csv with their phases
        attaches = [m for m in moves if m.kind == "attach"]
        assert len(attaches) == summary["num_attach"] and (tmp_path / "transitions.csv").exists()
        # eager prefill steps leave activations in torch's cache; an attach hands them back
        assert any(m.freed_bytes > 0 for m in attaches)
        assert all(m.empty_cache_s + m.map_s <= m.total_s * (1 + 1e-9) for m in attaches)
    teardown(setup)


@pytest.mark.parametrize("asynchronous, behind", [(False, True), (True, True), (True, False)])
def test_elastic_run_keeps_base_blocks_intact(asynchronous, behind):
    """Two decodes fill ~63 of 191 base blocks (lowest ids first); the late prompts make the
    engine take the reserve back. Under async scheduling it does so while the decode step in
    flight still runs (that step holds no elastic block), unless detach_behind_step is off.
    Every request finishes, the device reports no fault, and a base block no request uses
    keeps its contents."""
    cfg = replace(config(Policy.ELASTIC, async_scheduling=asynchronous),
                  detach_behind_step=behind)
    setup = build_gpu_engine(cfg, seed=0, max_kv_blocks=160)
    engine, store = setup.engine, setup.store
    top = engine.core.plan.num_kv_blocks  # device id of the last base block: unused here
    pattern = torch.arange(kv_layout(MODEL, 16).plane_elements, device="cuda") % 251
    pattern = pattern.to(torch.bfloat16).view(store.k_cache(0)[top].shape)
    for layer in range(MODEL.num_layers):
        store.k_cache(layer)[top] = pattern
        store.v_cache(layer)[top] = pattern + 1
    late = [Request(50 + i, 0.3 + 0.4 * i, 64, 4) for i in range(3)]
    replay(engine, REQUESTS[:2] + late, wait=False)
    torch.cuda.synchronize()  # a kernel that read unmapped memory would fault here
    summary = engine_summary(engine, {})
    assert summary["num_finished"] == 5 and summary["num_detach"] >= 1
    assert len(engine.elastic.attach_latencies_s) >= 1
    behind_steps = summary["measured"]["num_detach_behind_step"]
    if asynchronous and behind:  # a prompt arriving at an idle engine detaches with no wait
        assert 1 <= behind_steps <= summary["num_detach"]
    else:
        assert behind_steps == 0
    for layer in range(MODEL.num_layers):
        assert torch.equal(store.k_cache(layer)[top], pattern)
        assert torch.equal(store.v_cache(layer)[top], pattern + 1)
    teardown(setup)


def test_migration_copies_whole_blocks_on_the_pool():
    layout = kv_layout(MODEL, 16)
    torch.zeros(1, device="cuda")  # torch creates the context first, as the engine does
    with ElasticKVPool(layout, 32, 16 * MIB, elastic_handle_bytes=2 * MIB,
                       reclaim="release") as pool:
        pool.attach(num_handles=2)
        src = pool.plan.num_base_blocks + 3
        for layer in range(layout.num_layers):
            pool.k_cache(layer)[src] = layer + 1
            pool.v_cache(layer)[src] = -(layer + 1)
        copy_blocks(pool, [(src, 5)])
        torch.cuda.synchronize()
        pool.detach()
        for layer in range(layout.num_layers):
            assert (pool.k_cache(layer)[5] == layer + 1).all()
            assert (pool.v_cache(layer)[5] == -(layer + 1)).all()


def test_real_out_of_memory_fails_the_step_not_the_run():
    setup = build(Policy.STATIC, torch_cap="on")
    engine, budget = setup.engine, setup.budget
    assert budget is not None
    torch.cuda.empty_cache()
    budget.allowed_base = torch.cuda.memory_reserved()  # no new segment: a prefill cannot fit
    budget.set_mapped(0)
    replay(engine, [Request(0, 0.0, 512, 4)], wait=False)
    assert engine.num_real_oom == 1
    assert engine.recorder.requests[0].status is RequestStatus.FAILED_OOM
    budget.allowed_base += 8 * 2**30
    budget.set_mapped(0)
    replay(engine, [Request(1, 0.0, 512, 4)], wait=False)
    assert engine.recorder.requests[1].status is RequestStatus.FINISHED
    assert engine_summary(engine, {})["num_oom"] == 1
    teardown(setup)


def test_piecewise_graphs_match_the_eager_forward():
    """Prefill and mixed steps through the captured pieces (padded to the next size) from the
    same cache contents as the eager forward: its logits (bf16, GEMMs of another shape: a
    small tolerance) and the same K/V written; the padded rows write nothing (the scratch
    block stays zero). The pool holds every step's blocks apart (shared blocks would make
    two tokens of one step race for a slot)."""
    device = torch.device("cuda")
    model = load_model(config(Policy.STATIC), device, seed=0)
    num_blocks = 256
    eager_store = dummy_store(MODEL, num_blocks, 16, device)
    graph_store = dummy_store(MODEL, num_blocks, 16, device)
    eager_caches = kv_caches_of(eager_store, MODEL.num_layers)
    graph_caches = kv_caches_of(graph_store, MODEL.num_layers)
    for k_cache, v_cache in eager_caches:
        k_cache.normal_()
        v_cache.normal_()
        k_cache[0].zero_()  # the scratch block
        v_cache[0].zero_()
    pieces = PiecewiseGraphs(model, graph_caches, 512, device)
    pieces.capture()
    copier = InputCopier(device)
    for shape in (prefill_shape(300), mixed_shape(100, 200, 6, 400), prefill_shape(512)):
        batch = host_batch(shape, 16, num_blocks)
        size = pieces.bucket(batch.num_tokens)
        assert size is not None and size >= batch.num_tokens
        for (k_eager, v_eager), (k_graph, v_graph) in zip(eager_caches, graph_caches):
            k_graph.copy_(k_eager)
            v_graph.copy_(v_eager)
        eager = model.compute_logits(copier.to_device(batch), eager_caches).float()
        graphed = pieces.compute_logits(copier.to_device(batch), size).float()
        torch.cuda.synchronize()
        scale = eager.abs().max().item()
        assert (graphed - eager).abs().max().item() < 0.05 * scale, shape
        for (k_eager, v_eager), (k_graph, v_graph) in zip(eager_caches, graph_caches):
            assert (k_graph.float() - k_eager.float()).abs().max().item() < 0.05, shape
            assert (v_graph.float() - v_eager.float()).abs().max().item() < 0.05, shape
            assert k_graph[0].abs().max().item() == 0 and v_graph[0].abs().max().item() == 0
    pieces.release()
    del pieces, model, eager_store, graph_store, eager_caches, graph_caches
    gc.collect()
    torch.cuda.empty_cache()


def test_replay_with_piecewise_graphs():
    setup = build(Policy.ELASTIC, piecewise=True)
    engine = setup.engine
    replay(engine, REQUESTS, wait=False)
    summary = engine_summary(engine, {})
    assert {r.status for r in engine.recorder.requests} == {RequestStatus.FINISHED}
    measured = summary["measured"]
    assert measured["num_piecewise_steps"] > 0 and measured["num_eager_steps"] == 0
    assert measured["num_graph_steps"] > 0
    assert summary["num_attach"] >= 1 and summary["num_detach"] >= 1
    teardown(setup)


def test_replay_with_capped_piecewise_graphs():
    """Graphs up to 128 tokens (--piecewise-max-tokens 128): the short steps with a prompt run
    them, the longer ones (prompts of 300 tokens) run fully eager, and every request ends."""
    setup = build(Policy.ELASTIC, piecewise=True, piecewise_max_tokens=128)
    engine = setup.engine
    assert max(setup.piecewise.sizes) == 128
    replay(engine, REQUESTS, wait=False)
    measured = engine_summary(engine, {})["measured"]
    assert {r.status for r in engine.recorder.requests} == {RequestStatus.FINISHED}
    assert measured["num_piecewise_steps"] > 0 and measured["num_eager_steps"] > 0
    teardown(setup)


@pytest.mark.parametrize("piecewise", [False, True])
def test_a_step_that_samples_no_row_is_timed_to_its_end(piecewise):
    """A prompt longer than the chunk: its first step samples no row, so no ids come back to
    the host (an empty copy is no sync). The step is still timed to the end of its device
    work (a step timed without it stops the replay on "Both events must be completed")."""
    setup = build(Policy.STATIC, piecewise=piecewise)
    engine = setup.engine
    replay(engine, [Request(0, 0.0, 900, 4)], wait=False)  # chunk 512: 512 + 388 tokens
    assert {r.status for r in engine.recorder.requests} == {RequestStatus.FINISHED}
    first = engine.steps[0]  # (step_id, start, prefill tokens, decode tokens, ...)
    assert first[2] == 512 and first[11] == 0  # no sampled row
    device_s = first[-1]
    assert device_s > 0 and first[6] >= device_s  # the step's wall time holds its device span
    teardown(setup)


@pytest.mark.parametrize("flags", [[], ["--piecewise-graphs"], ["--no-attention-profile"]])
def test_quick_profile_in_two_passes(flags, tmp_path):
    """`python -m gpu_backend profile --quick` (two passes over the grid by default), with and
    without piecewise graphs: a calibration whose every point was timed twice and that the
    simulator and validation read (sizes recorded, efficiencies in range)."""
    import json

    from gpu_backend.__main__ import main
    from sim.core.calibration import load_efficiency

    out = tmp_path / "calibration.json"
    assert main(["profile", "--model", "qwen2.5-0.5b", "--quick", "--max-num-seqs", "16",
                 "--max-model-len", "2048", "--out", str(out), *flags]) == 0
    data = json.loads(out.read_text())
    assert data["passes"] == 2
    assert all(len(m["passes_measured_s"]) == 2 and m["measured_s"] > 0
               for m in data["measurements"])
    # launched back to back, a step's period is at most its time alone (the host's build and
    # launch hide behind the device, or the device waits for them as it does alone)
    assert all(0 < m["ahead_s"] <= 1.2 * m["measured_s"] and m["ahead_device_s"] > 0
               for m in data["measurements"])
    assert bool(data["piecewise_sizes"]) == ("--piecewise-graphs" in flags)
    attention = data["attention_measurements"]
    if "--no-attention-profile" in flags:
        assert attention == [] and data["attention_fit_error"] is None
    else:  # the attention of every step with prefill tokens, timed alone in both passes too
        assert len(attention) == sum(1 for m in data["measurements"] if m["prefills"])
        assert all(len(m["passes_measured_s"]) == 2 and m["measured_s"] > 0 for m in attention)
        assert data["attention_fit_error"]["median_abs_rel"] < 0.5
    load_efficiency(out)  # every key known, every value in range
    gc.collect()
    torch.cuda.empty_cache()


def test_an_attention_launch_timed_alone_grows_with_its_work():
    """The profile's attention timing (attention_profile.launch_ms): a chunk over a long
    prefix walks more keys than the same chunk alone, and decode rows beside it add theirs."""
    from gpu_backend.engine.attention_profile import launch_ms
    from gpu_backend.engine.shapes import StepShape

    alone = launch_ms(StepShape("prefill", ((1024, 0),)), 32, 8, 128)
    prefix = launch_ms(StepShape("prefill", ((1024, 16384),)), 32, 8, 128)
    rows = launch_ms(StepShape("mixed", ((1024, 0),), (30000,) * 8), 32, 8, 128)
    assert 0 < alone < prefix and alone < rows
    torch.cuda.empty_cache()


def test_decode_graph_steps_launched_back_to_back_keep_their_own_ids():
    """Two decode steps of one graph size launched before either is collected: the second
    replay reuses the graph's output tensor, so each step's ids must have been copied out
    behind its own replay (and its inputs staged apart from the next step's)."""
    device = torch.device("cuda")
    model = load_model(config(Policy.STATIC), device, seed=0)
    num_blocks = 128
    caches = kv_caches_of(dummy_store(MODEL, num_blocks, 16, device), MODEL.num_layers)
    graphs = DecodeGraphs(model, caches, 8, 1024, 16, device, (8,))
    graphs.capture()
    runner = ModelRunner(model, caches, device, graphs)
    first = host_batch(decode_shape(8, 300), 16, num_blocks)
    second = replace(first, input_ids=(first.input_ids * 7 + 3) % MODEL.vocab_size)
    alone = [runner.execute(first), runner.execute(second)]
    assert not np.array_equal(alone[0], alone[1])  # the test tells the two steps apart
    launched = [runner.launch(first), runner.launch(second)]
    assert [np.array_equal(step.collect(), ids)
            for step, ids in zip(launched, alone)] == [True, True]
    assert runner.num_graph_steps == 4
    graphs.release()
    del graphs, runner, model, caches
    gc.collect()
    torch.cuda.empty_cache()


def test_a_step_collected_late_is_dated_when_the_device_finished_it():
    """The host sleeps 200 ms between launching a 4k-token prompt and collecting it: the
    step's end (`done_t`) is dated by the device's timer, within its launch plus its device
    span, not at the collection. A step collected after a later one (which anchored the
    timers) is dated back from it by about the later step's span."""
    import time

    device = torch.device("cuda")
    model = load_model(config(Policy.STATIC), device, seed=0)
    num_blocks = 512
    caches = kv_caches_of(dummy_store(MODEL, num_blocks, 16, device), MODEL.num_layers)
    runner = ModelRunner(model, caches, device)
    batch = host_batch(prefill_shape(4096), 16, num_blocks)
    for _ in range(3):  # compiles and warms up
        runner.execute(batch)
    launch_t = time.perf_counter()
    step = runner.launch(batch)
    time.sleep(0.2)
    collect_t = time.perf_counter()
    step.collect()
    span_s = step.phases.device_s
    assert span_s > 0
    assert launch_t + span_s <= step.done_t <= launch_t + step.enqueue_s + span_s + 0.005
    assert step.done_t < collect_t - 0.15
    first, second = runner.launch(batch), runner.launch(batch)
    second.collect()  # waits: anchors the timers at the second step's end
    first.collect()   # ended before: dated back from the anchor
    gap_s = second.done_t - first.done_t  # the second's span, or its launch if longer
    assert 0.95 * second.phases.device_s - 0.2e-3 <= gap_s
    assert gap_s <= second.phases.device_s + second.enqueue_s + 0.5e-3
    del runner, model, caches
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.parametrize("piecewise", [False, True])
def test_async_scheduling_gives_the_synchronous_tokens(piecewise):
    """Every request arrives at once, so both engines schedule the same steps (arrivals
    during a step are what async scheduling sees one step later); decode rows then read their
    input ids from the step in flight on the device, through decode graphs and piecewise
    graphs, across preemptions and elastic migrations. Same steps, same kernels: the same
    tokens, bit for bit."""
    requests = [Request(i, 0.0, 100 + 37 * (i % 9), 40 + 13 * (i % 5)) for i in range(24)]
    outputs = []
    for asynchronous in (False, True):
        setup = build(Policy.ELASTIC, DrainStrategy.MIGRATE, asynchronous, piecewise=piecewise)
        engine = setup.engine
        engine.mirror.keep_outputs = True
        replay(engine, requests, wait=False)
        summary = engine_summary(engine, {})
        assert summary["num_finished"] == len(requests)
        assert summary["measured"]["num_graph_steps"] > 0
        outputs.append((engine.mirror.outputs, summary["num_preemptions"],
                        summary["num_engine_steps"]))
        teardown(setup)
    (sync_tokens, *sync_counts), (async_tokens, *async_counts) = outputs
    assert async_counts == sync_counts
    assert async_tokens == sync_tokens
