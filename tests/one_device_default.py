"""A stand-in for a host with one GPU: the default platform is a separate
one-device CPU client while jax.devices("cpu") keeps the virtual CPU devices.

A program or test that takes its devices from the default platform
(jax.devices(), pmap, a make_mesh without devices) instead of choosing them
then sees one device, as it would beside one GPU, and a call that picks its
platform's defaults without naming the platform gets the GPU's. What it cannot
stand in for: the CUDA handlers and their policies (tests/test_cuda.py runs
those on a GPU).

    ZIPCCL_TEST_ONE_DEVICE_DEFAULT=1 pytest tests        # the suite (tests/conftest.py)
    python tests/one_device_default.py examples/demo.py  # a script
    python tests/one_device_default.py -m zipccl_jax bench train ...
"""

import os
import runpy
import sys


def install() -> None:
    """Registers the one-device default platform; must run before JAX starts its backends. Also
    makes jax.default_backend() say "gpu", which is what zipccl_jax asks when it picks a
    platform's defaults (strategy.platform_family) for a call that names none."""
    import jax
    from jax._src import xla_bridge
    from jax._src.lib import xla_client

    xla_bridge.register_backend_factory("one_device_default", lambda: xla_client.make_cpu_client(num_devices=1),
                                        priority=500)
    if jax.config.jax_platforms:  # JAX_PLATFORMS (tests/conftest.py sets cpu where there is no GPU)
        jax.config.update("jax_platforms", "one_device_default," + jax.config.jax_platforms)
    jax.default_backend = lambda: "gpu"


if __name__ == "__main__":
    install()
    if sys.argv[1] == "-m":
        sys.argv = sys.argv[2:]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[1:]
        sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
        runpy.run_path(sys.argv[0], run_name="__main__")
