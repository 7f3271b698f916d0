"""Seed corpus for the coverage-guided fuzzer (fuzz_harness.cc): valid streams
of every dtype and every shape the format has, written by the numpy reference.

    python tests/fuzz_seeds.py DIR
"""

import sys
from pathlib import Path

import numpy as np

from zipccl_jax import reference as ref
from zipccl_jax.bench.data import gaussian, random_bits, special_values

B = 4096  # elements per block (FORMAT.md §1)


def seed_tensors(dtype) -> dict[str, np.ndarray]:
    """Inputs that make the encoder take each path of FORMAT.md §2-§6: family members and their sign
    flips, group codes at the blocks' refs and the group's, raw blocks, escapes, zeros, raw streams."""
    g = gaussian(3 * B + 100, dtype, seed=1)
    scaled = g.copy()
    scaled[B:2 * B] = gaussian(B, dtype, scale=2.0 ** -12, seed=2)  # blocks with their own ref: candidate B
    mixed = g.copy()
    mixed[B:2 * B] = random_bits(B, dtype, seed=3)  # a raw block between coded ones
    with np.errstate(over="ignore"):  # float16 overflows to Inf: escapes too
        wide = (gaussian(2000, "float32", seed=4) * np.exp2(np.random.default_rng(5).integers(-60, 60, 2000))).astype(dtype)
    zeros = g[:3000].copy()
    zeros[::3] = 0  # class ZERO
    special = np.tile(special_values(dtype), 40)
    special[::7] = gaussian(special[::7].size, dtype, seed=6)
    rng = np.random.default_rng(9)
    few_bits = (rng.integers(-64, 64, 2 * B + 50) / 64).astype(dtype)  # fp16/fp32: coded byte planes (§5.4)
    low_zero = gaussian(2 * B + 50, "float32", seed=10).view(np.uint32)
    low_zero[::3] &= 0xFFFFFF00  # fp32: plane 0 coded, plane 1 raw
    positive = np.abs(g)  # the sign coded in the symbols (§4.1)
    skewed = positive.copy()
    skewed[::9] = -skewed[::9]
    skewed[::50] = (skewed[::50].astype(np.float32) * 2.0**-15).astype(dtype)  # many binades below the rest
    relu = np.maximum(g, 0)  # implied zeros (§4.2)
    odd = relu.view(np.uint16 if relu.itemsize == 2 else np.uint32).copy()
    odd[::17] = 1 << (8 * relu.itemsize - 1)  # -0
    odd[::23] = 1  # a subnormal of t = 0: escapes
    return {
        "empty": g[:0], "one": g[:1], "three": g[:3], "small": g[:100], "block": g[:B],
        "blocks_group_ref": g, "blocks_own_ref": scaled, "raw_block": mixed, "escapes": wide,
        "zeros": zeros, "special": special, "stored_raw": random_bits(700, dtype, seed=7),
        "byte_codes": few_bits, "byte_code_plane0": low_zero.view(np.float32).astype(dtype),
        "sign_coded": positive, "sign_coded_wide": skewed, "sign_and_byte_codes": np.abs(few_bits),
        "implied_zeros": relu, "implied_zeros_escapes": odd.view(dtype), "zeros_and_byte_codes": np.maximum(few_bits, 0),
    }


def write_seeds(directory) -> int:
    """Writes one stream per dtype and tensor; returns how many."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    count = 0
    for dtype in ("bfloat16", "float16", "float32"):
        for name, x in seed_tensors(dtype).items():
            (directory / f"seed-{dtype}-{name}").write_bytes(ref.compress(x))
            count += 1
    # two groups of 16 blocks (two group tables), bf16 only to keep the corpus small
    (directory / "seed-bfloat16-two-groups").write_bytes(ref.compress(gaussian(17 * B, "bfloat16", seed=8)))
    return count + 1


if __name__ == "__main__":
    print(write_seeds(sys.argv[1]), "seeds written to", sys.argv[1])
