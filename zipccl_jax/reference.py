"""numpy reference codec: docs/FORMAT.md (format version 6), section by section.

Exponents coded against a per-block reference by a small family of codes built into the library,
or by a group's own code where that pays; a per-block descriptor that lets every block find and
check itself; 32 lanes a block. This is the oracle the C++ and CUDA codecs are tested against byte
for byte. It favours following the document over speed, but is vectorised where that keeps it
readable. It writes and reads version 6; a stream of any other version is refused (streams do not
outlive the collective that moves them).
"""

from __future__ import annotations

import numpy as np

from .dtypes import DTYPE_CODES, dtype_name
from .prefix_codes import MAX_CODE_LEN, BitReader, CorruptPayload, canonical_codes, code_lengths, decode_lut, pack_bits

MAGIC = b"ZCCL"
HEADER_BYTES = 16
BLOCK_LOG2 = 12
BLOCK = 1 << BLOCK_LOG2
VERSION = 6
FLAG_STORED_RAW = 1
GROUP_BLOCKS = 16  # §4: the blocks that may share a group's code
LANES = 32  # §3: value i of a block is in lane i % 32
DESC_BYTES = 8  # §2
MAX_WIDTH, WIDTH_SHORT = 20, 5  # §3: deviations of 1..20 bits; widths 5..11 take a 3-bit field
CLASS_ZERO, MAX_D, CLASS_ESC = 0, 119, 121  # §1: classes 1..120 are the distances 0..119
NSYM = 256  # a symbol is sign << 7 | class; classes 122..127 have no code
VALID = np.arange(NSYM) & 127 <= CLASS_ESC
TABLE_SYMBOLS = np.flatnonzero(VALID)  # §4: the 244 symbols a group table gives lengths for
TABLE_BYTES = len(TABLE_SYMBOLS) // 2  # 122: a nibble each
GROUP_CODE = 15  # §2: the code field of a block coded with its group's code
FLIP = np.arange(NSYM) ^ 128  # a symbol with its sign inverted

# §1: per dtype code: (elem_bytes, q_bits, low_bits); an element's bits are sign | q | low.
LAYOUTS = {1: (2, 10, 5), 2: (2, 7, 8), 3: (4, 10, 21)}

# §5: the family: each member's code lengths of symbols 0..255, a hex digit each (0: no code).
# Derived by `python -m zipccl_jax bench static-codes --emit-family` (docs/FORMAT.md §5).
FAMILY_HEX = (
    "1a98765655555556666677777788889999abaaabbbbccccccccccccccccccccc"
    "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccc000000"
    "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
    "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccb000000",
    "c13248cccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
    "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccc000000"
    "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
    "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccb000000",
    "ca9876666666666666666667777777888899999aaaabbbbccccccccccccccccc"
    "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccc000000"
    "bcccccccccbbaaa96445444555666777788888999999aaaaaaabaabbbbbbbbbc"
    "cbcccccccccccccccccccccccccccccccccccccccccccccccccccccccb000000",
    "c98876655555555566666777788889999aaababbcbbbcccccccccccccccccccc"
    "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccc000000"
    "c988766555555555566667777788899999aaaabbbbbbbccccccccccccccccccc"
    "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccc000000",
)
FAMILY = np.array([[int(c, 16) for c in m] for m in FAMILY_HEX], np.int64)  # [4, 256]
MEMBERS = len(FAMILY)


class Layout:
    """§1 for one dtype code."""

    def __init__(self, code: int):
        self.code = code
        self.elem_bytes, self.q_bits, self.low_bits = LAYOUTS[code]
        self.width = 8 * self.elem_bytes
        self.q_max = 4 * ((1 << (self.q_bits - 2)) - 1)  # q of the all-ones exponent (Inf, NaN)
        self.uint = np.uint16 if self.elem_bytes == 2 else np.uint32


def max_stream_bytes(n: int, dtype) -> int:
    return HEADER_BYTES + n * LAYOUTS[DTYPE_CODES[dtype_name(dtype)]][0]


# §1 ---------------------------------------------------------------------------


def split(lay: Layout, x: np.ndarray):
    """Element bits -> (sign, q, low) as int64 arrays."""
    b = np.ascontiguousarray(x).view(lay.uint).astype(np.int64)
    return b >> (lay.width - 1), (b >> lay.low_bits) & ((1 << lay.q_bits) - 1), b & ((1 << lay.low_bits) - 1)


def normal(lay: Layout, q: np.ndarray) -> np.ndarray:
    return (q >= 4) & (q < lay.q_max)


def block_ref(lay: Layout, q: np.ndarray) -> int:
    """§6 step 1: a block's own ref, the largest q of its normal values (0 if none)."""
    q = q[normal(lay, q)]
    return int(q.max()) if q.size else 0


def symbols(lay: Layout, sign, q, low, ref) -> np.ndarray:
    """§1: each value's symbol against ref (a scalar or per value)."""
    d = ref - q
    cls = np.where((q == 0) & (low == 0), CLASS_ZERO,
                   np.where(normal(lay, q) & (d >= 0) & (d <= MAX_D), d + 1, CLASS_ESC))
    return sign << 7 | cls


def fixed_bits(lay: Layout, sym: np.ndarray) -> np.ndarray:
    """§3: the bits a value stores beside its code: an escape's q, the low bits unless a zero."""
    cls = sym & 127
    return np.where(cls == CLASS_ESC, lay.q_bits, 0) + np.where(cls == CLASS_ZERO, 0, lay.low_bits)


# §3 ---------------------------------------------------------------------------


def width_field_bits(width: int) -> int:
    return 3 if WIDTH_SHORT <= width < WIDTH_SHORT + 7 else 8


def head_bits(width: int) -> int:
    """The bits before lane 0: the width field and the 31 deviations."""
    return (LANES - 1) * width + width_field_bits(width)


def body_bytes(lane_bits: np.ndarray) -> np.ndarray:
    """§6 step 3: a coded body's size for lane bit counts [..., L]: the narrowest width whose L - 1
    deviations fit, its field, the lanes, padded to a byte. (With L = 16 it is version 5's rule.)"""
    lane_bits = np.asarray(lane_bits, np.int64)
    lanes, total = lane_bits.shape[-1], lane_bits.sum(-1)
    out = np.zeros(total.shape, np.int64)
    for width in range(MAX_WIDTH, 0, -1):  # the narrowest last, so it wins
        head = (lanes - 1) * width + width_field_bits(width)
        size = (head + total + 7) // 8
        base = np.maximum(0, 8 * size - head) // lanes
        dev = lane_bits[..., : lanes - 1] - base[..., None]
        fits = ((dev >= -(1 << (width - 1))) & (dev < 1 << (width - 1))).all(-1)
        out = np.where(fits, size, out)
    return out


def _width(lane_bits: list[int]) -> tuple[int, list[int]]:
    """§6 step 3: the narrowest width whose deviations fit, and the deviations, for any number of
    lanes (32 here; the study's 16, version 5's, in tests/test_static_codes.py)."""
    lanes = len(lane_bits)
    for width in range(1, MAX_WIDTH + 1):
        head = (lanes - 1) * width + width_field_bits(width)
        base = max(0, 8 * ((head + sum(lane_bits) + 7) // 8) - head) // lanes
        devs = [b - base for b in lane_bits[: lanes - 1]]
        if all(-(1 << (width - 1)) <= d < 1 << (width - 1) for d in devs):
            return width, devs
    raise AssertionError("lane lengths beyond the format's widths")  # |dev| < 2^15 always


# §4, §5 -----------------------------------------------------------------------


def pack_table(lengths: np.ndarray) -> bytes:
    """§4: a group's code as 122 bytes, symbol TABLE_SYMBOLS[2 i] in byte i's low nibble."""
    nib = lengths[TABLE_SYMBOLS]
    return (nib[0::2] | nib[1::2] << 4).astype(np.uint8).tobytes()


def unpack_table(table: bytes) -> np.ndarray:
    """§4: a group table's lengths, checked."""
    b = np.frombuffer(table, np.uint8).astype(np.int64)
    lengths = np.zeros(NSYM, np.int64)
    lengths[TABLE_SYMBOLS] = np.stack([b & 15, b >> 4], 1).ravel()
    if lengths.max() > MAX_CODE_LEN:
        raise CorruptPayload("corrupt group table (a code length over 12)")
    if not lengths.any() or sum(1 << (MAX_CODE_LEN - int(v)) for v in lengths if v) > 1 << MAX_CODE_LEN:
        raise CorruptPayload("corrupt group table (not a prefix code)")
    return lengths


def block_code(choice: int, flip: int, group: np.ndarray | None) -> np.ndarray:
    """§2, §5: the code lengths a block's descriptor names, by symbol."""
    lengths = group if choice == GROUP_CODE else FAMILY[choice]
    return lengths[FLIP] if flip else lengths


# §6: the encoder's choices ------------------------------------------------------


def _lane_bits(lay: Layout, sym: np.ndarray, count: int, lengths: np.ndarray) -> np.ndarray:
    """[32] bits of each lane of a block under lengths (a code absent for a symbol: a huge size)."""
    bits = np.where(lengths[sym] > 0, lengths[sym], 1 << 40) + fixed_bits(lay, sym)
    return np.bincount(np.arange(count) % LANES, bits, minlength=LANES)


def _coded_size(lay: Layout, sym: np.ndarray, lengths: np.ndarray) -> int:
    return int(body_bytes(_lane_bits(lay, sym, sym.size, lengths)))


def family_choices(lay: Layout, own_syms: list, own: list) -> list[dict]:
    """§6 step 2: each block's smallest (member, flip) at its own ref (its symbols own_syms), or raw."""
    fam = []
    for sym, ref in zip(own_syms, own):
        sizes = [_coded_size(lay, sym, block_code(c >> 1, c & 1, None)) for c in range(2 * MEMBERS)]
        c = int(np.argmin(sizes))  # ties: the lowest member, then no flip
        raw = sizes[c] >= sym.size * lay.elem_bytes
        fam.append({"ref": 0 if raw else ref, "code": 0 if raw else c >> 1, "flip": 0 if raw else c & 1,
                    "raw": raw, "size": sym.size * lay.elem_bytes if raw else sizes[c]})
    return fam


def group_verdict(fam: list[dict], candidates: list) -> list[dict]:
    """§6 step 4's end: of the group code candidates [(refs, lengths, sizes)], the cheapest (the
    first on ties), where its cost is below the family choices'; else those. The table on the
    group's first block."""
    best = None
    for refs, lengths, sizes in candidates:
        cost = TABLE_BYTES + sum(min(f["size"], z) for f, z in zip(fam, sizes))
        if best is None or cost < best[0]:
            best = (cost, refs, lengths, sizes)
    if best[0] >= sum(f["size"] for f in fam):
        return [dict(f, table=None) for f in fam]
    _, refs, lengths, sizes = best
    out = [dict(ref=r, code=GROUP_CODE, flip=0, raw=False, size=z) if z < f["size"] else f
           for f, r, z in zip(fam, refs, sizes)]
    return [dict(d, table=lengths if i == 0 else None) for i, d in enumerate(out)]


def choose_group(lay: Layout, parts: list) -> list[dict]:
    """§6 steps 1-4 for one group's blocks [(sign, q, low)]: each block's descriptor fields and,
    on the group's first, its table (or None)."""
    own = [block_ref(lay, q) for _, q, _ in parts]
    own_syms = [symbols(lay, s, q, low, r) for (s, q, low), r in zip(parts, own)]
    group_ref = max(own)
    candidates = []
    for refs, syms in ((own, own_syms),  # the blocks' own refs, then the group's
                       ([group_ref] * len(own), [symbols(lay, s, q, low, group_ref) for s, q, low in parts])):
        lengths = code_lengths(np.bincount(np.concatenate(syms), minlength=NSYM))
        candidates.append((refs, lengths, [_coded_size(lay, sym, lengths) for sym in syms]))
    return group_verdict(family_choices(lay, own_syms, own), candidates)


def encode_body(lay: Layout, sign, q, low, ref: int, lengths: np.ndarray) -> bytes:
    """§3: a coded block's body."""
    sym = symbols(lay, sign, q, low, ref)
    cls = sym & 127
    count = sym.size
    fields = np.stack([canonical_codes(lengths)[sym], q, low], 1)
    widths = np.stack([lengths[sym], np.where(cls == CLASS_ESC, lay.q_bits, 0),
                       np.where(cls == CLASS_ZERO, 0, lay.low_bits)], 1)
    order = np.concatenate([np.arange(k, count, LANES) for k in range(LANES)])
    width, devs = _width([int(widths[k::LANES].sum()) for k in range(LANES)])
    field = width - WIDTH_SHORT if width_field_bits(width) == 3 else 7 | width << 3
    return pack_bits(np.concatenate([[field], np.array(devs, np.int64) & ((1 << width) - 1), fields[order].ravel()]),
                        np.concatenate([[width_field_bits(width)], np.full(LANES - 1, width), widths[order].ravel()]))


def descriptor(end: int, d: dict) -> bytes:
    """§2: a block's 8 bytes."""
    v = end | d["ref"] << 32 | d["code"] << 42 | d["flip"] << 46 | int(d["raw"]) << 47
    v |= int(d["table"] is not None) << 48
    return v.to_bytes(DESC_BYTES, "little")


def _blocks(lay: Layout, x: np.ndarray):
    """(block values, (sign, q, low)) of every group, group by group."""
    for g in range(0, x.size, GROUP_BLOCKS * BLOCK):
        vals = [x[b : b + BLOCK] for b in range(g, min(g + GROUP_BLOCKS * BLOCK, x.size), BLOCK)]
        yield vals, [split(lay, v) for v in vals]


def header(code: int, flags: int, n: int) -> bytes:
    return MAGIC + bytes([VERSION, code, flags, BLOCK_LOG2]) + int(n).to_bytes(8, "little")


def compress(x: np.ndarray) -> bytes:
    """One version-6 stream for the flattened array x."""
    code = DTYPE_CODES[dtype_name(x.dtype)]
    lay = Layout(code)
    x = np.ascontiguousarray(x).ravel()
    descs, data = [], []
    end = 0
    for vals, parts in _blocks(lay, x):
        chosen = choose_group(lay, parts)
        group = chosen[0]["table"]
        for v, (s, q, low), d in zip(vals, parts, chosen):
            rec = b"" if d["table"] is None else pack_table(d["table"])
            if d["raw"]:
                rec += v.tobytes()
            else:
                rec += encode_body(lay, s, q, low, d["ref"], block_code(d["code"], d["flip"], group))
            end += len(rec)
            descs.append(descriptor(end, d))
            data.append(rec)
    if DESC_BYTES * len(descs) + end >= x.size * lay.elem_bytes:
        return header(code, FLAG_STORED_RAW, x.size) + x.tobytes()
    return header(code, 0, x.size) + b"".join(descs) + b"".join(data)


def stream_bytes(x: np.ndarray) -> int:
    """len(compress(x)) from the encoder's choices, without writing the bodies."""
    lay = Layout(DTYPE_CODES[dtype_name(x.dtype)])
    x = np.ascontiguousarray(x).ravel()
    total = sum(d["size"] + (0 if d["table"] is None else TABLE_BYTES)
                for _, parts in _blocks(lay, x) for d in choose_group(lay, parts))
    total += DESC_BYTES * -(-x.size // BLOCK)
    return HEADER_BYTES + min(total, x.size * lay.elem_bytes)


# §2, §3: decoding ----------------------------------------------------------------

TRUNCATED = "truncated payload (shorter than its header says)"


def _check_header(buf: bytes, code: int, n: int) -> int:
    """§1: the header against the expected dtype and count -> its flags."""
    if len(buf) < HEADER_BYTES:
        raise CorruptPayload(TRUNCATED)
    if buf[:4] != MAGIC:
        raise CorruptPayload("bad magic (not a zipccl payload)")
    if buf[4] != VERSION:
        raise CorruptPayload(f"unsupported format version {buf[4]} (this build reads version {VERSION})")
    if buf[7] != BLOCK_LOG2:
        raise CorruptPayload("unsupported format version or block size")
    if buf[5] != code:
        raise CorruptPayload("payload dtype does not match the requested dtype")
    if int.from_bytes(buf[8:16], "little") != n:
        raise CorruptPayload("payload element count does not match the requested shape")
    if buf[6] & ~FLAG_STORED_RAW:
        raise CorruptPayload("unknown header flags")
    return buf[6]


def decompress(buf: bytes, dtype, n: int) -> np.ndarray:
    """Decode a version-6 stream of n elements of dtype; raises CorruptPayload."""
    dt = np.dtype(dtype)
    lay = Layout(DTYPE_CODES[dtype_name(dt)])
    buf = bytes(buf)
    if _check_header(buf, lay.code, n) & FLAG_STORED_RAW:
        if len(buf) - HEADER_BYTES < n * lay.elem_bytes:
            raise CorruptPayload(TRUNCATED)
        return np.frombuffer(buf, dt, count=n, offset=HEADER_BYTES).copy()
    nb = -(-n // BLOCK)
    data_at = HEADER_BYTES + DESC_BYTES * nb
    if len(buf) < data_at:
        raise CorruptPayload(TRUNCATED)
    out = np.empty(n, lay.uint)
    for b in range(nb):  # every block on its own: a GPU thread block, a CPU thread
        count = min(BLOCK, n - b * BLOCK)
        out[b * BLOCK : b * BLOCK + count] = decode_block(lay, buf, nb, b, count)
    return out.view(dt)


def read_descriptor(buf: bytes, b: int) -> dict:
    v = int.from_bytes(buf[HEADER_BYTES + DESC_BYTES * b :][:DESC_BYTES], "little")
    return {"end": v & 0xFFFFFFFF, "ref": v >> 32 & 0x3FF, "code": v >> 42 & 15, "flip": v >> 46 & 1,
            "raw": v >> 47 & 1, "table": v >> 48 & 1, "reserved": v >> 49}


def decode_block(lay: Layout, buf: bytes, nb: int, b: int, count: int) -> np.ndarray:
    """§2, §3: block b's values as unsigned bits; it reads its own descriptor and the one before
    (and its group's first block's, if it takes the group's code), nothing else of the stream."""
    data_at = HEADER_BYTES + DESC_BYTES * nb
    d = read_descriptor(buf, b)
    start = read_descriptor(buf, b - 1)["end"] if b else 0
    if d["reserved"] or d["ref"] >= 1 << lay.q_bits or (d["table"] and b % GROUP_BLOCKS):
        raise CorruptPayload(f"corrupt block descriptor (block {b}: reserved bits or fields out of range)")
    if not start <= d["end"] or data_at + d["end"] > len(buf):
        raise CorruptPayload(TRUNCATED if data_at + d["end"] > len(buf) else
                             f"corrupt block descriptor (block {b} ends before it starts)")
    if d["table"]:
        start += TABLE_BYTES
    body = buf[data_at + start : data_at + d["end"]]
    if start > d["end"]:
        raise CorruptPayload(f"corrupt block descriptor (block {b}: shorter than its group table)")
    if d["raw"]:
        if d["ref"] or d["code"] or d["flip"] or len(body) != count * lay.elem_bytes:
            raise CorruptPayload(f"corrupt block descriptor (block {b}: a raw block's fields)")
        return np.frombuffer(body, lay.uint).copy()
    if len(body) >= count * lay.elem_bytes:
        raise CorruptPayload(f"corrupt block descriptor (block {b}: bad body size)")
    group = None
    if d["code"] == GROUP_CODE:
        first = b - b % GROUP_BLOCKS
        fd = read_descriptor(buf, first)
        if not fd["table"]:
            raise CorruptPayload(f"corrupt block descriptor (block {b} takes its group's code; the group has none)")
        at = data_at + (read_descriptor(buf, first - 1)["end"] if first else 0)
        group = unpack_table(buf[at : at + TABLE_BYTES])
    elif d["code"] >= MEMBERS:
        raise CorruptPayload(f"corrupt block descriptor (block {b}: code {d['code']})")
    return _decode_body(lay, body, d["ref"], count, block_code(d["code"], d["flip"], group))


def lane_starts(body: bytes) -> list[int]:
    """§3: where each lane of a coded body starts, in bits, then the body's end."""
    value, end = int.from_bytes(body, "little"), 8 * len(body)
    if end < 3 or (value & 7 == 7 and end < 8):
        raise CorruptPayload("corrupt block body (bad body size)")
    if value & 7 != 7:
        width, field = (value & 7) + WIDTH_SHORT, 3
    else:
        width, field = (value >> 3) & 31, 8
        if not 1 <= width <= MAX_WIDTH:
            raise CorruptPayload("corrupt block body (bad width)")
    head = field + (LANES - 1) * width
    base = max(0, end - head) // LANES
    starts = [head]
    for k in range(LANES - 1):
        dev = (value >> (field + k * width)) & ((1 << width) - 1)
        starts.append(starts[-1] + base + dev - ((dev >> (width - 1)) << width))
    if head > end or any(b < a for a, b in zip(starts, starts[1:])) or starts[-1] > end:
        raise CorruptPayload("corrupt block body (bad lane lengths)")
    return starts + [end]


def _decode_body(lay: Layout, body: bytes, ref: int, count: int, lengths: np.ndarray) -> np.ndarray:
    value, starts = int.from_bytes(body, "little"), lane_starts(body)
    lut = decode_lut(lengths)
    out = np.zeros(count, np.int64)
    bits = None
    for k in range(LANES):
        bits = BitReader(value, starts[k], starts[k + 1])
        for i in range(k, count, LANES):
            sym = bits.symbol(lut)
            cls = sym & 127
            if cls == CLASS_ESC:
                q = bits.take(lay.q_bits)
            elif cls == CLASS_ZERO:
                q = 0
            else:
                q = ref - (cls - 1)
                if not 4 <= q < lay.q_max:
                    raise CorruptPayload("corrupt block bitstream (a distance beyond the normal exponents)")
            low = 0 if cls == CLASS_ZERO else bits.take(lay.low_bits)
            out[i] = (sym >> 7) << (lay.width - 1) | q << lay.low_bits | low
        if k + 1 < LANES and bits.pos != bits.stop:
            raise CorruptPayload("corrupt block bitstream (unused or nonzero padding bits)")
    if (bits.pos + 7) // 8 != len(body) or value >> bits.pos:
        raise CorruptPayload("corrupt block bitstream (unused or nonzero padding bits)")
    return out


# §7 ---------------------------------------------------------------------------


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


QUIET_BIT, INVALID_SUM_NAN = 0x00400000, 0xFFC00000


def add_f32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a + b in float32 by §7's rule: the IEEE sum, except that a NaN result
    is a's NaN if a is one, else b's, quieted, and an invalid sum's (inf +
    -inf) is 0xFFC00000. It is x86's rule (numpy's add there gives the same
    bits), written out so that the sum is one function on every platform."""
    with np.errstate(all="ignore"):
        total = (a + b).view(np.uint32)
    ua, ub = a.view(np.uint32), b.view(np.uint32)
    nan = lambda u: (u & 0x7FFFFFFF) > 0x7F800000  # noqa: E731
    rule = np.where(nan(ua), ua | QUIET_BIT, np.where(nan(ub), ub | QUIET_BIT, np.uint32(INVALID_SUM_NAN)))
    return np.where(nan(total), rule, total).astype(np.uint32).view(np.float32)


def accumulate(chunks: list[np.ndarray], out_dtype) -> np.ndarray:
    """Sum in list order in float32 (add_f32), rounded once to out_dtype."""
    acc = chunks[0].astype(np.float32)
    for c in chunks[1:]:
        acc = add_f32(acc, c.astype(np.float32))
    with np.errstate(over="ignore", invalid="ignore"):  # to float16: overflow to inf, as the kernels round
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
