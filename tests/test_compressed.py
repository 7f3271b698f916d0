"""zipccl_jax.compressed: lax-only programs adopt the zip collectives with one
call. Each program here is written once against a namespace of collectives
(`c.psum`, ...): with lax's (`LAX`) it is the lax-only program, with zip_ops()
the explicit zip version, and compressed(lax-only program) must equal the
explicit zip version bit for bit, also where the codec runs (asserted in the
compiled HLO under ZIPCCL_STRATEGY=compressed)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from conftest import cpu_devices
from parity import COMPRESS_CALL, FIVE, LAX, N, all_five, assert_bits, assert_compressed, compile_and_run, \
    expected_five, per_rank, zip_ops

pytestmark = pytest.mark.usefixtures("zip_strategy")


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((N,), ("d",), axis_types=(AxisType.Auto,), devices=cpu_devices())


def moe_loss(c, mesh, capacity=4):
    """A top-1 mixture of experts, one expert per device: tokens are routed by
    a replicated router, dispatched with all_to_all, transformed by their
    expert and combined back; the loss is summed over devices."""
    def layer(params, x):  # x: [tokens, d] on each device
        logits = x @ params["router"]
        expert = jnp.argmax(logits, axis=-1)
        gate = jnp.take_along_axis(jax.nn.softmax(logits), expert[:, None], axis=-1)
        onehot = jax.nn.one_hot(expert, N, dtype=x.dtype)
        position = jnp.sum(jnp.cumsum(onehot, axis=0) * onehot, axis=-1).astype(jnp.int32) - 1
        slot = jax.nn.one_hot(position, capacity, dtype=x.dtype)
        route = onehot[:, :, None] * slot[:, None, :]  # [tokens, expert, slot]; overflow dropped
        sent = c.all_to_all(jnp.einsum("tes,td->esd", route, x), "d", 0, 0)  # [source, slot, d]
        hidden = jax.nn.relu(sent @ params["w_in"][0]) @ params["w_out"][0]
        back = c.all_to_all(hidden, "d", 0, 0)  # [expert, slot, d]
        y = jnp.einsum("tes,esd->td", route * gate[:, :, None], back)
        return c.psum(jnp.sum((y - x) ** 2), "d")

    specs = ({"router": P(), "w_in": P("d"), "w_out": P("d")}, P("d"))
    return jax.shard_map(layer, mesh=mesh, in_specs=specs, out_specs=P())


def data_parallel_step(c, mesh):
    """Plain data parallelism (check_vma off, as with pmap): per-device
    gradients over two microbatches, each summed across devices with psum
    inside the scan, then an SGD update; also a psum of the int32 count."""
    def step(w, x, y):
        def micro(acc, batch):
            loss, g = jax.value_and_grad(lambda v: jnp.mean((jnp.tanh(batch[0] @ v["a"]) @ v["b"] - batch[1]) ** 2))(w)
            g = jax.tree.map(lambda t: c.psum(t, "d") / N, g)
            return jax.tree.map(jnp.add, acc, g), c.psum(loss, "d") / N

        g, losses = lax.scan(micro, jax.tree.map(jnp.zeros_like, w), (x.reshape(2, -1, x.shape[-1]),
                                                                       y.reshape(2, -1, y.shape[-1])))
        count = c.psum(jnp.int32(x.shape[0]), "d")
        return jax.tree.map(lambda p, t: p - 0.1 * t, w, g), losses, count

    return jax.shard_map(step, mesh=mesh, in_specs=(P(), P("d"), P("d")), out_specs=(P(), P(), P()),
                         check_vma=False)


def check_like_explicit_zip(lax_program, zip_program, args, strategy, autodiffs_psums=0):
    """compressed(lax_program) gives the explicit zip version's bits and runs
    the codec wherever that version does, and also on the psums autodiff
    makes (the transposes of shard_map's implicit pvary): those are lax's in
    the explicit version, which only replaces the collectives it names."""
    ours, hlo = compile_and_run(jax.jit(zc.compressed(lax_program)), *args)
    theirs, zip_hlo = compile_and_run(jax.jit(zip_program), *args)
    assert_bits(ours, theirs)
    if strategy == "compressed":
        assert hlo.count(COMPRESS_CALL) == zip_hlo.count(COMPRESS_CALL) + autodiffs_psums
    assert_compressed(hlo, strategy)


def test_a_lax_only_moe_layer_and_its_gradients(mesh, zip_strategy):
    k = jax.random.split(jax.random.key(0), 4)
    d, f = 16, 32
    params = {"router": jax.random.normal(k[0], (d, N)), "w_in": jax.random.normal(k[1], (N, d, f)) / 4,
              "w_out": jax.random.normal(k[2], (N, f, d)) / 6}
    shardings = {"router": P(), "w_in": P("d"), "w_out": P("d")}
    params = {n: jax.device_put(v, NamedSharding(mesh, shardings[n])) for n, v in params.items()}
    x = jax.device_put(jax.random.normal(k[3], (N * 16, d)), NamedSharding(mesh, P("d")))
    with_grads = lambda c: jax.value_and_grad(moe_loss(c, mesh))  # noqa: E731
    # 4 all_to_alls (2 and their transposes) + psum; + the router gradient's psum
    check_like_explicit_zip(with_grads(LAX), with_grads(zip_ops()), (params, x), zip_strategy, autodiffs_psums=1)


def test_a_lax_only_data_parallel_training_step(mesh, zip_strategy):
    k = jax.random.split(jax.random.key(1), 4)
    w = {"a": jax.random.normal(k[0], (8, 32)) / 3, "b": jax.random.normal(k[1], (32, 4)) / 6}
    x = jax.device_put(jax.random.normal(k[2], (N * 8, 8)), NamedSharding(mesh, P("d")))
    y = jax.device_put(jax.random.normal(k[3], (N * 8, 4)), NamedSharding(mesh, P("d")))
    lax_step, zip_step = data_parallel_step(LAX, mesh), data_parallel_step(zip_ops(), mesh)
    check_like_explicit_zip(lax_step, zip_step, (w, x, y), zip_strategy)
    ours = jax.jit(zc.compressed(lax_step))(w, x, y)
    assert int(ours[2]) == N * 8  # the int32 psum: lax's result


def test_a_program_without_collectives_is_unchanged(zip_strategy):
    def f(x, n):
        return jnp.sin(x) @ x.T * n, lax.scan(lambda s, r: (s + r, s), jnp.zeros(3), x)[1]

    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    wrapped = zc.compressed(f)
    assert str(jax.make_jaxpr(wrapped, static_argnums=1)(x, 2)) == str(jax.make_jaxpr(f, static_argnums=1)(x, 2))
    lowered = [jax.jit(g, static_argnums=1).lower(x, 2).as_text() for g in (wrapped, f)]
    assert lowered[0] == lowered[1]
    assert_bits(wrapped(x, 2), f(x, 2))


def test_integer_collectives_keep_laxs_results(mesh, zip_strategy):
    a, b = (np.random.default_rng(s).integers(-2**31, 2**31, (N, 16, 3), dtype=np.int64).astype(np.int32)
            for s in (8, 9))

    def body(c):
        return lambda u, v: all_five(c, "d", N, u, v)  # the int32 psums wrap around as lax's do

    f, args = per_rank(mesh, body(LAX), a, b)
    theirs = f(*args)
    ours, hlo = compile_and_run(jax.jit(zc.compressed(f)), *args)
    assert_bits(ours, theirs)
    assert COMPRESS_CALL not in hlo
    for name in ("all_gather", "all_to_all", "ppermute"):  # moved ints are the inputs' bits
        assert_bits(ours[name], expected_five(a, a)[name], name)
    assert set(ours) == set(FIVE)
