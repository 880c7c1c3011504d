"""The step grid `python -m gpu_backend profile` times: which prefill, decode and mixed steps,
and why each group is there (the replays it was added for).

Default (< 2.5 min for Llama-3.1-8B on an H200): prefills of 16..16,384 tokens (one prompt, or
many short ones), chunks over long prefixes, decode batches 1..256 x contexts 256..16,384 and
skewed ones (CUDA graphs, as the engine runs them), and mixed steps; where the profile's
command sets `--max-num-batched-tokens` or `--max-model-len` past that grid, steps at those
limits too (`limit_shapes`).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpu_backend.engine.shapes import (
    StepShape,
    decode_shape,
    mixed_shape,
    prefill_shape,
    skewed_decode_shape,
    spread_decode_shape,
)


def default_grid(quick: bool = False, max_step_tokens: int | None = None,
                 max_model_len: int | None = None) -> list[StepShape]:
    """The grid below, and `limit_shapes` of the engine's token budget and longest sequence
    where the profile's command sets them past it (not with `quick`)."""
    if quick:
        return base_grid(quick=True)
    grid = base_grid()
    return grid + limit_shapes(grid, max_step_tokens, max_model_len)


LIMIT_PROMPT = 1024  # the many-prompt step's prompt length, as the base grid's
# the longest sequence stops this short of max_model_len: the profile's own max_model_len is
# its grid's longest sequence and a block to spare (grid_max_len), which must stay within the
# model's context when max_model_len is the context itself
LIMIT_SPARE_KEYS = 256


def limit_shapes(grid: Sequence[StepShape], max_step_tokens: int | None,
                 max_model_len: int | None) -> list[StepShape]:
    """Steps at the engine's own limits, where they reach past `grid`, so that a run
    at such a chunk or with such sequences is priced from timed steps rather than by carrying
    the fitted rates past the grid (sim.core.calibration.coverage): a step of `max_step_tokens`
    tokens as one prompt and as prompts of 1,024 tokens (the study slice's chunk of 32,768:
    its 32,768-token first step came out 10-12% short from a grid that stopped at 16,384), and
    a chunk of 2,048 over the longest prefix `max_model_len` holds, and one decode row of
    that many keys beside a chunk (one row: the pool holds one such sequence), each
    LIMIT_SPARE_KEYS short of it."""
    shapes: list[StepShape] = []
    if max_step_tokens is not None and max_step_tokens > max(s.num_tokens for s in grid):
        shapes += [prefill_shape(max_step_tokens),
                   StepShape("prefill", ((LIMIT_PROMPT, 0),) * (max_step_tokens // LIMIT_PROMPT))]
    if max_model_len is not None and max_model_len - LIMIT_SPARE_KEYS > longest_sequence(grid):
        longest = max_model_len - LIMIT_SPARE_KEYS
        shapes += [prefill_shape(2048, longest - 2048), mixed_shape(2048, 0, 1, longest)]
    return shapes


def base_grid(quick: bool = False) -> list[StepShape]:
    """The grid of the module docstring, its groups of steps in this order (`quick`: the
    small grid of quick_grid)."""
    if quick:
        return quick_grid()
    return (prompt_steps() + uniform_decode_steps() + long_context_decode_steps()
            + graph_size_decode_steps() + skewed_decode_steps() + spread_decode_steps()
            + mixed_steps() + launch_bound_steps() + split_attention_steps()
            + long_row_mixed_steps() + replay_row_mixed_steps() + many_prompt_steps())


def quick_grid() -> list[StepShape]:
    """Two prefills, two decode batches and a mixed step: the small grid of the profile's
    `--quick` (tests, smoke runs)."""
    return [prefill_shape(64), prefill_shape(512), decode_shape(4, 256),
            decode_shape(16, 1024), mixed_shape(128, 0, 4, 512)]


def prompt_steps() -> list[StepShape]:
    """Single prompts of 16..16,384 tokens, then chunks of 512 and 2,048 tokens over prefixes
    of 6,144..16,384: a prefill's cost by its new tokens, and by the prefix its chunk attends
    over."""
    grid = [prefill_shape(n) for n in (16, 64, 256, 1024, 2048, 4096, 8192, 16384)]
    return grid + [prefill_shape(512, 8192), prefill_shape(2048, 6144), prefill_shape(512, 16384)]


def uniform_decode_steps() -> list[StepShape]:
    """Decode batches of 1..256 sequences x contexts of 256..8,192 keys, each sequence alike: a
    decode step's cost by its batch and by the keys each sequence reads."""
    return [decode_shape(b, c) for b in (1, 8, 32, 64, 128, 256) for c in (256, 1024, 4096, 8192)]


def long_context_decode_steps() -> list[StepShape]:
    """Long contexts per sequence (Mooncake-like): the replays showed them slower than the
    shorter grid points predict."""
    return [decode_shape(b, 16384) for b in (4, 16, 32)]


def graph_size_decode_steps() -> list[StepShape]:
    """The replays' other graph sizes (capture_sizes: a decode batch runs padded to the next
    one up): is a step's cost linear in the batch between the sizes of uniform_decode_steps?"""
    return [decode_shape(b, c) for b in (2, 4, 16, 48, 96, 192) for c in (1024, 4096)]


def skewed_decode_steps() -> list[StepShape]:
    """One or two long sequences among short ones: a decode step should cost its total keys,
    not its longest sequence (the attention kernel's split plan; see kernels/attention.py)."""
    return [skewed_decode_shape(32, 512, 16384), skewed_decode_shape(64, 1024, 16384, 2),
            skewed_decode_shape(20, 256, 12000, 4), skewed_decode_shape(128, 512, 8192)]


def spread_decode_steps() -> list[StepShape]:
    """Contexts spread as a trace's are (no single outlier): replays' decode steps of 17-48
    such sequences ran 3-17% over the uniform points' fit on the GPU alone, and
    benchmarks/decode_gap.py timed 40 of 200-2,000 keys above 48 uniform of 1,024."""
    return [spread_decode_shape(24, 200, 2000, seed=1), spread_decode_shape(40, 200, 2000, seed=3),
            spread_decode_shape(24, 2000, 24000, seed=5)]


def mixed_steps() -> list[StepShape]:
    """A chunk beside a decode batch (one of them over a prefix): what a step that runs both
    costs, beside the prefill-only and decode-only steps."""
    return [mixed_shape(2048, 0, 64, 1024), mixed_shape(512, 2048, 32, 2048),
            mixed_shape(1024, 0, 128, 512)]


def launch_bound_steps() -> list[StepShape]:
    """Short, launch-bound eager steps with many sequences, as replays have them (a few short
    prompts, or a small chunk beside a decode batch): what the per-sequence terms fit on."""
    return [StepShape("prefill", ((128, 0),) * 4), mixed_shape(128, 0, 32, 1024),
            mixed_shape(64, 512, 8, 2048)]


def split_attention_steps() -> list[StepShape]:
    """Eager steps whose attention splits its keys (sim.core.cost_model.attention_num_splits)
    beside ones that do not, for every GQA shape: a split launches a combine kernel per layer
    (split_launch_s), which a fit holds at 0 unless 3 or more grid steps split. A chunk of
    about a thousand tokens beside a dozen decodes: the Azure-conv replays' usual mixed step."""
    return [prefill_shape(128, 2048), mixed_shape(256, 0, 4, 2048),
            mixed_shape(1024, 0, 16, 1500), mixed_shape(384, 0, 12, 1200)]


def long_row_mixed_steps() -> list[StepShape]:
    """A chunk beside long decode rows (Mooncake at chunk 2,048): each decode row is one
    program of the mixed launch, unsplit, so the step lasts at least its longest row's
    program (Efficiency.attention_program); the replays ran 13 ms over the total work's
    price on such steps. Short chunks and long rows, one or several, and a long prefix;
    the same rows beside 4,096 and 8,192-token chunks, whose work should hide the row (each
    step the scheduler's token budget: the chunk less the decode rows)."""
    mooncake_rows = (8000,) * 15 + (30000,)
    grid = [StepShape("mixed", ((n - len(mooncake_rows), 0),), mooncake_rows)
            for n in (2048, 4096, 8192)]
    return grid + [StepShape("mixed", ((512, 0),), (2000,) * 20 + (28000,)),
                   mixed_shape(2048, 4096, 8, 24000), mixed_shape(1024, 0, 4, 30000),
                   mixed_shape(2048, 16384, 16, 12000)]


def replay_row_mixed_steps() -> list[StepShape]:
    """Several long rows among shorter ones, as the Mooncake replays' mixed steps have them (18
    rows, 218k keys, five of ~27k): timed alone those steps ran 1.3-1.7x their longest
    program where the one-long-row points of long_row_mixed_steps fit it
    (benchmarks/replay_attention.py), so the grid needs them to tell how the long programs
    share the SMs. The same rows beside a chunk of 8,192 over a prefix that is no whole number
    of SPLIT's segments: on the split and auto backends its 9,216-row square and two segments,
    a shape no other grid step runs (the H200 auto replays' chunk-8,192 steps over a prefix
    ran 1-4% over the price fitted on a grid without it, summed over each run, those without
    a prefix within 1.5%)."""
    replay_rows = (27000,) * 5 + (12000,) * 6 + (4000,) * 7
    return [StepShape("mixed", ((2048 - len(replay_rows), 6000),), replay_rows),
            StepShape("mixed", ((8192 - len(replay_rows), 0),), replay_rows),
            StepShape("mixed", ((8192 - len(replay_rows), 6000),), replay_rows)]


def many_prompt_steps() -> list[StepShape]:
    """Many short prompts in one step, as a burst of arrivals fills the token budget (the
    study's 40 prompts of 1,024 tokens, Mooncake's 40 requests at once): the linear layers at
    a large token count with little attention. The single prompts of prompt_steps grow both
    together, so without these the fit can trade the linear rate against the attention's,
    and it priced the study's first step (32 such prompts) 11-12% short."""
    return [StepShape("prefill", ((1024, 0),) * 8), StepShape("prefill", ((1024, 0),) * 16)]


def grid_max_len(grid: Sequence[StepShape], block_size: int, cap: int | None = None) -> int:
    """The profile's max_model_len: the grid's longest sequence (a prefill's prefix and chunk,
    or a decode row's context, mixed steps' decode rows too) and a block to spare, but at most
    `cap` (the profile command's --max-model-len, which may be the model's whole context)
    where the longest sequence fits in it. The rotary tables are this long: a mixed step's
    30k-key decode row past them reads an illegal address (Llama-3.1-8B)."""
    longest = longest_sequence(grid)
    if cap is not None and longest <= cap < longest + block_size:
        return cap
    return longest + block_size


def longest_sequence(grid: Sequence[StepShape]) -> int:
    """The grid's longest sequence: a prefill's prefix and chunk, or a decode row's context
    (mixed steps' decode rows too)."""
    return max(max([n + p for n, p in s.prefills] + list(s.decodes)) for s in grid)
