"""The few SDPA shapes SPLIT attention runs (gpu_backend.kernels.split_attention), and the work
they hold, which the cost model prices (sim.core.operator_costs).

torch's cuDNN attention builds an execution plan (50-190 ms on an H200) the first time it
meets an operand shape, and keeps it (per thread) for the process's life. A trace's prompt
lengths vary, so SPLIT pads every call to a shape from a fixed set and builds each plan at
start-up (split_attention.warm_plans); a replay then builds none.

One prefill sequence of c new tokens over p cached keys:

    keys   |<- 8,192 ->|<- 4,096 ->|<- 1,024 ->|<-a->|<----- own c ----->|pad|
           segments: key counts min_segment x 2^j,  a = p mod min_segment: the prefix's
           at most max_segment, unmasked,           tail, absorbed into the square
           queries padded to segment_rows(c)

    square rows  |<- a dummy ->|<--- c real --->|<- pad ->|   square_rows(a + c)
    square keys  |<- a prefix->|<--- c own  --->|<- pad ->|   causal (top-left)

Real row i of the square is row a + i, so the causal mask lets it see the a absorbed keys
and own keys 0..i, exactly what a chunk over its prefix sees, and never a pad key (they
sit after every real row). The dummy rows above and the pad rows below are computed and
dropped, never merged. Pad keys are zeros or keys an earlier call left in the buffer
(finite: a NaN there, times a zero weight, would still reach the real rows' sums).

Why these sets (Llama-3.1-8B shapes, max_num_batched_tokens 8,192, max_model_len 32,768):

    segment keys   1,024, 2,048, 4,096, 8,192: a prefix is its 8,192-key segments and the
                   binary digits of the rest down to 1,024 (at most 3 more calls); the
                   remainder under 1,024 rides in the square, costing it at most 1,023
                   dummy rows (a + c rows where c alone would do)
    segment rows   1,024 x {1, 1.5} x 2^k up to the chunk: a segment's work is linear in
                   its rows, so padding costs at most 1.5x (a 2,048 chunk beside 64
                   decodes, 1,984 rows, pads to 2,048: 3%)
    square rows    1,024 x {1, 1.125, 1.5} x 2^k: 1.125 takes a full chunk plus a remainder
                   (8,192 + 1,023 keys in 9,216 rows, not 12,288)
    at least 1,024 rows: below that a chunk is host-bound, so padding it costs nothing
                   measurable, and the auto backend sends such chunks to the Triton kernel

That is 11 squares (1,024 .. 9,216) and 7 x 4 = 28 segments: 39 plans, built once in
39 x (50-190 ms) = 2-7 s at start-up (`sdpa_shapes` lists them for a configuration;
split_attention.warm_plans builds them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

# auto backend: fewer new tokens run the Triton paged kernel. On an H200 (Llama-3.1-8B, 16k
# prompt, benchmarks/engine_bench.py) SPLIT beside 64 decodes took 1.46x / 1.18x / 1.17x
# the Triton path's TTFT at chunks of 1,280 / 1,536 / 1,792 and 0.92x from 2,048 up.
SPLIT_MIN_QUERY = 2048
# the engine's attention backends for steps with prefill tokens (EngineConfig.attention_backend)
ATTENTION_BACKENDS = ("triton", "split", "auto", "flashinfer")
TRITON_ATTENTION = "triton"
# flashinfer: prefill rows through FlashInfer's paged prefill (its Hopper kernel on Hopper),
# a mixed step's decode rows always apart, through the Triton decode path
FLASHINFER_ATTENTION = "flashinfer"
SEGMENT_TOKENS = 8192  # most prefix keys per SDPA call
MIN_SEGMENT_TOKENS = 1024  # fewest; a prefix's remainder below it goes into the square
MIN_QUERY_ROWS = 1024  # the smallest padded query count of any call
SQUARE_STEPS = (8, 9, 12)  # square rows: min_rows x 2^k x these / 8
SEGMENT_STEPS = (8, 12)  # segment rows: min_rows x 2^k x these / 8


class SplitWork(NamedTuple):
    """What SPLIT computes for one prefill sequence, padding included, over every layer's
    worth of one layer (the cost model multiplies by the layers)."""
    pairs: float  # query-key products: the causal square's half and every segment in full
    calls: int  # SDPA calls: the square and one per segment


@dataclass(frozen=True, order=True)
class SdpaShape:
    """One SDPA call's operand lengths: rows (queries) over keys, causal for the square."""
    rows: int
    keys: int
    causal: bool


@dataclass(frozen=True)
class SplitShapes:
    """The padding rules of one SPLIT configuration (module docstring); tests shrink them."""
    max_segment_tokens: int = SEGMENT_TOKENS
    min_segment_tokens: int = MIN_SEGMENT_TOKENS
    min_rows: int = MIN_QUERY_ROWS

    def __post_init__(self) -> None:
        ratio = self.max_segment_tokens // max(1, self.min_segment_tokens)
        if (self.min_segment_tokens < 1 or ratio * self.min_segment_tokens
                != self.max_segment_tokens or ratio & (ratio - 1)):
            raise ValueError(f"segments of {self.min_segment_tokens}..{self.max_segment_tokens} "
                             "keys: the largest must be the smallest times a power of two")
        if self.min_rows < 8 or self.min_rows % 8:
            raise ValueError(f"min_rows {self.min_rows}: use a multiple of 8 (the square "
                             "ladder's 9/8 step)")

    def _ladder(self, n: int, steps: tuple[int, ...]) -> int:
        base = self.min_rows
        while True:
            for step in steps:
                if base * step // 8 >= n:
                    return base * step // 8
            base *= 2

    def _ladder_upto(self, n: int, steps: tuple[int, ...]) -> list[int]:
        top, out, base = self._ladder(n, steps), [], self.min_rows
        while base <= top:
            out += [base * step // 8 for step in steps if base * step // 8 <= top]
            base *= 2
        return out

    def square_rows(self, n: int) -> int:
        """Padded rows (and keys) of a causal square holding n real keys."""
        return self._ladder(n, SQUARE_STEPS)

    def segment_rows(self, n: int) -> int:
        """Padded query rows of the prefix segments of a chunk of n tokens."""
        return self._ladder(n, SEGMENT_STEPS)

    def split_prefix(self, prefix_len: int) -> tuple[int, tuple[tuple[int, int], ...]]:
        """(keys absorbed into the square, ((first key, keys) of each segment)) of a prefix:
        whole max segments, then the rest's binary digits down to min_segment_tokens."""
        absorbed = prefix_len % self.min_segment_tokens
        segments, start, size = [], 0, self.max_segment_tokens
        while start < prefix_len - absorbed:
            if start + size <= prefix_len - absorbed:
                segments.append((start, size))
                start += size
            else:
                size //= 2
        return absorbed, tuple(segments)

    def sdpa_shapes(self, max_query_tokens: int, max_model_len: int) -> list[SdpaShape]:
        """Every shape a step can meet where no sequence has more than max_query_tokens new
        tokens nor a context beyond max_model_len: the plans to build up front."""
        longest_square = min(max_query_tokens + self.min_segment_tokens - 1, max_model_len)
        shapes = [SdpaShape(n, n, True) for n in self._ladder_upto(longest_square, SQUARE_STEPS)]
        longest_prefix = max_model_len - 1
        if longest_prefix >= self.min_segment_tokens:
            chunk = min(max_query_tokens, max_model_len - self.min_segment_tokens)
            keys, size = [], self.min_segment_tokens
            while size <= min(self.max_segment_tokens, longest_prefix):
                keys.append(size)
                size *= 2
            shapes += [SdpaShape(rows, n, False) for rows in
                       self._ladder_upto(chunk, SEGMENT_STEPS) for n in keys]
        return sorted(shapes)

    def work(self, query_len: int, prefix_len: int) -> SplitWork:
        """The padded work of a chunk of `query_len` new tokens over `prefix_len` cached keys:
        the square of square_rows(a + c) rows computes half its products (cuDNN skips the
        tiles above the diagonal), each segment its padded rows times its keys."""
        absorbed, segments = self.split_prefix(prefix_len)
        square = self.square_rows(absorbed + query_len)
        rows = self.segment_rows(query_len) if segments else 0
        return SplitWork(square * square / 2.0 + rows * (prefix_len - absorbed),
                         1 + len(segments))
