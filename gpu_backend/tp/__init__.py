"""Tensor parallelism (Megatron style, as vLLM): one process per GPU, one shared-core
scheduler replicated on every rank.

    group.py    the TP process group: init (NCCL on GPU, gloo on CPU) and the few scalar
                collectives the engine needs (max of step times, min of KV blocks, any-OOM)
    shard.py    the per-rank model: a shard of the same full random model (one seed), with
                the all-reduces after o_proj / down_proj, vocab-parallel embedding and lm_head
    engine.py   TpEngine: the GPU engine's step with the clock and OOM agreed across ranks
    setup.py    per-rank memory measurement, one agreed plan, per-rank KV pool, engine
    launch.py   `python -m gpu_backend replay --tp N`: spawn N ranks, rank 0 writes outputs

tp_size == 1 never enters this package: the single-GPU engine runs unchanged.
"""
