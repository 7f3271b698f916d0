"""Where a stream's bits go: the codec's output on a dataset, taken apart
field by field (FORMAT.md), in bits per value, next to the entropy of what
the symbol codes code and to ZipNN's size of the same bytes:

    python -m zipccl_jax.bench.framing --data "CRAFT float16,MiniLM float16"

Data names are bench codec's (`gaussian <dtype>`, `<model> <dtype>`); each
dataset is one stream of its tensors end to end, as bench codec measures it.
docs/BENCHMARKS.md has its figures.
"""

from __future__ import annotations

import argparse

import numpy as np

from .. import reference as R
from . import baselines, report
from . import codec as codec_bench
from . import data as bench_data

PARTS = ("header", "descriptors", "group records", "refs", "code tables", "length fields", "padding",
         "symbol codes", "escaped exponents", "coded planes", "stored bytes", "raw blocks")


def _symbols(code: int, x: np.ndarray, ref: int, mask: int) -> np.ndarray:
    """§4: the block's symbols as its group codes them (what _block_fields codes)."""
    lay = R.GroupLayout(code, mask)
    e, t, raw, extra = R.split(code, x)
    s = R.symbols(e, t, ref, R.LAYOUTS[code][1], extra & 1 if lay.sc else None)
    if lay.zeros:
        s = R.zero_mode_symbols(s, e, t, R.implied_zeros(e, t, raw, extra >> lay.sc))
    return s


def _entropy_bits(counts: np.ndarray) -> float:
    c = counts[counts > 0].astype(np.float64)
    return float(-(c * np.log2(c / c.sum())).sum())


def account(x: np.ndarray, buf: bytes) -> dict:
    """{part: bits} of stream `buf` (x compressed, format version 5) and the
    symbols' entropy per group ("symbol entropy"); the parts add up to
    8 * len(buf). "length fields" holds each coded body's width field and
    its 15 lane length deviations; "stored bytes" the stored extra values and
    byte planes of every lane."""
    x = np.ascontiguousarray(x).ravel()
    code = R.DTYPE_CODES[R.dtype_name(x.dtype)]
    n = x.size
    bits = dict.fromkeys(PARTS, 0)
    bits["header"] = 8 * R.HEADER_BYTES
    if buf[4] != R.VERSION:
        raise ValueError(f"framing: version {buf[4]} stream, this accounts for version {R.VERSION}")
    if buf[6] & R.FLAG_STORED_RAW:
        bits["raw blocks"] = 8 * (len(buf) - R.HEADER_BYTES)
        return {**bits, "symbol entropy": 0.0}
    nb = -(-n // R.BLOCK)
    ng = -(-nb // R.GROUP_BLOCKS)
    at = R.HEADER_BYTES
    descs = [int.from_bytes(buf[at + R.DESC_BYTES * b: at + R.DESC_BYTES * (b + 1)], "little") for b in range(nb)]
    at += R.DESC_BYTES * nb
    records = [buf[at + R.GROUP_RECORD_BYTES * g: at + R.GROUP_RECORD_BYTES * (g + 1)] for g in range(ng)]
    bits["descriptors"], bits["group records"] = 8 * R.DESC_BYTES * nb, 8 * R.GROUP_RECORD_BYTES * ng
    body_at = at + R.GROUP_RECORD_BYTES * ng
    table_at = body_at + sum(descs)
    entropy = 0.0
    for g, record in enumerate(records):
        mask, table_bytes = record[0], int.from_bytes(record[1:3], "little")
        blocks = range(g * R.GROUP_BLOCKS, min(nb, (g + 1) * R.GROUP_BLOCKS))
        nrefs = len(blocks) if mask & R.MASK_OWN_REFS else 1
        refs = list(buf[table_at: table_at + nrefs])
        lay = R.GroupLayout(code, mask)
        codes = R.unpack_tables(buf[table_at + nrefs: table_at + table_bytes],
                                [lay.nsym] + [R.PLANE_SYMS] * len(lay.coded))
        table_at += table_bytes
        bits["refs"] += 8 * nrefs
        bits["code tables"] += 8 * (table_bytes - nrefs)
        lengths, planes = codes[0], dict(zip(lay.coded, codes[1:]))
        counts = np.zeros(lay.nsym, np.int64)
        for i, b in enumerate(blocks):
            size, blk = descs[b], x[b * R.BLOCK: min(n, (b + 1) * R.BLOCK)]
            body_at += size
            if size == blk.size * blk.itemsize:
                bits["raw blocks"] += 8 * size
                continue
            width, field = R.read_width_field(buf[body_at - size], 8 * size)  # §2: the body's width field
            head = R.head_bits(width) - R.width_field_bits(width) + field
            ref = refs[i if mask & R.MASK_OWN_REFS else 0]
            _, widths, _ = R._block_fields(code, blk, ref, lengths, mask, planes)
            s = _symbols(code, blk, ref, mask)
            counts += np.bincount(s, minlength=lay.nsym)
            # the fields (§6): code, escaped exponent, stored extra, then each plane's code or stored byte
            fields = [int(widths[:, k].sum()) for k in range(widths.shape[1])]
            coded = sum(fields[3 + p] for p in lay.coded)
            stored = fields[2] + sum(fields[3 + p] for p in lay.stored)
            pad = 8 * size - head - sum(fields)
            if not 0 <= pad < 8:
                raise AssertionError(f"framing: block {b} does not add up ({pad} bits of padding)")
            bits["length fields"] += head
            bits["symbol codes"] += fields[0]
            bits["escaped exponents"] += fields[1]
            bits["coded planes"] += coded
            bits["stored bytes"] += stored
            bits["padding"] += pad
        entropy += _entropy_bits(counts)
    if 8 * len(buf) != sum(bits.values()):
        raise AssertionError(f"framing: {sum(bits.values())} bits accounted, the stream has {8 * len(buf)}")
    return {**bits, "symbol entropy": entropy}


def row(name: str, x: np.ndarray, zipnn: bool = True) -> dict:
    """One dataset's parts in bits per value, with its totals and ZipNN's."""
    import jax.numpy as jnp

    import zipccl_jax as zc

    c = zc.compress(jnp.asarray(x))
    buf = np.asarray(c.payload).tobytes()[: int(c.nbytes)]
    bits = account(x, buf)
    per = lambda v: v / x.size  # noqa: E731
    framing = sum(bits[p] for p in ("header", "descriptors", "group records", "refs", "code tables",
                                    "length fields", "padding"))
    out = {"data": name, "total": per(8 * len(buf)), "framing": per(framing),
           **{p: per(bits[p]) for p in PARTS},
           "symbol codes - entropy": per(bits["symbol codes"] - bits["symbol entropy"])}
    if zipnn:
        out["zipnn total"] = per(8 * len(baselines.zipnn_compress(x)))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="CRAFT float16", help="comma-separated bench codec data names")
    parser.add_argument("--no-zipnn", action="store_true")
    args = parser.parse_args(argv)
    wanted = [w.strip() for w in args.data.split(",")]
    found = {}
    for dt in bench_data.DTYPES:
        if f"gaussian {dt}" in wanted:
            found[f"gaussian {dt}"] = bench_data.gaussian(1 << 24, dt)
    for label, tensors in codec_bench.model_datasets() if len(found) < len(wanted) else ():
        name = label.replace(" (shipped)", "")
        if name in wanted:
            found[name] = codec_bench._flat(tensors)
    missing = [w for w in wanted if w not in found]
    if missing:
        raise SystemExit(f"framing: no data named {missing} (names as in bench codec's tables)")
    rows = [row(name, found[name], not args.no_zipnn) for name in wanted]
    print("bits per value")
    print(report.table([{k: f"{v:.5f}" if isinstance(v, float) else v for k, v in r.items()} for r in rows]))


if __name__ == "__main__":
    main()
