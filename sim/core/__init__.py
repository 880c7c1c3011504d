"""The pure core both executors share (no simpy, no torch)."""

from sim.core.compiled import check_fresh

check_fresh()
