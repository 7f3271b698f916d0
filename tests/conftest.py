import os

# Set before jax starts, inherited by the suite's subprocesses:
# - multi-device tests run on 8 virtual CPU devices;
# - on a GPU host the parent and its subprocesses share the GPUs: XLA must not take 75% of each at start;
# - where no NVIDIA driver is loaded, jax's CUDA plugin (installed by .[cuda13], or by CI for
#   test_cuda_aot.py) would print a traceback at every start-up: there the suite runs on the CPU platform.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
if not os.path.exists("/proc/driver/nvidia/version"):
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


if os.environ.get("ZIPCCL_TEST_ONE_DEVICE_DEFAULT") == "1":  # as on a host with one GPU: one_device_default.py
    import one_device_default

    one_device_default.install()

import jax  # noqa: E402
import pytest  # noqa: E402

from zipccl_jax import strategy  # noqa: E402


def _gpus() -> list:
    try:
        return jax.devices("gpu")
    except RuntimeError:  # no GPU platform here
        return []


# The platforms whose codec a platform-parametrized test runs on: the CPU, and the GPU where JAX sees one.
PLATFORMS = ["cpu"] + (["gpu"] if _gpus() else [])


def on(platform: str, x):
    """x placed (committed) on the platform's first device: the op runs there whatever the default."""
    return jax.device_put(x, jax.devices(platform)[0])


def cpu_devices(n: int = 8):
    """The 8 virtual CPU devices the multi-device tests run on, also on a GPU
    host (GPU runs are covered by test_cuda.py); failing, not skipping, when
    they are missing."""
    devices = jax.devices("cpu")
    if len(devices) < n:
        pytest.fail(f"needs {n} CPU devices: XLA_FLAGS=--xla_force_host_platform_device_count={n}")
    return devices[:n]


@pytest.fixture(autouse=True)
def _on_the_cpu():
    """Every test's unplaced arrays and computations go to a CPU device: the tests are about the CPU
    codec and the collectives on the 8 virtual CPU devices, also on a GPU host, where the default
    device would be a GPU. The GPU tests (test_cuda.py) place their data on the GPUs themselves,
    and tests that take devices pin them (cpu_devices, pmap's backend="cpu")."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


@pytest.fixture(autouse=True)
def _no_user_profile(tmp_path, monkeypatch):
    """Decisions in tests must not depend on a calibration profile in ~/.cache,
    nor on figures an earlier test's autotune installed."""
    monkeypatch.setenv("ZIPCCL_PROFILE", str(tmp_path / "no-profile.json"))
    yield
    strategy.uninstall()


@pytest.fixture(scope="module", params=["default", "compressed"])
def zip_strategy(request):
    """Runs a module's tests twice: with the default strategy and with
    ZIPCCL_STRATEGY=compressed, where every float message is compressed.

    The variable is read when a collective is traced, and JAX caches traces
    per Python function: build the functions that call zip_* inside the
    tests (fresh closures), never once at module level, or the second run
    reuses the first run's trace.
    """
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "default":
            patch.delenv("ZIPCCL_STRATEGY", raising=False)
        else:
            patch.setenv("ZIPCCL_STRATEGY", request.param)
        yield request.param
