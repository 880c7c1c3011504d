"""attention_options' catalog: the options each section runs (one pass, chunked, mixed), by
the names its rows carry."""

from __future__ import annotations

from attention_options_bench import Bench
from attention_options_builders import (
    Builder,
    Option,
    decode_rows_alone,
    fa2_varlen,
    flex,
    mixed_beside_decodes,
    mixed_one_launch,
    on_blocks,
    ours,
    sdpa,
)
from attention_options_cases import best_options, tile_name
from attention_options_split import LseOp, lse_one_pass, split
from attention_options_vendors import (
    FLASHINFER_BACKENDS,
    cudnn_gathered,
    cudnn_paged,
    flashinfer_paged,
    mixed_cudnn_one_call,
    mixed_flashinfer_one_call,
)

from gpu_backend.kernels.attention import TileConfig


def lse_ops(bench: Bench) -> list[LseOp]:
    if not bench.cuda:
        return [LseOp("cpu", False)]
    return [LseOp(kernel, expand) for kernel in ("cudnn", "flash") for expand in (False, True)]


def one_pass_options(bench: Bench, tiles: bool) -> list[Option]:
    opts = [Option("ours", ours(), needs_cuda=False, note="prefill_config tile")]
    if tiles:
        opts += [Option(f"ours {tile_name(t)}", ours(t), needs_cuda=False)
                 for t in bench.sizes.tiles] + other_blocks(bench)
    for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"):
        short = backend.split("_")[0].lower()
        opts.append(Option(f"sdpa {short} (gqa)", sdpa(backend, True)))
        opts.append(Option(f"sdpa {short} (kv expanded)", sdpa(backend, False),
                           note="K/V expanded beforehand, the copy not timed"))
    if not bench.cuda:  # materialises every score: small shapes only
        opts.append(Option("sdpa math (gqa)", sdpa("MATH", True), needs_cuda=False))
    opts += [Option(op.name, lse_one_pass(op), needs_cuda=op.kernel != "cpu")
             for op in lse_ops(bench)]
    opts += [Option("fa2 varlen", fa2_varlen(False)),
             Option("flex (compiled, causal block mask)", flex(None)),
             Option("cudnn paged (frontend)", cudnn_paged(), needs_frontend=True,
                    note="ragged Q, page tables, bottom-right causal")]
    return opts + flashinfer_options()


def flashinfer_options(block_size: int | None = None) -> list[Option]:
    """FlashInfer's batch prefill over the pool, each backend (on the pool re-paged at
    `block_size` if given)."""
    tail = f", {block_size}-token blocks" if block_size else ""
    return [Option(f"flashinfer {backend} paged{tail}",
                   on_blocks(flashinfer_paged(backend), block_size) if block_size
                   else flashinfer_paged(backend), flashinfer=backend, block_size=block_size,
                   note="pages read in place; planned once (untimed)")
            for backend in FLASHINFER_BACKENDS]


def chunked_options(bench: Bench, prompt: int) -> list[Option]:
    op = bench.lse_op or lse_ops(bench)[0]
    on_cpu = op.kernel == "cpu"
    return [
        Option("ours", ours(), needs_cuda=False, note="as the engine runs chunks"),
        Option(f"split: {op.name} square + gathered prefix", split(op, False),
               needs_cuda=not on_cpu, note="gather, both parts and the merge timed"),
        Option(f"split: {op.name} square + our prefix kernel", split(op, True),
               needs_cuda=not on_cpu, note="both parts and the merge timed"),
        Option("fa2 varlen, gathered prefix+chunk", fa2_varlen(True), note="gather timed"),
        Option("flex, gathered keys padded", flex(prompt),
               note=f"keys gathered (timed) into {prompt}; block mask made untimed"),
        Option("cudnn paged (frontend)", cudnn_paged(), needs_frontend=True),
        Option("cudnn dense (frontend), gathered prefix+chunk", cudnn_gathered(prompt),
               needs_frontend=True, note=f"gather timed, buffers of {prompt} keys"),
    ] + flashinfer_options() + other_blocks(bench)


def other_blocks(bench: Bench) -> list[Option]:
    """Ours and cuDNN paged over the pool re-paged at the other block size."""
    size = bench.sizes.other_block_size
    return [Option(f"ours, {size}-token blocks", on_blocks(ours(), size), needs_cuda=False,
                   block_size=size),
            Option(f"cudnn paged (frontend), {size}-token blocks",
                   on_blocks(cudnn_paged(), size), needs_frontend=True, block_size=size),
            *flashinfer_options(size)]


def best_tile(bench: Bench) -> TileConfig | None:
    """The swept tile fastest over the first chunk size (correct, timed), if any."""
    tiles = {f"ours {tile_name(t)}": t for t in bench.sizes.tiles}
    names = best_options(bench.rows, bench.sizes.chunks[0], 1, "-", bench.heads.block_size,
                         among=tuple(tiles))
    return tiles[names[0]] if names else None


def mixed_options(bench: Bench, builders: dict[str, Builder]) -> list[Option]:
    """Ours (one launch, with the fastest swept tile too; two launches), the two best
    other chunked options beside our decode launch, cuDNN's one ragged call, the decode
    rows alone."""
    opts = [Option("ours (one launch)", mixed_one_launch(), needs_cuda=False)]
    tile = best_tile(bench)
    if tile is not None:
        opts.append(Option(f"ours (one launch, {tile_name(tile)})", mixed_one_launch(tile),
                           needs_cuda=False))
    opts.append(Option("ours (decode launch + chunk launch)", mixed_beside_decodes(ours()),
                       needs_cuda=False))
    for name in best_options(bench.rows, bench.sizes.chunks[0], 2, "ours",
                             bench.heads.block_size):
        opts.append(Option(f"{name} + our decode launch", mixed_beside_decodes(builders[name]),
                           needs_cuda=bench.cuda, needs_frontend=name.startswith("cudnn"),
                           flashinfer=next((b for b in FLASHINFER_BACKENDS
                                            if name.startswith(f"flashinfer {b}")), None)))
    return opts + [Option("cudnn paged (one ragged call)", mixed_cudnn_one_call,
                          needs_frontend=True),
                   *(Option(f"flashinfer {b} (one ragged call)", mixed_flashinfer_one_call(b),
                            flashinfer=b) for b in FLASHINFER_BACKENDS),
                   Option("our decode launch alone (no chunk)", decode_rows_alone,
                          needs_cuda=False)]
