"""CUDA-graph capture sizes and the padding of decode-only batches (no GPU needed)."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_backend.engine.graphs import bucket_for, capture_sizes, pad_decode
from gpu_backend.engine.inputs import SCRATCH_BLOCK_ID
from gpu_backend.engine.shapes import decode_shape, host_batch, prefill_shape


def test_capture_sizes_cover_every_batch_up_to_max_num_seqs():
    assert capture_sizes(1) == (1,)
    assert capture_sizes(64) == (1, 2, 4, 8, 16, 32, 48, 64)
    sizes = capture_sizes(1024)
    assert sizes[:10] == (1, 2, 4, 8, 16, 32, 48, 64, 96, 128)
    assert sizes[-1] == 1024 and 512 in sizes and 640 in sizes
    assert capture_sizes(300)[-1] == 300
    for batch in range(1, 301):
        bucket = bucket_for(batch, capture_sizes(300))
        assert bucket is not None and bucket >= batch


def test_bucket_for_is_the_smallest_size_that_fits():
    sizes = capture_sizes(128)
    assert bucket_for(3, sizes) == 4
    assert bucket_for(33, sizes) == 48
    assert bucket_for(129, sizes) is None


def test_padded_rows_only_touch_the_scratch_block():
    block_size = 16
    batch = host_batch(decode_shape(3, 40), block_size, num_pool_blocks=100)
    padded = pad_decode(batch, 8, table_width=10, block_size=block_size)
    assert padded.block_tables.shape == (8, 3)  # the batch's width: the graph's is 10
    np.testing.assert_array_equal(padded.block_tables[:3], batch.block_tables)
    assert (padded.block_tables[3:] == SCRATCH_BLOCK_ID).all()
    assert (padded.slot_mapping[3:] == SCRATCH_BLOCK_ID * block_size).all()
    assert padded.slot_mapping[:3].tolist() == batch.slot_mapping.tolist()
    assert padded.seq_lens.tolist() == [40, 40, 40, 1, 1, 1, 1, 1]
    assert padded.query_start_loc.tolist() == list(range(9))
    assert padded.logits_indices.tolist() == list(range(8))
    assert batch.logits_indices.tolist() == [0, 1, 2]  # the rows the engine keeps


def test_pad_refuses_prefills_and_too_wide_tables():
    with pytest.raises(ValueError, match="decode-only"):
        pad_decode(host_batch(prefill_shape(8), 16, 10), 8, 4, 16)
    with pytest.raises(ValueError, match="max_model_len"):
        pad_decode(host_batch(decode_shape(2, 100), 16, 50), 4, 2, 16)
