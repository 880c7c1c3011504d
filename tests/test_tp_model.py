"""TP=2 forward on CPU (gloo, 2 processes) equals the TP=1 model built from the same seed:
prefill in two chunks, then decodes, over paged KV caches (torch attention backend)."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest
import torch
from test_engine_helpers import TINY

from gpu_backend.batch import ForwardBatch
from gpu_backend.model import build_model
from gpu_backend.tp.group import TpGroup, spawn_ranks
from gpu_backend.tp.shard import build_tp_model, kv_head_range, shard_spec

pytestmark = pytest.mark.skipif(not torch.distributed.is_gloo_available(),
                                reason="torch.distributed has no gloo backend in this build")

GQA_1 = replace(TINY, name="tiny-kv1", num_kv_heads=1, attention_bias=True)
BLOCK_SIZE, NUM_BLOCKS = 4, 32


def step_batch(seqs: list[tuple[int, int, list[int]]]) -> ForwardBatch:
    """seqs: (seq index, first position, new token ids); seq i owns blocks 1 + 8i .. 8 + 8i."""
    ids, pos, slots, lens, starts = [], [], [], [], [0]
    for seq, first, new in seqs:
        ids += new
        pos += range(first, first + len(new))
        slots += [(1 + 8 * seq + p // BLOCK_SIZE) * BLOCK_SIZE + p % BLOCK_SIZE
                  for p in range(first, first + len(new))]
        lens.append(first + len(new))
        starts.append(starts[-1] + len(new))
    tables = torch.tensor([[1 + 8 * s + b for b in range(8)] for s, _, _ in seqs],
                          dtype=torch.int32)
    i64 = torch.int64
    return ForwardBatch(torch.tensor(ids, dtype=i64), torch.tensor(pos, dtype=i64),
                        torch.tensor(slots, dtype=i64), tables,
                        torch.tensor(lens, dtype=torch.int32),
                        torch.tensor(starts, dtype=torch.int32),
                        torch.tensor(starts[1:], dtype=i64) - 1, max(map(len, (s[2] for s in seqs))),
                        max(lens))


def caches(spec) -> list[tuple[torch.Tensor, torch.Tensor]]:
    shape = (NUM_BLOCKS * 2, BLOCK_SIZE, spec.num_kv_heads, spec.head_dim)
    return [(torch.zeros(shape), torch.zeros(shape)) for _ in range(spec.num_layers)]


def run_steps(model, kv) -> list[torch.Tensor]:
    """Two sequences: prefill chunks (mixed with a decode), then three decode steps."""
    gen = torch.Generator().manual_seed(5)
    prompt = [int(x) for x in torch.randint(0, 256, (23,), generator=gen)]
    logits = [model.compute_logits(step_batch([(0, 0, prompt[:13]), (1, 0, prompt[:6])]), kv),
              model.compute_logits(step_batch([(0, 13, prompt[13:]), (1, 6, [7])]), kv)]
    for i in range(3):
        ids = logits[-1].argmax(-1).tolist()
        logits.append(model.compute_logits(step_batch([(0, 23 + i, [ids[0]]),
                                                       (1, 7 + i, [ids[1]])]), kv))
    return logits


def forward_rank(group: TpGroup, spec, out_dir: str) -> None:
    torch.set_num_threads(1)  # two ranks on one CPU: no oversubscription
    model = build_tp_model(spec, group, "cpu", torch.float32, qkv_bias=spec.attention_bias,
                           seed=11, attention_backend="torch", max_position=64)
    logits = run_steps(model, caches(shard_spec(spec, group.world_size)))
    with open(f"{out_dir}/rank{group.rank}.pkl", "wb") as f:
        pickle.dump(logits, f)


@pytest.mark.parametrize("spec", [TINY, GQA_1], ids=["kv2", "kv1-replicated"])
def test_tp2_forward_equals_tp1(spec, tmp_path):
    full = build_model(spec, "cpu", torch.float32, qkv_bias=spec.attention_bias, seed=11,
                       attention_backend="torch", max_position=64)
    reference = run_steps(full, caches(spec))
    spawn_ranks(forward_rank, 2, spec, str(tmp_path), backend="gloo")
    for rank in range(2):
        logits = pickle.loads((tmp_path / f"rank{rank}.pkl").read_bytes())
        assert len(logits) == len(reference) == 5
        for got, want in zip(logits, reference):
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
            assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_shard_shapes_and_kv_heads():
    assert kv_head_range(2, 2, 1) == (1, 2) and kv_head_range(1, 2, 1) == (0, 1)
    assert kv_head_range(2, 4, 3) == (1, 2)
    shard = shard_spec(TINY, 2)
    assert (shard.num_attention_heads, shard.num_kv_heads, shard.intermediate_size,
            shard.vocab_size) == (2, 1, 64, 128)
    with pytest.raises(ValueError, match="divisible"):
        shard_spec(TINY, 8)
