"""The C++ CPU codec (ffi/codec6_cpu.cc, format version 6) against the numpy reference: the same bytes,
the same sizes, bit-exact round trips, and the reference's verdict on hostile bytes, on the fast
coder (AVX-512 where the CPU has it, and without) and on format6.h's generic one (the CUDA codec's)."""

import os
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from zipccl_jax import _zipccl_cpu as cpu
from zipccl_jax import reference as R
from zipccl_jax.bench.data import DTYPES, gaussian, random_bits
from test_reference import CODES, bits, descriptors, kinds, odd_values, with_descriptor

ROOT = Path(__file__).resolve().parents[1]


def compress(x, generic=False):
    out = np.zeros(R.max_stream_bytes(x.size, x.dtype), np.uint8)
    length = cpu.compress_into(np.ascontiguousarray(x).view(np.uint8).ravel(), CODES[x.dtype.name], out, generic)
    return out[:length].tobytes()


def decompress(stream, x, generic=False):
    out = np.zeros(x.nbytes, np.uint8)
    cpu.decompress_into(np.frombuffer(stream, np.uint8), CODES[x.dtype.name], out, generic)
    return out.view(bits(x).dtype)



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



# The CPU codec's paths, by the environment that selects them (ffi/simd_cpu.h): the widest the CPU
# has (AVX-512, else AVX2), AVX2 (on an AVX-512 CPU too), the portable loops. On a CPU without
# AVX-512 the first two are the same path, run twice.
SIMD_PATHS = {"widest": {}, "avx2": {"ZIPCCL_SIMD": "avx2"}, "portable": {"ZIPCCL_NO_SIMD": "1"}}


def path_env(path: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("ZIPCCL_NO_SIMD", "ZIPCCL_SIMD")}
    return {**env, **SIMD_PATHS[path]}


def run_sanitized_fuzzer(tmp_path, fuzzer: str, *codec: str):
    """Builds tests/<fuzzer> with the ffi/ sources `codec` under AddressSanitizer and UBSan and runs
    it on each of the CPU codec's paths (150 inputs each); it must report no failure."""
    import shutil

    compiler = shutil.which("g++") or shutil.which("c++")
    assert compiler, "a C++ compiler is needed to build the fuzzer"
    root = Path(__file__).resolve().parents[1]
    exe = tmp_path / Path(fuzzer).stem
    subprocess.run([compiler, "-std=c++17", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                    f"-I{root / 'ffi'}", str(root / "tests" / fuzzer), *(str(root / "ffi" / c) for c in codec), "-o", str(exe)],
                   check=True, timeout=600)
    for seed, path in enumerate(SIMD_PATHS, start=1):
        run = subprocess.run([str(exe), str(seed), "150"], env=path_env(path), capture_output=True, text=True, timeout=600)
        assert run.returncode == 0 and ", 0 failures" in run.stdout, path + run.stdout[-2000:] + run.stderr[-3000:]

def category(message: str) -> str:
    """A verdict's kind, as the reference and the C++ codec both word it: 'corrupt block descriptor',
    'corrupt group table', 'corrupt block body', 'corrupt block bitstream', 'truncated payload (shorter', ..."""
    return " ".join(message.removeprefix("zipccl: corrupt payload: ").split()[:3])


def verdicts(stream: bytes, x, generic=False):
    """(the reference's verdict category or None, the C++ one or None, the C++ decode or None)."""
    try:
        R.decompress(stream, x.dtype, x.size)
        ref = None
    except R.CorruptPayload as e:
        ref = category(str(e))
    try:
        return ref, None, decompress(stream, x, generic)
    except ValueError as e:
        return ref, category(str(e)), None


@pytest.mark.parametrize("generic", [False, True], ids=["fast", "generic"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_streams_are_the_references_byte_for_byte_and_round_trip(dtype, generic):
    cases = {**kinds(dtype), "two full blocks": gaussian(2 * R.BLOCK, dtype, seed=21),  # the last body at the end
             "silu": (lambda g: g / (1 + np.exp(-g)))(gaussian(R.GROUP_BLOCKS * R.BLOCK, "float32", seed=22)).astype(dtype)}
    for name, x in cases.items():
        s = compress(x, generic)
        assert s == R.compress(x), name
        raw = np.ascontiguousarray(x).view(np.uint8).ravel()
        assert cpu.stream_bytes(raw, CODES[dtype], generic=generic) == len(s), name
        plan = np.zeros(cpu.plan_bytes(x.size), np.uint8)
        assert cpu.stream_bytes(raw, CODES[dtype], plan, generic=generic) == len(s), name
        planned = np.zeros(R.max_stream_bytes(x.size, dtype), np.uint8)  # the size pass's plan codes the same stream
        assert planned[: cpu.compress_into(raw, CODES[dtype], planned, generic, plan)].tobytes() == s, name
        np.testing.assert_array_equal(decompress(s, x, generic), bits(x), err_msg=name)


def test_the_cpp_family_is_the_references():
    """format6.h embeds the family as numbers; reference.py as hex text (docs/FORMAT.md §5)."""
    text = (ROOT / "ffi" / "format6.h").read_text()
    body = text[text.index("#define ZC6_FAMILY_LENGTHS") :].split("constexpr", 1)[0]
    rows = [[int(v) for v in row.split(",")] for row in re.findall(r"\{([\d,]+)\}", body)]
    np.testing.assert_array_equal(np.array(rows), R.FAMILY)


def test_every_block_kind_and_escape_round_trips_through_both_decoders():
    x = gaussian(2 * R.GROUP_BLOCKS * R.BLOCK + 777, "bfloat16", seed=23)
    x[3 * R.BLOCK : 4 * R.BLOCK] = random_bits(R.BLOCK, "bfloat16")  # a raw block
    x[20 * R.BLOCK : 21 * R.BLOCK] = -np.maximum(x[20 * R.BLOCK : 21 * R.BLOCK], 0)  # a flipped member?
    with_odd_values(x, 53)
    s = compress(x)
    d = descriptors(s, x.size)
    assert any(b["raw"] for b in d) and any(b["code"] == R.GROUP_CODE for b in d) and d[0]["table"]
    for generic in (False, True):
        np.testing.assert_array_equal(decompress(s, x, generic), bits(x))


def test_a_group_code_read_with_the_sign_inverted_decodes_as_the_reference_does():
    """The encoder never flips a group code, but §2 lets a descriptor do it: the decoders must agree."""
    x = gaussian(R.GROUP_BLOCKS * R.BLOCK, "bfloat16", seed=24)
    s = compress(x)
    assert descriptors(s, x.size)[3]["code"] == R.GROUP_CODE
    t = with_descriptor(s, 3, flip=1)
    ref = R.decompress(t, x.dtype, x.size) if verdicts(t, x)[0] is None else None
    for generic in (False, True):
        got = verdicts(t, x, generic)
        assert got[0] == got[1]
        if ref is not None:
            np.testing.assert_array_equal(got[2], bits(ref))


def with_odd_values(x, step):
    """x with every step-th value a special one: escapes and zeros inside coded blocks."""
    x[::step] = np.resize(odd_values(x.dtype), x[::step].size)
    return x


CASES = {
    "bf16 groups": lambda: gaussian(R.GROUP_BLOCKS * R.BLOCK + 3000, "bfloat16", seed=31),
    "fp16 escapes": lambda: with_odd_values(gaussian(3 * R.BLOCK + 50, "float16", seed=32), 41),
    "fp32 raw block": lambda: np.concatenate([gaussian(R.BLOCK, "float32", seed=33), random_bits(R.BLOCK, "float32"),
                                              gaussian(900, "float32", seed=34)]),
    "bf16 relu": lambda: np.maximum(gaussian(2 * R.BLOCK + 10, "bfloat16", seed=35), 0),
}


@pytest.mark.parametrize("generic", [False, True], ids=["fast", "generic"])
@pytest.mark.parametrize("case", CASES)
def test_mutated_streams_get_the_references_verdict(case, generic):
    """Same verdict (its kind) and, when accepted, the same decoded bits."""
    x = CASES[case]()
    stream = R.compress(x)
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    refused = 0
    for _ in range(60):
        bad = mutate(stream, rng)
        ref, got, decoded = verdicts(bad, x, generic)
        assert got == ref, (ref, got)
        if ref is None:
            np.testing.assert_array_equal(decoded, bits(R.decompress(bad, x.dtype, x.size)))
        refused += ref is not None
    assert refused > 10


KNOWN_VERDICTS = {"truncated payload (shorter", "bad magic (not", "unsupported format version",
                  "payload dtype does", "payload element count", "unknown header flags", "corrupt block descriptor",
                  "corrupt group table", "corrupt block body", "corrupt block bitstream"}


@pytest.mark.parametrize("generic", [False, True], ids=["fast", "generic"])
@pytest.mark.parametrize("case", CASES)
def test_thousands_of_mutations_never_crash_and_errors_are_clear(case, generic):
    """2,000 mutations a case through the C++ decoders alone (the reference is too slow for as
    many): each is refused with a known verdict, or decoded to the same bits by the other decoder."""
    x = CASES[case]()
    stream = R.compress(x)
    rng = np.random.default_rng(zlib.crc32(case.encode()) + 1)
    seen = set()
    for _ in range(2000):
        bad = mutate(stream, rng)
        try:
            first = decompress(bad, x, generic)
        except ValueError as e:
            assert category(str(e)) in KNOWN_VERDICTS, str(e)
            seen.add(category(str(e)))
            continue
        np.testing.assert_array_equal(first, decompress(bad, x, not generic))
    assert len(seen) >= 3, seen

def test_hostile_descriptors_and_tables_get_the_references_verdicts():
    x = gaussian(2 * R.GROUP_BLOCKS * R.BLOCK, "bfloat16", seed=36)
    x[17 * R.BLOCK : 18 * R.BLOCK] = random_bits(R.BLOCK, "bfloat16")  # a raw block in the second group
    s = R.compress(x)
    d = descriptors(s, x.size)
    assert d[17]["raw"] and d[0]["table"]
    table_at = R.HEADER_BYTES + R.DESC_BYTES * len(d)
    cases = {
        "reserved": with_descriptor(s, 0, reserved=1), "table off a group's first": with_descriptor(s, 2, table=1),
        "code 7": with_descriptor(s, 2, code=7), "raw with a ref": with_descriptor(s, 17, ref=3),
        "ends before it starts": with_descriptor(s, 2, end=d[1]["end"] - 1), "past the end": with_descriptor(s, 4, end=1 << 31),
        "raw turned coded": with_descriptor(s, 17, raw=0), "no table": with_descriptor(s, 0, table=0),
        "ref below the normals": with_descriptor(s, 2, ref=3), "ref out of range": with_descriptor(s, 2, ref=1023),
        "a length over 12": s[:table_at] + b"\xfd" + s[table_at + 1 :],
        "not a prefix code": s[:table_at] + b"\x11" * R.TABLE_BYTES + s[table_at + R.TABLE_BYTES :],
        "truncated": s[:-1], "truncated descriptors": s[:40], "version 5": b"ZCCL\x05" + s[5:],
    }
    seen = set()
    for name, t in cases.items():
        for generic in (False, True):
            ref, got, _ = verdicts(t, x, generic)
            assert ref is not None and got == ref, (name, ref, got)
            seen.add(ref)
    assert {"corrupt block descriptor", "corrupt group table", "corrupt block bitstream", "truncated payload (shorter",
            "unsupported format version"} <= seen


def test_every_path_gives_the_same_bytes_and_decodes(tmp_path):
    """AVX-512, AVX2 and the portable loops (ZIPCCL_SIMD=avx2, ZIPCCL_NO_SIMD=1): the same streams
    and decodes, for each dtype and kind of data, in fresh processes (run outside the checkout, so
    the installed package is imported, not the source tree)."""
    code = ("import numpy as np, sys, zlib; sys.path.insert(0, %r); import test_codec_cpu as t;"
            "out = []\n"
            "for dtype in t.DTYPES:\n"
            "    for name, x in t.kinds(dtype).items():\n"
            "        s = t.compress(x); out.append(f'{dtype}/{name}:{zlib.crc32(s)}:{t.decompress(s, x).tobytes() == x.tobytes()}')\n"
            "out.append(f'fallbacks:{t.cpu.generic_fallbacks()}')\n"
            "print('|'.join(out))") % str(Path(__file__).parent)
    outs = {}
    for path in SIMD_PATHS:
        run = subprocess.run([sys.executable, "-c", code], env=path_env(path), capture_output=True, text=True, timeout=300,
                             cwd=tmp_path)
        assert run.returncode == 0, run.stderr[-2000:]
        outs[path] = run.stdout.strip().split("|")
    assert outs["widest"] == outs["avx2"] == outs["portable"]
    assert outs["widest"][-1] == "fallbacks:0"  # every valid block decoded by the fast decoders, on every path
    assert len(outs["widest"]) >= 3 * 8 and all(item.endswith(":True") for item in outs["widest"][:-1]), outs["widest"]


def test_the_fast_decoders_hand_a_corrupt_block_to_the_generic_one():
    """generic_fallbacks counts the blocks the fast decoders could not vouch for: none of a valid
    stream (test_every_path_gives_the_same_bytes_and_decodes, on each path), one a corrupt block."""
    x = gaussian(8 * R.BLOCK, "bfloat16", seed=70)
    s = bytearray(compress(x))
    before = cpu.generic_fallbacks()
    assert decompress(bytes(s), x).tobytes() == x.tobytes() and cpu.generic_fallbacks() == before
    end = R.HEADER_BYTES + 8 * 8  # the data area; block 2's record ends at its descriptor's end
    s[end + int.from_bytes(s[R.HEADER_BYTES + 16:R.HEADER_BYTES + 20], "little") - 1] ^= 0x80  # block 2's last byte
    with pytest.raises(ValueError, match="corrupt"):
        decompress(bytes(s), x)
    assert cpu.generic_fallbacks() > before


def test_sanitized_differential_fuzzer(tmp_path):
    """tests/fuzz_codec_cpu.cc under AddressSanitizer and UBSan: fast and generic coders agree on
    random inputs and on corrupted streams (the same Status), on the SIMD and the portable paths."""
    run_sanitized_fuzzer(tmp_path, "fuzz_codec_cpu.cc", "codec6_cpu.cc", "accumulate_cpu.cc")


def test_decode_tables_filled_by_doubling_are_build_luts(tmp_path):
    """tests/cpu_decode_tables.cc under AddressSanitizer and UBSan: the fast decoder's tables, filled
    by doubling from code lengths, hold at every window what build_lut's table implies, and
    canonical_codes gives §4's codes, for complete, incomplete and one-symbol codes and the family's."""
    exe = tmp_path / "cpu_decode_tables"
    subprocess.run([shutil.which("g++") or "c++", "-std=c++20", "-O1", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=all", f"-I{ROOT / 'ffi'}", str(ROOT / "tests" / "cpu_decode_tables.cc"),
                    "-o", str(exe)], check=True, timeout=300)
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("ok 3004"), out.stdout + out.stderr[-2000:]


def test_buffers_at_any_alignment_give_the_same_bytes():
    """Inputs, streams and outputs need not be aligned to their elements (numpy views at odd offsets)."""
    x = gaussian(2 * R.BLOCK + 77, "float32", seed=42)
    want = R.compress(x)
    for offset in (1, 3):
        raw = np.zeros(x.nbytes + offset, np.uint8)[offset:]
        raw[:] = x.view(np.uint8)
        out = np.zeros(R.max_stream_bytes(x.size, x.dtype) + offset, np.uint8)[offset:]
        length = cpu.compress_into(raw, CODES["float32"], out)
        assert out[:length].tobytes() == want
        back = np.zeros(x.nbytes + offset, np.uint8)[offset:]
        cpu.decompress_into(out[:length], CODES["float32"], back)
        assert back.tobytes() == x.tobytes()


def test_a_stream_holds_what_a_uint32_length_counts():
    """docs/FORMAT.md §1: a stream's length fits a uint32, so a descriptor's 32-bit end always fits;
    the C++ fuzzer checks that one element more is refused before any byte is read."""
    limit = cpu.max_elements(CODES["bfloat16"])
    assert limit == (2**32 - 1 - R.HEADER_BYTES) // 2


def rows_of(chunks):
    """The chunks' reference streams, each in a row of one zero-padded byte array."""
    streams = [R.compress(c) for c in chunks]
    rows = np.zeros((len(streams), max(map(len, streams))), np.uint8)
    for j, s in enumerate(streams):
        rows[j, : len(s)] = np.frombuffer(s, np.uint8)
    return rows


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_decode_and_sum_in_row_order_bit_for_bit(dtype):
    """The reduce step's arithmetic (FORMAT.md §7): rows summed in order in float32, NaN payloads,
    infinities and subnormals among the values; a corrupt row is refused by name."""
    n, k = 5000, 3
    chunks = [with_odd_values(gaussian(n, dtype, seed=50 + j), 37 + j) for j in range(k)]
    rows = rows_of(chunks)
    got = cpu.decompress_accumulate(rows, CODES[dtype], n)
    want = R.accumulate(chunks, np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    rows[1, 16 + 8 * 2 - 1] ^= 0x40  # row 1's second descriptor: a reserved bit
    with pytest.raises(ValueError, match="corrupt block descriptor"):
        cpu.decompress_accumulate(rows, CODES[dtype], n)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_summed_a_tile_at_a_time_give_the_row_by_row_sums_and_verdict(dtype, tmp_path):
    """The reduce step sums 65,536 elements (a group's blocks) of every row at a time, in cache
    (ffi/accumulate_cpu.h): rows over three tiles with a partial last, every 16-bit pattern among
    the values, give the reference's bits; a row failing in a later tile is reported before a later
    row failing in the first, as summing row by row would."""
    n = 3 * 16 * R.BLOCK + 5000
    chunks = [with_odd_values(gaussian(n, dtype, seed=60 + j), 53 + j) for j in range(3)]
    if dtype != "float32":  # every bit pattern, one tile of one row: subnormals, infinities, NaN payloads
        chunks[1][:65536] = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(chunks[1].dtype)
    rows = rows_of(chunks)
    np.save(tmp_path / "rows.npy", rows)
    want = R.accumulate(chunks, np.float32).view(np.uint32)
    code = ("import numpy as np; from zipccl_jax import _zipccl_cpu as c; "
            f"np.save('sums.npy', c.decompress_accumulate(np.load('rows.npy'), {CODES[dtype]}, {n}))")
    for path in SIMD_PATHS:  # each path in its own process (ffi/simd_cpu.h reads the environment once)
        run = subprocess.run([sys.executable, "-c", code], env=path_env(path), capture_output=True, text=True, timeout=120,
                             cwd=tmp_path)
        assert run.returncode == 0, run.stderr[-2000:]
        np.testing.assert_array_equal(np.load(tmp_path / "sums.npy").view(np.uint32), want, err_msg=path)
    rows[2, 3] ^= 1  # row 2's magic: its first tile fails
    with pytest.raises(ValueError, match="bad magic"):
        cpu.decompress_accumulate(rows, CODES[dtype], n)
    nb = (n + R.BLOCK - 1) // R.BLOCK
    rows[1, 16 + 8 * nb - 1] ^= 0x40  # row 1's last descriptor: a reserved bit, in the last tile
    with pytest.raises(ValueError, match="corrupt block descriptor"):
        cpu.decompress_accumulate(rows, CODES[dtype], n)


def test_each_header_field_is_checked_with_its_own_message():
    x = gaussian(5000, "bfloat16")
    s = bytearray(R.compress(x))

    def expect(b, message, n=5000, code=1):
        with pytest.raises(ValueError, match=message):
            cpu.decompress_into(np.frombuffer(bytes(b), np.uint8), code, np.zeros(2 * n, np.uint8))

    expect(s[:10], "truncated")
    expect(b"ZCCX" + s[4:], "bad magic")
    for version in (0, 4, 5, 7):  # version 6 alone is read
        expect(s[:4] + bytes([version]) + s[5:], "unsupported format version")
    expect(s, "dtype does not match", code=2)
    expect(s, "element count does not match", n=4999)
    expect(s[:6] + b"\x80" + s[7:], "unknown header flags")
    expect(s[:-1], "truncated")


def test_round_trip_of_every_float32_exponent_and_sign():
    e = np.arange(256, dtype=np.uint32)
    x = ((e[:, None] << 23) | np.array([0, 1, 0x7FFFFF, 1 << 31, (1 << 31) | 0x400000], np.uint32)).ravel()
    x = np.tile(x, 20).view(np.float32)
    out = np.zeros(R.max_stream_bytes(x.size, x.dtype), np.uint8)
    length = cpu.compress_into(x.view(np.uint8), 3, out)
    assert out[:length].tobytes() == R.compress(x)
    assert decompress(out[:length].tobytes(), x).tobytes() == x.tobytes()


def test_output_buffer_smaller_than_worst_case_is_refused():
    x = gaussian(100, ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match="smaller than max_stream_bytes"):
        cpu.compress_into(x.view(np.uint8), 1, np.zeros(100, np.uint8))
