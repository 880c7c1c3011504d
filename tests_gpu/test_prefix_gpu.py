"""Prefix caching on the GPU engine (qwen2.5-0.5b, random bf16 weights, Triton kernels).
Skipped without CUDA. Run on the GPU machine: ``python -m pytest tests_gpu/test_prefix_gpu.py -q``.

A request whose prefix an earlier request cached must attend over the KV recomputing would
write and get the logits it gets with prefix caching off, while the engine runs only its
uncached tokens; with decode graphs and an elastic reserve taken back by migration, shared
blocks must stay intact. Every forward lasts one virtual second (`ForwardClock`), so arrivals
land at the same steps in every run and the hits are known in advance. In bf16, two runs
batch a prefix differently and may round it differently, so KV and logits are compared
within a tolerance, and a sampled token may differ only where the two best logits were
within it (the runs diverge from there).
"""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from gpu_backend.engine.replay import engine_summary, replay  # noqa: E402
from gpu_backend.engine.setup import build_gpu_engine  # noqa: E402
from sim.core.catalog import get_gpu, get_model  # noqa: E402
from sim.core.elastic import DrainStrategy, Policy  # noqa: E402
from sim.core.engine_config import EngineConfig  # noqa: E402
from sim.core.request import RequestStatus  # noqa: E402
from traces import Request  # noqa: E402

MODEL = get_model("qwen2.5-0.5b")
HASH = 64  # prompt tokens per hash: four blocks of 16
# The random model's logits stay within |3.2|; bf16 rounds a differently batched prefix by an
# ulp or a few (0.016 at |x| >= 2): 0.055 at most was seen, on 3 of 151,936 logits of a row.
LOGIT_ATOL = 0.1
KV_RTOL = 0.05  # of the largest |K| or |V| (seen: 0.017; another prompt's KV: 1.45)
# 0 caches hashes 0-8 and block 0 of hash 9 (37 full blocks of 600 tokens) in steps 1-2;
# 1 and 2 arrive while it decodes, 3 after it finished. Expected hits, by hand:
#   1: 700 tokens, hashes 0-8 then 20 21     -> 36 blocks -> 576 tokens
#   2: 300 tokens, hashes 0-2 then 30 31     -> 12 blocks -> 192 tokens
#   3: 620 tokens, hashes 0-9                -> 37 blocks -> 592 tokens
SHARED = [Request(0, 0.0, 600, 20, tuple(range(10))), Request(4, 0.0, 100, 20),
          Request(1, 5.0, 700, 12, (*range(9), 20, 21)), Request(2, 5.0, 300, 12, (0, 1, 2, 30, 31)),
          Request(3, 60.0, 620, 8, tuple(range(10)))]
EXPECTED_CACHED = {0: 0, 1: 576, 2: 192, 3: 592, 4: 0}
# Four decodes on two stems (hash 0 or 1) outgrow the 63 base blocks (64 device blocks: the
# pool's 6 MiB quantum) and borrow the lent reserve; 4 and 5 hit the stems (0's cached blocks,
# 2's and 3's live ones), and lent blocks are migrated into base blocks before prefills.
CROWD = [Request(0, 0.0, 250, 10, (0, 10, 11, 12)), Request(1, 0.0, 250, 250, (0, 13, 14, 15)),
         Request(2, 0.0, 250, 250, (1, 16, 17, 18)), Request(3, 0.0, 250, 250, (1, 19, 20, 21)),
         Request(4, 80.0, 100, 8, (0, 22)), Request(5, 80.0, 100, 8, (1, 23))]


class ForwardClock:
    """The engine's step timer: one second per forward run (a step re-run after a kernel
    compiled is timed on its own), so a step lasts one second however long it took."""

    def __init__(self) -> None:
        self.num_forwards = 0

    def __call__(self) -> float:
        return float(self.num_forwards)


class LogitsTap:
    """The runner's eager model: the same forward, keeping each sampled row's logits by
    (request, tokens known before it), and at the first token of a request in `kv_blocks`
    the KV of its first blocks. Graph-replayed decode steps bypass it."""

    def __init__(self, model, mirror, kv_caches, kv_blocks: dict[int, int]) -> None:
        self.model, self.mirror, self.kv_caches = model, mirror, kv_caches
        self.kv_blocks = kv_blocks
        self.logits: dict[tuple[int, int], torch.Tensor] = {}
        self.kv: dict[int, torch.Tensor] = {}  # [layers, 2, blocks, block_size, heads, dim]
        self.request_ids: list[int] = []

    def __call__(self, batch, kv_caches):
        logits = self.model.compute_logits(batch, kv_caches)  # [R, vocab]
        for request_id, row in zip(self.request_ids, logits.float().cpu(), strict=True):
            self.logits[(request_id, len(self.mirror.tokens[request_id]))] = row
            if request_id in self.kv_blocks and request_id not in self.kv:
                self.kv[request_id] = self._prefix_kv(request_id)
        return logits.argmax(dim=-1)

    def _prefix_kv(self, request_id: int) -> torch.Tensor:
        table = self.mirror.tables[request_id][:self.kv_blocks[request_id]]
        ids = torch.as_tensor(table + self.mirror.block_id_offset, device="cuda").long()
        return torch.stack([torch.stack((k[ids], v[ids])) for k, v in self.kv_caches]).float().cpu()


def run(requests, caching: bool, policy=Policy.STATIC, drain=DrainStrategy.PREEMPT,
        max_kv_blocks=400, use_graphs=False, kv_blocks: dict[int, int] | None = None):
    # synchronous steps: the tap keys each sampled row by the tokens the mirror holds when
    # the step runs, which under async scheduling still lack the pending ones
    config = EngineConfig(MODEL, get_gpu("h200"), max_num_batched_tokens=512, max_num_seqs=16,
                          max_model_len=1024, block_size=16, policy=policy, drain=drain,
                          vmm_handle_bytes=2 * 2**20, enable_prefix_caching=caching,
                          hash_block_tokens=HASH, async_scheduling=False)
    setup = build_gpu_engine(config, seed=0, max_kv_blocks=max_kv_blocks, use_graphs=use_graphs)
    engine = setup.engine
    engine.mirror.keep_outputs = True
    engine.timer = clock = ForwardClock()
    tap = LogitsTap(engine.runner.model, engine.mirror, engine.runner.kv_caches, kv_blocks or {})
    engine.runner.model = tap
    execute = engine.runner.execute

    def tapped(batch):
        tap.request_ids = batch.sample_request_ids
        ids = execute(batch)
        clock.num_forwards += 1
        return ids

    engine.runner.execute = tapped
    replay(engine, requests, wait=False)
    result = {
        "outputs": engine.mirror.outputs, "logits": tap.logits, "kv": tap.kv,
        "summary": engine_summary(engine, {}),
        "cached": {r.request_id: r.num_cached_tokens for r in engine.recorder.requests},
        "finished": all(r.status is RequestStatus.FINISHED for r in engine.recorder.requests),
        "tokens_run": sum(step[2] + step[3] for step in engine.steps),
        "prefill_tokens": sum(step[2] for step in engine.steps),
        "used_blocks_after": engine.core.scheduler.pool.num_used_blocks,
    }
    close = getattr(setup.store, "close", None)
    if close is not None:
        close()
    del setup, engine
    gc.collect()
    torch.cuda.empty_cache()
    return result


def assert_same_sampling(on: dict, off: dict, prompt_tokens: dict[int, int]) -> int:
    """Logits close wherever both runs know them with the same history; a token may differ
    only at a near tie (the runs diverge from there). Returns the rows compared."""
    compared = 0
    for request_id, off_ids in off["outputs"].items():
        on_ids = on["outputs"][request_id]
        assert len(on_ids) == len(off_ids)
        for position in range(prompt_tokens[request_id], len(off_ids)):
            key = (request_id, position)
            if key in off["logits"] and key in on["logits"]:
                off_row, on_row = off["logits"][key], on["logits"][key]
                torch.testing.assert_close(on_row, off_row, rtol=0, atol=LOGIT_ATOL)
                compared += 1
                if on_ids[position] != off_ids[position]:
                    top1, top2 = off_row.topk(2).values.tolist()
                    assert top1 - top2 < 2 * LOGIT_ATOL, (request_id, position, top1, top2)
                    break
            elif on_ids[position] != off_ids[position]:
                break  # a graph-replayed step: no logits to judge the tie by
    return compared


def relative_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def test_cached_prefix_gives_the_recomputed_kv_and_logits():
    # request 1's first 36 blocks (the hits), and request 4's 6 (other tokens: the control)
    kv_blocks = {1: 36, 4: 6}
    off = run(SHARED, caching=False, kv_blocks=kv_blocks)
    on = run(SHARED, caching=True, kv_blocks=kv_blocks)
    assert on["finished"] and off["finished"]
    assert on["cached"] == EXPECTED_CACHED
    total_cached = sum(EXPECTED_CACHED.values())
    assert off["tokens_run"] - on["tokens_run"] == total_cached
    assert on["prefill_tokens"] == sum(r.prompt_tokens for r in SHARED) - total_cached
    # the KV request 1 read from request 0's blocks is what it wrote itself with caching off
    assert relative_gap(on["kv"][1], off["kv"][1]) < KV_RTOL
    assert relative_gap(off["kv"][4], off["kv"][1][:, :, :6]) > 10 * KV_RTOL  # other tokens
    prompts = {r.request_id: r.prompt_tokens for r in SHARED}
    # every row is eager here: every sampled row with the same history is compared
    assert assert_same_sampling(on, off, prompts) >= len(SHARED)
    assert all((request_id, n) in on["logits"] for request_id, n in prompts.items())
    assert on["used_blocks_after"] == 0


def test_shared_blocks_survive_graphs_and_migration():
    off = run(CROWD, caching=False, use_graphs=True)
    on = run(CROWD, caching=True, policy=Policy.ELASTIC, drain=DrainStrategy.MIGRATE,
             max_kv_blocks=63, use_graphs=True)
    assert on["finished"] and on["used_blocks_after"] == 0
    assert on["cached"][4] == on["cached"][5] == HASH  # the stems, cached by 1 and 2/3
    summary = on["summary"]
    assert summary["num_attach"] >= 1 and summary["migrated_bytes"] > 0
    assert summary["num_preemptions"] == 0
    prompts = {r.request_id: r.prompt_tokens for r in CROWD}
    assert assert_same_sampling(on, off, prompts) >= len(CROWD)  # first tokens at least
