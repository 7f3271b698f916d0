import os

# Multi-device tests run on 8 virtual CPU devices; must be set before jax starts.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import pytest  # noqa: E402

from zipccl_jax import strategy  # noqa: E402


def cpu_devices(n: int = 8):
    """The 8 virtual CPU devices the multi-device tests run on, also on a GPU
    host (GPU runs are covered by test_cuda.py); failing, not skipping, when
    they are missing."""
    devices = jax.devices("cpu")
    if len(devices) < n:
        pytest.fail(f"needs {n} CPU devices: XLA_FLAGS=--xla_force_host_platform_device_count={n}")
    return devices[:n]


@pytest.fixture(autouse=True)
def _no_user_profile(tmp_path, monkeypatch):
    """Decisions in tests must not depend on a calibration profile in ~/.cache,
    nor on figures an earlier test's autotune installed."""
    monkeypatch.setenv("ZIPCCL_PROFILE", str(tmp_path / "no-profile.json"))
    yield
    strategy.uninstall()
