"""What a GPU result is recorded with (gpu_backend.env), the parts that need no GPU."""

from __future__ import annotations

import platform

from gpu_backend.env import machine_start


def test_the_machine_start_is_the_host_and_its_boot(tmp_path):
    boot = tmp_path / "boot_id"
    boot.write_text("3f1c9a2e-0b7d-4c55-9a0e-5d2f8e1b7c64\n")
    assert machine_start(boot) == f"{platform.node()}/3f1c9a2e-0b7d-4c55-9a0e-5d2f8e1b7c64"
    boot.write_text("")
    assert machine_start(boot) is None
    assert machine_start(tmp_path / "missing") is None
