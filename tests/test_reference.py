"""The numpy reference codec (zipccl_jax/reference.py) against docs/FORMAT.md (format version 6),
and the C++ codec against it byte for byte: bit-exact round trips on every bit pattern, the
encoder's paths, blocks that decode alone, and a verdict for hostile bytes."""

import ml_dtypes
import numpy as np
import pytest

from zipccl_jax import _zipccl_cpu as cpu
from zipccl_jax import reference as ref
from zipccl_jax.bench.data import DTYPES, gaussian, random_bits, special_values
from zipccl_jax.dtypes import DTYPE_CODES

CODES = DTYPE_CODES  # dtype name -> the format's dtype code
ALL_DTYPES = [ml_dtypes.bfloat16, np.float16, np.float32]
SIZES = [0, 1, 2, 3, 4, 5, 4095, 4096, 4097, 8191, 8192, 8193, 3 * 4096 + 1234]


def raw_bytes(x):
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
    if kind == "relu":  # half exact zeros: implied (§4.2), the sign coded
        return np.maximum(gaussian(n, np.float32, seed=seed), 0).astype(dtype)
    if kind == "relu_odd_zeros":  # zeros with -0 and subnormals of t = 0 among them: escapes (§4.2)
        x = np.maximum(gaussian(n, np.float32, seed=seed), 0).astype(dtype)
        u = x.view(np.uint16 if x.itemsize == 2 else np.uint32)
        sign = 1 << (8 * x.itemsize - 1)
        u[rng.random(n) < 0.05] = sign  # -0
        u[rng.random(n) < 0.05] = 1  # the smallest subnormal: e = 0, t = 0, a stored bit set
        u[rng.random(n) < 0.02] = sign | 3
        return x
    if kind == "gelu":  # many binades below the largest values, either sign: 256-symbol sign coding (§4.1)
        g = gaussian(n, np.float32, seed=seed) * np.float32(3)
        return (0.5 * g * (1 + np.tanh(0.7978846 * (g + 0.044715 * g**3)))).astype(np.float32).astype(dtype)
    if kind == "nans":  # NaNs of random payloads and signs, quiet and signalling, and infinities: a sum's §7 rule
        x = gaussian(n, dtype, seed=seed)
        info = ml_dtypes.finfo(dtype)
        u = x.view(f"u{x.itemsize}")
        mant, top = (1 << info.nmant) - 1, ((1 << info.nexp) - 1) << info.nmant
        pick = rng.random(n)
        sign = rng.integers(0, 2, n).astype(u.dtype) << (8 * x.itemsize - 1)
        payload = rng.integers(1, mant + 1, n).astype(u.dtype)
        u[pick < 0.3] = (sign | top | payload)[pick < 0.3]
        u[(pick >= 0.3) & (pick < 0.4)] = (sign | top)[(pick >= 0.3) & (pick < 0.4)]
        return x
    raise ValueError(kind)



KINDS = ["gauss", "gauss_tiny", "gauss_huge", "wide", "random_bits", "zeros", "signed_zeros",
         "constant", "specials", "specials_in_gauss", "sparse", "low_precision", "mixed_precision", "positive",
         "skewed_signs", "relu", "relu_odd_zeros", "gelu", "nans"]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", KINDS)
def test_reference_round_trip_is_bit_exact(dtype, kind):
    for n in SIZES:
        x = make(kind, n, dtype, seed=n)
        stream = ref.compress(x)
        assert len(stream) <= ref.max_stream_bytes(n, dtype)
        assert raw_bytes(ref.decompress(stream, dtype, n)) == raw_bytes(x), n


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("generic", [False, True], ids=["fast", "generic"])
def test_cpu_codec_is_byte_identical_to_reference(dtype, kind, generic):
    """generic=True runs the block coder of format6.h (the CUDA codec's)."""
    code = CODES[np.dtype(dtype).name]
    for n in SIZES:
        x = make(kind, n, dtype, seed=n + 1)
        expected = ref.compress(x)
        out = np.zeros(ref.max_stream_bytes(n, dtype), np.uint8)
        length = cpu.compress_into(np.frombuffer(raw_bytes(x), np.uint8), code, out, generic=generic)
        assert out[:length].tobytes() == expected, n
        back = np.zeros(x.nbytes, np.uint8)
        cpu.decompress_into(np.frombuffer(expected, np.uint8).copy(), code, back, generic=generic)
        assert back.tobytes() == raw_bytes(x), n


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_large_odd_size_round_trips_through_cpu_and_reference(dtype):
    n = 1_000_003
    x = make("specials_in_gauss", n, dtype, seed=7)
    code = CODES[np.dtype(dtype).name]
    out = np.zeros(ref.max_stream_bytes(n, dtype), np.uint8)
    length = cpu.compress_into(np.frombuffer(raw_bytes(x), np.uint8), code, out)
    assert out[:length].tobytes() == ref.compress(x)
    assert raw_bytes(ref.decompress(out[:length].tobytes(), dtype, n)) == raw_bytes(x)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_incompressible_input_grows_by_the_header_only(dtype):
    for n in [1, 4096, 100_001]:
        x = random_bits(n, dtype, seed=n)
        stream = ref.compress(x)
        assert len(stream) == ref.HEADER_BYTES + x.nbytes
        assert stream[6] == ref.FLAG_STORED_RAW


def test_code_lengths_are_identical_in_cpp_and_within_12_bits():
    nsym = ref.NSYM
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


def test_chunked_streams_and_accumulate_follow_section_7():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(4 * 3000)).astype(ml_dtypes.bfloat16)
    rows, sizes = ref.compress_chunks(x, 4)
    assert rows.shape == (4, ref.max_stream_bytes(3000, x.dtype))
    for c in range(4):
        assert rows[c, : sizes[c]].tobytes() == ref.compress(x[c * 3000 : (c + 1) * 3000])
    total = ref.decompress_accumulate(rows, x.dtype, 3000)
    chunks = x.reshape(4, 3000).astype(np.float32)
    expected = (((chunks[0] + chunks[1]) + chunks[2]) + chunks[3]).astype(ml_dtypes.bfloat16)
    assert raw_bytes(total) == raw_bytes(expected)


def test_unsupported_dtype_is_named():
    with pytest.raises(ValueError, match="unsupported dtype int32"):
        ref.compress(np.zeros(4, np.int32))
    with pytest.raises(ValueError, match="unsupported dtype float64"):
        ref.decompress(b"", np.float64, 0)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_stream_bytes_is_the_compressed_length_without_coding(dtype):
    """A size pass (codec6_cpu.h: stream_bytes) gives exactly compress's length: the reference's and
    the C++ one's, fast and generic, on every data kind and size."""
    code = CODES[np.dtype(dtype).name]
    for kind in KINDS:
        for n in SIZES + [2 * 65536 + 77]:
            x = make(kind, n, dtype, seed=n + 2)
            length = len(ref.compress(x))
            assert ref.stream_bytes(x) == length, (kind, n)
            raw = np.frombuffer(raw_bytes(x), np.uint8)
            for generic in (False, True):
                assert cpu.stream_bytes(raw, code, generic=generic) == length, (kind, n)
            # the size pass's plan spares compress its choices: the same stream
            plan = np.zeros(cpu.plan_bytes(n), np.uint8)
            assert cpu.stream_bytes(raw, code, plan=plan) == length
            out = np.zeros(ref.max_stream_bytes(n, dtype), np.uint8)
            assert out[: cpu.compress_into(raw, code, out, plan=plan)].tobytes() == ref.compress(x), (kind, n)


def odd_values(dtype):
    """The special values that are no normal (±0, subnormals, ±Inf, NaNs with payloads): escapes and
    zeros inside a coded block. (A normal outlier such as the largest finite value sets its block's
    ref, and the block's Gaussians escape: the block is stored raw.)"""
    specials = special_values(dtype)
    wide = specials.astype(np.float32)
    return specials[~np.isfinite(wide) | (np.abs(wide) < np.finfo(np.float32).tiny)]


def bits(x):
    return np.ascontiguousarray(x).view(np.uint16 if x.itemsize == 2 else np.uint32)


@np.errstate(over="ignore")
def kinds(dtype):
    g = gaussian(2 * ref.GROUP_BLOCKS * ref.BLOCK + 3 * ref.BLOCK + 1234, dtype, seed=2)  # 3 groups, partial block
    scales = gaussian(40_000, "float32", seed=5) * np.exp2(np.arange(40_000) // 4096 * 9 - 60)
    mixed = gaussian(20_000, dtype, seed=3)
    mixed[::61] = np.resize(odd_values(dtype), mixed[::61].size)
    return {
        "gaussian": g,
        "specials": np.tile(special_values(dtype), 40),
        "random bits": random_bits(9000, dtype),
        "mixed": mixed,
        "relu": np.maximum(gaussian(12_000, dtype, seed=4), 0),
        "negative relu": -np.maximum(gaussian(12_000, dtype, seed=4), 0),
        "zeros": np.zeros(5000, dtype),
        "scales": scales.astype(dtype),  # blocks 2^-60 .. 2^21: subnormals, Infs in float16
        "one": gaussian(1, dtype),
        "33": gaussian(33, dtype),
        "empty": np.zeros(0, dtype),
    }


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_is_bit_exact_and_sized_exactly(dtype):
    for name, x in kinds(dtype).items():
        s = ref.compress(x)
        assert len(s) == ref.stream_bytes(x), name
        assert len(s) <= ref.max_stream_bytes(x.size, dtype), name
        if name in ("gaussian", "mixed", "relu", "negative relu", "zeros", "random bits", "empty"):
            assert s[6] == (name in ("random bits", "empty")), name  # STORED_RAW, or coded
        np.testing.assert_array_equal(bits(ref.decompress(s, dtype, x.size)), bits(x), err_msg=name)


def test_elements_split_as_the_format_says():
    lay = ref.Layout(1)  # bfloat16 1.0 = 0x3F80: e = 127, t = 0; -1.5 = 0xBFC0: t = 2
    x = np.array([0x3F80, 0xBFC0, 0x0001, 0x8000], np.uint16).view(gaussian(1, "bfloat16").dtype)
    sign, q, low = ref.split(lay, x)
    assert sign.tolist() == [0, 1, 0, 1] and q.tolist() == [508, 510, 0, 0] and low.tolist() == [0, 0, 1, 0]
    sym = ref.symbols(lay, sign, q, low, 510)
    assert sym.tolist() == [3, 128 | 1, ref.CLASS_ESC, 128 | ref.CLASS_ZERO]  # d = 2, d = 0, a subnormal, -0
    assert ref.fixed_bits(lay, sym).tolist() == [5, 5, 15, 0]


def descriptors(s, n):
    return [ref.read_descriptor(s, b) for b in range(-(-n // ref.BLOCK))]


def test_the_encoder_takes_every_kind_of_block():
    bf = "bfloat16"
    many = gaussian(3 * ref.GROUP_BLOCKS * ref.BLOCK, bf, seed=7)
    d = descriptors(ref.compress(many), many.size)
    assert d[0]["table"] and all(x["code"] == ref.GROUP_CODE for x in d)  # a Gaussian group pays its table
    assert not any(x["table"] for i, x in enumerate(d) if i % ref.GROUP_BLOCKS)
    one = gaussian(ref.BLOCK, bf, seed=8)
    (d,) = descriptors(ref.compress(one), one.size)
    assert not d["table"] and d["code"] == 3  # one block: the Gaussian member, no table
    neg = -np.maximum(gaussian(ref.BLOCK, bf, seed=9), 0)
    (d,) = descriptors(ref.compress(neg), neg.size)
    assert (d["code"], d["flip"]) == (0, 1)  # ReLU's member, read with the sign inverted
    mix = np.concatenate([random_bits(ref.BLOCK, bf), gaussian(ref.BLOCK, bf)])
    d = descriptors(ref.compress(mix), mix.size)
    assert d[0]["raw"] and d[0]["ref"] == 0 and not d[1]["raw"]
    assert ref.compress(random_bits(100, bf))[6] == ref.FLAG_STORED_RAW


def test_gaussian_bf16_reaches_1_5x():
    x = gaussian(1 << 20, "bfloat16")
    assert x.nbytes / ref.stream_bytes(x) >= 1.50


def test_the_family_is_four_complete_codes_of_the_valid_symbols():
    assert ref.FAMILY.shape == (4, 256)
    for m in ref.FAMILY:
        assert (m[ref.VALID] >= 1).all() and (m[~ref.VALID] == 0).all() and m.max() <= 12
        assert sum(2.0 ** -m[ref.VALID]) == 1.0
    assert ref.TABLE_BYTES == 122 and len(ref.pack_table(ref.FAMILY[0])) == 122
    np.testing.assert_array_equal(ref.unpack_table(ref.pack_table(ref.FAMILY[2])), ref.FAMILY[2])
    # `bench static-codes --emit-family` prints the module's source text (with MiniLM installed it
    # derives the same lengths: docs/BENCHMARKS.md, "Format version 6")
    from zipccl_jax.bench import static_codes

    assert static_codes.family_hex(ref.FAMILY) in open(ref.__file__).read()


def test_every_block_decodes_from_its_own_record_and_two_descriptors():
    """Garbage everywhere else in the stream does not change a block's values."""
    x = gaussian(2 * ref.GROUP_BLOCKS * ref.BLOCK, "bfloat16", seed=11)
    x[5 * ref.BLOCK : 6 * ref.BLOCK] = random_bits(ref.BLOCK, "bfloat16")  # a raw block too
    s = bytearray(ref.compress(x))
    nb = x.size // ref.BLOCK
    data_at = ref.HEADER_BYTES + ref.DESC_BYTES * nb
    ends = [ref.read_descriptor(s, b)["end"] for b in range(nb)]
    lay = ref.Layout(1)
    for b in (0, 5, 17, 31):
        first = b - b % ref.GROUP_BLOCKS
        keep_desc = {b - 1, b, first - 1, first}
        keep_data = [(ends[b - 1] if b else 0, ends[b]), (ends[first - 1] if first else 0,
                                                        (ends[first - 1] if first else 0) + ref.TABLE_BYTES)]
        t = bytearray(b"\xa5" * len(s))
        t[: ref.HEADER_BYTES] = s[: ref.HEADER_BYTES]
        for k in keep_desc - {-1}:
            at = ref.HEADER_BYTES + ref.DESC_BYTES * k
            t[at : at + ref.DESC_BYTES] = s[at : at + ref.DESC_BYTES]
        for lo, hi in keep_data:
            t[data_at + lo : data_at + hi] = s[data_at + lo : data_at + hi]
        got = ref.decode_block(lay, bytes(t), nb, b, ref.BLOCK)
        np.testing.assert_array_equal(got, bits(x[b * ref.BLOCK : (b + 1) * ref.BLOCK]))


def with_descriptor(s: bytes, b: int, **fields) -> bytes:
    d = ref.read_descriptor(s, b)
    d.update(fields)
    v = (d["end"] | d["ref"] << 32 | d["code"] << 42 | d["flip"] << 46 | d["raw"] << 47 | d["table"] << 48
         | d["reserved"] << 49)
    at = ref.HEADER_BYTES + ref.DESC_BYTES * b
    return s[:at] + v.to_bytes(8, "little") + s[at + 8 :]


def verdict(s: bytes, n: int, dtype="bfloat16") -> str:
    with pytest.raises(ref.CorruptPayload) as e:
        ref.decompress(s, dtype, n)
    return str(e.value)


def test_hostile_headers_and_descriptors_get_named_verdicts():
    x = gaussian(3 * ref.BLOCK, "bfloat16", seed=12)
    x[ref.BLOCK : 2 * ref.BLOCK] = random_bits(ref.BLOCK, "bfloat16")
    s = ref.compress(x)
    n = x.size
    d = descriptors(s, n)
    assert not d[0]["raw"] and d[1]["raw"] and d[0]["code"] != ref.GROUP_CODE
    assert "version 5" in verdict(s[:4] + b"\x05" + s[5:], n)  # another version, refused by name
    assert "dtype" in verdict(s, n, "float16") and "count" in verdict(s, n + 1)
    assert "truncated" in verdict(s[:-1], n) and "truncated" in verdict(s[:20], n)
    assert "reserved" in verdict(with_descriptor(s, 0, reserved=1), n)
    assert "out of range" in verdict(with_descriptor(s, 1, table=1), n)  # a table on no group's first
    assert "code 7" in verdict(with_descriptor(s, 0, code=7), n)
    assert "raw block" in verdict(with_descriptor(s, 1, ref=3), n)
    assert "ends before it starts" in verdict(with_descriptor(s, 1, end=d[0]["end"] - 1), n)
    assert "the group has none" in verdict(with_descriptor(s, 2, code=ref.GROUP_CODE), n)
    assert "bad body size" in verdict(with_descriptor(s, 1, raw=0), n)  # a coded body as long as raw
    assert "bitstream" in verdict(with_descriptor(s, 0, ref=3), n)  # distances below the normals


def test_hostile_group_tables_and_bodies_get_named_verdicts():
    x = gaussian(ref.GROUP_BLOCKS * ref.BLOCK, "bfloat16", seed=13)
    s = bytearray(ref.compress(x))
    at = ref.HEADER_BYTES + ref.DESC_BYTES * ref.GROUP_BLOCKS  # the group's table: the first record
    assert ref.read_descriptor(s, 0)["table"]
    bad = s.copy()
    bad[at] = 0xFD  # a length of 15 ... 13
    assert "over 12" in verdict(bytes(bad), x.size)
    bad = s.copy()
    bad[at : at + ref.TABLE_BYTES] = b"\x11" * ref.TABLE_BYTES  # 244 one-bit codes
    assert "not a prefix code" in verdict(bytes(bad), x.size)
    body_end = ref.HEADER_BYTES + ref.DESC_BYTES * ref.GROUP_BLOCKS + ref.read_descriptor(s, 0)["end"]
    bad = s.copy()
    bad[body_end - 1] ^= 0x80  # the last byte's top bit: padding, or lane 31's last bit
    assert "bitstream" in verdict(bytes(bad), x.size)


@pytest.mark.parametrize("dtype", DTYPES)
def test_random_corruption_gets_a_verdict_or_a_decode(dtype):
    """Byte flips anywhere: CorruptPayload or n values, never another exception."""
    x = gaussian(3 * ref.BLOCK + 100, dtype, seed=14)
    x[::97] = np.resize(odd_values(dtype), x[::97].size)
    s = ref.compress(x)
    assert s[6] == 0 and not any(d["raw"] for d in descriptors(s, x.size))
    rng = np.random.default_rng(15)
    outcomes = set()
    for _ in range(150):
        t = bytearray(s)
        for at in rng.integers(ref.HEADER_BYTES, len(t), rng.integers(1, 4)):
            t[at] ^= 1 << int(rng.integers(8))
        try:
            assert ref.decompress(bytes(t), dtype, x.size).size == x.size
            outcomes.add("decoded")
        except ref.CorruptPayload:
            outcomes.add("refused")
    assert outcomes == {"decoded", "refused"}
