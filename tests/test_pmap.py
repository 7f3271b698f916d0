"""The zip collectives inside jax.pmap and inside vmap(axis_name=...), alone and
nested in pmap, as JAX's pmap_test exercises lax's (testGather,
testReduceScatter, testAllToAll, testPpermute, VmapPmapCollectivesTest): each
result is what numpy computes from the inputs, on every rank."""

import jax
import numpy as np
import pytest

from parity import LAX, N, all_five, assert_bits, assert_compressed, assert_same_outcome, collective, \
    compile_and_run, expected, expected_five, lax_outcome, moved, outcome, summed, zip_ops

pytestmark = pytest.mark.usefixtures("zip_strategy")

MOVED, SUMMED = moved((N, 16, 3), seed=1), summed((N, 16, 3), seed=2)


def as_bits(x):
    return jax.lax.bitcast_convert_type(x, f"uint{8 * x.dtype.itemsize}")


def test_collectives_in_pmap(zip_strategy):
    f = jax.pmap(lambda g, k: all_five(zip_ops(), "i", N, g, k), axis_name="i", backend="cpu")
    out, hlo = compile_and_run(f, MOVED, SUMMED)
    for name, want in expected_five(MOVED, SUMMED).items():
        assert_bits(out[name], want, name)
    assert_compressed(hlo, zip_strategy)


def test_collectives_in_vmap_with_an_axis_name():
    f = jax.jit(jax.vmap(lambda g, k: all_five(zip_ops(), "i", N, g, k), axis_name="i"))
    out = f(MOVED, SUMMED)
    for name, want in expected_five(MOVED, SUMMED).items():
        assert_bits(out[name], want, name)


def test_vmap_with_an_axis_name_nested_in_pmap(zip_strategy):
    """pmap over i (4 devices) of vmap over j (2): collectives over j, over i
    and over (i, j), whose ranks are i * 2 + j.

    The results over j are unbatched along j and vmap broadcasts them: they
    leave the body as integer bits, because XLA:CPU on a CPU with AVX512_BF16
    flushes bf16 subnormals in such a broadcast (lax's results too)."""
    def body(g, k):
        c = zip_ops()
        return (jax.tree.map(as_bits, all_five(c, "j", 2, g, k)), all_five(c, "i", 4, g, k),
                {name: collective(c, name, g if name == "all_to_all" else k, ("i", "j"), N)
                 for name in ("psum", "all_to_all")})

    g, k = MOVED.reshape(4, 2, 16, 3), SUMMED.reshape(4, 2, 16, 3)
    nested = jax.pmap(jax.vmap(body, axis_name="j"), axis_name="i", backend="cpu")
    (over_j, over_i, over_ij), hlo = compile_and_run(nested, g, k)
    for name, out in over_j.items():
        want = np.stack([expected_five(g[i], k[i])[name] for i in range(4)])
        assert_bits(out, want.view(f"uint{8 * want.itemsize}"), f"{name} over j")
    for name, out in over_i.items():
        assert_bits(out, np.stack([expected_five(g[:, j], k[:, j])[name] for j in range(2)], axis=1),
                    f"{name} over i")
    for name, out in over_ij.items():
        want = expected(name, MOVED if name == "all_to_all" else SUMMED)
        assert_bits(out, want.reshape(4, 2, *want.shape[1:]), f"{name} over (i, j)")
    assert_compressed(hlo, zip_strategy)


@pytest.mark.parametrize("name", ["all_gather", "psum_scatter", "ppermute"])
def test_collectives_over_a_pmap_and_a_vmap_axis_fail_as_laxs_do(name):
    """lax (0.10.2 to 0.11.2) rejects these over (pmap axis, vmap axis); ours
    does what lax does, whichever way a jax version goes."""
    def program(c):
        return jax.pmap(jax.vmap(lambda a: collective(c, name, a, ("i", "j"), N), axis_name="j"), axis_name="i",
                        backend="cpu")

    x = SUMMED.reshape(4, 2, 16, 3)
    assert_same_outcome(outcome(program(zip_ops()), x), lax_outcome(("pmap-vmap", name), program(LAX), x), name)



def test_ppermute_takes_a_perm_given_as_any_iterable(zip_strategy):
    """JAX's testPpermuteWithZipObject: a zip iterator (read once), a generator and a list of lists
    give what the list of pairs gives."""
    import zipccl_jax as zc

    perm = [N - 1] + list(range(N - 1))
    x = np.arange(N * 1000, dtype=np.float32).reshape(N, 1000)
    for make in (lambda: zip(perm, range(N)), lambda: ((s, d) for s, d in zip(perm, range(N))),
                 lambda: [[s, d] for s, d in zip(perm, range(N))]):
        got = jax.pmap(lambda a, make=make: zc.zip_ppermute(a, "i", make()), axis_name="i", backend="cpu")(x)
        np.testing.assert_array_equal(np.asarray(got), x[perm])
