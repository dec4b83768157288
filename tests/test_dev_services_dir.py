"""The development services of a source checkout are found at the repository root, wherever the code moves."""

from __future__ import annotations

from gpufleet.paths import dev_services_dir


def test_dev_services_live_beside_the_scripts_that_start_them() -> None:
    root = dev_services_dir("slurm").parent.parent
    assert (root / "scripts" / "dev-slurm").is_file() and (root / "scripts" / "dev-ray").is_file()
    assert dev_services_dir("ray") == root / ".dev" / "ray"
