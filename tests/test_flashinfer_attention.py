"""The flashinfer attention backend's host side, without a GPU: the page lists a step hands
FlashInfer (worked by hand), what the cost model's and the engine's backend lists hold, and the
error where FlashInfer is not installed."""

from __future__ import annotations

import importlib.util

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
    assert {a.dtype for a in (lists.qo_indptr, lists.kv_indptr, lists.indices,
                              lists.last_page_len)} == {np.dtype(np.int32)}


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


def test_the_engine_and_the_cost_model_know_the_backend():
    from gpu_backend.layers import ATTENTION_BACKENDS, FUSED_BACKENDS
    from sim.core.engine_config import EngineConfig
    from sim.core.split_shapes import ATTENTION_BACKENDS as PRICED

    assert "flashinfer" in PRICED and "flashinfer" in ATTENTION_BACKENDS
    assert "flashinfer" in FUSED_BACKENDS  # its layers run the fused kernels
    assert EngineConfig(attention_backend="flashinfer").attention_backend == "flashinfer"


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
