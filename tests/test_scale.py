"""Scale: streams over 2^31 bytes and over 2^31 elements (64-bit indexing), and
zip_psum over a pytree of many leaves. Each big run is its own process
(scale_check.py) so its peak memory is measured and freed; docs/RELIABILITY.md
records the figures."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import zipccl_jax as zc

SCRIPT = Path(__file__).with_name("scale_check.py")


def available_gb() -> float:
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) / 2**20


def scale_check(*args, need_gb, timeout=600):
    if available_gb() < need_gb:
        pytest.skip(f"needs {need_gb} GB of free memory, {available_gb():.1f} GB available")
    run = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                         timeout=timeout, cwd=SCRIPT.parent.parent / "tests")
    print(run.stdout)
    assert run.returncode == 0 and run.stdout.startswith("ok=True"), run.stdout[-2000:] + run.stderr[-3000:]
    return dict(kv.split("=") for kv in run.stdout.split())


def test_a_stream_over_2gib_round_trips():
    """One bf16 stream of 2^30 + 2^20 + 4095 elements (2.15 GB; a short last block)
    through the jitted compress and decompress: every bit back, about 3x the
    tensor in peak memory (input, payload, output)."""
    figures = scale_check("stream", 2**30 + 2**20 + 4095, need_gb=9)
    assert int(figures["raw_bytes"]) > 2**31 and 1.45 < float(figures["ratio"]) < 1.6
    assert float(figures["peak_rss_gb"]) < 4 * int(figures["raw_bytes"]) / 2**30


@pytest.mark.skipif(not os.environ.get("ZIPCCL_HUGE_TESTS"), reason="set ZIPCCL_HUGE_TESTS=1: needs ~18 GB, ~1 min")
def test_over_2g_elements_round_trip_in_two_streams():
    scale_check("chunks", 2**31 + 2**21, 2, need_gb=18)


def test_a_stream_over_4gib_is_refused_with_a_clear_error():
    """A stream's length is a uint32: instead of a wrapped length, an error that says how to split."""
    big = jax.ShapeDtypeStruct((2**31,), jnp.bfloat16)
    with pytest.raises(ValueError, match="over the 4294967295 a stream's uint32 length can count"):
        jax.eval_shape(zc.compress, big)
    two = jax.eval_shape(lambda x: zc.compress_chunks(x, 2), big)  # each stream 2^30 elements: fine
    assert two.payload.shape == (2, 2**31 + 16)


def test_a_pytree_of_many_leaves_through_zip_psum():
    """300 leaves of mixed sizes and dtypes on 8 devices: bit-exact rank-ordered sums, and
    compile time (CPU seconds, robust to a busy machine) within a constant of lax.psum's."""
    f = scale_check("leaves", 300, need_gb=2)
    assert float(f["zip_compile_cpu_s"]) < 8 * float(f["lax_compile_cpu_s"]) + 5
    assert float(f["zip_temp_mb"]) < 3 * int(f["bytes_per_device"]) / 2**20 + 1
