"""One engine step as the model sees it: plain tensors flattened over the step's sequences,
built from the scheduler's output (`gpu_backend.engine.inputs`) and read by every layer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import Tensor

from gpu_backend.kernels.attention import DecodePlan
from gpu_backend.kernels.flashinfer_attention import PrefillPlan
from gpu_backend.kernels.split_plan import SplitPlan


@dataclass(frozen=True)
class HostLens:
    """A step's lengths on the host, as the engine had them when it built the step: attention
    that launches per sequence (the split backend) or plans on the host (flashinfer) reads
    them here, not from the device."""

    query_start_loc: np.ndarray  # [S+1] offsets of each sequence's tokens in T
    seq_lens: np.ndarray  # [S] context length after this step
    block_tables: np.ndarray | None = None  # [S, max_blocks] (the flashinfer backend's pages)


@dataclass
class ForwardBatch:
    """One engine step, flattened over sequences (built from the scheduler's output)."""

    input_ids: Tensor  # [T] int64
    positions: Tensor  # [T] int64
    slot_mapping: Tensor  # [T] int64 cache slot of each token (block_id * block_size + off)
    block_tables: Tensor  # [S, max_blocks] int32
    seq_lens: Tensor  # [S] int32 context length after this step
    query_start_loc: Tensor  # [S+1] int32 offsets of each sequence's tokens in T
    logits_indices: Tensor  # [R] int64 rows of T that sample
    max_query_len: int
    max_seq_len: int
    # leading sequences with one new token each (decode rows, first in a mixed batch): their
    # attention runs apart from the prefill rows' (see PagedAttention.prepare)
    num_decodes: int = 0
    decode_plan: DecodePlan | None = None  # made by Model.compute_logits (decode rows)
    prefill_query_start_loc: Tensor | None = None  # [S - num_decodes + 1], mixed steps only
    host_lens: HostLens | None = None  # the lengths above on the host (HostBatch.host_lens)
    split_plan: SplitPlan | None = None  # made by PagedAttention.prepare (split backend)
    prefill_plan: PrefillPlan | None = None  # made by PagedAttention.prepare (flashinfer)
