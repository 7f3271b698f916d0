"""What §6 step 4 would cost in ratio with a cheaper group code (docs/BENCHMARKS.md, "where compress
stands against issue 26's 1.5x"): the group's code built from the symbol counts of every STRIDE-th
block, scaled up, where the format counts every block's. Every block's sizes stay exact; with the
floor, every symbol a block can hold (classes 0 to its ref less its least normal q, the escape,
either sign; at the group ref, shifted there) gets a count of at least 1, so the code covers them.
The exact format (reference.stream_bytes) beside it, against version 5 on the held-out corpus of
`bench static-codes` (MiniLM, the 4-layer LM's traffic after 200 steps) and a bf16 Gaussian.

    python tools/v6_study/sampled_group_code.py V5/_zipccl_cpu.so STRIDE [nofloor] [quick]

A study of the encoder's rule, not the library: it patches reference.choose_group while it sizes.
"""
import math
import sys

import numpy as np

from zipccl_jax import reference as R
from zipccl_jax.bench import data as D
from zipccl_jax.bench import static_codes as S
from zipccl_jax.bench.codec import load_baseline


def possible_symbols(lay, q, shift):
    """The symbols a block (its q) can hold at its own ref raised by shift."""
    n = q[R.normal(lay, q)]
    top = 0 if not n.size else min(int(n.max()) - int(n.min()) + 1, R.MAX_D + 1)
    cls = np.arange(top + 1)
    cls = np.where(cls >= 1, cls + shift, cls)
    cls = np.unique(np.r_[np.where(cls > R.MAX_D + 1, R.CLASS_ESC, cls), R.CLASS_ESC])
    return np.r_[cls, cls | 128]


def choose_group_sampled(lay, parts, stride, floor):
    """reference.choose_group with the group code's counts from every stride-th block."""
    own = [R.block_ref(lay, q) for _, q, _ in parts]
    own_syms = [R.symbols(lay, s, q, low, r) for (s, q, low), r in zip(parts, own)]
    sample, top, candidates = range(0, len(parts), stride), max(own), []
    for refs, syms in ((own, own_syms), ([top] * len(own), [R.symbols(lay, s, q, low, top) for s, q, low in parts])):
        counts = np.bincount(np.concatenate([syms[b] for b in sample]), minlength=R.NSYM)
        counts = np.ceil(counts * len(parts) / len(sample)).astype(np.int64)
        for b, (_, q, _) in enumerate(parts if floor else []):
            at = possible_symbols(lay, q, refs[b] - own[b])
            counts[at] = np.maximum(counts[at], 1)
        lengths = R.code_lengths(counts)
        candidates.append((refs, lengths, [R._coded_size(lay, sym, lengths) if (lengths[sym] > 0).all() else 1 << 40
                                           for sym in syms]))
    return R.group_verdict(R.family_choices(lay, own_syms, own), candidates)


def main(argv):
    v5, stride = load_baseline(argv[1]), int(argv[2])
    floor, exact = "nofloor" not in argv, R.choose_group
    gauss = {("gaussian", "bfloat16"): {"g": D.gaussian(1 << (18 if "quick" in argv else 22), "bfloat16")}}
    classes = gauss if "quick" in argv else {**gauss, **S.corpora(200)[1]}
    print(f"every {stride}th block's counts{', floor of 1' if floor else ''}\n")
    print("| class | dtype | v5 | v6 | sampled | v6 / v5 | sampled / v5 |\n|---|---|---|---|---|---|---|")
    rows = []
    for (c, dt), tensors in classes.items():
        x = S._flat(tensors)
        v6 = x.nbytes / R.stream_bytes(x)
        R.choose_group = lambda lay, parts: choose_group_sampled(lay, parts, stride, floor)
        try:
            sampled = x.nbytes / R.stream_bytes(x)
        finally:
            R.choose_group = exact
        rows.append((c, dt, x.nbytes / S._v5_bytes(v5, x), v6, sampled))
        print(f"| {c} | {dt} | {rows[-1][2]:.4f} | {v6:.4f} | {sampled:.4f} | {v6 / rows[-1][2]:.4f} | "
              f"{sampled / rows[-1][2]:.4f} |", flush=True)
    real = [r for r in rows if r[0] != "gaussian"]
    for name, k in (("v6", 3), ("sampled", 4)):
        rel = [r[k] / r[2] for r in real]
        if rel:
            w = int(np.argmin(rel))
            print(f"{name}: geomean / v5 {math.exp(np.mean(np.log(rel))):.4f}, worst {real[w][0]} {real[w][1]} {rel[w]:.4f}")


if __name__ == "__main__":
    main(sys.argv)
