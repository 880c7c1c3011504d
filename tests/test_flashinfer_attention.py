"""The flashinfer attention backend's host side, without a GPU: the page lists a step hands
FlashInfer (worked by hand), what the cost model's and the engine's backend lists hold, and the
error where FlashInfer is not installed."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

from gpu_backend.batch import ForwardBatch, HostLens
from gpu_backend.kernels.flashinfer_attention import INSTALL_HINT, page_lists
from gpu_backend.layers import PagedAttention

# Three sequences of a step with 16-token blocks: one decode row (41 keys), a 100-token chunk
# over 300 cached keys (400 keys), a 16-token prompt (16 keys); their block-table rows.
QSL = np.array([0, 1, 101, 117], dtype=np.int32)
LENS = np.array([41, 400, 16], dtype=np.int32)
TABLES = np.zeros((3, 30), dtype=np.int32)
TABLES[0, :3] = [7, 3, 9]
TABLES[1, :25] = np.arange(100, 125)
TABLES[2, :1] = [55]
TABLES[:, 25:] = -1  # never read: past every sequence's last block


def test_page_lists_of_the_prefill_sequences():
    # from sequence 1 on: query rows 0..100 and 100..116; 400 keys = 25 blocks of 16, the
    # last one full; 16 keys = 1 block, full
    lists = page_lists(QSL, LENS, TABLES, 1, 16)
    np.testing.assert_array_equal(lists.qo_indptr, [0, 100, 116])
    np.testing.assert_array_equal(lists.kv_indptr, [0, 25, 26])
    np.testing.assert_array_equal(lists.indices, list(range(100, 125)) + [55])
    np.testing.assert_array_equal(lists.last_page_len, [16, 16])
    np.testing.assert_array_equal(lists.kv_lens, [400, 16])
    assert {a.dtype for a in (lists.qo_indptr, lists.kv_indptr, lists.indices,
                              lists.last_page_len, lists.kv_lens)} == {np.dtype(np.int32)}


def test_page_lists_of_every_sequence_count_partial_last_blocks():
    # 41 keys = 2 full blocks + 9; with 64-token blocks: 1 block of 41, 400 = 6 x 64 + 16
    lists = page_lists(QSL, LENS, TABLES, 0, 16)
    np.testing.assert_array_equal(lists.kv_indptr, [0, 3, 28, 29])
    np.testing.assert_array_equal(lists.indices[:3], [7, 3, 9])
    np.testing.assert_array_equal(lists.last_page_len, [9, 16, 16])
    wide = page_lists(QSL, LENS, TABLES, 0, 64)
    np.testing.assert_array_equal(wide.kv_indptr, [0, 1, 8, 9])
    np.testing.assert_array_equal(wide.indices, [7, *range(100, 107), 55])
    np.testing.assert_array_equal(wide.last_page_len, [41, 16, 16])


def test_page_lists_refuse_what_the_tables_cannot_hold():
    with pytest.raises(ValueError, match="400 keys needs 25 blocks; the block table holds 20"):
        page_lists(QSL, LENS, TABLES[:, :20], 1, 16)
    with pytest.raises(ValueError, match="a sequence of 0 keys"):
        page_lists(QSL, np.array([41, 0, 16]), TABLES, 0, 16)
    with pytest.raises(ValueError, match="3 sequences with 3 query offsets"):
        page_lists(QSL[:3], LENS, TABLES, 0, 16)


def test_an_engine_config_takes_the_backend_and_refuses_a_misspelt_one():
    from sim.core.engine_config import EngineConfig

    assert EngineConfig(attention_backend="flashinfer").attention_backend == "flashinfer"
    with pytest.raises(ValueError, match="--attention-backend 'flashinfr'"):
        EngineConfig(attention_backend="flashinfr")


@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is not None,
                    reason="FlashInfer is installed here")
def test_a_prefill_step_without_flashinfer_says_what_to_install():
    attn = PagedAttention(4, 2, 32, "flashinfer")
    k_cache = torch.zeros(30, 16, 2, 32)
    tables = torch.as_tensor(TABLES[:, :26])
    batch = ForwardBatch(
        input_ids=torch.zeros(0, dtype=torch.int64), positions=torch.zeros(0, dtype=torch.int64),
        slot_mapping=torch.zeros(0, dtype=torch.int64), block_tables=tables,
        seq_lens=torch.as_tensor(LENS), query_start_loc=torch.as_tensor(QSL),
        logits_indices=torch.zeros(0, dtype=torch.int64), max_query_len=100, max_seq_len=400,
        num_decodes=1, host_lens=HostLens(QSL, LENS, TABLES))
    with pytest.raises(RuntimeError, match="needs FlashInfer: pip install"):
        attn.prepare(batch, k_cache)
    assert "flashinfer-python" in INSTALL_HINT


@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is not None,
                    reason="FlashInfer is installed here")
def test_versions_name_flashinfer_only_where_it_is_installed():
    from gpu_backend.env import versions

    found = versions()
    assert "flashinfer" not in found and found["torch"] == torch.__version__


def test_versions_read_a_flashinfer_copy_without_its_metadata(tmp_path, monkeypatch):
    """A FlashInfer tree put on the path without its dist-info (as a trimmed copy is) still
    has its version recorded, from the package itself."""
    from gpu_backend.env import versions

    (tmp_path / "flashinfer").mkdir()
    (tmp_path / "flashinfer" / "__init__.py").write_text('__version__ = "0.7.4"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flashinfer", raising=False)
    try:
        assert versions()["flashinfer"] == "0.7.4"
    finally:
        sys.modules.pop("flashinfer", None)


class FakeWrapper:
    """FlashInfer's wrapper as the backend calls it, attending in float32 from the page lists
    it was planned with (pages read from the pool, causal aligned to each sequence's end)."""

    def __init__(self, workspace, layout, backend):
        assert layout == "NHD" and workspace.dtype == torch.uint8
        self.backend = backend

    def plan(self, qo_indptr, kv_indptr, indices, last_page_len, num_heads, num_kv_heads,
             head_dim, page_size, *, causal, sm_scale, q_data_type, kv_data_type,
             non_blocking, seq_lens):
        assert causal and q_data_type == kv_data_type
        pages = (kv_indptr[1:] - kv_indptr[:-1]).tolist()  # the lengths FlashInfer would derive
        assert seq_lens.tolist() == [(n - 1) * page_size + last
                                     for n, last in zip(pages, last_page_len.tolist())]
        self.lists = (qo_indptr.tolist(), kv_indptr.tolist(), indices.clone(),
                      last_page_len.tolist(), page_size, sm_scale)

    def run(self, q, caches, out):
        qo, kv, indices, last, page, scale = self.lists
        k_cache, v_cache = caches
        for i in range(len(qo) - 1):
            pages = indices[kv[i]:kv[i + 1]].long()
            keys_len = (len(pages) - 1) * page + last[i]
            k = k_cache[pages].reshape(-1, *k_cache.shape[2:])[:keys_len].float()
            v = v_cache[pages].reshape(-1, *v_cache.shape[2:])[:keys_len].float()
            rows = q[qo[i]:qo[i + 1]].float()
            group = rows.shape[1] // k.shape[1]
            scores = torch.einsum("rhd,lhd->hrl", rows, k.repeat_interleave(group, 1)) * scale
            first = keys_len - rows.shape[0]  # row r sees keys [0, first + r]
            seen = torch.arange(keys_len)[None, :] <= first + torch.arange(rows.shape[0])[:, None]
            probs = scores.masked_fill(~seen, float("-inf")).softmax(-1)
            out[qo[i]:qo[i + 1]] = torch.einsum("hrl,lhd->rhd", probs,
                                                v.repeat_interleave(group, 1)).to(out.dtype)
        return out


@pytest.fixture
def fake_flashinfer(monkeypatch):
    import sys
    import types

    from gpu_backend.kernels import flashinfer_attention

    module = types.ModuleType("flashinfer")
    module.BatchPrefillWithPagedKVCacheWrapper = FakeWrapper
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    flashinfer_attention._prefill_of.cache_clear()
    yield
    flashinfer_attention._prefill_of.cache_clear()


def prefill_problem():
    from gpu_backend.kernels import store_kvcache_ref
    from tests.kernel_cases import make_problem

    # prefill rows only (a 1-token chunk among them), over the strided pool with NaN slots
    pb = make_problem([1, 37, 200, 16], [40, 0, 333, 16], 4, 2, 32, 16, torch.float32, seed=3)
    store_kvcache_ref(pb.new_k, pb.new_v, pb.k_cache, pb.v_cache, pb.slot_mapping)
    empty = torch.zeros(0, dtype=torch.int64)
    batch = ForwardBatch(
        input_ids=empty, positions=empty, slot_mapping=empty, block_tables=pb.block_tables,
        seq_lens=pb.seq_lens, query_start_loc=pb.query_start_loc, logits_indices=empty,
        max_query_len=pb.max_query_len, max_seq_len=pb.max_seq_len, num_decodes=0,
        host_lens=HostLens(pb.query_start_loc.numpy(), pb.seq_lens.numpy(),
                           pb.block_tables.numpy()))
    return pb, batch


def test_the_backend_plans_once_and_every_layer_runs_the_plan(fake_flashinfer):
    """A step of prefill rows through the flashinfer path with FlashInfer replaced by a
    float32 attention over the page lists it is handed: the dense reference's output, so the
    lists, the row split and the plan's hand-over are right; a plan run after its wrapper was
    planned twice more is refused."""
    from tests.kernel_cases import dense_reference, rel_error

    pb, batch = prefill_problem()
    attn = PagedAttention(4, 2, 32, "flashinfer")
    prepared = attn.prepare(batch, pb.k_cache)
    plan = prepared.prefill_plan
    assert plan is not None and plan.num_rows == pb.q.shape[0]
    assert plan.wrapper.backend == "fa2"  # not Hopper
    for _ in range(2):  # two layers, one plan
        out = attn.attend(pb.q, pb.k_cache, pb.v_cache, prepared)
        assert rel_error(out, dense_reference(pb)) < 1e-5
    # a batch built without its host lengths and tables: copied from the device, same output
    bare = replace(batch, host_lens=None)
    out = attn.attend(pb.q, pb.k_cache, pb.v_cache, attn.prepare(bare, pb.k_cache))
    assert rel_error(out, dense_reference(pb)) < 1e-5
    for _ in range(2):
        attn.prepare(batch, pb.k_cache)
    with pytest.raises(RuntimeError, match="planned again"):
        attn.attend(pb.q, pb.k_cache, pb.v_cache, prepared)
    with pytest.raises(ValueError, match="for a plan of 254 rows"):
        attn.prepare(batch, pb.k_cache).prefill_plan.run(pb.q[1:], pb.k_cache, pb.v_cache,
                                                         torch.empty_like(pb.q[1:]))
