"""The numpy reference codec against FORMAT.md, and the C++ codec against it byte for byte."""

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
    if kind == "nans":  # NaNs of random payloads and signs, quiet and signalling, and infinities: a sum's §8 rule
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
    assert stream[4] == 5 and stream[6] == 0  # version 5, coded
    assert x.nbytes / len(stream) >= 1.515


def _layout(stream: bytes, n: int):
    """§1, §2: (blocks as (body_bytes, width: 0 raw, else its body's width field), records as (mask,
    table_bytes), bodies_at, tables_at)."""
    nb = -(-n // ref.BLOCK)
    ng = -(-nb // ref.GROUP_BLOCKS)
    sizes = [int.from_bytes(stream[16 + 2 * b : 18 + 2 * b], "little") for b in range(nb)]
    at = 16 + 2 * nb
    records = [(stream[at + 3 * g], int.from_bytes(stream[at + 3 * g + 1 : at + 3 * g + 3], "little"))
               for g in range(ng)]
    bodies_at = at + 3 * ng
    elem_bytes = ref.LAYOUTS[stream[5]][0]
    descs, pos = [], bodies_at
    for b, size in enumerate(sizes):
        raw = size == min(ref.BLOCK, n - b * ref.BLOCK) * elem_bytes
        width = 0 if raw else ref.read_width_field(stream[pos], 8 * size)[0]
        descs.append((size, width))
        pos += size
    return descs, records, bodies_at, pos


def _masks(stream: bytes, n: int) -> list:
    return [mask for mask, _ in _layout(stream, n)[1]]


def test_header_fields_follow_the_format():
    x = gaussian(5000, "float32")
    s = ref.compress(x)
    assert s[:4] == b"ZCCL" and s[4] == 5 and s[5] == 3 and s[6] == 0 and s[7] == 12
    assert int.from_bytes(s[8:16], "little") == 5000
    descs, records, bodies_at, tables_at = _layout(s, 5000)
    assert bodies_at == 16 + 2 * 2 + 3 and all(1 <= w <= ref.MAX_WIDTH for _, w in descs)  # both blocks coded
    (mask, table_bytes), = records
    assert mask == 0 and tables_at + table_bytes == len(s)  # one group: no planes, signs stored, one ref
    e = ref.split(3, x)[0]
    assert s[tables_at] == ref.block_ref(e, 8)  # §5.5: the group's ref, then its code lengths
    lengths, = ref.unpack_tables(s[tables_at + 1 :], [ref.NUM_SYMS])
    assert sum(2.0 ** -int(l) for l in lengths if l) <= 1.0
    assert table_bytes - 1 < 64 // 2 + 8  # §5.3: about half a table of 128 4-bit lengths


def test_stored_code_lengths_round_trip_and_are_checked():
    """§5.3: lengths relative to their prediction; every misuse of the entries is a corrupt table."""
    rng = np.random.default_rng(4)
    for nsym in (ref.NUM_SYMS, 2 * ref.NUM_SYMS, ref.PLANE_SYMS):
        counts = (2 ** rng.integers(0, 12, nsym)) * (rng.random(nsym) < 0.8)
        lengths = ref.code_lengths(counts + (counts.sum() == 0))
        assert (ref.unpack_tables(ref.pack_tables([lengths]), [nsym])[0] == lengths).all()
    for table, sizes in [(bytes([0b11111111, 0b1]), [4]),  # a raw length of 15
                         (bytes(16), [128]),  # every length 0: no symbol
                         (bytes([0b110]), [1]),  # one less than a prediction of 0
                         (ref.pack_tables([np.array([1, 1])]) + b"\0", [2]),  # a whole unused byte
                         (bytes([0b10]), [128])]:  # runs out of bits
        with pytest.raises(ref.CorruptPayload, match="corrupt code table"):
            ref.unpack_tables(table, sizes)


def test_symbol_tables_store_class_counts_and_jumps():
    """§5.3: a symbol code stores per sign the number of leading classes it codes, then
    those classes' entries and ESC's; the jump entry takes a length from 12 to 0 or from 0 to 12."""
    lengths = np.zeros(2 * ref.NUM_SYMS, np.int64)
    lengths[4:12] = [12, 12, 11, 11, 4, 3, 3, 4]  # classes 1 and 2 of the positive half ...
    lengths[ref.NUM_SYMS + 4: ref.NUM_SYMS + 8] = [3, 3, 12, 0]  # ... class 1 of the negative one
    lengths[ref.NUM_SYMS + 124] = 12  # ... and one ESC symbol
    fields = ref.table_fields(lengths, True)
    assert [ref.stored_classes(lengths, h) for h in (0, 1)] == [3, 2]
    # half 0: k = 3, then 12 entries (classes 0-2) and 4 (ESC); half 1: k = 2, 8 entries and 4
    assert len(fields) == 1 + 12 + 4 + 1 + 8 + 4 and fields[0] == (3, 5) and fields[17] == (2, 5)
    assert fields[1 + 4] == (7, 4)  # symbol 4: 12 after a prediction of 0 (class 0), the jump
    assert fields[1 + 5] == (0, 1) and fields[1 + 6] == (3, 3)  # 12 again; 11, one less
    assert fields[1 + 8] == (15 | 4 << 4, 8)  # symbol 8: 4 after 12 (symbol 4), a literal
    assert fields[18 + 7] == (7, 4)  # symbol 128 + 7: 0 after 12, the jump
    packed = ref.pack_tables([lengths])
    assert len(packed) == (sum(w for _, w in fields) + 7) // 8
    assert (ref.unpack_tables(packed, [2 * ref.NUM_SYMS])[0] == lengths).all()
    # a class count that hides the classes in use leaves bits unread: a corrupt table, in every decoder
    n = 5000
    x = gaussian(n, "bfloat16", seed=2)
    s = bytearray(ref.compress(x))
    _, records, _, tables_at = _layout(bytes(s), n)
    assert records[0][0] == 0 and (s[tables_at + 1] & 31) == ref.stored_classes(
        ref.unpack_tables(bytes(s[tables_at + 1:]), [ref.NUM_SYMS])[0], 0)
    s[tables_at + 1] &= ~31 & 0xFF  # k = 0: only ESC's four entries
    expect_rejected(bytes(s), x.dtype, n, "corrupt code table")


@pytest.mark.parametrize("nsym", [ref.NUM_SYMS, 2 * ref.NUM_SYMS], ids=["symbols", "sign_or_byte_plane"])
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


def expect_rejected(stream: bytes, dtype, n: int, message: str):
    """The reference and both C++ decoders reject stream, naming the same problem."""
    with pytest.raises(ref.CorruptPayload, match=message):
        ref.decompress(stream, dtype, n)
    for generic in (False, True):
        with pytest.raises(ValueError, match=message):
            cpu.decompress_into(np.frombuffer(stream, np.uint8), CODES[np.dtype(dtype)],
                                np.zeros(n * np.dtype(dtype).itemsize, np.uint8), generic=generic)


def test_group_records_are_validated():
    n = 70000  # two groups
    x = make("mixed_precision", n, np.float32, seed=2)
    s = ref.compress(x)
    nb = -(-n // ref.BLOCK)
    records_at = ref.HEADER_BYTES + ref.DESC_BYTES * nb
    _, records, _, tables_at = _layout(s, n)
    assert records[0][0] & 1  # plane 0 coded
    expect_rejected(s[:records_at] + b"\x20" + s[records_at + 1 :], np.float32, n, "corrupt group mask")  # bit 5
    expect_rejected(s[:6] + bytes([2]) + s[7:], np.float32, n, "unknown header flags")  # flag bit 1
    expect_rejected(s[:records_at + 4], np.float32, n, "truncated")
    expect_rejected(s[:-1], np.float32, n, "truncated")  # the last table area
    expect_rejected(s[:tables_at + 1] + bytes(records[0][1] - 1) + s[tables_at + records[0][1] :], np.float32, n,
                    "code table")  # group 0's lengths zeroed
    h = ref.compress(gaussian(n, ml_dtypes.bfloat16))
    expect_rejected(h[:records_at] + b"\x01" + h[records_at + 1 :], ml_dtypes.bfloat16, n, "corrupt group mask")
    for version in (4, 6):  # one version is read: streams do not outlive the call that moves them
        expect_rejected(h[:4] + bytes([version]) + h[5:], ml_dtypes.bfloat16, n, "unsupported format version")


def test_block_descriptors_and_lengths_are_validated():
    """§2: the body size, the width field and the lane lengths, each with its message."""
    n = 9000
    x = gaussian(n, "bfloat16", seed=5)
    s = bytearray(ref.compress(x))
    (size, width), *_ = _layout(bytes(s), n)[0]
    _, _, bodies_at, _ = _layout(bytes(s), n)
    assert 5 <= width <= 11 and s[bodies_at] & 7 == width - ref.WIDTH_SHORT  # a 3-bit width field
    for w in (0, ref.MAX_WIDTH + 1):  # the long field (7, then 5 bits) with a width out of 1..20
        bad = s.copy()
        bad[bodies_at] = 7 | w << 3
        expect_rejected(bytes(bad), x.dtype, n, "bad mode")
    bad = s.copy()  # block 0's body longer than the raw block (block 1's shorter): neither raw nor coded
    (size1, _) = _layout(bytes(s), n)[0][1]
    bad[16:20] = (ref.BLOCK * 2 + 1).to_bytes(2, "little") + (size1 + size - ref.BLOCK * 2 - 1).to_bytes(2, "little")
    expect_rejected(bytes(bad), x.dtype, n, "bad body size")
    bad = s.copy()  # width 20, dev_0 = 2^19 - 1: lane 0 runs past the body
    bad[bodies_at : bodies_at + 4] = bytes([7 | 20 << 3, 0xFF, 0xFF, (bad[bodies_at + 3] & 0xF0) | 0x7])
    expect_rejected(bytes(bad), x.dtype, n, "bad body size")
    bad = s.copy()  # a body one byte longer: the lanes' base moves, they no longer end where they should
    bad[16] = (bad[16] + 1) % 256
    with pytest.raises(ref.CorruptPayload):
        ref.decompress(bytes(bad), x.dtype, n)


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
        assert [m & ref.MASK_SIGN for m in _masks(stream, n)] == [ref.MASK_SIGN] * 2
        balanced = ref.compress(_signs(n, dtype, 0.5))
        assert len(balanced) - len(stream) > saved * n / 8, positive
        assert bits(ref.decompress(stream, dtype, n)) == bits(x)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_sign_coded_groups_cover_every_delta(dtype):
    """§4.1: sign-coded symbols keep all 30 deltas: values 20 binades below the group's largest do
    not escape."""
    n = 65536
    x = _signs(n, np.float32, 0.9).astype(np.float32)
    x[::3] *= np.float32(2.0**-9)  # fp16's normals span 30 binades; stay within them
    x = x.astype(dtype)
    stream = ref.compress(x)
    assert _masks(stream, n)[0] & ref.MASK_SIGN
    e, t, _, extra = ref.split(CODES[np.dtype(dtype)], x)
    s = ref.symbols(e, t, ref.block_ref(e, ref.LAYOUTS[CODES[np.dtype(dtype)]][1]), 8, extra & 1)
    assert ((s >> 2) & 31 == 31).sum() == 0  # no escapes
    assert bits(ref.decompress(stream, dtype, n)) == bits(x)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_implied_zeros_store_nothing_but_their_symbol(dtype):
    """§4.2: exact zeros of a ZEROS group cost their symbol's code only; -0 (without a coded sign) and
    subnormals with t = 0 escape and keep their bits."""
    n = 2 * 65536
    x = make("relu", n, dtype, seed=3)
    zeros = int((x.view(np.uint16 if x.itemsize == 2 else np.uint32) == 0).sum())
    stream = ref.compress(x)
    assert all(m & ref.MASK_ZEROS and m & ref.MASK_SIGN for m in _masks(stream, n))
    stored = 8 * ref.LAYOUTS[CODES[np.dtype(dtype)]][2] + ref.LAYOUTS[CODES[np.dtype(dtype)]][3] - 1
    # the same values with random low bits in the zeros (subnormals of t = 0): nothing implied
    noisy = x.view(np.uint16 if x.itemsize == 2 else np.uint32).copy()
    noisy[noisy == 0] = np.random.default_rng(5).integers(1, 1 << stored, zeros)
    assert len(ref.compress(noisy.view(dtype))) - len(stream) > 0.8 * zeros * stored / 8
    assert bits(ref.decompress(stream, dtype, n)) == bits(x)
    odd = make("relu_odd_zeros", n, dtype, seed=4)
    assert bits(ref.decompress(ref.compress(odd), dtype, n)) == bits(odd)


def test_zero_mode_is_only_taken_where_it_saves_a_sixteenth_of_a_bit():
    """§7 step 2: sporadic zeros leave a group on the plain decoders."""
    n = 65536
    x = gaussian(n, "bfloat16", seed=8)
    for zeros, expected in [(100, 0), (4000, ref.MASK_ZEROS)]:  # 6 stored bits each: n / 16 / 6 = 683
        y = x.copy()
        y[np.random.default_rng(zeros).choice(n, zeros, replace=False)] = 0
        assert _masks(ref.compress(y), n)[0] & ref.MASK_ZEROS == expected, zeros


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_coded_entropy_bound_is_just_below_the_stream(dtype):
    """bench's coded entropy bound (docs/BENCHMARKS.md) models the encoder's own choices: the
    stream is never below it, and Huffman plus framing cost less than 3% over it."""
    from zipccl_jax.bench.baselines import coded_entropy_bits

    for kind in ("gauss", "positive", "skewed_signs", "relu"):
        x = make(kind, 3 * ref.BLOCK + 100, dtype)
        ratio = 8 * len(ref.compress(x)) / coded_entropy_bits(x)
        assert 1 < ratio < 1.03, (kind, ratio)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_stream_bytes_is_the_compressed_length_without_coding(dtype):
    """A size pass (codec_cpu.h: stream_bytes) gives exactly compress's length: the reference's and
    the C++ one's, fast and generic, on every data kind and size."""
    code = CODES[np.dtype(dtype)]
    for kind in KINDS:
        for n in SIZES + [2 * 65536 + 77]:
            x = make(kind, n, dtype, seed=n + 2)
            length = len(ref.compress(x))
            assert ref.stream_bytes(x) == length, (kind, n)
            raw = np.frombuffer(bits(x), np.uint8)
            for generic in (False, True):
                assert cpu.stream_bytes(raw, code, generic=generic) == length, (kind, n)
            # the size pass's plan spares compress its choices: the same stream
            plan = np.zeros(cpu.plan_bytes(n), np.uint8)
            assert cpu.stream_bytes(raw, code, plan=plan) == length
            out = np.zeros(ref.max_stream_bytes(n, dtype), np.uint8)
            assert out[: cpu.compress_into(raw, code, out, plan=plan)].tobytes() == ref.compress(x), (kind, n)
