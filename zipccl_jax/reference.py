"""numpy reference codec: docs/FORMAT.md, section by section.

This is the oracle the C++ and CUDA codecs are tested against byte for byte.
It favours following the document over speed, but is vectorised enough
(across blocks) to check tensors of a few million elements.
"""

from __future__ import annotations

import numpy as np

from .dtypes import DTYPE_CODES, dtype_name

MAGIC = b"ZCCL"
VERSION = 1
HEADER_BYTES = 16
BLOCK_LOG2 = 12
BLOCK = 1 << BLOCK_LOG2
FLAG_STORED_RAW = 1
NUM_SYMS, SYM_ZERO, SYM_ESC, MAX_DELTA = 32, 0, 31, 29
MAX_CODE_LEN = 12
REF_CANDIDATES = 6
SUBSTREAMS = 4

# §5: code lengths per table, symbols 0..31.
CODE_LENGTHS = np.array(
    [
        [12, 5, 2, 2, 2, 3, 5, 5, 6, 8, 8, 9, 10] + [12] * 19,
        [12, 8, 4, 3, 2, 2, 3, 4, 4, 5, 7, 7, 8, 9, 10, 11, 11] + [12] * 15,
        [12, 8, 5, 4, 3, 3, 3, 3, 3, 3, 4, 5, 5, 6, 8, 9, 10, 10] + [12] * 13 + [11],
        [1, 6, 3, 3, 3, 4, 6, 6, 8, 8, 9, 10] + [12] * 20,
        [3, 5, 2, 2, 3, 3, 5, 5, 6, 8, 8, 9, 10, 11] + [12] * 18,
        [12, 10, 1, 2, 3, 4, 5, 6, 8, 8, 10, 11, 11] + [12] * 19,
        [12, 10, 9, 8, 7, 6, 5, 4, 4, 3, 3, 3, 3, 3, 4, 4, 5, 6, 7, 8, 9] + [12] * 11,
        [12, 9, 7, 5, 3, 2, 2, 3, 3, 5, 5, 7, 8, 8, 10, 11] + [12] * 15 + [11],
    ],
    dtype=np.int64,
)

# §3: (elem_bytes, exp_bits, raw_bytes, extra_bits) per dtype code.
LAYOUTS = {1: (2, 8, 1, 0), 2: (2, 5, 1, 3), 3: (4, 8, 3, 0)}


class CorruptPayload(ValueError):
    """The bytes are not a valid stream for the requested dtype and shape."""


def max_stream_bytes(n: int, dtype) -> int:
    """§1: no stream is larger than the raw bytes plus the header."""
    return HEADER_BYTES + n * LAYOUTS[DTYPE_CODES[dtype_name(dtype)]][0]


def canonical_codes(lens: np.ndarray) -> np.ndarray:
    """§5-6: canonical codes, bit-reversed so they are written value-LSB first."""
    codes = np.zeros(NUM_SYMS, np.int64)
    code = 0
    for length in range(1, MAX_CODE_LEN + 1):
        for s in range(NUM_SYMS):
            if lens[s] == length:
                codes[s] = int(f"{code:0{length}b}"[::-1], 2)
                code += 1
        code <<= 1
    return codes


def decode_lut(lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symbol and length for every 12-bit window (read LSB first)."""
    sym = np.zeros(1 << MAX_CODE_LEN, np.int64)
    length = np.zeros(1 << MAX_CODE_LEN, np.int64)
    for s, code in enumerate(canonical_codes(lens)):
        window = code + (np.arange(1 << (MAX_CODE_LEN - lens[s])) << lens[s])
        sym[window], length[window] = s, lens[s]
    return sym, length


CODES = np.stack([canonical_codes(t) for t in CODE_LENGTHS])
LUTS = [tuple(a.tolist() for a in decode_lut(t)) for t in CODE_LENGTHS]


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint16 if x.dtype.itemsize == 2 else np.uint32).astype(np.int64)


def split(code: int, x: np.ndarray):
    """§3: element bits -> (e, raw bytes [n, raw_bytes], extra bits)."""
    x = _bits(x)
    if code == 1:
        return (x >> 7) & 0xFF, (((x & 0x7F) << 1) | (x >> 15))[:, None], np.zeros_like(x)
    if code == 2:
        return (x >> 10) & 0x1F, (x & 0xFF)[:, None], ((x >> 15) << 2) | ((x >> 8) & 3)
    raw = np.stack([x & 0xFF, (x >> 8) & 0xFF, (((x >> 16) & 0x7F) << 1) | (x >> 31)], axis=1)
    return (x >> 23) & 0xFF, raw, np.zeros_like(x)


def join(code: int, e, raw, extra) -> np.ndarray:
    """§3: the inverse of split, as unsigned element bits."""
    if code == 1:
        return ((raw[:, 0] & 1) << 15) | (e << 7) | (raw[:, 0] >> 1)
    if code == 2:
        return ((extra >> 2) << 15) | (e << 10) | ((extra & 3) << 8) | raw[:, 0]
    return ((raw[:, 2] & 1) << 31) | (e << 23) | ((raw[:, 2] >> 1) << 16) | (raw[:, 1] << 8) | raw[:, 0]


def symbols(e: np.ndarray, ref, all_ones: int) -> np.ndarray:
    """§4: exponent -> symbol relative to ref (broadcasts)."""
    d = ref - e
    coded = (e >= 1) & (e != all_ones) & (d >= 0) & (d <= MAX_DELTA)
    return np.where(e == 0, SYM_ZERO, np.where(coded, d + 1, SYM_ESC))


def choose_code(e: np.ndarray, exp_bits: int) -> tuple[int, int, int]:
    """§7 steps 1-3 for one block: (ref, table, bits of exponent codes)."""
    all_ones = (1 << exp_bits) - 1
    hist = np.bincount(e, minlength=all_ones + 1)
    present = np.nonzero(hist[1:all_ones])[0]
    emax = int(present[-1]) + 1 if present.size else 0
    values = np.nonzero(hist)[0]
    best = None
    for k in range(REF_CANDIDATES):
        ref = emax - k
        if ref < 0:
            break
        s = symbols(values, ref, all_ones)
        cost = CODE_LENGTHS[:, s] + np.where(s == SYM_ESC, exp_bits, 0)
        bits = cost @ hist[values]
        t = int(np.argmin(bits))
        if best is None or bits[t] < best[2]:
            best = (ref, t, int(bits[t]))
    return best


def pack_bits(values: np.ndarray, lengths: np.ndarray) -> bytes:
    """§6: write each value's `length` low bits, LSB first, zero padded."""
    total = int(lengths.sum())
    if total == 0:
        return b""
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    offset = np.arange(total) - starts
    bits = (np.repeat(values, lengths) >> offset) & 1
    return np.packbits(bits.astype(np.uint8), bitorder="little").tobytes()


def substream_ranges(count: int) -> list[range]:
    """§6: sub-stream k holds elements [k q, min(count, (k + 1) q)), q = ceil(count / 4)."""
    q = -(-count // SUBSTREAMS)
    return [range(min(count, k * q), min(count, (k + 1) * q)) for k in range(SUBSTREAMS)]


def encode_block(code: int, x: np.ndarray) -> tuple[int, bytes]:
    """§2, §6, §7 step 4: one block -> (descriptor, body)."""
    elem_bytes, exp_bits, raw_bytes, extra_bits = LAYOUTS[code]
    count = x.size
    e, raw, extra = split(code, x)
    ref, table, _ = choose_code(e, exp_bits)
    s = symbols(e, ref, (1 << exp_bits) - 1)
    # per element: code, then the escaped exponent, then the extra bits
    fields = np.stack([CODES[table][s], e, extra], axis=1)
    widths = np.stack(
        [CODE_LENGTHS[table][s], np.where(s == SYM_ESC, exp_bits, 0), np.full(count, extra_bits)], axis=1
    )
    streams = [pack_bits(fields[r].ravel(), widths[r].ravel()) for r in substream_ranges(count)]
    lengths = np.array([len(t) for t in streams[:-1]], "<u2").tobytes()
    body = raw.astype(np.uint8).tobytes() + lengths + b"".join(streams)
    if len(body) >= count * elem_bytes:
        return count * elem_bytes, x.tobytes()
    return len(body) | (ref << 16) | ((table + 1) << 24), body


def header(code: int, flags: int, n: int) -> bytes:
    """§1."""
    return MAGIC + bytes([VERSION, code, flags, BLOCK_LOG2]) + int(n).to_bytes(8, "little")


def compress(x: np.ndarray) -> bytes:
    """One stream for the flattened array x (§1, §7 step 5)."""
    code = DTYPE_CODES[dtype_name(x.dtype)]
    x = np.ascontiguousarray(x).ravel()
    n, elem_bytes = x.size, LAYOUTS[code][0]
    descs, bodies = [], []
    for b in range(0, n, BLOCK):
        desc, body = encode_block(code, x[b : b + BLOCK])
        descs.append(desc)
        bodies.append(body)
    coded_len = 4 * len(descs) + sum(map(len, bodies))
    if coded_len >= n * elem_bytes:
        return header(code, FLAG_STORED_RAW, n) + x.tobytes()
    return header(code, 0, n) + np.array(descs, "<u4").tobytes() + b"".join(bodies)


def _check_header(buf: bytes, code: int, n: int) -> int:
    if len(buf) < HEADER_BYTES:
        raise CorruptPayload("truncated payload (shorter than its header says)")
    if buf[:4] != MAGIC:
        raise CorruptPayload("bad magic (not a zipccl payload)")
    if buf[4] != VERSION or buf[7] != BLOCK_LOG2:
        raise CorruptPayload("unsupported format version or block size")
    if buf[5] != code:
        raise CorruptPayload("payload dtype does not match the requested dtype")
    if int.from_bytes(buf[8:16], "little") != n:
        raise CorruptPayload("payload element count does not match the requested shape")
    if buf[6] & ~FLAG_STORED_RAW:
        raise CorruptPayload("unknown header flags")
    return buf[6]


def decompress(buf: bytes, dtype, n: int) -> np.ndarray:
    """Decode a stream of n elements of dtype; raises CorruptPayload."""
    dt = np.dtype(dtype)
    code = DTYPE_CODES[dtype_name(dt)]
    elem_bytes, exp_bits, raw_bytes, extra_bits = LAYOUTS[code]
    buf = bytes(buf)
    flags = _check_header(buf, code, n)
    if flags & FLAG_STORED_RAW:
        if len(buf) - HEADER_BYTES < n * elem_bytes:
            raise CorruptPayload("truncated payload (shorter than its header says)")
        return np.frombuffer(buf, dt, count=n, offset=HEADER_BYTES).copy()
    nb = -(-n // BLOCK)
    if (len(buf) - HEADER_BYTES) // 4 < nb:
        raise CorruptPayload("truncated payload (shorter than its header says)")
    descs = np.frombuffer(buf, "<u4", count=nb, offset=HEADER_BYTES).astype(np.int64)
    out = np.empty(n, dt)
    pos = HEADER_BYTES + 4 * nb
    for b, desc in enumerate(descs):
        count = min(BLOCK, n - b * BLOCK)
        size = int(desc & 0xFFFF)
        if size > len(buf) - pos:
            raise CorruptPayload("truncated payload (shorter than its header says)")
        out[b * BLOCK : b * BLOCK + count] = _decode_block(code, buf[pos : pos + size], int(desc), count).view(dt)
        pos += size
    return out


def _decode_block(code: int, body: bytes, desc: int, count: int) -> np.ndarray:
    """§2-§6 for one block; returns the elements' unsigned bits."""
    elem_bytes, exp_bits, raw_bytes, extra_bits = LAYOUTS[code]
    utype = np.uint16 if elem_bytes == 2 else np.uint32
    size, ref, mode = desc & 0xFFFF, (desc >> 16) & 0xFF, desc >> 24
    if mode == 0:
        if size != count * elem_bytes:
            raise CorruptPayload("corrupt block descriptor (bad body size)")
        return np.frombuffer(body, utype).copy()
    if mode > len(CODE_LENGTHS):
        raise CorruptPayload("corrupt block descriptor (bad mode)")
    raw = np.frombuffer(body, np.uint8, count=count * raw_bytes).reshape(count, raw_bytes).astype(np.int64)
    header_end = count * raw_bytes + 2 * (SUBSTREAMS - 1)
    if not header_end < size < count * elem_bytes:
        raise CorruptPayload("corrupt block descriptor (bad body size)")
    lengths = np.frombuffer(body, "<u2", count=SUBSTREAMS - 1, offset=count * raw_bytes)
    bounds = header_end + np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    if bounds[-1] > size:
        raise CorruptPayload("corrupt block descriptor (bad body size)")
    bounds = [*bounds.tolist(), size]
    lut_sym, lut_len = LUTS[mode - 1]
    e = np.empty(count, np.int64)
    extra = np.zeros(count, np.int64)
    for k, elements in enumerate(substream_ranges(count)):
        stream = body[bounds[k] : bounds[k + 1]]
        nbits = 8 * len(stream)
        value = int.from_bytes(stream, "little")  # bits past the end read as 0
        pos = 0

        def take(width: int) -> int:
            nonlocal pos
            if pos + width > nbits:
                raise CorruptPayload("corrupt block bitstream")
            pos += width
            return (value >> (pos - width)) & ((1 << width) - 1)

        for i in elements:
            window = (value >> pos) & ((1 << MAX_CODE_LEN) - 1)
            s = lut_sym[window]
            take(lut_len[window])
            if s == SYM_ZERO:
                e[i] = 0
            elif s == SYM_ESC:
                e[i] = take(exp_bits)
            else:
                if s - 1 >= ref:
                    raise CorruptPayload("corrupt block bitstream")
                e[i] = ref - (s - 1)
            if extra_bits:
                extra[i] = take(extra_bits)
        if (pos + 7) // 8 != len(stream) or value >> pos:
            raise CorruptPayload("corrupt block bitstream (unused or nonzero padding bits)")
    return join(code, e, raw, extra).astype(utype)


def compress_chunks(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """§8: k equal chunks -> ([k, cap] uint8 payload rows, [k] uint32 lengths)."""
    x = np.ascontiguousarray(x).ravel()
    if x.size % k:
        raise ValueError(f"size {x.size} is not divisible into {k} chunks")
    m = x.size // k
    cap = max_stream_bytes(m, x.dtype)
    rows = np.zeros((k, cap), np.uint8)
    sizes = np.zeros(k, np.uint32)
    for c in range(k):
        s = compress(x[c * m : (c + 1) * m])
        rows[c, : len(s)] = np.frombuffer(s, np.uint8)
        sizes[c] = len(s)
    return rows, sizes


def accumulate(chunks: list[np.ndarray], out_dtype) -> np.ndarray:
    """§8: sum in list order in float32, rounded once to out_dtype."""
    acc = chunks[0].astype(np.float32)
    with np.errstate(all="ignore"):  # inf - inf is a NaN here as in the kernels
        for c in chunks[1:]:
            acc = acc + c.astype(np.float32)
        return acc.astype(out_dtype)


def decompress_accumulate(rows: np.ndarray, dtype, n: int, out_dtype=None) -> np.ndarray:
    """§8: decode each row (a stream of n elements) and accumulate in row order."""
    chunks = [decompress(r.tobytes(), dtype, n) for r in rows]
    return accumulate(chunks, out_dtype or dtype)
