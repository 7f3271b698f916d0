"""reference_v6.py, format version 6's numpy reference (docs/FORMAT6.md): bit-exact round trips on
every bit pattern, the encoder's paths, blocks that decode alone, and a verdict for hostile bytes."""

import numpy as np
import pytest

from zipccl_jax import reference as v5
from zipccl_jax import reference_v6 as r6
from zipccl_jax.bench.data import DTYPES, gaussian, random_bits, special_values

CODES = {"bfloat16": 1, "float16": 2, "float32": 3}


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
    g = gaussian(2 * r6.GROUP_BLOCKS * r6.BLOCK + 3 * r6.BLOCK + 1234, dtype, seed=2)  # 3 groups, partial block
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
        s = r6.compress(x)
        assert len(s) == r6.stream_bytes(x), name
        assert len(s) <= r6.max_stream_bytes(x.size, dtype), name
        if name in ("gaussian", "mixed", "relu", "negative relu", "zeros", "random bits", "empty"):
            assert s[6] == (name in ("random bits", "empty")), name  # STORED_RAW, or coded
        np.testing.assert_array_equal(bits(r6.decompress(s, dtype, x.size)), bits(x), err_msg=name)


def test_elements_split_as_the_format_says():
    lay = r6.Layout(1)  # bfloat16 1.0 = 0x3F80: e = 127, t = 0; -1.5 = 0xBFC0: t = 2
    x = np.array([0x3F80, 0xBFC0, 0x0001, 0x8000], np.uint16).view(gaussian(1, "bfloat16").dtype)
    sign, q, low = r6.split(lay, x)
    assert sign.tolist() == [0, 1, 0, 1] and q.tolist() == [508, 510, 0, 0] and low.tolist() == [0, 0, 1, 0]
    sym = r6.symbols(lay, sign, q, low, 510)
    assert sym.tolist() == [3, 128 | 1, r6.CLASS_ESC, 128 | r6.CLASS_ZERO]  # d = 2, d = 0, a subnormal, -0
    assert r6.fixed_bits(lay, sym).tolist() == [5, 5, 15, 0]


def descriptors(s, n):
    return [r6.read_descriptor(s, b) for b in range(-(-n // r6.BLOCK))]


def test_the_encoder_takes_every_kind_of_block():
    bf = "bfloat16"
    many = gaussian(3 * r6.GROUP_BLOCKS * r6.BLOCK, bf, seed=7)
    d = descriptors(r6.compress(many), many.size)
    assert d[0]["table"] and all(x["code"] == r6.GROUP_CODE for x in d)  # a Gaussian group pays its table
    assert not any(x["table"] for i, x in enumerate(d) if i % r6.GROUP_BLOCKS)
    one = gaussian(r6.BLOCK, bf, seed=8)
    (d,) = descriptors(r6.compress(one), one.size)
    assert not d["table"] and d["code"] == 3  # one block: the Gaussian member, no table
    neg = -np.maximum(gaussian(r6.BLOCK, bf, seed=9), 0)
    (d,) = descriptors(r6.compress(neg), neg.size)
    assert (d["code"], d["flip"]) == (0, 1)  # ReLU's member, read with the sign inverted
    mix = np.concatenate([random_bits(r6.BLOCK, bf), gaussian(r6.BLOCK, bf)])
    d = descriptors(r6.compress(mix), mix.size)
    assert d[0]["raw"] and d[0]["ref"] == 0 and not d[1]["raw"]
    assert r6.compress(random_bits(100, bf))[6] == r6.FLAG_STORED_RAW


def test_gaussian_bf16_reaches_1_5x():
    x = gaussian(1 << 20, "bfloat16")
    assert x.nbytes / r6.stream_bytes(x) >= 1.50


def test_the_family_is_four_complete_codes_of_the_valid_symbols():
    assert r6.FAMILY.shape == (4, 256)
    for m in r6.FAMILY:
        assert (m[r6.VALID] >= 1).all() and (m[~r6.VALID] == 0).all() and m.max() <= 12
        assert sum(2.0 ** -m[r6.VALID]) == 1.0
    assert r6.TABLE_BYTES == 122 and len(r6.pack_table(r6.FAMILY[0])) == 122
    np.testing.assert_array_equal(r6.unpack_table(r6.pack_table(r6.FAMILY[2])), r6.FAMILY[2])
    # `bench static-codes --emit-family` prints the module's source text (with MiniLM installed it
    # derives the same lengths: docs/BENCHMARKS.md, "Format version 6")
    from zipccl_jax.bench import static_codes

    assert static_codes.family_hex(r6.FAMILY) in open(r6.__file__).read()


def test_every_block_decodes_from_its_own_record_and_two_descriptors():
    """Garbage everywhere else in the stream does not change a block's values."""
    x = gaussian(2 * r6.GROUP_BLOCKS * r6.BLOCK, "bfloat16", seed=11)
    x[5 * r6.BLOCK : 6 * r6.BLOCK] = random_bits(r6.BLOCK, "bfloat16")  # a raw block too
    s = bytearray(r6.compress(x))
    nb = x.size // r6.BLOCK
    data_at = r6.HEADER_BYTES + r6.DESC_BYTES * nb
    ends = [r6.read_descriptor(s, b)["end"] for b in range(nb)]
    lay = r6.Layout(1)
    for b in (0, 5, 17, 31):
        first = b - b % r6.GROUP_BLOCKS
        keep_desc = {b - 1, b, first - 1, first}
        keep_data = [(ends[b - 1] if b else 0, ends[b]), (ends[first - 1] if first else 0,
                                                        (ends[first - 1] if first else 0) + r6.TABLE_BYTES)]
        t = bytearray(b"\xa5" * len(s))
        t[: r6.HEADER_BYTES] = s[: r6.HEADER_BYTES]
        for k in keep_desc - {-1}:
            at = r6.HEADER_BYTES + r6.DESC_BYTES * k
            t[at : at + r6.DESC_BYTES] = s[at : at + r6.DESC_BYTES]
        for lo, hi in keep_data:
            t[data_at + lo : data_at + hi] = s[data_at + lo : data_at + hi]
        got = r6.decode_block(lay, bytes(t), nb, b, r6.BLOCK)
        np.testing.assert_array_equal(got, bits(x[b * r6.BLOCK : (b + 1) * r6.BLOCK]))


def with_descriptor(s: bytes, b: int, **fields) -> bytes:
    d = r6.read_descriptor(s, b)
    d.update(fields)
    v = (d["end"] | d["ref"] << 32 | d["code"] << 42 | d["flip"] << 46 | d["raw"] << 47 | d["table"] << 48
         | d["reserved"] << 49)
    at = r6.HEADER_BYTES + r6.DESC_BYTES * b
    return s[:at] + v.to_bytes(8, "little") + s[at + 8 :]


def verdict(s: bytes, n: int, dtype="bfloat16") -> str:
    with pytest.raises(r6.CorruptPayload) as e:
        r6.decompress(s, dtype, n)
    return str(e.value)


def test_hostile_headers_and_descriptors_get_named_verdicts():
    x = gaussian(3 * r6.BLOCK, "bfloat16", seed=12)
    x[r6.BLOCK : 2 * r6.BLOCK] = random_bits(r6.BLOCK, "bfloat16")
    s = r6.compress(x)
    n = x.size
    d = descriptors(s, n)
    assert not d[0]["raw"] and d[1]["raw"] and d[0]["code"] != r6.GROUP_CODE
    assert "version 5" in verdict(v5.compress(x), n)  # the other version, refused by name
    with pytest.raises(v5.CorruptPayload, match="unsupported format version"):
        v5.decompress(s, x.dtype, n)  # and version 5's decoder refuses version 6
    assert "dtype" in verdict(s, n, "float16") and "count" in verdict(s, n + 1)
    assert "truncated" in verdict(s[:-1], n) and "truncated" in verdict(s[:20], n)
    assert "reserved" in verdict(with_descriptor(s, 0, reserved=1), n)
    assert "out of range" in verdict(with_descriptor(s, 1, table=1), n)  # a table on no group's first
    assert "code 7" in verdict(with_descriptor(s, 0, code=7), n)
    assert "raw block" in verdict(with_descriptor(s, 1, ref=3), n)
    assert "ends before it starts" in verdict(with_descriptor(s, 1, end=d[0]["end"] - 1), n)
    assert "the group has none" in verdict(with_descriptor(s, 2, code=r6.GROUP_CODE), n)
    assert "bad body size" in verdict(with_descriptor(s, 1, raw=0), n)  # a coded body as long as raw
    assert "bitstream" in verdict(with_descriptor(s, 0, ref=3), n)  # distances below the normals


def test_hostile_group_tables_and_bodies_get_named_verdicts():
    x = gaussian(r6.GROUP_BLOCKS * r6.BLOCK, "bfloat16", seed=13)
    s = bytearray(r6.compress(x))
    at = r6.HEADER_BYTES + r6.DESC_BYTES * r6.GROUP_BLOCKS  # the group's table: the first record
    assert r6.read_descriptor(s, 0)["table"]
    bad = s.copy()
    bad[at] = 0xFD  # a length of 15 ... 13
    assert "over 12" in verdict(bytes(bad), x.size)
    bad = s.copy()
    bad[at : at + r6.TABLE_BYTES] = b"\x11" * r6.TABLE_BYTES  # 244 one-bit codes
    assert "not a prefix code" in verdict(bytes(bad), x.size)
    body_end = r6.HEADER_BYTES + r6.DESC_BYTES * r6.GROUP_BLOCKS + r6.read_descriptor(s, 0)["end"]
    bad = s.copy()
    bad[body_end - 1] ^= 0x80  # the last byte's top bit: padding, or lane 31's last bit
    assert "bitstream" in verdict(bytes(bad), x.size)


@pytest.mark.parametrize("dtype", DTYPES)
def test_random_corruption_gets_a_verdict_or_a_decode(dtype):
    """Byte flips anywhere: CorruptPayload or n values, never another exception."""
    x = gaussian(3 * r6.BLOCK + 100, dtype, seed=14)
    x[::97] = np.resize(odd_values(dtype), x[::97].size)
    s = r6.compress(x)
    assert s[6] == 0 and not any(d["raw"] for d in descriptors(s, x.size))
    rng = np.random.default_rng(15)
    outcomes = set()
    for _ in range(150):
        t = bytearray(s)
        for at in rng.integers(r6.HEADER_BYTES, len(t), rng.integers(1, 4)):
            t[at] ^= 1 << int(rng.integers(8))
        try:
            assert r6.decompress(bytes(t), dtype, x.size).size == x.size
            outcomes.add("decoded")
        except r6.CorruptPayload:
            outcomes.add("refused")
    assert outcomes == {"decoded", "refused"}
