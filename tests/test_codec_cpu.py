"""The C++ codec on hostile input: corrupt, truncated and mutated payloads."""

import zlib

import ml_dtypes
import numpy as np
import pytest

from zipccl_jax import _zipccl_cpu as cpu
from zipccl_jax import reference as ref
from zipccl_jax.bench.data import gaussian, random_bits
from test_reference import make

CASES = {
    "bf16_coded": (gaussian(9000, "bfloat16", seed=1), 1),
    "fp16_coded": (gaussian(9000, "float16", seed=2), 2),
    "fp32_coded": (gaussian(9000, "float32", seed=3), 3),
    "bf16_stored_raw": (random_bits(300, "bfloat16", seed=4), 1),
    # one raw block between coded ones
    "fp32_mixed": (np.concatenate([gaussian(4096, "float32"), random_bits(4096, "float32"),
                                   gaussian(100, "float32")]), 3),
    # Huffman-coded byte planes (FORMAT.md §5.4): both planes, and plane 0 only
    "fp32_byte_codes": ((np.random.default_rng(6).integers(-64, 64, 9000) / 64).astype(np.float32), 3),
    "fp16_byte_codes": ((np.random.default_rng(7).integers(-64, 64, 9000) / 64).astype(np.float16), 2),
    # implied zeros (§4.2) with -0 and subnormals among them, 256-symbol sign coding (§4.1), own refs (§5.5)
    "bf16_relu": (make("relu_odd_zeros", 9000, ml_dtypes.bfloat16, seed=8), 1),
    "fp32_relu": (make("relu", 9000, np.float32, seed=9), 3),
    "fp16_gelu": (make("gelu", 9000, np.float16, seed=10), 2),
    "bf16_own_refs": (np.concatenate([gaussian(4096, "bfloat16"), gaussian(4096, "bfloat16", scale=2.0**-20),
                                      gaussian(800, "bfloat16")]), 1),
}


def decode_cpu(payload: bytes, code: int, n: int, itemsize: int, generic=False):
    out = np.zeros(n * itemsize, np.uint8)
    cpu.decompress_into(np.frombuffer(payload, np.uint8), code, out, generic=generic)
    return out.tobytes()


def mutate(stream: bytes, rng) -> bytes:
    """One random corruption: bit flips, byte overwrites, truncation or garbage appended."""
    b = bytearray(stream)
    kind = rng.integers(0, 5)
    if kind == 0:
        for _ in range(rng.integers(1, 4)):
            i = rng.integers(0, len(b))
            b[i] ^= 1 << int(rng.integers(0, 8))
    elif kind == 1:
        i = rng.integers(0, len(b))
        b[i] = rng.integers(0, 256)
    elif kind == 2:  # header and descriptors are where structure lives
        i = rng.integers(0, min(len(b), 64))
        b[i] = rng.integers(0, 256)
    elif kind == 3:
        del b[rng.integers(0, len(b)) :]
    else:
        b += bytes(rng.integers(0, 256, rng.integers(1, 64)).astype(np.uint8))
    return bytes(b)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("generic", [False, True], ids=["fast", "generic"])
def test_thousands_of_mutations_never_crash_and_errors_are_clear(case, generic):
    x, code = CASES[case]
    stream = ref.compress(x)
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    rejected = 0
    for _ in range(2000):
        bad = mutate(stream, rng)
        try:
            decode_cpu(bad, code, x.size, x.itemsize, generic)
        except ValueError as err:
            assert str(err).startswith("zipccl: corrupt payload: "), err
            rejected += 1
    assert rejected > 200  # structural damage is caught, not decoded as garbage


@pytest.mark.parametrize("case", ["bf16_coded", "fp16_coded", "fp32_mixed", "fp32_byte_codes", "fp16_byte_codes",
                                  "bf16_relu", "fp32_relu", "fp16_gelu", "bf16_own_refs"])
def test_cpu_and_reference_agree_on_every_mutated_payload(case):
    """Same verdict and, when accepted, the same decoded bits."""
    x, code = CASES[case]
    stream = ref.compress(x)
    rng = np.random.default_rng(5)
    for _ in range(150):
        bad = mutate(stream, rng)
        try:
            expected = ref.decompress(bad, x.dtype, x.size).view(np.uint8).tobytes()
        except ref.CorruptPayload:
            expected = None
        try:
            got = decode_cpu(bad, code, x.size, x.itemsize)
        except ValueError:
            got = None
        assert got == expected


def test_each_header_field_is_checked_with_its_own_message():
    x = gaussian(5000, "bfloat16")
    s = bytearray(ref.compress(x))

    def expect(b, message, n=5000, code=1):
        with pytest.raises(ValueError, match=message):
            decode_cpu(bytes(b), code, n, 2)

    expect(s[:10], "truncated")
    expect(b"ZCCX" + s[4:], "bad magic")
    for version in (0, 4, 6):  # version 5 alone is read
        expect(s[:4] + bytes([version]) + s[5:], "unsupported format version")
    expect(s, "dtype does not match", code=2)
    expect(s, "element count does not match", n=4999)
    expect(s[:6] + b"\x80" + s[7:], "unknown header flags")
    expect(s[:-1], "truncated")
    bad_mode = bytearray(s)
    bad_mode[16 + 2 * 2 + 3] = 7 | 21 << 3  # block 0's body starts with its width field: at most 20
    expect(bad_mode, "bad mode")


def test_round_trip_of_every_float32_exponent_and_sign():
    e = np.arange(256, dtype=np.uint32)
    x = ((e[:, None] << 23) | np.array([0, 1, 0x7FFFFF, 1 << 31, (1 << 31) | 0x400000], np.uint32)).ravel()
    x = np.tile(x, 20).view(np.float32)
    out = np.zeros(ref.max_stream_bytes(x.size, x.dtype), np.uint8)
    length = cpu.compress_into(x.view(np.uint8), 3, out)
    assert out[:length].tobytes() == ref.compress(x)
    assert decode_cpu(out[:length].tobytes(), 3, x.size, 4) == x.tobytes()


def test_large_outputs_advised_to_huge_pages_round_trip():
    """Outputs of 8 MiB and more get madvise(MADV_HUGEPAGE) before they are written (codec_cpu.cc):
    the bytes must come out the same, at any alignment of the buffer."""
    x = gaussian(3 << 20, "float32", seed=4)  # 12 MiB
    raw = x.view(np.uint8)
    for offset in (0, 1, 4096 + 3):
        out = np.zeros(ref.max_stream_bytes(x.size, x.dtype) + offset, np.uint8)[offset:]
        length = cpu.compress_into(raw, 3, out)
        back = np.zeros(x.nbytes + offset, np.uint8)[offset:]
        cpu.decompress_into(out[:length], 3, back)
        assert back.tobytes() == raw.tobytes()


def test_output_buffer_smaller_than_worst_case_is_refused():
    x = gaussian(100, ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match="smaller than max_stream_bytes"):
        cpu.compress_into(x.view(np.uint8), 1, np.zeros(100, np.uint8))


PLAIN_VS_SIMD = """
import hashlib
import numpy as np
from zipccl_jax import _zipccl_cpu as cpu, reference as ref
from zipccl_jax.bench.data import gaussian, random_bits
from test_reference import make

mixed = gaussian(40000, "bfloat16")
mixed[5000:9000] = random_bits(4000, "bfloat16")  # a raw block among coded ones
cases = [(gaussian(70000, "bfloat16"), 1), (gaussian(70000, "float16"), 2), (gaussian(70000, "float32"), 3),
         (mixed, 1)]
cases += [(np.abs(x), code) for x, code in cases[:3]]  # coded signs (FORMAT.md §4.1)
cases += [(make(kind, 70000, dt, seed=3), code) for kind in ("relu", "relu_odd_zeros", "gelu")
          for dt, code in (("bfloat16", 1), ("float16", 2), ("float32", 3))]  # implied zeros (§4.2)
digest = hashlib.sha256()
for x, code in cases:
    out = np.zeros(ref.max_stream_bytes(x.size, x.dtype), np.uint8)
    stream = out[: cpu.compress_into(x.view(np.uint8), code, out)]
    back = np.zeros(x.nbytes, np.uint8)
    cpu.decompress_into(stream, code, back)
    assert back.tobytes() == x.tobytes()
    digest.update(stream.tobytes())
print(digest.hexdigest())
"""


def test_plain_paths_give_the_same_bytes_as_the_simd_paths(tmp_path):
    """The CPU codec takes AVX-512 paths where it can; ZIPCCL_NO_SIMD=1 forces the
    portable ones, which must produce and accept the same bytes."""
    import os
    import subprocess
    import sys

    digests = []
    for no_simd in (False, True):
        env = {k: v for k, v in os.environ.items() if k != "ZIPCCL_NO_SIMD"}
        # test_reference's data kinds, ahead of where the installed package may be found
        env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        if no_simd:
            env["ZIPCCL_NO_SIMD"] = "1"
        # cwd away from the repo root, whose zipccl_jax/ has no compiled modules
        run = subprocess.run([sys.executable, "-c", PLAIN_VS_SIMD], env=env, capture_output=True, text=True,
                             timeout=120, cwd=tmp_path)
        assert run.returncode == 0, run.stderr[-2000:]
        digests.append(run.stdout.strip())
    assert digests[0] == digests[1] and len(digests[0]) == 64


def run_sanitized_fuzzer(tmp_path, fuzzer: str, *codec: str):
    """Builds tests/<fuzzer> with the ffi/ sources `codec` under AddressSanitizer and UBSan and runs
    it on the SIMD and the portable paths (150 inputs each); it must report no failure."""
    import os
    import shutil
    import subprocess
    from pathlib import Path

    compiler = shutil.which("g++") or shutil.which("c++")
    assert compiler, "a C++ compiler is needed to build the fuzzer"
    root = Path(__file__).resolve().parents[1]
    exe = tmp_path / Path(fuzzer).stem
    subprocess.run([compiler, "-std=c++17", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                    f"-I{root / 'ffi'}", str(root / "tests" / fuzzer), *(str(root / "ffi" / c) for c in codec), "-o", str(exe)],
                   check=True, timeout=600)
    for seed, no_simd in [(1, False), (2, True)]:
        env = {k: v for k, v in os.environ.items() if k != "ZIPCCL_NO_SIMD"}
        if no_simd:
            env["ZIPCCL_NO_SIMD"] = "1"
        run = subprocess.run([str(exe), str(seed), "150"], env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0 and ", 0 failures" in run.stdout, run.stdout[-2000:] + run.stderr[-3000:]


def test_sanitized_differential_fuzzer(tmp_path):
    """tests/fuzz_codec_cpu.cc under AddressSanitizer and UBSan: fast and generic coders agree on
    random inputs and on corrupted streams, on both the SIMD and the portable paths."""
    run_sanitized_fuzzer(tmp_path, "fuzz_codec_cpu.cc", "codec_cpu.cc")
