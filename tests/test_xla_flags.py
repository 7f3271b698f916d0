"""zipccl_jax/_xla_flags.py: the import turns XLA:GPU's latency-hiding scheduler on in XLA_FLAGS
where that can still take effect, and says so; the compiled consequences are test_schedule.py's."""

import os
import subprocess
import sys
import warnings

import pytest

from zipccl_jax import _xla_flags

FLAG = "--xla_gpu_enable_latency_hiding_scheduler=true"


@pytest.fixture
def environ(monkeypatch):
    monkeypatch.delenv(_xla_flags.OPT_OUT, raising=False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    return monkeypatch


def backends(environ, started, gpu):
    environ.setattr(_xla_flags, "_backends_started", lambda: (started, gpu))


def test_before_the_backends_start_the_flag_is_added_to_the_users_flags(environ):
    backends(environ, False, False)
    assert _xla_flags.apply() == "set"
    assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8 " + FLAG


@pytest.mark.parametrize("value", ["0", "false", "off", " No "])
def test_opting_out_leaves_xla_flags_alone(environ, value):
    backends(environ, False, False)
    environ.setenv(_xla_flags.OPT_OUT, value)
    assert _xla_flags.apply() == "off"
    assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8"


@pytest.mark.parametrize("theirs", ["=false", "=true"])
def test_a_flag_the_user_set_is_theirs(environ, theirs):
    backends(environ, False, False)
    environ.setenv("XLA_FLAGS", f"--xla_gpu_enable_latency_hiding_scheduler{theirs}")
    assert _xla_flags.apply() == "user"
    assert os.environ["XLA_FLAGS"] == f"--xla_gpu_enable_latency_hiding_scheduler{theirs}"


def test_too_late_on_a_gpu_host_warns_with_the_fixes(environ):
    backends(environ, True, True)
    with pytest.warns(RuntimeWarning, match=r"imported after JAX's backends started.*"
                      r"compiler_options=zipccl_jax.GPU_COMPILER_OPTIONS.*ZIPCCL_XLA_FLAGS=0"):
        assert _xla_flags.apply() == "late"
    assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8"


def test_too_late_without_a_gpu_is_silent(environ):
    backends(environ, True, False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _xla_flags.apply() == "late"


def test_the_real_check_sees_this_processs_backends():
    import jax

    jax.devices("cpu")  # started (conftest's 8 CPU devices)
    started, gpu = _xla_flags._backends_started()
    assert started and gpu == any(d.platform == "gpu" for d in jax.devices())


def test_a_fresh_process_gets_the_flag_and_jax_reads_its_own_flags_beside_it(tmp_path):
    """As a user's script: the import adds the flag before JAX starts; XLA parses it (an unknown or
    malformed flag would abort) and the user's own flag still counts (2 CPU devices)."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    env.pop(_xla_flags.OPT_OUT, None)
    code = ("import os, jax, zipccl_jax as zc; print(zc._xla_flags.STATE, '|', os.environ['XLA_FLAGS'], '|', "
            "len(jax.devices()))")
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("|") == ["set ", f" --xla_force_host_platform_device_count=2 {FLAG} ", " 2\n"]


def test_every_state_is_worded_for_the_selftest_and_bench_schedule():
    assert _xla_flags.describe() == _xla_flags.describe(_xla_flags.STATE)
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" in _xla_flags.describe("set")
    for state in ("off", "late"):
        assert "GPU_COMPILER_OPTIONS" in _xla_flags.describe(state)
    with pytest.raises(KeyError):
        _xla_flags.describe("unknown")
