"""The CUDA codec against jax's real CUDA plugin, without a GPU: its FFI targets register and programs
using them compile for 8 H100s (../shared/gpu/AOT.md); a build without the CUDA codec says so when a
program is lowered for a GPU, before XLA compiles anything. Each check runs cuda_aot_worker.py in a
subprocess with JAX_PLATFORMS=cpu.

Needs jax-cuda13-pjrt and jax-cuda13-plugin at the jaxlib's version (pip install --no-deps ...). Without
them these tests skip, unless ZIPCCL_REQUIRE_CUDA_PLUGIN=1 (CI), where they fail.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from zipccl_jax import _ffi
from zipccl_jax.bench import schedule

WORKER = Path(__file__).with_name("cuda_aot_worker.py")
REBUILD = "ZIPCCL_CUDA=ON pip install -v --force-reinstall --no-deps"


def _require_plugin():
    if not schedule.plugin_installed():
        why = "jax's CUDA 13 plugin is not installed (pip install --no-deps jax-cuda13-pjrt jax-cuda13-plugin)"
        if os.environ.get("ZIPCCL_REQUIRE_CUDA_PLUGIN") == "1":
            pytest.fail(f"ZIPCCL_REQUIRE_CUDA_PLUGIN=1 but {why}")
        pytest.skip(why)


def _worker(mode: str) -> dict:
    _require_plugin()
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, str(WORKER), mode], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_cuda_targets_register_and_compile_for_h100s():
    """Every CUDA target registers with the plugin of the installed jax (0.10.2's refuses traits: they are
    then left to the handlers' own declaration), and the compiled programs call them."""
    if _ffi.cuda_module() is None:
        pytest.fail("this build has no CUDA codec (zipccl_jax._zipccl_cuda): CI builds it with ZIPCCL_CUDA=ON")
    got = _worker("register")
    assert got["jax"] == jax.__version__ and got["platforms"] == ["cpu", "CUDA"]
    hlo = got["hlo"]
    assert hlo["compress"] == ["zipccl_compress"]
    assert hlo["decompress_accumulate"] == ["zipccl_decompress_accumulate"]
    # on CUDA the encoder returns the lengths it wrote: no size pass (docs/DESIGN.md, "Static transfers on GPUs")
    assert hlo["zip_psum strategy=compressed"] == ["zipccl_decode_accumulate_rows", "zipccl_encode_rows"]
    assert hlo["zip_all_to_all strategy=compressed"] == ["zipccl_decode_rows", "zipccl_encode_rows"]
    # the command-buffer trait goes with the registration where the plugin takes traits (not 0.10.2's)
    assert len(got["compatible"]) == 7
    assert got["traits"] == ([] if jax.__version__ == "0.10.2" else got["compatible"])


def test_without_the_cuda_codec_lowering_for_gpus_says_what_is_missing():
    """As a build without _zipccl_cuda: every op, every collective under every strategy but "raw", and
    autotune raise NoCudaCodecError naming the cause and the fix when lowered for GPUs; "raw" runs XLA's
    own collective; the CPU codec still works."""
    got = _worker("no-cuda")
    assert got["platforms"] == ["cpu"] and got["cpu_round_trip"]
    lowered = got["lowered"]
    assert len(lowered) == 6 + 6 * 6 + 1
    for name, result in {**lowered, "autotune": got["autotune"]}.items():
        if name.endswith("strategy=raw"):
            assert result == {"ok": []}, name  # XLA's own collective: no codec, no custom call
            continue
        assert result.get("error") == "NoCudaCodecError", (name, result)
        message = result["message"]
        assert "cannot run on" in message and "has no CUDA codec" in message, (name, message)
        assert REBUILD in message, (name, message)
