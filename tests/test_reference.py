"""The numpy reference codec against FORMAT.md, and the C++ codec against it byte for byte."""

import hashlib
import pathlib

import ml_dtypes
import numpy as np
import pytest

from zipccl_jax import _zipccl_cpu as cpu
from zipccl_jax import reference as ref
from zipccl_jax.bench.data import gaussian, random_bits, special_values

DTYPES = [ml_dtypes.bfloat16, np.float16, np.float32]
CODES = {np.dtype(ml_dtypes.bfloat16): 1, np.dtype(np.float16): 2, np.dtype(np.float32): 3}
SIZES = [0, 1, 2, 3, 4, 5, 4095, 4096, 4097, 8191, 8192, 8193, 3 * 4096 + 1234]


def bits(x):
    return np.ascontiguousarray(x).view(np.uint8).tobytes()


def make(kind, n, dtype, seed=0):
    """Test tensors: every class of bit pattern the codec must survive."""
    rng = np.random.default_rng(seed)
    if kind == "gauss":
        return gaussian(n, dtype, seed=seed)
    if kind == "gauss_tiny":
        return gaussian(n, dtype, scale=1e-6, seed=seed)
    if kind == "gauss_huge":
        return (rng.standard_normal(n) * 1e4).astype(np.float32).astype(dtype)
    if kind == "wide":  # exponents spread over the whole range, overflowing to inf in fp16
        with np.errstate(over="ignore"):
            return (rng.standard_normal(n) * np.exp(rng.uniform(-30, 30, n))).astype(np.float32).astype(dtype)
    if kind == "random_bits":
        return random_bits(n, dtype, seed=seed)
    if kind == "zeros":
        return np.zeros(n, dtype)
    if kind == "signed_zeros":
        return np.where(rng.random(n) < 0.5, -0.0, 0.0).astype(dtype)
    if kind == "constant":
        return np.full(n, 0.3125, dtype)
    if kind == "specials":
        s = special_values(dtype)
        return np.resize(s, n) if n else s[:0]
    if kind == "specials_in_gauss":  # specials sprinkled into compressible data
        x = gaussian(n, dtype, seed=seed)
        s = special_values(dtype)
        idx = rng.integers(0, max(n, 1), size=min(n, 3 * s.size))
        x[idx] = np.resize(s, idx.size)
        return x
    if kind == "sparse":
        return (gaussian(n, dtype, seed=seed).astype(np.float32) * (rng.random(n) < 0.1)).astype(dtype)
    if kind == "low_precision":  # few mantissa bits: fp16/fp32 code both low byte planes (§5.4)
        return (rng.integers(-64, 64, n) / 64).astype(dtype)
    if kind == "positive":  # every sign 0: coded in the symbols at no cost (§4.1)
        return np.abs(gaussian(n, dtype, seed=seed))
    if kind == "skewed_signs":  # 88% positive, a few values far below the rest: escapes carry the sign
        x = np.abs(gaussian(n, np.float32, seed=seed)) * np.where(rng.random(n) < 0.12, -1, 1).astype(np.float32)
        x[rng.random(n) < 0.01] *= np.float32(2.0**-15)
        return x.astype(dtype)
    if kind == "mixed_precision":  # a third of the values with a zero low byte: fp32 codes plane 0 only
        x = gaussian(n, np.float32, seed=seed).view(np.uint32)
        x[::3] &= 0xFFFFFF00
        return x.view(np.float32).astype(dtype)
    raise ValueError(kind)


KINDS = ["gauss", "gauss_tiny", "gauss_huge", "wide", "random_bits", "zeros", "signed_zeros",
         "constant", "specials", "specials_in_gauss", "sparse", "low_precision", "mixed_precision", "positive",
         "skewed_signs"]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", KINDS)
def test_reference_round_trip_is_bit_exact(dtype, kind):
    for n in SIZES:
        x = make(kind, n, dtype, seed=n)
        stream = ref.compress(x)
        assert len(stream) <= ref.max_stream_bytes(n, dtype)
        assert bits(ref.decompress(stream, dtype, n)) == bits(x), n


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("generic", [False, True], ids=["fast", "generic"])
def test_cpu_codec_is_byte_identical_to_reference(dtype, kind, generic):
    """generic=True runs the shared block coder of zipccl_format.h (the CUDA codec's)."""
    code = CODES[np.dtype(dtype)]
    for n in SIZES:
        x = make(kind, n, dtype, seed=n + 1)
        expected = ref.compress(x)
        out = np.zeros(ref.max_stream_bytes(n, dtype), np.uint8)
        length = cpu.compress_into(np.frombuffer(bits(x), np.uint8), code, out, generic=generic)
        assert out[:length].tobytes() == expected, n
        back = np.zeros(x.nbytes, np.uint8)
        cpu.decompress_into(np.frombuffer(expected, np.uint8).copy(), code, back, generic=generic)
        assert back.tobytes() == bits(x), n


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_large_odd_size_round_trips_through_cpu_and_reference(dtype):
    n = 1_000_003
    x = make("specials_in_gauss", n, dtype, seed=7)
    code = CODES[np.dtype(dtype)]
    out = np.zeros(ref.max_stream_bytes(n, dtype), np.uint8)
    length = cpu.compress_into(np.frombuffer(bits(x), np.uint8), code, out)
    assert out[:length].tobytes() == ref.compress(x)
    assert bits(ref.decompress(out[:length].tobytes(), dtype, n)) == bits(x)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_incompressible_input_grows_by_the_header_only(dtype):
    for n in [1, 4096, 100_001]:
        x = random_bits(n, dtype, seed=n)
        stream = ref.compress(x)
        assert len(stream) == ref.HEADER_BYTES + x.nbytes
        assert stream[6] == ref.FLAG_STORED_RAW


def test_gaussian_bf16_is_coded_not_raw_and_reaches_1_5x():
    x = gaussian(1 << 18, "bfloat16")
    stream = ref.compress(x)
    assert stream[6] == ref.FLAG_MASKS  # coded: a coded stream always has its group masks
    assert x.nbytes / len(stream) >= 1.50


def test_header_fields_follow_the_format():
    x = gaussian(5000, "float32")
    s = ref.compress(x)
    assert s[:4] == b"ZCCL" and s[4] == 2 and s[5] == 3 and s[6] == ref.FLAG_MASKS and s[7] == 12
    assert int.from_bytes(s[8:16], "little") == 5000
    descs = np.frombuffer(s, "<u4", count=2, offset=16)
    assert list(descs >> 24) == [1, 1]  # both blocks coded
    assert s[24] & 3 == 0  # the group mask: no byte plane coded
    assert 16 + 8 + 1 + 64 + int((descs & 0xFFFF).sum()) == len(s)  # descriptors, mask, one table, bodies
    lengths = ref.unpack_table(s[25:89])
    assert sum(2.0 ** -int(l) for l in lengths if l) <= 1.0


@pytest.mark.parametrize("nsym", [ref.NUM_SYMS, ref.PLANE_SYMS], ids=["symbols", "byte_plane"])
def test_code_lengths_are_identical_in_cpp_and_within_12_bits(nsym):
    rng = np.random.default_rng(0)
    for trial in range(300):
        counts = rng.integers(0, 1000, nsym) * (rng.random(nsym) < 0.5)
        if trial % 3 == 0:  # power-law counts force the 12-bit limit
            counts = (2 ** rng.integers(0, 24, nsym)) * (rng.random(nsym) < 0.7)
        counts[trial % nsym] += 1
        lengths = ref.code_lengths(counts)
        assert cpu.code_lengths([int(c) for c in counts]) == lengths.tolist()
        assert lengths.max() <= ref.MAX_CODE_LEN
        assert ((lengths > 0) == (counts > 0)).all()
        used = lengths[lengths > 0]
        assert used.size == 1 or sum(2.0 ** -int(l) for l in used) == 1.0  # complete prefix code


def test_chunked_streams_and_accumulate_follow_section_8():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(4 * 3000)).astype(ml_dtypes.bfloat16)
    rows, sizes = ref.compress_chunks(x, 4)
    assert rows.shape == (4, ref.max_stream_bytes(3000, x.dtype))
    for c in range(4):
        assert rows[c, : sizes[c]].tobytes() == ref.compress(x[c * 3000 : (c + 1) * 3000])
    total = ref.decompress_accumulate(rows, x.dtype, 3000)
    chunks = x.reshape(4, 3000).astype(np.float32)
    expected = (((chunks[0] + chunks[1]) + chunks[2]) + chunks[3]).astype(ml_dtypes.bfloat16)
    assert bits(total) == bits(expected)


def test_unsupported_dtype_is_named():
    with pytest.raises(ValueError, match="unsupported dtype int32"):
        ref.compress(np.zeros(4, np.int32))
    with pytest.raises(ValueError, match="unsupported dtype float64"):
        ref.decompress(b"", np.float64, 0)


def _masks(stream: bytes, n: int) -> list:
    nb = -(-n // ref.BLOCK)
    return list(stream[ref.HEADER_BYTES + 4 * nb :][: -(-nb // ref.GROUP_BLOCKS)])


@pytest.mark.parametrize("dtype,kind,mask", [(np.float32, "mixed_precision", 1), (np.float32, "low_precision", 3),
                                             (np.float16, "low_precision", 1)])
def test_skewed_low_bytes_are_huffman_coded_and_pay(dtype, kind, mask):
    """§5.4: a plane whose bytes are far from uniform is coded; one that is uniform stays raw."""
    n = 3 * 65536 + 5000
    x = make(kind, n, dtype, seed=7)
    stream = ref.compress(x)
    assert [m & 3 for m in _masks(stream, n)] == [mask] * 4
    # the same values with uniformly random low bytes: no plane pays, and the stream is larger
    noisy = np.ascontiguousarray(x).view(np.uint16 if x.itemsize == 2 else np.uint32).copy()
    noisy ^= np.random.default_rng(1).integers(0, 1 << (8 * (x.itemsize // 2)), n).astype(noisy.dtype)
    plain = ref.compress(noisy.view(dtype))
    assert [m & 3 for m in _masks(plain, n)] == [0] * 4
    assert len(stream) < len(plain) - n // 16  # at least half a bit per element saved
    assert bits(ref.decompress(stream, dtype, n)) == bits(x)


def test_group_mask_fields_are_validated():
    n = 70000  # two groups
    x = make("mixed_precision", n, np.float32, seed=2)
    s = ref.compress(x)
    nb = -(-n // ref.BLOCK)
    masks_at = ref.HEADER_BYTES + 4 * nb

    def expect(b, message, dtype=np.float32):
        with pytest.raises(ref.CorruptPayload, match=message):
            ref.decompress(bytes(b), dtype, n)
        with pytest.raises(ValueError, match=message):
            cpu.decompress_into(np.frombuffer(bytes(b), np.uint8), CODES[np.dtype(dtype)],
                                np.zeros(n * np.dtype(dtype).itemsize, np.uint8))

    assert s[6] == ref.FLAG_MASKS
    expect(s[:masks_at] + b"\x08" + s[masks_at + 1 :], "corrupt group mask")  # fp32: planes 0, 1 and the sign
    expect(s[:6] + bytes([ref.FLAG_MASKS | ref.FLAG_STORED_RAW]) + s[7:], "unknown header flags")
    plane_table = masks_at + 2 + ref.TABLE_BYTES  # group 0's plane-0 table
    expect(s[:plane_table] + bytes(ref.PLANE_TABLE_BYTES) + s[plane_table + ref.PLANE_TABLE_BYTES :], "code table")
    expect(s[:masks_at + 1], "truncated")
    h = ref.compress(gaussian(n, ml_dtypes.bfloat16))
    expect(h[:masks_at] + b"\x01" + h[masks_at + 1 :], "corrupt group mask", dtype=ml_dtypes.bfloat16)  # no planes
    expect(h[:4] + b"\x03" + h[5:], "unsupported format version")
    # version 1 had no sign bit, and no masks for bfloat16
    v1 = _v1_streams()
    f32 = v1["f32_planes"]
    at = ref.HEADER_BYTES + 4 * -(-f32.size // ref.BLOCK)
    with pytest.raises(ref.CorruptPayload, match="corrupt group mask"):
        ref.decompress(f32.stream[:at] + bytes([f32.stream[at] | ref.MASK_SIGN]) + f32.stream[at + 1 :], np.float32,
                       f32.size)
    b16 = v1["bf16_mixed"]
    with pytest.raises(ref.CorruptPayload, match="unknown header flags"):
        ref.decompress(b16.stream[:6] + bytes([ref.FLAG_MASKS]) + b16.stream[7:], ml_dtypes.bfloat16, b16.size)


class _Vector:
    def __init__(self, stream: bytes, dtype: np.dtype, sha256: str):
        self.stream, self.dtype, self.sha256 = stream, dtype, sha256
        self.size = int.from_bytes(stream[8:16], "little")


def _v1_streams() -> dict:
    """Version-1 streams written by the version-1 encoder (commit e221c64's reference.compress) from
    bf16 Gaussian data with a block at another scale and specials (escapes), fp16 and fp32 data with
    coded byte planes, fp32 with a raw block, and random bf16 bits (a STORED_RAW stream)."""
    d = np.load(pathlib.Path(__file__).parent / "data" / "format_v1.npz")
    return {k: _Vector(d[k].tobytes(), np.dtype(str(d[k + ".dtype"])), str(d[k + ".sha256"]))
            for k in d.files if "." not in k}


@pytest.mark.parametrize("generic", [False, True], ids=["fast", "generic"])
def test_version_1_streams_still_decode(generic):
    for name, v in _v1_streams().items():
        assert v.stream[4] == 1
        x = ref.decompress(v.stream, v.dtype, v.size)
        assert hashlib.sha256(bits(x)).hexdigest() == v.sha256, name
        back = np.zeros(x.nbytes, np.uint8)
        cpu.decompress_into(np.frombuffer(v.stream, np.uint8), CODES[v.dtype], back, generic=generic)
        assert back.tobytes() == bits(x), name


def _signs(n, dtype, positive, seed=0):
    """|Gaussian| values, a fraction `positive` of them positive: a sign-skewed tensor."""
    rng = np.random.default_rng(seed)
    x = np.abs(rng.standard_normal(n)).astype(np.float32)
    return np.where(rng.random(n) < positive, x, -x).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_skewed_signs_are_coded_and_pay(dtype):
    """§4.1: a group whose signs are skewed codes them in its symbols: all positive costs no sign bit,
    88% positive about H(0.88) = 0.53 bits instead of 1."""
    n = 2 * 65536
    for positive, saved in [(1.0, 0.95), (0.88, 0.4)]:
        x = _signs(n, dtype, positive)
        stream = ref.compress(x)
        assert _masks(stream, n) == [ref.MASK_SIGN] * 2
        balanced = ref.compress(_signs(n, dtype, 0.5))
        assert len(balanced) - len(stream) > saved * n / 8, positive
        assert bits(ref.decompress(stream, dtype, n)) == bits(x)


def test_sign_coded_class_15_is_corrupt():
    """§4.1: class 15 is no sign-coded class; a stream whose code uses it is rejected."""
    count = 64
    lengths = np.full(ref.NUM_SYMS, 7)  # a complete code: every symbol 7 bits
    codes = ref.canonical_codes(lengths)
    syms = np.zeros(count, np.int64)
    syms[37] = 15 << ref.TOP_BITS
    streams = [ref.pack_bits(codes[syms[r]], lengths[syms[r]]) for r in ref.substream_ranges(count)]
    body = bytes(ref.extra_bytes(count, 5)) + np.array([len(t) for t in streams[:3]], "<u2").tobytes() + b"".join(
        streams)
    desc = len(body) | (100 << 16) | (1 << 24)
    stream = (ref.header(1, ref.FLAG_MASKS, count) + np.array([desc], "<u4").tobytes() + bytes([ref.MASK_SIGN])
              + ref.pack_table(lengths) + body)
    with pytest.raises(ref.CorruptPayload, match="corrupt block bitstream"):
        ref.decompress(stream, ml_dtypes.bfloat16, count)
    for generic in (False, True):
        with pytest.raises(ValueError, match="corrupt block bitstream"):
            cpu.decompress_into(np.frombuffer(stream, np.uint8), 1, np.zeros(2 * count, np.uint8), generic=generic)
    syms[37] = 0  # the same stream without it decodes
    streams = [ref.pack_bits(codes[syms[r]], lengths[syms[r]]) for r in ref.substream_ranges(count)]
    ok = stream[: -sum(map(len, streams))] + b"".join(streams)
    assert bits(ref.decompress(ok, ml_dtypes.bfloat16, count)) == bytes(2 * count)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_coded_entropy_bound_is_just_below_the_stream(dtype):
    """bench's coded entropy bound (docs/BENCHMARKS.md) models the encoder's own choices: the
    stream is never below it, and Huffman plus framing cost less than 3% over it."""
    from zipccl_jax.bench.baselines import coded_entropy_bits

    for kind in ("gauss", "positive", "skewed_signs"):
        x = make(kind, 3 * ref.BLOCK + 100, dtype)
        ratio = 8 * len(ref.compress(x)) / coded_entropy_bits(x)
        assert 1 < ratio < 1.03, (kind, ratio)
