"""The real-GPU serving engine: the shared core's decisions executed on a paged KV cache.

    inputs.py     executor-side block tables and token ids -> host arrays of one forward
    block_tables.py  each request's block ids as a growing array, with its largest id
    graphs.py     CUDA-graph capture sizes and padding of decode-only batches
    runner.py     one pinned host->device copy, eager forward or graph replay, sampled ids
    device_clock.py  when a step ended on the device, on the host's clock; its phases
    kv_store.py   plain-tensor KV store with the ElasticKVPool interface; whole-block copies
    elastic.py    the core's attach / detach / migrate actions on the real pool, timed
    memory.py     measured weights, activation peaks, non-torch and graph memory -> MemoryPlan
    setup.py      build model, plan, core, pool and graphs in vLLM's order
    engine.py     the step loop (schedule, elastic, forward, update, record)
    clocks.py     the engine's timeline: wall clock or virtual clock
    replay.py     trace replay and the simulator-compatible outputs
    shapes.py     synthetic steps for calibration and benchmarks
    profile_grid.py  the steps a calibration times, and why each is there
    calibrate.py  builds the profiled engine and writes the calibration (`python -m
                  gpu_backend profile`; its format and fits: sim.core.calibration)
    calibrate_timing.py  the grid timed on that engine and the cost model fitted to it
    attention_profile.py  the grid's attention launches timed alone
    transitions.py  the elastic transitions timed for the calibration
"""
