"""The metrics validation compares between a GPU replay's summary and its simulation, and
where each sits in a summary (validation.compare compares them; validation.summary_check
checks a replay's values are numbers)."""

# (name, summary key, sub key or None, unit). num_cached_tokens: prompt tokens served from the
# prefix cache, summed over the run's requests. The total rather than the cached share of
# prompt tokens, because both sides' summaries carry it (sim.recording.metrics.summarize, which
# the GPU replay's summary runs too) and neither carries the prompt total; the share would need
# the request rows, which a repeat kept as summary.json alone lacks. A replay whose summary
# predates the key has None here, which a report shows as "not recorded", never as 0.
METRICS = (
    ("kv_capacity_tokens", "kv_capacity_tokens", None, "tokens"),
    ("kv_capacity_lent_tokens", "kv_capacity_lent_tokens", None, "tokens"),
    ("ttft_p50_s", "ttft_s", "p50", "s"),
    ("ttft_p99_s", "ttft_s", "p99", "s"),
    ("tpot_p50_s", "tpot_s", "p50", "s"),
    ("tpot_p99_s", "tpot_s", "p99", "s"),
    ("e2e_p50_s", "e2e_s", "p50", "s"),
    ("throughput_tok_s", "throughput_tok_s", None, "tok/s"),
    ("num_preemptions", "num_preemptions", None, ""),
    ("num_cached_tokens", "num_cached_tokens", None, "tokens"),
    ("num_attach", "num_attach", None, ""),
    ("attach_time_s", "attach_time_s", None, "s"),
    ("num_detach", "num_detach", None, ""),
    ("detach_time_s", "detach_time_s", None, "s"),
    ("reserve_share", "reserve_share", None, "share"),
)
