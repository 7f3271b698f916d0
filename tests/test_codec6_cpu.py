"""Format version 6's C++ CPU codec (ffi/codec6_cpu.cc) against its numpy reference: the same bytes,
the same sizes, bit-exact round trips, and the reference's verdict on hostile bytes, on the fast
coder (AVX-512 where the CPU has it, and without) and on format6.h's generic one (the CUDA codec's)."""

import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from zipccl_jax import _zipccl_cpu as cpu
from zipccl_jax import reference_v6 as r6
from zipccl_jax.bench.data import DTYPES, gaussian, random_bits
from test_codec_cpu import mutate, run_sanitized_fuzzer
from test_reference_v6 import CODES, bits, descriptors, kinds, odd_values, with_descriptor

ROOT = Path(__file__).resolve().parents[1]


def compress(x, generic=False):
    out = np.zeros(r6.max_stream_bytes(x.size, x.dtype), np.uint8)
    length = cpu.compress6_into(np.ascontiguousarray(x).view(np.uint8).ravel(), CODES[x.dtype.name], out, generic)
    return out[:length].tobytes()


def decompress(stream, x, generic=False):
    out = np.zeros(x.nbytes, np.uint8)
    cpu.decompress6_into(np.frombuffer(stream, np.uint8), CODES[x.dtype.name], out, generic)
    return out.view(bits(x).dtype)


def category(message: str) -> str:
    """A verdict's kind, as the reference and the C++ codec both word it: 'corrupt block descriptor',
    'corrupt group table', 'corrupt block body', 'corrupt block bitstream', 'truncated payload (shorter', ..."""
    return " ".join(message.removeprefix("zipccl: corrupt payload: ").split()[:3])


def verdicts(stream: bytes, x, generic=False):
    """(the reference's verdict category or None, the C++ one or None, the C++ decode or None)."""
    try:
        r6.decompress(stream, x.dtype, x.size)
        ref = None
    except r6.CorruptPayload as e:
        ref = category(str(e))
    try:
        return ref, None, decompress(stream, x, generic)
    except ValueError as e:
        return ref, category(str(e)), None


@pytest.mark.parametrize("generic", [False, True], ids=["fast", "generic"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_streams_are_the_references_byte_for_byte_and_round_trip(dtype, generic):
    cases = {**kinds(dtype), "two full blocks": gaussian(2 * r6.BLOCK, dtype, seed=21),  # the last body at the end
             "silu": (lambda g: g / (1 + np.exp(-g)))(gaussian(r6.GROUP_BLOCKS * r6.BLOCK, "float32", seed=22)).astype(dtype)}
    for name, x in cases.items():
        s = compress(x, generic)
        assert s == r6.compress(x), name
        raw = np.ascontiguousarray(x).view(np.uint8).ravel()
        assert cpu.stream_bytes6(raw, CODES[dtype], generic=generic) == len(s), name
        plan = np.zeros(cpu.plan_bytes6(x.size), np.uint8)
        assert cpu.stream_bytes6(raw, CODES[dtype], plan, generic=generic) == len(s), name
        planned = np.zeros(r6.max_stream_bytes(x.size, dtype), np.uint8)  # the size pass's plan codes the same stream
        assert planned[: cpu.compress6_into(raw, CODES[dtype], planned, generic, plan)].tobytes() == s, name
        np.testing.assert_array_equal(decompress(s, x, generic), bits(x), err_msg=name)


def test_the_cpp_family_is_the_references():
    """format6.h embeds the family as numbers; reference_v6 as hex text (docs/FORMAT6.md §5)."""
    text = (ROOT / "ffi" / "format6.h").read_text()
    body = text[text.index("#define ZC6_FAMILY_LENGTHS") :].split("constexpr", 1)[0]
    rows = [[int(v) for v in row.split(",")] for row in re.findall(r"\{([\d,]+)\}", body)]
    np.testing.assert_array_equal(np.array(rows), r6.FAMILY)


def test_every_block_kind_and_escape_round_trips_through_both_decoders():
    x = gaussian(2 * r6.GROUP_BLOCKS * r6.BLOCK + 777, "bfloat16", seed=23)
    x[3 * r6.BLOCK : 4 * r6.BLOCK] = random_bits(r6.BLOCK, "bfloat16")  # a raw block
    x[20 * r6.BLOCK : 21 * r6.BLOCK] = -np.maximum(x[20 * r6.BLOCK : 21 * r6.BLOCK], 0)  # a flipped member?
    with_odd_values(x, 53)
    s = compress(x)
    d = descriptors(s, x.size)
    assert any(b["raw"] for b in d) and any(b["code"] == r6.GROUP_CODE for b in d) and d[0]["table"]
    for generic in (False, True):
        np.testing.assert_array_equal(decompress(s, x, generic), bits(x))


def test_a_group_code_read_with_the_sign_inverted_decodes_as_the_reference_does():
    """The encoder never flips a group code, but §2 lets a descriptor do it: the decoders must agree."""
    x = gaussian(r6.GROUP_BLOCKS * r6.BLOCK, "bfloat16", seed=24)
    s = compress(x)
    assert descriptors(s, x.size)[3]["code"] == r6.GROUP_CODE
    t = with_descriptor(s, 3, flip=1)
    ref = r6.decompress(t, x.dtype, x.size) if verdicts(t, x)[0] is None else None
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
    "bf16 groups": lambda: gaussian(r6.GROUP_BLOCKS * r6.BLOCK + 3000, "bfloat16", seed=31),
    "fp16 escapes": lambda: with_odd_values(gaussian(3 * r6.BLOCK + 50, "float16", seed=32), 41),
    "fp32 raw block": lambda: np.concatenate([gaussian(r6.BLOCK, "float32", seed=33), random_bits(r6.BLOCK, "float32"),
                                              gaussian(900, "float32", seed=34)]),
    "bf16 relu": lambda: np.maximum(gaussian(2 * r6.BLOCK + 10, "bfloat16", seed=35), 0),
}


@pytest.mark.parametrize("generic", [False, True], ids=["fast", "generic"])
@pytest.mark.parametrize("case", CASES)
def test_mutated_streams_get_the_references_verdict(case, generic):
    """Same verdict (its kind) and, when accepted, the same decoded bits."""
    x = CASES[case]()
    stream = r6.compress(x)
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    refused = 0
    for _ in range(60):
        bad = mutate(stream, rng)
        ref, got, decoded = verdicts(bad, x, generic)
        assert got == ref, (ref, got)
        if ref is None:
            np.testing.assert_array_equal(decoded, bits(r6.decompress(bad, x.dtype, x.size)))
        refused += ref is not None
    assert refused > 10


def test_hostile_descriptors_and_tables_get_the_references_verdicts():
    x = gaussian(2 * r6.GROUP_BLOCKS * r6.BLOCK, "bfloat16", seed=36)
    x[17 * r6.BLOCK : 18 * r6.BLOCK] = random_bits(r6.BLOCK, "bfloat16")  # a raw block in the second group
    s = r6.compress(x)
    d = descriptors(s, x.size)
    assert d[17]["raw"] and d[0]["table"]
    table_at = r6.HEADER_BYTES + r6.DESC_BYTES * len(d)
    cases = {
        "reserved": with_descriptor(s, 0, reserved=1), "table off a group's first": with_descriptor(s, 2, table=1),
        "code 7": with_descriptor(s, 2, code=7), "raw with a ref": with_descriptor(s, 17, ref=3),
        "ends before it starts": with_descriptor(s, 2, end=d[1]["end"] - 1), "past the end": with_descriptor(s, 4, end=1 << 31),
        "raw turned coded": with_descriptor(s, 17, raw=0), "no table": with_descriptor(s, 0, table=0),
        "ref below the normals": with_descriptor(s, 2, ref=3), "ref out of range": with_descriptor(s, 2, ref=1023),
        "a length over 12": s[:table_at] + b"\xfd" + s[table_at + 1 :],
        "not a prefix code": s[:table_at] + b"\x11" * r6.TABLE_BYTES + s[table_at + r6.TABLE_BYTES :],
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


def test_plain_paths_give_the_same_bytes_as_avx512(tmp_path):
    """ZIPCCL_NO_SIMD=1 forces the portable decoder: the same streams and decodes, in a fresh process
    (run outside the checkout, so the installed package is imported, not the source tree)."""
    code = ("import numpy as np, sys, zlib; sys.path.insert(0, %r); import test_codec6_cpu as t; from zipccl_jax.bench.data import gaussian;"
            "x = gaussian(3 * 4096 + 5, 'bfloat16', seed=41); s = t.compress(x);"
            "print(zlib.crc32(s), t.decompress(s, x).tobytes() == x.tobytes())") % str(Path(__file__).parent)
    outs = []
    for no_simd in (False, True):
        env = {k: v for k, v in os.environ.items() if k != "ZIPCCL_NO_SIMD"}
        if no_simd:
            env["ZIPCCL_NO_SIMD"] = "1"
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                             cwd=tmp_path)
        assert run.returncode == 0, run.stderr[-2000:]
        outs.append(run.stdout.split())
    assert outs[0] == outs[1] and outs[0][1] == "True"


def test_sanitized_differential_fuzzer(tmp_path):
    """tests/fuzz_codec6_cpu.cc under AddressSanitizer and UBSan: fast and generic coders agree on
    random inputs and on corrupted streams (the same Status), on the SIMD and the portable paths."""
    run_sanitized_fuzzer(tmp_path, "fuzz_codec6_cpu.cc", "codec6_cpu.cc", "codec_cpu.cc")


def test_buffers_at_any_alignment_give_the_same_bytes():
    """Inputs, streams and outputs need not be aligned to their elements (numpy views at odd offsets)."""
    x = gaussian(2 * r6.BLOCK + 77, "float32", seed=42)
    want = r6.compress(x)
    for offset in (1, 3):
        raw = np.zeros(x.nbytes + offset, np.uint8)[offset:]
        raw[:] = x.view(np.uint8)
        out = np.zeros(r6.max_stream_bytes(x.size, x.dtype) + offset, np.uint8)[offset:]
        length = cpu.compress6_into(raw, CODES["float32"], out)
        assert out[:length].tobytes() == want
        back = np.zeros(x.nbytes + offset, np.uint8)[offset:]
        cpu.decompress6_into(out[:length], CODES["float32"], back)
        assert back.tobytes() == x.tobytes()


def test_a_stream_holds_what_a_uint32_length_counts():
    """docs/FORMAT6.md §1: a stream's length fits a uint32, so a descriptor's 32-bit end always fits;
    the C++ fuzzer checks that one element more is refused before any byte is read."""
    limit = cpu.max_elements6(CODES["bfloat16"])
    assert limit == (2**32 - 1 - r6.HEADER_BYTES) // 2


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_decode_and_sum_in_row_order_bit_for_bit(dtype):
    """The reduce step's arithmetic on version 6 (FORMAT.md §8): rows summed in order in float32,
    NaN payloads, infinities and subnormals among the values; a corrupt row is refused by name."""
    from zipccl_jax import reference as v5

    n, k = 5000, 3
    chunks = [with_odd_values(gaussian(n, dtype, seed=50 + j), 37 + j) for j in range(k)]
    streams = [r6.compress(c) for c in chunks]
    cap = max(len(s) for s in streams)
    rows = np.zeros((k, cap), np.uint8)
    for j, s in enumerate(streams):
        rows[j, : len(s)] = np.frombuffer(s, np.uint8)
    got = cpu.decompress_accumulate6(rows, CODES[dtype], n)
    want = v5.accumulate(chunks, np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    rows[1, 16 + 8 * 2 - 1] ^= 0x40  # row 1's second descriptor: a reserved bit
    with pytest.raises(ValueError, match="corrupt block descriptor"):
        cpu.decompress_accumulate6(rows, CODES[dtype], n)
