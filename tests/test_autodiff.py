"""Autodiff through the zip collectives in both modes, as JAX's tests exercise
lax's (shard_map_test: test_jvp_basic, test_linearize_basic, test_reverse_mode_ad;
pmap_test: testGradOfPsum, testJvpAndPartialEval, testGradOfJvp). Collectives
are linear: jvp, linearize, vjp and linear_transpose in shard_map, and jvp,
linearize, jacfwd, hessian and grad of a pmapped function give lax's numbers;
check_grads (orders 1 and 2, fwd and rev) holds through all five in a chain."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.test_util import check_grads

from conftest import cpu_devices
from zipccl_jax import profile, strategy
from parity import FIVE, LAX, N, assert_bits, assert_compressed, collective, compile_and_run, lax_outcome, summed, \
    zip_ops

pytestmark = pytest.mark.usefixtures("zip_strategy")

# shard_map out_specs of each collective's result: psum's is invariant
OUT = {name: P() if name == "psum" else P("d") for name in FIVE}


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((N,), ("d",), axis_types=(AxisType.Explicit,), devices=cpu_devices())


def test_check_grads_orders_1_and_2_fwd_and_rev_through_every_collective(zip_strategy):
    """One chain through all five, nonlinear in between, so second derivatives
    cross each collective (an Auto mesh: check_grads perturbs unsharded arrays).
    check_grads compiles ~22 programs: a two-rung ladder keeps each small."""
    cpu = strategy.PLATFORM_DEFAULTS["cpu"]
    strategy.install(profile.Profile("cpu", "cpu", cpu.compress_rate, cpu.decompress_rate, (), (), (0.75, 1.0)))
    mesh = jax.make_mesh((N,), ("d",), axis_types=(AxisType.Auto,), devices=cpu_devices())
    c = zip_ops()

    def chain(a):  # a: [16, 3] per device
        p = c.psum(a * a, "d")
        g = c.all_gather(jnp.sin(p) * a, "d", axis=1, tiled=True)  # [16, 24]
        s = c.psum_scatter(jnp.cos(g), "d", scatter_dimension=0, tiled=True)  # [2, 24]
        t = c.all_to_all(s * s, "d", 1, 0, tiled=True)  # [16, 3]
        return c.ppermute(jnp.sin(t), "d", [(i, (i + 3) % N) for i in range(N)])

    f = jax.jit(jax.shard_map(chain, mesh=mesh, in_specs=P("d"), out_specs=P("d")))
    x = jax.device_put(np.random.default_rng(0).normal(0, 0.5, (N * 16, 3)).astype(np.float32),
                       NamedSharding(mesh, P("d")))
    check_grads(f, (x,), order=2, modes=("fwd", "rev"), atol=1e-2, rtol=1e-2)
    assert_compressed(jax.jit(lambda v, t: jax.jvp(f, (v,), (t,))).lower(x, x).compile().as_text(), zip_strategy)


def one(c, name, mesh):
    """shard_map of collective `name` alone over the 1-D mesh."""
    return jax.shard_map(lambda a: collective(c, name, a, "d", N), mesh=mesh, in_specs=P("d"), out_specs=OUT[name])


@pytest.mark.parametrize("name", FIVE)
def test_jvp_linearize_vjp_and_transpose_give_laxs_results(name, mesh, zip_strategy):
    def program(c):
        g = one(c, name, mesh)

        def run(x, t, ct):
            y, y_dot = jax.jvp(g, (x,), (t,))
            y_lin, lin = jax.linearize(g, x)
            (x_bar,) = jax.vjp(g, x)[1](ct)
            (x_bar_t,) = jax.linear_transpose(g, x)(ct)
            return y, y_dot, y_lin, lin(t), x_bar, x_bar_t
        return jax.jit(run)

    x, t = (jax.device_put(summed((N * 16, 3), seed=s), NamedSharding(mesh, P("d"))) for s in (1, 2))
    out = jax.eval_shape(one(LAX, name, mesh), x)
    ct = jax.device_put(summed(out.shape, seed=3), NamedSharding(mesh, OUT[name]))
    ours, hlo = compile_and_run(program(zip_ops()), x, t, ct)
    assert_bits(ours, lax_outcome(("linear", name), program(LAX), x, t, ct), name)
    assert_compressed(hlo, zip_strategy)


@pytest.mark.parametrize("name", FIVE)
def test_forward_and_reverse_mode_of_a_pmapped_function(name, zip_strategy):
    """jvp, linearize, jacfwd, hessian and grad of pmap(f), f one collective."""
    def program(c):
        f = jax.pmap(lambda a: collective(c, name, a, "i", N), axis_name="i", backend="cpu")
        loss = lambda x: jnp.sum(jnp.sin(f(x)))  # noqa: E731

        def run(x, t):
            y, y_dot = jax.jvp(f, (x,), (t,))
            y_lin, lin = jax.linearize(f, x)
            return y, y_dot, y_lin, lin(t), jax.jacfwd(f)(x), jax.hessian(loss)(x), jax.grad(loss)(x)
        return jax.jit(run)

    x, t = summed((N, 8, 2), np.float32, seed=5), summed((N, 8, 2), np.float32, seed=6)
    ours, hlo = compile_and_run(program(zip_ops()), x, t)
    theirs = lax_outcome(("pmap", name), program(LAX), x, t)
    assert_bits(ours[:4], theirs[:4], f"{name} jvp/linearize")  # linear in exactly summable data
    for what, a, b in zip(("jacfwd", "hessian", "grad"), ours[4:], theirs[4:]):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-5, atol=1e-6, err_msg=f"{name} {what}")
    assert_compressed(hlo, zip_strategy)
