"""Study for issue 26: exponent codes fixed ahead of time, against format version 5's adaptive ones.

    python -m zipccl_jax bench static-codes --against V5/_zipccl_cpu.so [--family K] [--json OUT]
    python -m zipccl_jax bench static-codes --emit-family

Version 5's streams come from its C++ codec built from a commit that has it (f5ec9bf or earlier:
`pip wheel` there, or its CMake build), loaded beside this build (`bench codec --against`).

Tooling, not the format: it sizes a candidate version-6 stream exactly, writes no bytes.

Symbols are `sign << 7 | class` against a block's `q_ref`, the largest `q = 4 e + t` of its normal
values (`e` the exponent, `t` the two top mantissa bits: a quarter-binade scale): class 0 an exact
zero (magnitude bits all 0; nothing else stored), `1 + (q_ref - q)` for a distance 0..119 (30
binades), 121 an escape followed by q raw (subnormals, Inf/NaN, farther values). The low mantissa
bits are stored as version 5 stores them, and every block is cut into version 5's 16 lanes with their
width field and 15 length deviations (§2).

A *family* is K prefix codes over these symbols (244 used), lengths 1..12, derived once from a
fitting corpus; nothing about a code is in the stream. Per block the encoder takes the member and
*sign flip* (the sign read inverted, so an all-negative block uses the member of an all-positive one)
of the smallest exact body, ties to the lowest (member, flip), or stores the block raw when the body
would not be smaller. A block's descriptor is 6 bytes: its u32 body offset, its q_ref and choice. The
stream has version 5's 16-byte header.

`K=k+T` adds a second block kind: a group of 16 blocks may carry its own code (the length-limited
Huffman code of its symbol counts, `plan_with_group_tables`), which its blocks take instead of a
member where smaller, at the cost of the table (`group_table_bytes`).
"""

from __future__ import annotations

import importlib.util
import math
import re

import numpy as np

from .. import reference
from ..dtypes import DTYPE_CODES
from . import baselines, report
from . import data as bench_data

BLOCK, LANES = reference.BLOCK, 16  # the study's blocks: version 5's 16 lanes
# version 6's symbol alphabet (docs/FORMAT.md §1), which the study sized first
MAX_D, CLASS_ZERO, CLASS_ESC = reference.MAX_D, reference.CLASS_ZERO, reference.CLASS_ESC
NSYM, VALID, FLIP = reference.NSYM, reference.VALID, reference.FLIP
DESC_BYTES = 6  # per block: u32 body offset, u8 ref, u8 member << 1 | flip (255: raw)
CHUNK_BLOCKS = 256  # blocks whose lane histograms are held at once
SIZES = (4, 8, 16)


def block_stats(x: np.ndarray):
    """Per block and lane of x (any shape, bf16/fp16/fp32): the symbol histogram [nb, 16, 256], the
    bits stored beside the codes (escaped exponents, mantissa bits) [nb, 16], refs [nb], counts [nb]."""
    lay = reference.Layout(DTYPE_CODES[x.dtype.name])
    x = np.ascontiguousarray(x).ravel()
    nb = -(-x.size // BLOCK)
    hist = np.zeros((nb, LANES, NSYM), np.int32)
    fixed = np.zeros((nb, LANES), np.int64)
    refs = np.zeros(nb, np.int64)
    for b0 in range(0, nb, CHUNK_BLOCKS):
        xs = x[b0 * BLOCK : (b0 + CHUNK_BLOCKS) * BLOCK]
        sign, q, low = reference.split(lay, xs)
        blk = np.arange(xs.size) // BLOCK
        normal = reference.normal(lay, q)
        ref = np.zeros(blk[-1] + 1, np.int64)
        np.maximum.at(ref, blk[normal], q[normal])  # each block's own ref
        sym = reference.symbols(lay, sign, q, low, ref[blk])
        cell = blk * LANES + np.arange(xs.size) % LANES
        n = (blk[-1] + 1) * LANES
        hist[b0 : b0 + blk[-1] + 1] = np.bincount(cell * NSYM + sym, minlength=n * NSYM).reshape(-1, LANES, NSYM)
        fixed[b0 : b0 + blk[-1] + 1] = np.bincount(cell, reference.fixed_bits(lay, sym),
                                                   minlength=n).reshape(-1, LANES)
        refs[b0 : b0 + blk[-1] + 1] = ref
    counts = np.minimum(BLOCK, x.size - np.arange(nb) * BLOCK)
    return hist, fixed, refs, counts


body_bytes = reference.body_bytes  # version 5's coded body size (§2, §7 step 4) for 16 lane bit counts


def plan(x: np.ndarray, family: np.ndarray, stats=None) -> dict:
    """Each block's choice under `family` [K, 256] and the stream's exact size: refs, `choice`
    (member << 1 | flip, -1 raw), body bytes, total bytes. stats: block_stats(x), if at hand."""
    elem_bytes = x.dtype.itemsize
    hist, fixed, refs, counts = block_stats(x) if stats is None else stats
    table = np.stack([family, family[:, FLIP]], 1).reshape(-1, NSYM)  # [2K, 256]: (member, flip)
    lane_bits = np.einsum("bls,ms->bml", hist, table) + fixed[:, None, :]
    sizes = body_bytes(lane_bits)  # [nb, 2K]
    choice = sizes.argmin(1)  # ties: the lowest member, then no flip
    body = sizes[np.arange(len(choice)), choice]
    raw = body >= counts * elem_bytes
    body = np.where(raw, counts * elem_bytes, body)
    total = reference.HEADER_BYTES + DESC_BYTES * len(body) + int(body.sum()) if x.size else reference.HEADER_BYTES
    return {"refs": refs, "choice": np.where(raw, -1, choice), "body": body, "bytes": total}


GROUP_BLOCKS = 16  # blocks that may share a group table


def group_table_bytes(lengths: np.ndarray) -> int:
    """A group table's cost: a 1-bit flag per valid symbol (absent or not), 4 bits of length per
    present one, and a byte that says which blocks use it; lengths are 1..12."""
    present = int((lengths[VALID] > 0).sum())
    return (int(VALID.sum()) + 4 * present + 7) // 8 + 1


def plan_with_group_tables(x: np.ndarray, family: np.ndarray, group_blocks: int = GROUP_BLOCKS, stats=None) -> dict:
    """`plan` with a second block kind: a group of `group_blocks` blocks may carry its own code (the
    length-limited Huffman code of its symbol counts), which its blocks may take instead of a family
    member where it is smaller; a group carries the table only where that saves more than the table
    costs. Its size (exact bodies, the table by `group_table_bytes`) and how many groups took one."""
    stats = block_stats(x) if stats is None else stats
    hist, fixed = stats[:2]
    fam = plan(x, family, stats)["body"]  # each block's body under the family, or raw
    total, tabled = 0, 0
    for g0 in range(0, len(fam), group_blocks):
        sl = slice(g0, g0 + group_blocks)
        own_lengths = reference.code_lengths(hist[sl].sum((0, 1)))
        own = body_bytes(np.einsum("bls,s->bl", hist[sl], own_lengths) + fixed[sl])
        with_table = group_table_bytes(own_lengths) + int(np.minimum(fam[sl], own).sum())
        total += min(with_table, int(fam[sl].sum()))
        tabled += with_table < int(fam[sl].sum())
    size = reference.HEADER_BYTES + DESC_BYTES * len(fam) + total if x.size else reference.HEADER_BYTES
    return {"bytes": size, "groups": -(-len(fam) // group_blocks), "tabled": tabled}


# The family ------------------------------------------------------------------


def fit_code(counts: np.ndarray) -> np.ndarray:
    """Length-limited Huffman lengths (version 5's §5.1) of counts + 1 on every used symbol, so that
    every symbol a block can hold has a code."""
    return reference.code_lengths(np.where(VALID, counts + 1, 0))


def block_histograms(tensors) -> np.ndarray:
    """The corpus' blocks, each as a symbol histogram [N, 256] (lanes summed)."""
    return np.concatenate([block_stats(t)[0].sum(1) for t in tensors])


def synthetic_tensors(blocks: int = 64, seed: int = 26) -> list[np.ndarray]:
    """The model shapes, one tensor each of `blocks` blocks, bf16, every block at its own scale (the
    exponents relative to the block max do not depend on it, but the max's place in its binade does):
    Gaussian, Laplace (gradients), Student-t with 3 degrees of freedom (heavier tails), uniform (flat),
    and norm weights (1 + N(0, 0.1^2): narrow, one sign)."""
    rng = np.random.default_rng(seed)
    shapes = (rng.standard_normal, rng.laplace, lambda n: rng.standard_t(3, n), lambda n: rng.uniform(-1, 1, n),
              lambda n: 1 + 0.1 * rng.standard_normal(n))
    out = []
    for draw in shapes:
        scale = np.exp2(rng.uniform(-20, 4, blocks)).repeat(BLOCK)
        out.append((draw(blocks * BLOCK) * scale).astype(np.float32).astype(bench_data._dtype("bfloat16")))
    return out


def _costs(hist: np.ndarray, members: list[np.ndarray]) -> np.ndarray:
    """Bits of each block [N] under each (member, flip) [N, 2K]."""
    table = np.stack([np.stack([m, m[FLIP]]) for m in members]).reshape(-1, NSYM)
    return hist @ table.T


def _refit(hist: np.ndarray, members: list[np.ndarray]) -> list[np.ndarray]:
    """Lloyd steps until no block changes member: assign each block to its cheapest (member, flip),
    refit each member on its blocks (flipped ones read flipped); a member left with no block stays."""
    assign = None
    for _ in range(50):
        new = _costs(hist, members).argmin(1)
        if assign is not None and np.array_equal(new, assign):
            break
        assign = new
        for k in range(len(members)):
            mine = hist[assign == 2 * k].sum(0) + hist[assign == 2 * k + 1][:, FLIP].sum(0)
            if mine.any():
                members[k] = fit_code(mine)
    return members


def derive_families(hist: np.ndarray, sizes=SIZES) -> dict[int, np.ndarray]:
    """K -> lengths [K, 256], deterministic in the corpus: start from one code fitted on every block;
    then, until there are K members, add the code of the block that the family codes worst against
    its own code (most bits over), and refit (Lloyd). The members of K are those of the smaller K,
    moved by the refits."""
    own = np.array([h @ fit_code(h) for h in hist])
    members = _refit(hist, [fit_code(hist.sum(0))])
    out = {}
    while len(members) < max(sizes):
        members = _refit(hist, members + [fit_code(hist[int(np.argmax(_costs(hist, members).min(1) - own))])])
        if len(members) in sizes:
            out[len(members)] = np.array(members)
    return out


# The data --------------------------------------------------------------------


def _fits(name: str) -> bool:
    """The fitting half: MiniLM's even encoder layers, the LM's layer 0; the rest is the test half."""
    layer = re.search(r"layer\.(\d+)\.|\[(\d+)\]|^L(\d+)", name)
    return layer is not None and int(next(g for g in layer.groups() if g)) % 2 == 0


def corpora(lm_steps: int):
    """(fit tensors in bf16, test classes {(class, dtype): {name: array}})."""
    bf16 = bench_data._dtype("bfloat16")
    minilm = bench_data.minilm_tensors()
    lm = bench_data.lm_traffic(lm_steps)
    fit = synthetic_tensors() + [t.astype(bf16) for n, t in sorted(minilm.items()) if _fits(n)]
    fit += [t.astype(bf16) for c in sorted(lm) for n, t in sorted(lm[c].items()) if _fits(n)]
    test = {}
    for dt in ("bfloat16", "float32"):
        held = {n: t.astype(dt) for n, t in minilm.items() if not _fits(n)}
        test[("MiniLM", dt)] = held
        for n, t in held.items():
            test.setdefault((f"MiniLM {bench_data.weight_kind(n, t.shape)}", dt), {})[n] = t
    for c in sorted(lm):
        for dt in ("bfloat16", "float32") if c == "gradients" else ("bfloat16",):
            test[(f"LM {c}", dt)] = {n: t.astype(dt) for n, t in lm[c].items() if not _fits(n)}
    return fit, test


# The report ------------------------------------------------------------------


def _flat(tensors: dict) -> np.ndarray:
    return np.concatenate([tensors[k].ravel() for k in sorted(tensors)])


def _v5_bytes(v5, x: np.ndarray) -> int:
    """The length of version 5's stream of x, from its C++ codec (the module v5)."""
    raw = np.ascontiguousarray(x).view(np.uint8).ravel()
    out = np.empty(reference.max_stream_bytes(x.size, x.dtype), np.uint8)
    return v5.compress_into(raw, DTYPE_CODES[x.dtype.name], out)


def measure(name: str, x: np.ndarray, families: dict, zipnn: bool, v5) -> dict:
    raw = x.nbytes
    row = {"data": name, "dtype": x.dtype.name, "values": x.size, "v5": raw / _v5_bytes(v5, x)}
    if zipnn:
        row["zipnn"] = raw / len(baselines.zipnn_compress(x))
    row["v6"] = raw / reference.stream_bytes(x)  # the format's exact stream, its family built in
    row["v6 / v5"] = row["v6"] / row["v5"]
    stats = block_stats(x)
    for k, fam in families.items():
        size = plan(x, fam, stats)["bytes"]
        row[f"K={k}"] = raw / size
        row[f"K={k} bits/value"] = 8 * size / x.size
        row[f"K={k} / v5"] = row[f"K={k}"] / row["v5"]
        tabled = plan_with_group_tables(x, fam, stats=stats)
        row[f"K={k}+T"] = raw / tabled["bytes"]
        row[f"K={k}+T / v5"] = row[f"K={k}+T"] / row["v5"]
        row[f"K={k}+T groups tabled"] = f"{tabled['tabled']}/{tabled['groups']}"
    return row


def summary(rows: list[dict], families: dict) -> list[dict]:
    """Per scheme (each K alone and with group tables, then format version 6's stream): the geometric
    mean of (its ratio / v5's) over the real classes, and the worst class."""
    out = []
    for scheme in [f"K={k}{kind}" for k in families for kind in ("", "+T")] + ["v6"]:
        rel = {f"{r['data']} {r['dtype']}": r[f"{scheme} / v5"] for r in rows}
        worst = min(rel, key=rel.get)
        out.append({"scheme": scheme, "geomean / v5": math.exp(np.mean(np.log(list(rel.values())))),
                    "worst class": worst, "its / v5": rel[worst],
                    "classes below 0.97": sum(v < 0.97 for v in rel.values())})
    return out


def _cells(rows):
    return [{k: f"{v:.4f}" if isinstance(v, float) else v for k, v in r.items()} for r in rows]


def family_hex(family: np.ndarray) -> str:
    """A family as reference.FAMILY_HEX's source: each member's 256 lengths, a hex digit each."""
    members = ["".join(f"{v:x}" for v in m) for m in family]
    quarters = ["\n".join(f'    "{m[i : i + 64]}"' for i in range(0, 256, 64)) for m in members]
    return "FAMILY_HEX = (\n" + ",\n".join(quarters) + ",\n)"


def run(family_sizes, json_path=None, lm_steps: int = 200, gaussian_values: int = 1 << 22,
        emit_family: bool = False, against: str | None = None) -> None:
    if not set(family_sizes) <= set(SIZES):
        raise SystemExit(f"--family: sizes of {SIZES}")
    if emit_family:  # format version 6's: K = 4 from the fitting corpus (docs/FORMAT.md §5)
        fit, _ = corpora(lm_steps)
        print(family_hex(derive_families(block_histograms(fit), (4,))[4]))
        return
    if not against:
        raise SystemExit("bench static-codes compares with format version 5: build its _zipccl_cpu module from a "
                         "commit that has it (f5ec9bf or earlier) and pass --against PATH")
    from .codec import load_baseline

    v5 = load_baseline(against)
    zipnn = importlib.util.find_spec("zipnn") is not None
    progress = report.Progress(3)
    progress.start("corpora: MiniLM, the LM's traffic")
    fit, test = corpora(lm_steps)
    progress.finish(f"{len(fit)} fitting tensors, {len(test)} test classes")
    progress.start("deriving the families")
    families = {k: v for k, v in derive_families(block_histograms(fit), SIZES).items() if k in family_sizes}
    progress.finish()
    progress.start("sizing every class and tensor")
    gauss = measure("gaussian", bench_data.gaussian(gaussian_values, "bfloat16"), families, zipnn, v5)
    classes = [measure(c, _flat(t), families, zipnn, v5) for (c, dt), t in test.items()]
    tensors = [measure(f"{c}: {n}", t, families, False, v5) for (c, dt), ts in test.items()
               if not c.startswith("MiniLM ") for n, t in sorted(ts.items())]
    progress.finish()
    print("## Gaussian bfloat16\n\n" + report.table(_cells([gauss])))
    print("\n## Per tensor class (test half)\n\n" + report.table(_cells(classes)))
    print("\n## Against version 5\n\n" + report.table(_cells(summary(classes, families))))
    print("\n## Per tensor (test half)\n\n" + report.table(_cells(
        [{k: v for k, v in r.items() if "bits" not in k} for r in tensors])))
    if not zipnn:
        print("\n(ZipNN columns skipped: pip install zipnn)")
    if json_path:
        report.save_json(json_path, gaussian=gauss, classes=classes, tensors=tensors,
                         summary=summary(classes, families),
                         families={k: ["".join(f"{v:x}" for v in m) for m in f] for k, f in families.items()})
