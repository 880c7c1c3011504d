"""The runner's launch / collect split and its staging buffers, on the CPU (tiny model)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from test_engine_helpers import TINY, toy_config, toy_core

from gpu_backend.engine.memory import kv_caches_of
from gpu_backend.engine.runner import InputCopier, ModelRunner
from gpu_backend.engine.setup import plain_store
from gpu_backend.engine.shapes import decode_shape, host_batch, mixed_shape, prefill_shape
from gpu_backend.model import build_model


def runner_and_blocks() -> tuple[ModelRunner, int]:
    config = toy_config()
    store = plain_store(toy_core(config, num_kv_blocks=64), "cpu", torch.float32)
    model = build_model(TINY, "cpu", torch.float32, attention_backend="torch", max_position=2048,
                        seed=3)
    return ModelRunner(model, kv_caches_of(store, TINY.num_layers), torch.device("cpu")), \
        store.num_blocks


def test_a_staged_step_keeps_its_bytes_while_the_next_one_is_staged():
    """Two buffers in turn: staging step B does not overwrite step A's packed inputs (A's copy
    to the device may still be queued); the third stage takes A's buffer again."""
    copier = InputCopier(torch.device("cpu"))
    a = host_batch(prefill_shape(40, 16), 16, 64)
    b = host_batch(decode_shape(5, 70), 16, 64)
    packed_a, views_a = copier.stage(a)
    _, views_b = copier.stage(b)
    assert views_a["positions"].tolist() == list(range(16, 56))
    assert views_a["seq_lens"].tolist() == [56]
    assert views_b["seq_lens"].tolist() == [70] * 5
    packed_c, views_c = copier.stage(b)
    assert packed_c.data_ptr() == packed_a.data_ptr()  # A's buffer, written again
    assert views_c["seq_lens"].tolist() == [70] * 5


def test_steps_launched_back_to_back_give_the_ids_each_gives_alone():
    runner, num_blocks = runner_and_blocks()
    shapes = (prefill_shape(48), mixed_shape(20, 48, 3, 30), decode_shape(4, 90))
    batches = [host_batch(s, 16, num_blocks) for s in shapes]
    alone = [runner.execute(b) for b in batches]
    launched = [runner.launch(b) for b in batches]
    together = [step.collect() for step in launched]
    for one, other, shape in zip(alone, together, shapes):
        assert one.shape == (len(shape.prefills) + len(shape.decodes),)
        assert np.array_equal(one, other)
    assert runner.num_eager_steps == 6


def test_a_step_without_tokens_launches_nothing():
    runner, num_blocks = runner_and_blocks()
    empty = host_batch(prefill_shape(1), 16, num_blocks)
    empty = replace(empty, input_ids=empty.input_ids[:0], positions=empty.positions[:0],
                    slot_mapping=empty.slot_mapping[:0],
                    query_start_loc=np.zeros(2, dtype=np.int32),
                    logits_indices=empty.logits_indices[:0])
    assert empty.num_tokens == 0
    assert runner.launch(empty).collect().shape == (0,)
    assert runner.num_eager_steps == 0


def test_an_eager_step_takes_its_pending_ids_from_the_step_launched_before():
    """Rows whose input id is the launched step's sample (async scheduling) are filled on
    the device, in reversed order here: the same ids as the batch with them filled on the
    host."""
    runner, num_blocks = runner_and_blocks()
    first = runner.launch(host_batch(decode_shape(4, 50), 16, num_blocks))
    sampled = first.collect()
    second = host_batch(decode_shape(4, 51), 16, num_blocks)
    rows, sources = np.arange(4, dtype=np.int64), np.array([3, 2, 1, 0], dtype=np.int64)
    pending = replace(second, input_ids=np.zeros(4, np.int64), pending_rows=rows,
                      pending_sources=sources)
    fed = runner.launch(pending, after=first).collect()
    resolved = replace(second, input_ids=sampled[sources])
    assert np.array_equal(fed, runner.execute(resolved))
    assert not np.array_equal(fed, runner.execute(replace(pending, pending_rows=rows[:0],
                                                          pending_sources=rows[:0])))
