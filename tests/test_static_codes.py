"""bench/static_codes.py: its sizes are those of bytes really written, its family is deterministic."""

import numpy as np
import pytest

from zipccl_jax import reference as ref
from zipccl_jax.bench import static_codes as sc
from zipccl_jax.bench.data import gaussian, random_bits, special_values


@pytest.fixture(scope="module")
def family():
    """K = 8 derived from the model shapes alone (no real data: seconds)."""
    return sc.derive_families(sc.block_histograms(sc.synthetic_tensors()), (8,))[8]


EXP_BITS = {1: 8, 2: 5, 3: 8}  # per dtype code


def element_fields(v: int, q_ref: int, code: int):
    """One element's (symbol, [(value, bits) stored beside its code]), from its bit pattern alone."""
    exp_bits = EXP_BITS[code]
    width = 8 * ref.LAYOUTS[code][0]
    sign, mag = v >> (width - 1), v & ((1 << (width - 1)) - 1)
    e, t = mag >> (width - 1 - exp_bits), (mag >> (width - 3 - exp_bits)) & 3
    low = mag & ((1 << (width - 3 - exp_bits)) - 1)  # the stored mantissa bits
    if mag == 0:
        return sign << 7 | sc.CLASS_ZERO, []
    d = q_ref - (4 * e + t)
    if 1 <= e < (1 << exp_bits) - 1 and 0 <= d <= sc.MAX_D:
        return sign << 7 | (d + 1), [(low, width - 3 - exp_bits)]
    return sign << 7 | sc.CLASS_ESC, [(4 * e + t, exp_bits + 2), (low, width - 3 - exp_bits)]


def written_bytes(x: np.ndarray, family: np.ndarray, choice: int, q_ref: int) -> int:
    """A block's body written with reference.pack_bits: the width field, deviations and 16 lanes."""
    code = {2: 1, 4: 3}[x.itemsize]
    member, flip = divmod(choice, 2)
    codes = ref.canonical_codes(family[member])
    bits = x.view(np.uint16 if x.itemsize == 2 else np.uint32)
    lanes = []
    for k in range(sc.LANES):
        fields = []
        for v in bits[k :: sc.LANES]:
            sym, stored = element_fields(int(v), q_ref, code)
            sym ^= 128 * flip
            fields += [(int(codes[sym]), int(family[member][sym]))] + stored
        lanes.append(fields)
    width, devs = ref._width([sum(w for _, w in lane) for lane in lanes])
    field = width - ref.WIDTH_SHORT if ref.width_field_bits(width) == 3 else 7 | width << 3
    head = [(field, ref.width_field_bits(width))] + [(d & ((1 << width) - 1), width) for d in devs]
    values, widths = zip(*(head + [f for lane in lanes for f in lane]))
    return len(ref.pack_bits(np.array(values, np.int64), np.array(widths, np.int64)))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_sizes_are_those_of_the_written_bytes(family, dtype):
    sprinkled = gaussian(4096, dtype, seed=3)
    specials = special_values(dtype)
    wide = specials.astype(np.float32)
    odd = specials[~np.isfinite(wide) | (np.abs(wide) < np.finfo(np.float32).tiny)]  # no normal
    sprinkled[::128] = np.resize(odd, 32)  # escapes, zeros and subnormals inside a coded block
    x = np.concatenate([gaussian(4096, dtype, seed=1), random_bits(4096, dtype), sprinkled,
                        np.tile(special_values(dtype), 40), np.zeros(700, dtype), gaussian(900, dtype, seed=2)])
    p = sc.plan(x, family)
    nb = -(-x.size // sc.BLOCK)
    assert p["bytes"] == ref.HEADER_BYTES + sc.DESC_BYTES * nb + p["body"].sum()
    for b in range(nb):
        blk = x[b * sc.BLOCK : (b + 1) * sc.BLOCK]
        if p["choice"][b] < 0:
            assert p["body"][b] == blk.nbytes
            assert min(written_bytes(blk, family, c, p["refs"][b]) for c in range(16)) >= blk.nbytes
        else:
            assert p["body"][b] == written_bytes(blk, family, p["choice"][b], p["refs"][b]) < blk.nbytes
    assert list(p["choice"][:3] < 0) == [False, True, False]  # random bits go raw


def test_family_is_deterministic_and_complete(family):
    again = sc.derive_families(sc.block_histograms(sc.synthetic_tensors()), (8,))[8]
    assert np.array_equal(family, again)
    assert family.shape == (8, 256) and family[:, sc.VALID].min() >= 1 and family.max() <= 12
    assert not family[:, ~sc.VALID].any()
    assert (np.exp2(-family[:, sc.VALID].astype(float)).sum(1) <= 1).all()  # Kraft: prefix codes


def test_gaussian_bfloat16_ratio(family):
    x = gaussian(1 << 20, "bfloat16", seed=7)
    assert x.nbytes / sc.plan(x, family)["bytes"] == pytest.approx(1.5055, abs=5e-4)


def test_group_tables_pay_where_the_family_misses_and_never_cost():
    """The second block kind (a group's own code): a shape no member fits (values near 1, as norm
    weights are) takes it in every group and gains; on Gaussians, which the family fits, a group
    takes it only where it saves, so the size never exceeds the family's alone. The family here is
    fitted on Gaussians only, so that norm-like data is new to it."""
    rng = np.random.default_rng(3)
    gauss_only = sc.derive_families(sc.block_histograms([gaussian(1 << 16, "bfloat16", seed=s) for s in range(4)]),
                                    (8,))[8]
    norm = (1 + 0.01 * rng.standard_normal(16 * sc.BLOCK * 4, dtype=np.float32)).astype(gaussian(1, "bfloat16").dtype)
    plain, tabled = sc.plan(norm, gauss_only), sc.plan_with_group_tables(norm, gauss_only)
    assert tabled["tabled"] == tabled["groups"] == 4 and tabled["bytes"] < 0.9 * plain["bytes"]
    x = gaussian(1 << 18, "bfloat16", seed=9)
    plain, tabled = sc.plan(x, gauss_only), sc.plan_with_group_tables(x, gauss_only)
    assert tabled["bytes"] <= plain["bytes"] and tabled["groups"] == 4


def test_group_table_cost():
    lengths = np.zeros(sc.NSYM, np.int64)
    lengths[[1, 2, 129]] = [1, 2, 2]
    # a flag bit for each of the 244 valid symbols, 4 bits for each of 3 present ones, a byte of use
    assert sc.group_table_bytes(lengths) == (244 + 12 + 7) // 8 + 1


def test_the_study_names_the_version_5_module_it_needs():
    """Version 5's codec is no longer in the tree: the study asks for a build of it by name."""
    with pytest.raises(SystemExit, match="pass --against PATH"):
        sc.run([4])
