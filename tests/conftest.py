import os

# Multi-device tests run on 8 virtual CPU devices; must be set before jax starts.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_user_profile(tmp_path, monkeypatch):
    """Decisions in tests must not depend on a calibration profile in ~/.cache."""
    monkeypatch.setenv("ZIPCCL_PROFILE", str(tmp_path / "no-profile.json"))
