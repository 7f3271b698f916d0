"""What filling a group's 12-bit decode table window by window cost a warp (docs/GPU.md, "Seventh
version"): each thread took a range of windows (MSB first) and walked the code runs in it, and a
warp issues what its slowest lane does. Counted from the numpy reference's group code of real
streams, with the SASS's costs of the old fill (FillWindows, 0b5c977: ~88 instructions for the
binary search of a range's first code, ~49 a run, 26 a loop of 4 windows).

    python tools/v6_cuda/fill_runs.py
"""
import math
from collections import Counter

import numpy as np

from zipccl_jax import reference as r6
from zipccl_jax.bench.data import gaussian

SEARCH, RUN, LOOP4 = 88, 49, 26


def group_code(x):
    """The code lengths of x's first group (its table: x must take its group's code)."""
    stream = r6.compress(x)
    at = r6.HEADER_BYTES + r6.DESC_BYTES * -(-x.size // r6.BLOCK)
    assert r6.read_descriptor(stream, 0)["table"], "the first block does not carry a group table"
    return r6.unpack_table(stream[at : at + r6.TABLE_BYTES])


def lane_costs(lengths, windows):
    """Each thread's instructions, a thread per `windows` windows of the 4,096."""
    lens = sorted(int(v) for v in lengths if v)  # canonical order: by length (then symbol)
    starts = np.cumsum([0] + [1 << (12 - v) for v in lens])
    costs = []
    for lo in range(0, 4096, windows):
        runs = np.maximum(0, np.minimum(lo + windows, starts[1:]) - np.maximum(lo, starts[:-1]))
        costs.append(SEARCH + sum(RUN + LOOP4 * math.ceil(r / 4) for r in runs if r))
    return np.array(costs)


def main():
    cases = {"bf16 Gaussian": gaussian(65536, "bfloat16", seed=1),
             "bf16 ReLU output": np.maximum(gaussian(65536, "bfloat16", seed=2), 0).astype("bfloat16")}
    for name, x in cases.items():
        lengths = group_code(x)
        print(f"{name}: {np.count_nonzero(lengths)} codes, by length {sorted(Counter(lengths[lengths > 0].tolist()).items())}")
        warp = lane_costs(lengths, 4096 // 32)  # a row warp's table (AccumulateKernel)
        print(f"  a warp's fill: slowest lane {warp.max()}, mean {warp.mean():.0f}: "
              f"~{32 * warp.max() / 1000:.0f}K thread instructions (32 lanes' worth)")
        cta = lane_costs(lengths, 4096 // 256).reshape(8, 32).max(axis=1)  # a CTA's (DecodeKernel)
        print(f"  a CTA's fill: each warp's slowest thread {cta.tolist()}: ~{32 * cta.sum() / 1000:.0f}K")


if __name__ == "__main__":
    main()
