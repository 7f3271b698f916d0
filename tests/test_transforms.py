"""The zip collectives inside control flow and transformations, as JAX's
shard_map_test and pmap_test exercise lax's: scan, cond and while_loop
bodies, remat, a user's custom_vjp, vmap without an axis name (lax's batching
rules, whose collectives are compressed too), jit with NamedSharding in and
out shardings, and axis_index_groups (accepted where lax accepts them, lax's
error where lax refuses them)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from conftest import cpu_devices
from zipccl_jax import strategy
from parity import FIVE, LAX, N, all_five, assert_bits, assert_compressed, assert_same_outcome, collective, \
    compile_and_run, expected, expected_five, lax_outcome, moved, outcome, per_rank, ring, summed, zip_ops

pytestmark = pytest.mark.usefixtures("zip_strategy")


@pytest.fixture(scope="module")
def mesh():
    """Auto: jit's in_shardings then place the unsharded arguments (an
    Explicit mesh would type them unsharded, which shard_map refuses)."""
    return jax.make_mesh((N,), ("d",), axis_types=(AxisType.Auto,), devices=cpu_devices())


def test_scan_cond_and_while_loop_bodies(mesh, zip_strategy):
    g, k = moved((N, 16, 3), seed=1), summed((N, 16, 3), seed=2)

    def body(a, b):
        c = zip_ops()

        def step(carry, _):
            return c.ppermute(carry, "d", ring(N)), c.psum_scatter(b, "d", scatter_dimension=0, tiled=True)

        shifted, scattered = lax.scan(step, a, None, length=2)
        everyone = c.psum(jnp.ones((), jnp.int32), "d") == N  # the same on every device
        gathered = lax.cond(everyone, lambda v: c.all_gather(v, "d", axis=1, tiled=True),
                            lambda v: jnp.tile(v, (1, N)), a)
        _, swapped, summed_twice = lax.while_loop(
            lambda s: s[0] < 2, lambda s: (s[0] + 1, c.all_to_all(s[1], "d", 0, 0, tiled=True), s[2] + c.psum(b, "d")),
            (0, a, jnp.zeros_like(b)))
        return shifted, scattered, gathered, swapped, summed_twice

    f, args = per_rank(mesh, body, g, k)
    (shifted, scattered, gathered, swapped, summed_twice), hlo = compile_and_run(f, *args)
    assert_bits(shifted, expected("ppermute", g, perm=ring(N, 2)), "scan: ppermute twice")
    assert_bits(scattered, np.stack([expected("psum_scatter", k)] * 2, axis=1), "scan: psum_scatter")
    assert_bits(gathered, expected("all_gather", g), "cond: all_gather")
    swap = dict(split_axis=0, concat_axis=0)
    assert_bits(swapped, expected("all_to_all", expected("all_to_all", g, **swap), **swap), "while: all_to_all")
    assert_bits(summed_twice, 2 * expected("psum", k), "while: psum")
    assert_compressed(hlo, zip_strategy)


def test_remat_and_a_users_custom_vjp(mesh, zip_strategy):
    """A custom_vjp gathering weights forward and scattering (doubled, so the
    rule is seen to run) backward, under jax.checkpoint: lax's gradients."""
    def program(c):
        @jax.custom_vjp
        def gather(w):
            return c.all_gather(w, "d", axis=0, tiled=True)

        gather.defvjp(lambda w: (gather(w), None),
                      lambda _, ct: (2 * c.psum_scatter(ct, "d", scatter_dimension=0, tiled=True),))

        @jax.checkpoint
        def loss(w, a):
            return c.psum(jnp.sum((gather(w) * a) ** 2) / 2, "d")

        f = jax.shard_map(loss, mesh=mesh, in_specs=P("d"), out_specs=P())
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))

    w, a = (jax.device_put(summed(shape, np.float32, seed=s), NamedSharding(mesh, P("d")))
            for shape, s in (((N * 4, 3), 3), ((N * N * 4, 3), 4)))
    ours, hlo = compile_and_run(program(zip_ops()), w, a)
    theirs = lax_outcome("remat", program(LAX), w, a)
    assert_bits(ours, theirs, "value and gradients")
    assert "remat" in str(jax.make_jaxpr(program(zip_ops()))(w, a))
    assert_compressed(hlo, zip_strategy)


def test_vmap_without_an_axis_name_under_jit_with_named_shardings(mesh, zip_strategy):
    """A batch of 2 per device, vmapped: lax's batching rules move the
    batch dimension; the placement comes from jit's in/out_shardings."""
    g, k = moved((N, 2, 16, 3), seed=5), summed((N, 2, 16, 3), seed=6)
    spec = NamedSharding(mesh, P("d"))
    body = jax.vmap(lambda a, b: all_five(zip_ops(), "d", N, a, b))
    f = jax.jit(jax.shard_map(lambda a, b: jax.tree.map(lambda r: r[None], body(a[0], b[0])), mesh=mesh,
                              in_specs=P("d"), out_specs=P("d")), in_shardings=spec, out_shardings=spec)
    out, hlo = compile_and_run(f, g, k)
    for name in FIVE:
        want = np.stack([expected_five(g[:, i], k[:, i])[name] for i in range(2)], axis=1)
        assert_bits(out[name], want, name)
        assert out[name].sharding == spec
    assert_compressed(hlo, zip_strategy)


GROUPS = [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("mapping", ["pmap", "shard_map"])
@pytest.mark.parametrize("name", [n for n in FIVE if n != "ppermute"])
def test_axis_index_groups_as_lax_takes_them(name, mapping, mesh, zip_strategy):
    """Results where lax accepts them (within each group of 4), lax's error
    where it refuses them."""
    def program(c):
        def one(a):
            return collective(c, name, a, "d", N, axis_index_groups=GROUPS)

        if mapping == "pmap":
            return jax.pmap(one, axis_name="d", backend="cpu")
        return jax.jit(jax.shard_map(lambda a: one(a[0])[None], mesh=mesh, in_specs=P("d"), out_specs=P("d"),
                                     check_vma=False))

    x = summed((N, 48, 3), np.float32, seed=7)  # 576 bytes: above all_gather's memory bound for a codec
    theirs = lax_outcome(("groups", name, mapping), program(LAX), x)
    assert_same_outcome(outcome(program(zip_ops()), x), theirs, f"{name} in {mapping}")
    if not isinstance(theirs, Exception):
        want = np.concatenate([expected(name, x[g]) for g in (slice(0, 4), slice(4, 8))])
        assert_bits(theirs, want, f"lax's {name} in {mapping}")
        assert_compressed(compile_and_run(program(zip_ops()), x)[1], zip_strategy)


UNEVEN = [[0, 1], [2, 3, 4, 5, 6, 7]]


@pytest.mark.parametrize("mapping", ["pmap", "shard_map"])
@pytest.mark.parametrize("name", [n for n in FIVE if n != "ppermute"])
def test_uneven_axis_index_groups_as_lax_takes_them(name, mapping, mesh, zip_strategy):
    """JAX's testPsumUnevenReplicaGroups: groups of different sizes. Where lax takes them (psum) ours
    gives lax's result, sent by XLA's own all-reduce whatever the strategy (the rank-ordered plans
    need all_gather and all_to_all, which take equal groups only), and says so in its plan; where
    lax fails (XLA's verifier: "Invalid replica id -1"), ours raises a ValueError that says what
    is wrong."""
    def program(c):
        def one(a):
            return collective(c, name, a, "d", N, axis_index_groups=UNEVEN)

        if mapping == "pmap":
            return jax.pmap(one, axis_name="d", backend="cpu")
        return jax.jit(jax.shard_map(lambda a: one(a[0])[None], mesh=mesh, in_specs=P("d"), out_specs=P("d"),
                                     check_vma=False))

    x = summed((N, 48, 3), np.float32, seed=8)
    theirs = lax_outcome(("uneven groups", name, mapping), program(LAX), x)
    strategy.last_plans(clear=True)
    ours = outcome(program(zip_ops()), x)
    if isinstance(theirs, Exception):
        assert isinstance(ours, ValueError) and "axis_index_groups must all have the same size, got sizes [2, 6]: " \
            "only psum takes groups of different sizes" in str(ours), f"{name} in {mapping}: {ours!r}"
    else:
        assert_same_outcome(ours, theirs, f"{name} in {mapping}")
        want = np.concatenate([expected(name, x[g]) for g in (slice(0, 2), slice(2, 8))])
        assert_bits(theirs, want, f"lax's {name} in {mapping}")
        plans = strategy.last_plans()
        assert plans and all(p.name == "raw all_reduce" and "axis_index_groups of different sizes" in p.reason
                             for p in plans)
