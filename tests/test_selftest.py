"""`python -m zipccl_jax selftest` on the CPU devices (8 virtual ones, tests/conftest.py), and its
GPU timing's Python half (the CUDA half runs in tests/test_cuda_emulation.py)."""

import numpy as np

from zipccl_jax import selftest


def test_selftest_passes_on_cpu_and_says_what_it_did_not_check(capsys):
    assert selftest.main(elements=1 << 14, repeat=1, platform="cpu") == 0
    out = capsys.readouterr().out
    assert f"codec on {selftest.jax.local_devices(backend='cpu')[0]}: correct" in out
    assert "collectives on 8 cpu devices: correct" in out
    assert "not checked: the CUDA codec: --platform cpu" in out
    assert "strategy: psum of 64 KiB bfloat16 over 8 devices ->" in out
    assert "compress" in out.split("speed on ")[1] and "read+write pass" in out
    assert "  measured with wall-clock medians of 1 jitted calls" in out
    assert out.rstrip().endswith("verdict: correct")


def test_selftest_reports_a_codec_that_disagrees_with_the_reference(monkeypatch):
    """A reference whose streams have one bit flipped -- the first after the header (a raw
    element's, or block 0's body size), the header's last for an empty array: every case is
    reported as a different stream, and every non-empty one also as a reference stream that is
    rejected or decodes to other values (an empty array is not decoded at all). (The last byte
    would not do: since format version 3 it can be a table byte of a group whose blocks are all
    raw, which decoders do not read: FORMAT.md §5.5.)"""
    real = selftest.reference.compress

    def flipped(x):
        s = real(x)
        k = min(16, len(s) - 1)
        return s[:k] + bytes([s[k] ^ 1]) + s[k + 1:]
    monkeypatch.setattr(selftest.reference, "compress", flipped)
    wrong = selftest.check_codec(selftest.jax.local_devices(backend="cpu")[0])
    cases = 3 * (3 * 2 + 3)  # dtypes * (kinds * large sizes + small sizes)
    assert len([w for w in wrong if w.endswith("stream differs from the reference")]) == cases
    rejected = [w for w in wrong if w.endswith("the reference's stream does not decode to the input")]
    assert len(rejected) == cases - 3 and not any(" n=0:" in w for w in rejected)
    assert len(wrong) == 2 * cases - 3
    assert "float16 random_bits n=4097: stream differs from the reference" in wrong


RAW = {"compress_ms": 0.5, "decompress_ms": 0.25, "copy_ms": 0.05, "compressed_bytes": 22_000_000,
       "round_trip": True, "elements": 1 << 24, "bytes": 2 << 24, "repeat": 5}


class FakeGpu:
    platform, id, local_hardware_id = "gpu", 9, 3

    def __str__(self):
        return "cuda:3"


def test_on_a_gpu_the_codec_is_timed_by_the_cuda_module_and_reported_in_gb_per_second(monkeypatch):
    """time_codec hands the CUDA module's time_codec the device's CUDA ordinal, the bfloat16 code, the
    raw bytes and the repeat count, and turns its milliseconds per call into GB/s of raw input."""
    calls = []

    class Module:
        @staticmethod
        def time_codec(device, dtype, raw, repeat):
            calls.append((device, dtype, raw.dtype, raw.size, repeat))
            return RAW

    monkeypatch.setattr(selftest._ffi, "cuda_module", lambda: Module)
    speed = selftest.time_codec(FakeGpu(), 1 << 10, 5)
    assert calls == [(3, 1, np.uint8, 2 << 10, 5)]
    assert selftest.speed_lines(FakeGpu(), 1 << 24, speed) == [
        "speed on cuda:3 (16777216 bfloat16 Gaussians, ratio 1.525): compress 67.1 GB/s, decompress 134.2 GB/s, "
        "device-to-device copy 671.1 GB/s",
        "  measured with CUDA events around 5 back-to-back calls on one stream after a warm-up, device buffers "
        "reused; the copy is cudaMemcpyAsync device to device of the input"]
    assert speed["round_trip"] and not selftest.speed_from_cuda_events({**RAW, "round_trip": False})["round_trip"]


def test_on_a_host_with_an_nvidia_driver_where_jax_sees_no_gpu_it_fails_saying_how_to_install_gpu_jax(
        tmp_path, capsys, monkeypatch):
    """A driver file (/proc/driver/nvidia/version on a real host) and no GPU in JAX: the selftest fails
    before checking anything, naming the cause and the command; --platform cpu still checks the CPU."""
    local = selftest._local_devices
    monkeypatch.setattr(selftest, "_local_devices", lambda platform: [] if platform == "gpu" else local(platform))
    driver = tmp_path / "version"
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06\n")
    assert selftest.main(elements=1 << 14, repeat=1, driver_file=driver) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"FAIL: this host has an NVIDIA driver ({driver}) but JAX sees no GPU: ")
    assert f'pip install "jax[cuda13]=={selftest.jax.__version__}"' in out and "codec on" not in out
    assert selftest.main(elements=1 << 14, repeat=1, platform="cpu", driver_file=driver) == 0
    assert capsys.readouterr().out.rstrip().endswith("verdict: correct")


def test_the_suite_keeps_xla_from_preallocating_gpu_memory_for_itself_and_its_subprocesses():
    """tests/conftest.py: on a multi-GPU host the suite's subprocesses share the GPUs with the parent."""
    import os
    import subprocess
    import sys

    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    child = subprocess.run([sys.executable, "-c", "import os; print(os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'])"],
                           capture_output=True, text=True)
    assert child.stdout.strip() == "false"
    if not os.path.exists("/proc/driver/nvidia/version"):  # no GPU: the CPU platform, quiet beside a CUDA plugin
        assert os.environ["JAX_PLATFORMS"] == "cpu" and {d.platform for d in selftest.jax.devices()} == {"cpu"}


def test_where_jax_sees_gpus_but_the_build_has_no_cuda_codec_it_fails_saying_how_to_rebuild(monkeypatch, capsys):
    gpu = type("Gpu", (FakeGpu,), {"device_kind": "NVIDIA H100 80GB HBM3"})()
    monkeypatch.setattr(selftest, "_local_devices", lambda platform: [gpu] if platform == "gpu" else [])
    monkeypatch.setattr(selftest._ffi, "register", lambda: ("cpu",))
    assert selftest.main(elements=1 << 14, repeat=1) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == ("FAIL: JAX sees GPUs but this build of zipccl_jax has no CUDA codec; rebuild it with the CUDA "
                       "codec: ZIPCCL_CUDA=ON pip install -v --force-reinstall --no-deps <zipccl_jax's source> (on "
                       "Linux x86_64 pip fetches CUDA 13's nvcc from PyPI; elsewhere name an nvcc with "
                       "CUDACXX=/path/to/nvcc; docs/GPU.md, \"Building\")")


def test_with_cpu_only_jax_the_driver_host_message_says_so(tmp_path, monkeypatch):
    """CPU-only jax has no jax_plugins package at all: find_spec of a submodule raises, which must not."""
    def no_jax_plugins(name, *args):
        raise ModuleNotFoundError(f"No module named {name.split('.')[0]!r}")
    monkeypatch.setattr(selftest.importlib.util, "find_spec", no_jax_plugins)
    (tmp_path / "version").write_text("NVRM version: 580.65.06\n")
    assert not selftest.cuda_plugin_installed()
    assert ": the installed jax is CPU-only. Install GPU jax: pip install" in selftest.no_gpu_seen(tmp_path / "version")
    assert selftest.no_gpu_seen(tmp_path / "absent") is None
