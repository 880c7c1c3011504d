"""What a GPU result is recorded with (gpu_backend.env), the parts that need no GPU."""

from __future__ import annotations

import math
import platform
import sys

import pytest

from gpu_backend.env import machine_start


def test_the_machine_start_is_the_host_and_its_boot(tmp_path):
    boot = tmp_path / "boot_id"
    boot.write_text("3f1c9a2e-0b7d-4c55-9a0e-5d2f8e1b7c64\n")
    assert machine_start(boot) == f"{platform.node()}/3f1c9a2e-0b7d-4c55-9a0e-5d2f8e1b7c64"
    boot.write_text("")
    assert machine_start(boot) is None
    assert machine_start(tmp_path / "missing") is None


def test_clock_samples_read_into_means_and_the_shares_held_back():
    from gpu_backend.env import POWER_CAP_REASON, THERMAL_REASONS, clock_summary

    # three samples: free at 1980 MHz, then two under the power cap (one also hot)
    samples = [(1980.0, 500.0, 0), (1800.0, 700.0, POWER_CAP_REASON),
               (1710.0, 690.0, POWER_CAP_REASON | THERMAL_REASONS)]
    got = clock_summary(samples)
    assert got["sm_clock_mhz"] == 1830.0 and got["sm_clock_min_mhz"] == 1710.0
    assert got["power_w"] == 630.0 and got["clock_samples"] == 3
    assert got["power_capped_share"] == 2 / 3 and got["thermal_share"] == 1 / 3
    assert clock_summary([]) == {}


def test_without_nvml_a_sampled_block_runs_and_says_why_nothing_was_sampled():
    import importlib.util

    from gpu_backend.env import ClockSampler

    if importlib.util.find_spec("pynvml") is not None:
        import pynvml
        try:
            pynvml.nvmlInit()
            pytest.skip("NVML reads a driver here")
        except pynvml.NVMLError:
            pass
    ran = []
    with ClockSampler(period_s=0.001) as clocks:
        ran.append(1)
    assert ran == [1]
    summary = clocks.summary()
    assert list(summary) == ["clocks_not_sampled"] and "NVML" in summary["clocks_not_sampled"]


def test_a_sampler_reads_clock_power_and_reasons_until_a_read_fails(monkeypatch):
    """Through a stand-in for NVML (none runs here): three good reads, then a failed one
    ends the sampling and is named in the summary beside the samples read."""
    import threading
    import types

    from gpu_backend.env import POWER_CAP_REASON, ClockSampler

    reads, done = [], threading.Event()

    def clock(handle, kind):
        reads.append(kind)
        if len(reads) > 3:
            done.set()
            raise RuntimeError("GPU is lost")
        return 1500 + 100 * len(reads)

    fake = types.SimpleNamespace(
        NVML_CLOCK_SM=1, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: "gpu0",
        nvmlDeviceGetClockInfo=clock, nvmlDeviceGetPowerUsage=lambda h: 600_000,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: POWER_CAP_REASON)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with ClockSampler(period_s=0.001) as clocks:
        assert done.wait(5.0)
    got = clocks.summary()
    assert got["clock_samples"] == 3 and got["sm_clock_mhz"] == 1700.0
    assert got["power_w"] == 600.0 and got["power_capped_share"] == 1.0
    assert "GPU is lost" in got["clocks_not_sampled"]


def test_nvml_is_shut_down_when_the_device_handle_cannot_be_read(monkeypatch):
    """Through a stand-in for NVML: it starts, but the GPU's handle fails; the block runs
    unsampled, says why, and NVML is shut down again."""
    import types

    from gpu_backend.env import ClockSampler

    calls = []

    def no_handle(index):
        raise RuntimeError(f"no GPU {index}")

    fake = types.SimpleNamespace(nvmlInit=lambda: calls.append("init"),
                                 nvmlShutdown=lambda: calls.append("shutdown"),
                                 nvmlDeviceGetHandleByIndex=no_handle)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with ClockSampler(index=3) as clocks:
        pass
    assert calls == ["init", "shutdown"]
    assert "no GPU 3" in clocks.summary()["clocks_not_sampled"]


def test_the_energy_counter_gives_what_the_board_drew_over_the_block(monkeypatch):
    """Through a stand-in for NVML: the counter reads 1,000 mJ as the block starts and
    4,500 mJ as it ends, so the block drew 3.5 J; a board without the counter gives clocks
    and no energy."""
    import types

    from gpu_backend.env import ClockSampler

    counter = iter([1_000, 4_500])
    fake = types.SimpleNamespace(
        NVML_CLOCK_SM=1, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: "gpu0",
        nvmlDeviceGetClockInfo=lambda h, kind: 1980, nvmlDeviceGetPowerUsage=lambda h: 400_000,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0,
        nvmlDeviceGetTotalEnergyConsumption=lambda h: next(counter))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with ClockSampler(period_s=0.001) as clocks:
        pass
    assert clocks.summary()["energy_j"] == 3.5

    def no_counter(handle):
        raise RuntimeError("not supported")

    fake.nvmlDeviceGetTotalEnergyConsumption = no_counter
    with ClockSampler(period_s=0.001) as clocks:
        pass
    got = clocks.summary()
    assert "energy_j" not in got and "clocks_not_sampled" not in got


def test_a_sampled_stream_of_steps_reads_as_one_steps_clock_power_and_energy():
    from gpu_backend.env import per_step_clocks

    summary = {"sm_clock_mhz": 1700.0, "sm_clock_min_mhz": 1650.0, "power_w": 690.0,
               "power_capped_share": 1.0, "thermal_share": 0.0, "clock_samples": 80,
               "energy_j": 35.0}
    assert per_step_clocks(summary, 7) == {
        "ahead_sm_clock_mhz": 1700.0, "ahead_power_w": 690.0,
        "ahead_power_capped_share": 1.0, "ahead_energy_j": 5.0}
    unread = per_step_clocks({"clocks_not_sampled": "NVML unavailable"}, 7)
    assert set(unread) == {"ahead_sm_clock_mhz", "ahead_power_w", "ahead_power_capped_share",
                           "ahead_energy_j"}
    assert all(math.isnan(v) for v in unread.values())


def test_a_grid_says_how_many_of_its_steps_ran_at_the_power_cap():
    from gpu_backend.env import grid_clocks, per_step_clocks

    def point(mhz, capped):
        return per_step_clocks({"sm_clock_mhz": mhz, "power_w": 600.0,
                                "power_capped_share": capped}, 8)

    points = [point(1980.0, 0.0), point(1712.0, 1.0), point(1650.0, 0.6),
              per_step_clocks({}, 8)]
    assert grid_clocks(points) == ("2 of 3 grid steps ran at the power cap; SM clock "
                                   "1,650-1,980 MHz")
    assert grid_clocks([per_step_clocks({}, 8)]) is None
