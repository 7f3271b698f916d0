"""The zip collectives on every kind of mesh JAX's shard_map_test covers: fully
manual Auto and Explicit meshes with check_vma on and off, tuples of axes,
partially manual meshes (manual over `data`, `model` Auto or Explicit), and
unreduced/reduced types (test_unreduced_psum_fwd_preduced_bwd,
test_all_gather_reduced_fwd_unreduced_psum_scatter_bwd,
test_unreduced_psum_scatter_fwd_all_gather_reduced_bwd,
test_shmap_unreduced_fsdp_grad, test_shmap_unreduced_fsdp_custom_vjp_bwd).
Results are numpy's from the inputs, types are lax's, and on a partially
manual Explicit mesh no collective runs over `model` (checked in the HLO)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from conftest import cpu_devices
from parity import FIVE, LAX, N, all_five, assert_bits, assert_collectives_only_over, assert_compressed, \
    collective, collectives, compile_and_run, expected, expected_five, manual_type, moved, operand, per_rank, \
    replica_groups, summed, zip_ops

pytestmark = pytest.mark.usefixtures("zip_strategy")

AXIS_TYPES = {"explicit": AxisType.Explicit, "auto": AxisType.Auto}


@pytest.mark.parametrize("check_vma", [True, False], ids=["vma", "no_vma"])
@pytest.mark.parametrize("axis_type", AXIS_TYPES)
def test_fully_manual_meshes(axis_type, check_vma, zip_strategy):
    mesh = jax.make_mesh((N,), ("d",), axis_types=(AXIS_TYPES[axis_type],), devices=cpu_devices())
    g, k = moved((N, 16, 3), seed=1), summed((N, 16, 3), seed=2)
    types = {}

    def body(c, key):
        def run(a, b):
            out = all_five(c, "d", N, a, b)
            types[key] = jax.tree.map(manual_type, out) if check_vma else None
            return out
        return run

    f_lax, args = per_rank(mesh, body(LAX, "lax"), g, k, check_vma=check_vma)
    jax.eval_shape(f_lax, *args)  # traced only: lax's types
    f, args = per_rank(mesh, body(zip_ops(), "zip"), g, k, check_vma=check_vma)
    out, hlo = compile_and_run(f, *args)
    for name, want in expected_five(g, k).items():
        assert_bits(out[name], want, name)
    assert types["zip"] == types["lax"]
    assert_compressed(hlo, zip_strategy)


def test_tuples_of_axes_on_a_2d_mesh(zip_strategy):
    """Over (a, b) the rank is a * 4 + b; over b alone, 4 ranks per a; over a, 2 per b."""
    mesh = jax.make_mesh((2, 4), ("a", "b"), devices=cpu_devices())
    g, k = moved((N, 16, 3), seed=3), summed((N, 16, 3), seed=4)

    def body(a, b):
        c = zip_ops()
        return all_five(c, ("a", "b"), N, a, b), all_five(c, "b", 4, a, b), all_five(c, "a", 2, a, b)

    f, args = per_rank(mesh, body, g, k, spec=P(("a", "b")))
    (over_ab, over_b, over_a), hlo = compile_and_run(f, *args)
    for name, want in expected_five(g, k).items():
        assert_bits(over_ab[name], want, f"{name} over (a, b)")
    g2, k2 = g.reshape(2, 4, 16, 3), k.reshape(2, 4, 16, 3)
    for name in FIVE:
        by_a = np.stack([expected_five(g2[i], k2[i])[name] for i in range(2)])
        assert_bits(over_b[name], by_a.reshape(N, *by_a.shape[2:]), f"{name} over b")
        by_b = np.stack([expected_five(g2[:, j], k2[:, j])[name] for j in range(4)], axis=1)
        assert_bits(over_a[name], by_b.reshape(N, *by_b.shape[2:]), f"{name} over a")
    assert_compressed(hlo, zip_strategy)


# manual over `data` (4), `model` (2) automatic; the block's dimension 1 is
# sharded over `model`, so the collectives work along dimension 0
ALONG_0 = {"all_gather": dict(axis=0), "all_to_all": dict(concat_axis=0)}


@pytest.mark.parametrize("name", FIVE)
@pytest.mark.parametrize("model", AXIS_TYPES)
def test_partially_manual_mesh(model, name, zip_strategy):
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit, AXIS_TYPES[model]),
                         devices=cpu_devices())
    # bf16: lax.psum of bf16 here aborts XLA:CPU, ours must not. Blocks of
    # 576 bytes: all_gather's memory bound leaves a smaller one no compressed rung
    xs = operand(name, (4, 96, 6), seed=5)
    x = jax.device_put(xs.reshape(4 * 96, 6), NamedSharding(mesh, P("data", "model")))
    inner = []

    def body(a):
        out = collective(zip_ops(), name, a, "data", 4, **ALONG_0.get(name, {}))
        inner.append(jax.typeof(out).sharding.spec)
        return out[None]

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=P("data"), axis_names={"data"}))
    out, hlo = compile_and_run(f, x)
    assert_bits(out, expected(name, xs, **ALONG_0.get(name, {})), name)
    if model == "explicit":  # the types keep `model`'s sharding, and no collective crosses `model`
        assert inner == [P(None, "model")] and out.sharding.spec == P("data", None, "model")
        assert_collectives_only_over(hlo, mesh, {"data"})
    assert_compressed(hlo, zip_strategy)


def test_replica_groups_are_read_in_every_spelling():
    """The HLO reader the partially manual test relies on."""
    assert replica_groups("{{0,2,4,6},{1,3,5,7}}") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert replica_groups("[4,2]<=[8]") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert replica_groups("[2,4]<=[4,2]T(1,0)") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert replica_groups("mesh['data'=4,'model'=2] {'data'}") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert replica_groups("mesh['data'=4,'model'=2] {'model'}") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert replica_groups("{}") is None
    line = ("%cp = bf16[8,6]{1,0} collective-permute(bf16[8,6]{1,0} %p), channel_id=1, "
            'source_target_pairs={{0,2},{2,4}}, metadata={op_name="jit(f)/shard_map/ppermute"}')
    assert collectives(line) == [("collective-permute", [[0, 2], [2, 4]], "jit(f)/shard_map/ppermute")]


# ---------------------------------------------------------------------------- unreduced and reduced

@pytest.fixture(scope="module")
def mesh_x():
    return jax.make_mesh((N,), ("x",), axis_types=(AxisType.Explicit,), devices=cpu_devices())


@pytest.fixture(scope="module")
def mesh_data_seq():
    return jax.make_mesh((2, 4), ("data", "seq"), axis_types=(AxisType.Explicit,) * 2, devices=cpu_devices())


def matmul_grads(x, y):
    """d/dx and d/dy of sum(x @ y) (any leading batch dimensions of x)."""
    ones = np.ones(x.shape[:-1] + y.shape[1:], np.float32)
    batch = list(range(x.ndim - 1))
    return ones @ y.T, np.tensordot(x, ones, axes=(batch, batch))


def check_sum_of_matmul(f, mesh, x, y, grad_specs, strategy):
    """f(x, y) = sum(x @ y) with collectives inside: its value and gradients
    (exact, the data being small integers) and the gradients' shardings."""
    out, hlo = compile_and_run(jax.jit(f), x, y)
    assert out.sharding == NamedSharding(mesh, P())
    assert float(out) == float(np.sum(np.asarray(x) @ np.asarray(y)))
    gx, gy = jax.jit(jax.grad(f, argnums=(0, 1)))(x, y)
    assert (gx.sharding.spec, gy.sharding.spec) == grad_specs
    for got, want in zip((gx, gy), matmul_grads(np.asarray(x), np.asarray(y))):
        assert_bits(got, want.astype(np.float32))
    assert_compressed(hlo, strategy)


def test_psum_of_an_unreduced_input_and_its_reduced_gradient(mesh_x, zip_strategy):
    with jax.set_mesh(mesh_x):
        x = jax.device_put(summed((2, 16), np.float32, seed=1), P(None, "x"))
        y = jax.device_put(summed((16, 6), np.float32, seed=2), P("x", None))
        types = []

        @jax.shard_map(in_specs=P(unreduced={"x"}), out_specs=P())
        def ar(z):
            out = zc.zip_psum(z, "x")
            types.append((manual_type(z), manual_type(out)))
            return out

        f = lambda a, b: ar(jnp.einsum("ab,bc->ac", a, b, out_sharding=P(unreduced={"x"}))).sum()  # noqa: E731
        check_sum_of_matmul(f, mesh_x, x, y, (P(None, "x"), P("x", None)), zip_strategy)
        assert types[0] == ((frozenset(), {"x"}, frozenset()), (frozenset(),) * 3)


def test_all_gather_to_reduced_and_its_unreduced_psum_scatter_gradient(mesh_x, zip_strategy):
    with jax.set_mesh(mesh_x):
        x = jax.device_put(summed((16, 64), np.float32, seed=3), P("x", None))
        y = jax.device_put(summed((64, 8), np.float32, seed=4), P("x", None))  # 256 bytes a device, see fsdp_inputs
        types = []

        @jax.shard_map(in_specs=P("x", None), out_specs=P(None, None, reduced={"x"}))
        def ag(a):
            out = zc.zip_all_gather(a, "x", tiled=True, to="reduced")
            types.append((manual_type(a), manual_type(out)))
            return out

        f = lambda a, b: jnp.einsum("td,df->tf", a, ag(b)).sum()  # noqa: E731
        check_sum_of_matmul(f, mesh_x, x, y, (P("x", None), P("x", None)), zip_strategy)
        assert types[0] == (({"x"}, frozenset(), frozenset()), (frozenset(), frozenset(), {"x"}))


def test_psum_scatter_of_an_unreduced_input_and_its_reduced_all_gather_gradient(mesh_x, zip_strategy):
    with jax.set_mesh(mesh_x):
        x = jax.device_put(summed((8, 16), np.float32, seed=5), P(None, "x"))
        y = jax.device_put(summed((16, 8), np.float32, seed=6), P("x", None))
        types = []

        @jax.shard_map(in_specs=P(unreduced={"x"}), out_specs=P("x", None))
        def rs(z):
            out = zc.zip_psum_scatter(z, "x", tiled=True)
            types.append((manual_type(z), manual_type(out)))
            return out

        f = lambda a, b: rs(jnp.einsum("ab,bc->ac", a, b, out_sharding=P(unreduced={"x"}))).sum()  # noqa: E731
        check_sum_of_matmul(f, mesh_x, x, y, (P(None, "x"), P("x", None)), zip_strategy)
        assert types[0] == ((frozenset(), {"x"}, frozenset()), ({"x"}, frozenset(), frozenset()))


def fsdp_inputs():
    """Activations [batch, time, d] over (data, seq) and weights [d, f] over
    seq, 512 bytes a device: all_gather's memory bound (1.1 x its output)
    leaves a much smaller operand only the raw rung, so no codec to check."""
    return (jax.device_put(summed((8, 4, 32), np.float32, seed=7), P("data", "seq", None)),
            jax.device_put(summed((32, 16), np.float32, seed=8), P("seq", None)))


def test_fsdp_with_reduced_weights_and_unreduced_gradients(mesh_data_seq, zip_strategy):
    """Weights all-gathered to `reduced`; their gradient comes back unreduced,
    scattered over seq and summed over data by the transposes."""
    with jax.set_mesh(mesh_data_seq):
        x, y = fsdp_inputs()
        types = []

        @jax.shard_map(in_specs=P("seq", None), out_specs=P("seq", None, reduced={"data"}))
        def preduced(a):
            return jax.lax.pcast(a, "data", to="reduced")

        @jax.shard_map(in_specs=P("seq", None, reduced={"data"}), out_specs=P(None, None, reduced={"seq", "data"}))
        def ag(a):
            out = zc.zip_all_gather(a, "seq", tiled=True, to="reduced")
            types.append((manual_type(a), manual_type(out)))
            return out

        f = lambda a, b: jnp.einsum("btd,df->btf", a, ag(preduced(b))).sum()  # noqa: E731
        check_sum_of_matmul(f, mesh_data_seq, x, y, (P("data", "seq", None), P("seq", None)), zip_strategy)
        assert types[0] == (({"seq"}, frozenset(), {"data"}), (frozenset(), frozenset(), {"seq", "data"}))


def test_fsdp_custom_vjp_reducing_unreduced_gradients(mesh_data_seq, zip_strategy):
    """A user's custom_vjp whose backward scatters an unreduced gradient over
    seq and sums it over data with the zip collectives."""
    with jax.set_mesh(mesh_data_seq):
        x, y = fsdp_inputs()
        types = []

        @jax.custom_vjp
        def f(a, b):
            ag = jax.shard_map(lambda w: zc.zip_all_gather(w, "seq", tiled=True, to="reduced"),
                               in_specs=P("seq", None), out_specs=P(None, None, reduced={"seq"}))
            return jnp.einsum("btd,df->btf", a, ag(b))

        @jax.shard_map(in_specs=P(unreduced={"data", "seq"}), out_specs=P("seq", None, unreduced={"data"}))
        def rs(g):
            out = zc.zip_psum_scatter(g, "seq", tiled=True)
            types.append((manual_type(g), manual_type(out)))
            return out

        @jax.shard_map(in_specs=P("seq", None, unreduced={"data"}), out_specs=P("seq", None))
        def ar(g):
            out = zc.zip_psum(g, "data")
            types.append((manual_type(g), manual_type(out)))
            return out

        def f_bwd(res, g):
            a, b = res
            a_bar = jnp.einsum("btf,df->btd", g, b, out_sharding=P("data", "seq", None))
            return a_bar, ar(rs(jnp.einsum("btd,btf->df", a, g, out_sharding=P(None, None, unreduced={"data", "seq"}))))

        f.defvjp(lambda a, b: (f(a, b), (a, b)), f_bwd)
        check_sum_of_matmul(lambda a, b: f(a, b).sum(), mesh_data_seq, x, y,
                            (P("data", "seq", None), P("seq", None)), zip_strategy)
        assert types[:2] == [((frozenset(), {"data", "seq"}, frozenset()), ({"seq"}, {"data"}, frozenset())),
                             (({"seq"}, {"data"}, frozenset()), ({"seq"}, frozenset(), frozenset()))]
