"""What both executors record while they run: per-request rows, step timelines and the
summary metrics computed from them (pure Python; no simpy, no torch)."""
