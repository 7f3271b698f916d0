"""numpy reference codec: docs/FORMAT.md, section by section.

This is the oracle the C++ and CUDA codecs are tested against byte for byte.
It favours following the document over speed, but is vectorised where that
keeps it readable, so it checks tensors of a few million elements.
"""

from __future__ import annotations

import numpy as np

from .dtypes import DTYPE_CODES, dtype_name

MAGIC = b"ZCCL"
VERSION = 2  # written; version 1 streams are still read (§1)
HEADER_BYTES = 16
BLOCK_LOG2 = 12
BLOCK = 1 << BLOCK_LOG2
GROUP_BLOCKS = 16  # blocks sharing one code table
FLAG_STORED_RAW = 1
FLAG_MASKS = 2  # one mask byte per group (§1; BYTE_CODES in version 1)
MASK_SIGN = 4  # mask bit 2: the group codes the sign in its symbols (§4.1, version 2)
NUM_CLASSES, CLASS_ZERO, CLASS_ESC, MAX_DELTA = 32, 0, 31, 29
SIGN_MAX_DELTA = 13  # §4.1: the deltas a sign-coded class covers
TOP_BITS = 2  # top mantissa bits coded jointly with the exponent class
NUM_SYMS = NUM_CLASSES << TOP_BITS
TABLE_BYTES = NUM_SYMS // 2
MAX_CODE_LEN = 12
SUBSTREAMS = 4
PLANE_SYMS = 256  # §5.4: a raw byte plane's alphabet
PLANE_TABLE_BYTES = PLANE_SYMS // 2
PLANE_SAMPLE_STRIDE = 8  # §7 step 3's pre-check looks at every 8th element

# §3: (elem_bytes, exp_bits, raw_bytes, extra_bits) per dtype code.
LAYOUTS = {1: (2, 8, 0, 6), 2: (2, 5, 1, 1), 3: (4, 8, 2, 6)}


class CorruptPayload(ValueError):
    """The bytes are not a valid stream for the requested dtype and shape."""


def max_stream_bytes(n: int, dtype) -> int:
    """§1: no stream is larger than the raw bytes plus the header."""
    return HEADER_BYTES + n * LAYOUTS[DTYPE_CODES[dtype_name(dtype)]][0]


# §3 ---------------------------------------------------------------------------


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).view(np.uint16 if x.dtype.itemsize == 2 else np.uint32).astype(np.int64)


def split(code: int, x: np.ndarray):
    """Element bits -> (e, t, raw bytes [n, raw_bytes], extra)."""
    x = _bits(x)
    if code == 1:
        return (x >> 7) & 0xFF, (x >> 5) & 3, np.zeros((x.size, 0), np.int64), ((x & 0x1F) << 1) | (x >> 15)
    if code == 2:
        return (x >> 10) & 0x1F, (x >> 8) & 3, (x & 0xFF)[:, None], x >> 15
    raw = np.stack([x & 0xFF, (x >> 8) & 0xFF], axis=1)
    return (x >> 23) & 0xFF, (x >> 21) & 3, raw, (((x >> 16) & 0x1F) << 1) | (x >> 31)


def join(code: int, e, t, raw, extra) -> np.ndarray:
    """Inverse of split, as unsigned element bits."""
    if code == 1:
        return ((extra & 1) << 15) | (e << 7) | (t << 5) | (extra >> 1)
    if code == 2:
        return (extra << 15) | (e << 10) | (t << 8) | raw[:, 0]
    return ((extra & 1) << 31) | (e << 23) | (t << 21) | ((extra >> 1) << 16) | (raw[:, 1] << 8) | raw[:, 0]


# §4 ---------------------------------------------------------------------------


def block_ref(e: np.ndarray, exp_bits: int) -> int:
    """The largest exponent field with 1 <= e < ALL_ONES, or 0."""
    normal = e[(e >= 1) & (e < (1 << exp_bits) - 1)]
    return int(normal.max()) if normal.size else 0


def symbols(e: np.ndarray, t: np.ndarray, ref, exp_bits: int, sign: np.ndarray | None = None) -> np.ndarray:
    """Symbol = (exponent class relative to ref) << 2 | top mantissa bits.

    With sign (a sign-coded group, §4.1) the class covers d <= 13 and carries
    the sign in its bit 4; escapes stay class 31.
    """
    d = ref - e
    max_delta = MAX_DELTA if sign is None else SIGN_MAX_DELTA
    coded = (e >= 1) & (e != (1 << exp_bits) - 1) & (d >= 0) & (d <= max_delta)
    cls = np.where(e == 0, CLASS_ZERO, np.where(coded, d + 1, CLASS_ESC))
    if sign is not None:
        cls = np.where(cls == CLASS_ESC, CLASS_ESC, cls | (sign << 4))
    return (cls << TOP_BITS) | t


# §5 ---------------------------------------------------------------------------


def huffman_lengths(counts: np.ndarray) -> np.ndarray:
    """§5.1: the deterministic two-queue Huffman code lengths (unlimited)."""
    used = [s for s in range(len(counts)) if counts[s] > 0]
    lengths = np.zeros(len(counts), np.int64)
    if len(used) == 1:
        lengths[used[0]] = 1
        return lengths
    leaves = sorted(used, key=lambda s: (counts[s], s))
    weight = [int(counts[s]) for s in leaves]  # nodes 0..n-1 are the leaves, in that order
    parent = [0] * (2 * len(leaves) - 1)
    li, ni = 0, len(leaves)  # fronts of the leaf queue and the node queue

    def take():
        nonlocal li, ni
        if li < len(leaves) and (ni >= len(weight) or weight[li] <= weight[ni]):
            li += 1
            return li - 1
        ni += 1
        return ni - 1

    while len(weight) < 2 * len(leaves) - 1:
        a, b = take(), take()
        parent[a] = parent[b] = len(weight)
        weight.append(weight[a] + weight[b])
    depth = [0] * len(weight)
    for node in range(len(weight) - 2, -1, -1):
        depth[node] = depth[parent[node]] + 1
    for i, s in enumerate(leaves):
        lengths[s] = depth[i]
    return lengths


def code_lengths(counts: np.ndarray) -> np.ndarray:
    """§5.1: Huffman lengths, flattening the counts until no code is over 12 bits."""
    counts = np.asarray(counts, np.int64).copy()
    while True:
        lengths = huffman_lengths(counts)
        if lengths.max() <= MAX_CODE_LEN:
            return lengths
        counts = np.where(counts > 0, (counts + 1) >> 1, 0)


def canonical_codes(lengths: np.ndarray) -> np.ndarray:
    """§5.2: canonical codes, bit-reversed so they are written value-LSB first."""
    codes = np.zeros(len(lengths), np.int64)
    code = 0
    for length in range(1, MAX_CODE_LEN + 1):
        for s in range(len(lengths)):
            if lengths[s] == length:
                codes[s] = int(f"{code:0{length}b}"[::-1], 2)
                code += 1
        code <<= 1
    return codes


def pack_table(lengths: np.ndarray) -> bytes:
    return bytes((lengths[0::2] | (lengths[1::2] << 4)).astype(np.uint8))


def unpack_table(table: bytes) -> np.ndarray:
    """§5.3: the lengths of a stored table (two per byte), validated."""
    b = np.frombuffer(table, np.uint8).astype(np.int64)
    lengths = np.stack([b & 15, b >> 4], axis=1).ravel()
    if lengths.max() > MAX_CODE_LEN or not lengths.any():
        raise CorruptPayload("corrupt code table")
    if sum(1 << (MAX_CODE_LEN - int(l)) for l in lengths if l) > 1 << MAX_CODE_LEN:
        raise CorruptPayload("corrupt code table")
    return lengths


def decode_lut(lengths: np.ndarray) -> tuple[list, list]:
    """Symbol and length for every 12-bit window (read LSB first); length 0 = no code."""
    sym = np.zeros(1 << MAX_CODE_LEN, np.int64)
    size = np.zeros(1 << MAX_CODE_LEN, np.int64)
    for s, code in enumerate(canonical_codes(lengths)):
        if lengths[s]:
            window = code + (np.arange(1 << (MAX_CODE_LEN - lengths[s])) << lengths[s])
            sym[window], size[window] = s, lengths[s]
    return sym.tolist(), size.tolist()


# §6 ---------------------------------------------------------------------------


def substream_ranges(count: int) -> list[range]:
    """Sub-stream k holds elements [k q, min(count, (k + 1) q)), q = ceil(count / 4)."""
    q = -(-count // SUBSTREAMS)
    return [range(min(count, k * q), min(count, (k + 1) * q)) for k in range(SUBSTREAMS)]


def extra_bytes(count: int, extra_bits: int) -> int:
    return (count * extra_bits + 7) // 8


def pack_bits(values: np.ndarray, widths: np.ndarray) -> bytes:
    """Write each value's `width` low bits, LSB first, zero padded to a byte."""
    total = int(widths.sum())
    if total == 0:
        return b""
    starts = np.repeat(np.cumsum(widths) - widths, widths)
    bits = (np.repeat(values, widths) >> (np.arange(total) - starts)) & 1
    return np.packbits(bits.astype(np.uint8), bitorder="little").tobytes()


# §7 ---------------------------------------------------------------------------


def header(code: int, flags: int, n: int) -> bytes:
    return MAGIC + bytes([VERSION, code, flags, BLOCK_LOG2]) + int(n).to_bytes(8, "little")


def encode_block(code: int, x: np.ndarray, ref: int, lengths: np.ndarray, codes: np.ndarray,
                 planes: dict | None = None, sign_coded: bool = False) -> tuple[int, bytes]:
    """One block with its ref and its group's codes -> (descriptor, body).

    planes maps each coded raw byte plane p to its (lengths, codes) (§5.4);
    sign_coded: the group's symbols carry the sign (§4.1).
    """
    elem_bytes, exp_bits, raw_bytes, extra_bits = LAYOUTS[code]
    planes = planes or {}
    count, sc = x.size, int(sign_coded)
    e, t, raw, extra = split(code, x)
    sign = extra & 1  # §3: the sign is bit 0 of extra
    s = symbols(e, t, ref, exp_bits, sign if sc else None)
    esc = s >> TOP_BITS == CLASS_ESC
    # per element: symbol code, escaped exponent (and sign), then each coded plane's code
    fields = np.stack([codes[s], e | (sign << exp_bits) * sc] + [planes[p][1][raw[:, p]] for p in sorted(planes)],
                      axis=1)
    widths = np.stack([lengths[s], np.where(esc, exp_bits + sc, 0)] + [planes[p][0][raw[:, p]] for p in sorted(planes)],
                      axis=1)
    streams = [pack_bits(fields[r].ravel(), widths[r].ravel()) for r in substream_ranges(count)]
    sizes = np.array([len(t) for t in streams[:-1]], "<u2").tobytes()
    extras = pack_bits(extra >> sc, np.full(count, extra_bits - sc))
    stored = raw[:, [p for p in range(raw_bytes) if p not in planes]]
    body = stored.astype(np.uint8).tobytes() + extras + sizes + b"".join(streams)
    if len(body) >= count * elem_bytes:
        return count * elem_bytes, x.tobytes()
    return len(body) | (ref << 16) | (1 << 24), body


def choose_group_code(code: int, blocks: list[np.ndarray]) -> tuple[list[int], np.ndarray, bool]:
    """§7 step 2: the refs of a group's blocks, the group's code lengths and whether it codes the sign."""
    exp_bits = LAYOUTS[code][1]
    parts = [(e, t, extra & 1) for e, t, _, extra in (split(code, blk) for blk in blocks)]
    block_refs = [block_ref(e, exp_bits) for e, _, _ in parts]
    group_refs = [max(block_refs)] * len(blocks)
    best = None
    # in this order, a candidate replaces the best only if strictly cheaper
    for sc, refs in ((0, group_refs), (0, block_refs), (1, group_refs), (1, block_refs)):
        counts = sum(np.bincount(symbols(e, t, r, exp_bits, sign if sc else None), minlength=NUM_SYMS)
                     for (e, t, sign), r in zip(parts, refs))
        lengths = code_lengths(counts)
        esc = counts.reshape(NUM_CLASSES, -1)[CLASS_ESC].sum()
        cost = int(counts @ lengths) + (exp_bits + sc) * int(esc) + (1 - sc) * int(counts.sum())
        if best is None or cost < best[0]:
            best = (cost, refs, lengths, bool(sc))
    return best[1:]


def _plane_code_bits(plane: np.ndarray) -> tuple[int, np.ndarray]:
    """Bits the bytes take under their own Huffman code, and the code's lengths."""
    counts = np.bincount(plane, minlength=PLANE_SYMS)
    lengths = code_lengths(counts)
    return int(counts @ lengths), lengths


def choose_planes(code: int, x: np.ndarray) -> dict:
    """§7 step 3: the raw byte planes a group codes -> {plane: code lengths}."""
    raw = split(code, x)[2]
    planes = {}
    for p in range(raw.shape[1]):
        sample = raw[::PLANE_SAMPLE_STRIDE, p]  # pre-check: saves >= 1/16 bit per sampled byte?
        if 16 * (8 * sample.size - _plane_code_bits(sample)[0]) < sample.size:
            continue
        bits, lengths = _plane_code_bits(raw[:, p])
        if bits + 8 * PLANE_TABLE_BYTES < 8 * x.size:
            planes[p] = lengths
    return planes


def compress(x: np.ndarray) -> bytes:
    """One stream for the flattened array x."""
    code = DTYPE_CODES[dtype_name(x.dtype)]
    x = np.ascontiguousarray(x).ravel()
    n, elem_bytes = x.size, LAYOUTS[code][0]
    group = GROUP_BLOCKS * BLOCK
    descs, masks, tables, bodies = [], [], [], []
    for g in range(0, n, group):
        planes = choose_planes(code, x[g : g + group])
        blocks = [x[b : min(b + BLOCK, n)] for b in range(g, min(g + group, n), BLOCK)]
        refs, lengths, sign_coded = choose_group_code(code, blocks)
        masks.append(sum(1 << p for p in planes) | (MASK_SIGN if sign_coded else 0))
        tables.append(pack_table(lengths) + b"".join(pack_table(planes[p]) for p in sorted(planes)))
        codes = canonical_codes(lengths)
        plane_codes = {p: (lens, canonical_codes(lens)) for p, lens in planes.items()}
        for blk, r in zip(blocks, refs):
            desc, body = encode_block(code, blk, r, lengths, codes, plane_codes, sign_coded)
            descs.append(desc)
            bodies.append(body)
    coded_len = 4 * len(descs) + len(masks) + sum(map(len, tables)) + sum(map(len, bodies))
    if coded_len >= n * elem_bytes:
        return header(code, FLAG_STORED_RAW, n) + x.tobytes()
    return (header(code, FLAG_MASKS, n) + np.array(descs, "<u4").tobytes() + bytes(masks) + b"".join(tables)
            + b"".join(bodies))


# decoding ------------------------------------------------------------------------


def _check_header(buf: bytes, code: int, n: int) -> tuple[int, int]:
    """§1: (flags, the bits a group's mask may have)."""
    if len(buf) < HEADER_BYTES:
        raise CorruptPayload("truncated payload (shorter than its header says)")
    if buf[:4] != MAGIC:
        raise CorruptPayload("bad magic (not a zipccl payload)")
    if buf[4] not in (1, VERSION) or buf[7] != BLOCK_LOG2:
        raise CorruptPayload("unsupported format version or block size")
    if buf[5] != code:
        raise CorruptPayload("payload dtype does not match the requested dtype")
    if int.from_bytes(buf[8:16], "little") != n:
        raise CorruptPayload("payload element count does not match the requested shape")
    flags = buf[6]
    mask_bits = (1 << LAYOUTS[code][2]) - 1 | (MASK_SIGN if buf[4] >= 2 else 0)
    if flags & ~(FLAG_STORED_RAW | FLAG_MASKS) or (flags & FLAG_MASKS and (not mask_bits or flags & FLAG_STORED_RAW)):
        raise CorruptPayload("unknown header flags")
    return flags, mask_bits


def decompress(buf: bytes, dtype, n: int) -> np.ndarray:
    """Decode a stream of n elements of dtype; raises CorruptPayload."""
    dt = np.dtype(dtype)
    code = DTYPE_CODES[dtype_name(dt)]
    elem_bytes, raw_bytes = LAYOUTS[code][0], LAYOUTS[code][2]
    buf = bytes(buf)
    flags, mask_bits = _check_header(buf, code, n)
    truncated = CorruptPayload("truncated payload (shorter than its header says)")
    if flags & FLAG_STORED_RAW:
        if len(buf) - HEADER_BYTES < n * elem_bytes:
            raise truncated
        return np.frombuffer(buf, dt, count=n, offset=HEADER_BYTES).copy()
    nb = -(-n // BLOCK)
    ng = -(-nb // GROUP_BLOCKS)
    table_at = HEADER_BYTES + 4 * nb + (ng if flags & FLAG_MASKS else 0)
    if len(buf) < table_at:
        raise truncated
    masks = list(buf[HEADER_BYTES + 4 * nb : table_at]) if flags & FLAG_MASKS else [0] * ng
    if any(m & ~mask_bits for m in masks):
        raise CorruptPayload("corrupt group mask")
    table_sizes = [TABLE_BYTES + PLANE_TABLE_BYTES * bin(m & ~MASK_SIGN).count("1") for m in masks]
    pos = table_at + sum(table_sizes)
    if len(buf) < pos:
        raise truncated
    descs = np.frombuffer(buf, "<u4", count=nb, offset=HEADER_BYTES).astype(np.int64)
    out = np.empty(n, dt)
    luts = None
    for b, desc in enumerate(descs):
        g = b // GROUP_BLOCKS
        if b % GROUP_BLOCKS == 0:
            luts = None  # built lazily: a group of raw blocks may carry any tables
            tables = buf[table_at : table_at + table_sizes[g]]
            table_at += table_sizes[g]
        count = min(BLOCK, n - b * BLOCK)
        size = int(desc & 0xFFFF)
        if size > len(buf) - pos:
            raise truncated
        if desc >> 24 == 1 and luts is None:
            luts = _group_luts(tables, masks[g], raw_bytes)
        block = _decode_block(code, buf[pos : pos + size], int(desc), count, luts, bool(masks[g] & MASK_SIGN))
        out[b * BLOCK : b * BLOCK + count] = block.view(dt)
        pos += size
    return out


def _group_luts(tables: bytes, mask: int, raw_bytes: int) -> tuple:
    """§5.3-5.4: the symbol table's decode table, then each plane's (None: stored raw)."""
    luts = [decode_lut(unpack_table(tables[:TABLE_BYTES]))]
    at = TABLE_BYTES
    for p in range(raw_bytes):
        if mask >> p & 1:
            luts.append(decode_lut(unpack_table(tables[at : at + PLANE_TABLE_BYTES])))
            at += PLANE_TABLE_BYTES
        else:
            luts.append(None)
    return tuple(luts)


def _decode_block(code: int, body: bytes, desc: int, count: int, luts, sign_coded: bool) -> np.ndarray:
    """One block; luts from _group_luts. Returns the elements' unsigned bits."""
    elem_bytes, exp_bits, raw_bytes, extra_bits = LAYOUTS[code]
    sc = int(sign_coded)
    extra_bits -= sc  # §4.1: the sign is coded, not stored
    utype = np.uint16 if elem_bytes == 2 else np.uint32
    size, ref, mode = desc & 0xFFFF, (desc >> 16) & 0xFF, desc >> 24
    if mode == 0:
        if size != count * elem_bytes:
            raise CorruptPayload("corrupt block descriptor (bad body size)")
        return np.frombuffer(body, utype).copy()
    if mode != 1:
        raise CorruptPayload("corrupt block descriptor (bad mode)")
    coded = [p for p in range(raw_bytes) if luts and luts[1 + p] is not None]
    stored_planes = [p for p in range(raw_bytes) if p not in coded]
    extra_at = count * len(stored_planes)
    sizes_at = extra_at + extra_bytes(count, extra_bits)
    header_end = sizes_at + 2 * (SUBSTREAMS - 1)
    if not header_end < size < count * elem_bytes:
        raise CorruptPayload("corrupt block descriptor (bad body size)")
    raw = np.zeros((count, raw_bytes), np.int64)
    raw[:, stored_planes] = np.frombuffer(body, np.uint8, count=extra_at).reshape(count, -1)
    ebits = np.unpackbits(np.frombuffer(body[extra_at:sizes_at], np.uint8), bitorder="little")
    if ebits[count * extra_bits :].any():
        raise CorruptPayload("corrupt block bitstream (unused or nonzero padding bits)")
    extra = ebits[: count * extra_bits].reshape(count, extra_bits).astype(np.int64) @ (1 << np.arange(extra_bits))
    sizes = np.frombuffer(body, "<u2", count=SUBSTREAMS - 1, offset=sizes_at)
    bounds = header_end + np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    if bounds[-1] > size:
        raise CorruptPayload("corrupt block descriptor (bad body size)")
    bounds = [*bounds.tolist(), size]
    e, t, sign = np.zeros(count, np.int64), np.zeros(count, np.int64), np.zeros(count, np.int64)
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

        def symbol(lut) -> int:
            lut_sym, lut_len = lut
            window = (value >> pos) & ((1 << MAX_CODE_LEN) - 1)
            if not lut_len[window]:
                raise CorruptPayload("corrupt block bitstream")
            take(lut_len[window])
            return lut_sym[window]

        for i in elements:
            s = symbol(luts[0])
            cls, t[i] = s >> TOP_BITS, s & ((1 << TOP_BITS) - 1)
            if cls == CLASS_ESC:
                e[i] = take(exp_bits)
                sign[i] = take(sc)
            elif sc:
                sign[i], cls = cls >> 4, cls & 15
                if cls == 15:  # §4.1: the one class a sign-coded group does not use
                    raise CorruptPayload("corrupt block bitstream")
            if cls not in (CLASS_ZERO, CLASS_ESC):
                if cls - 1 >= ref:
                    raise CorruptPayload("corrupt block bitstream")
                e[i] = ref - (cls - 1)
            for p in coded:
                raw[i, p] = symbol(luts[1 + p])
        if (pos + 7) // 8 != len(stream) or value >> pos:
            raise CorruptPayload("corrupt block bitstream (unused or nonzero padding bits)")
    return join(code, e, t, raw, extra << sc | sign).astype(utype)


# §8 ---------------------------------------------------------------------------


def compress_chunks(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """k equal chunks -> ([k, cap] uint8 payload rows, [k] uint32 lengths)."""
    x = np.ascontiguousarray(x).ravel()
    if x.size % k:
        raise ValueError(f"size {x.size} is not divisible into {k} chunks")
    m = x.size // k
    rows = np.zeros((k, max_stream_bytes(m, x.dtype)), np.uint8)
    sizes = np.zeros(k, np.uint32)
    for c in range(k):
        s = compress(x[c * m : (c + 1) * m])
        rows[c, : len(s)] = np.frombuffer(s, np.uint8)
        sizes[c] = len(s)
    return rows, sizes


def accumulate(chunks: list[np.ndarray], out_dtype) -> np.ndarray:
    """Sum in list order in float32, rounded once to out_dtype."""
    acc = chunks[0].astype(np.float32)
    with np.errstate(all="ignore"):  # inf - inf is a NaN here as in the kernels
        for c in chunks[1:]:
            acc = acc + c.astype(np.float32)
        return acc.astype(out_dtype)


def decompress_accumulate(rows: np.ndarray, dtype, n: int, out_dtype=None) -> np.ndarray:
    """Decode each row (a stream of n elements) and accumulate in row order."""
    chunks = [decompress(r.tobytes(), dtype, n) for r in rows]
    return accumulate(chunks, out_dtype or dtype)


# ---------------------------------------------------------------------------
# The collectives' rows (ffi/zipccl_rows.h): the oracle of the row ops.


def row_order(size: int, rows: int, unit: int = 0) -> np.ndarray:
    """[rows, m] source positions of each row's elements in a flat array of
    `size` elements (m = ceil(size / rows)); -1 marks zero padding. unit 0:
    contiguous rows. unit > 0: row j holds the units j, j + rows, ... of the
    largest prefix of the padded rows * m elements that is a multiple of
    rows units, then its contiguous share of the rest."""
    m = -(-size // rows)
    padded = rows * m
    if unit:
        main = padded // (rows * unit) * (rows * unit)
        head = np.arange(main).reshape(-1, rows, unit).transpose(1, 0, 2).reshape(rows, -1)
        order = np.concatenate([head, np.arange(main, padded).reshape(rows, -1)], axis=1)
    else:
        order = np.arange(padded).reshape(rows, m)
    return np.where(order < size, order, -1)


def cut_rows(x: np.ndarray, rows: int, unit: int = 0) -> np.ndarray:
    """flat x -> [rows, m] as row_order lays it out (padding zero)."""
    order = row_order(x.size, rows, unit)
    out = x.reshape(-1)[np.maximum(order, 0)]
    out[order < 0] = 0
    return out


def stream_sizes(x: np.ndarray, rows: int, unit: int = 0) -> np.ndarray:
    """The length of each row's stream: what the size pass returns."""
    return np.array([len(compress(r)) for r in cut_rows(x, rows, unit)], np.uint32)
