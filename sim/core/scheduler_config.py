"""The scheduler's settings (EngineConfig builds them; a test may build them alone)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_model_len: int = 32768
    block_size: int = 16
    enable_prefix_caching: bool = False
    hash_block_tokens: int = 512  # prompt tokens named by one trace block hash (Mooncake)

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.block_size < 1 or self.hash_block_tokens % self.block_size:
            raise ValueError(
                f"block_size {self.block_size} must be >= 1 and divide hash_block_tokens "
                f"{self.hash_block_tokens}"
            )
