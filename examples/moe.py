"""A mixture-of-experts layer with expert parallelism, dispatch and combine through zip_all_to_all.

    python examples/moe.py            # up to 8 GPUs, or 8 virtual CPU devices (fewer than 2 GPUs), one expert each

Each device holds its tokens and its share of the experts. A router sends
each token to its top-1 expert (up to a capacity per expert; the rest are
dropped and pass through as zeros), the token slots travel to the experts'
devices in bf16 with zip_all_to_all, the experts run there, and the results
come back by a second zip_all_to_all and are weighted by the router's gate.
jax.grad runs the backward pass through the same, compressed, all_to_alls.

all_to_all only moves bytes, so the layer on zip_all_to_all equals the same
layer on lax.all_to_all bit for bit, forward and backward: the script checks it.
It also runs the lax-only layer, unchanged, wrapped in one call,
`zipccl_jax.compressed(fn, strategy="compressed")`, which carries out every
lax collective in it (the backward pass's too) by the zip version.
"""

import functools
import math

from zipccl_jax.bench import devices as device_choice

device_choice.ask_for_virtual_cpus(8)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import zipccl_jax as zc  # noqa: E402

WIRE_DTYPE = jnp.bfloat16  # what the token slots are sent in


def init_params(key, d_model, d_ff, n_experts):
    k1, k2, k3 = jax.random.split(key, 3)
    return {"router": jax.random.normal(k1, (d_model, n_experts)) / math.sqrt(d_model),
            "w_in": jax.random.normal(k2, (n_experts, d_model, d_ff)) / math.sqrt(d_model),
            "w_out": jax.random.normal(k3, (n_experts, d_ff, d_model)) / math.sqrt(d_ff)}


def exchange(x, axis, use_zip, compress=True):
    """x [n * k, ...] -> [n * k, ...]: block j goes to device j, block i of the
    result came from device i. Returns (result, bytes this device sent)."""
    if use_zip:
        out, stats = zc.zip_all_to_all(x, axis, 0, 0, tiled=True, compress=compress, strategy="compressed",
                                       with_stats=True)
        return out, stats.wire_bytes
    n = lax.axis_size(axis)
    return lax.all_to_all(x, axis, 0, 0, tiled=True), jnp.float32(x.size * x.dtype.itemsize * (n - 1) // n)


def moe_layer(params, x, *, axis, capacity, use_zip, compress=True):
    """Inside shard_map: x [tokens, d] this device's tokens; params["w_in"],
    ["w_out"] this device's experts; params["router"] replicated.
    Returns (y [tokens, d], bytes sent)."""
    n, e_local = lax.axis_size(axis), params["w_in"].shape[0]
    n_experts = n * e_local
    probs = jax.nn.softmax(x @ params["router"], axis=-1)  # [t, E]
    expert = jnp.argmax(probs, axis=-1)
    gate = jnp.take_along_axis(probs, expert[:, None], axis=-1)  # [t, 1]
    onehot = jax.nn.one_hot(expert, n_experts, dtype=x.dtype)  # [t, E]
    # each token's place in its expert's queue (-1 for the other experts)
    slot = (jnp.cumsum(onehot, axis=0) * onehot - 1).astype(jnp.int32)
    dispatch = onehot[:, :, None] * jax.nn.one_hot(slot, capacity, dtype=x.dtype)  # [t, E, C]; overflow: all 0
    slots = jnp.einsum("tec,td->ecd", dispatch, x).astype(WIRE_DTYPE)  # [E, C, d], expert e on device e // e_local
    received, sent_in = exchange(slots, axis, use_zip, compress)  # [n sources * e_local, C, d]
    received = received.reshape(n, e_local, capacity, -1).astype(x.dtype)
    h = jax.nn.gelu(jnp.einsum("secd,edf->secf", received, params["w_in"]))
    out = jnp.einsum("secf,efd->secd", h, params["w_out"]).astype(WIRE_DTYPE)
    back, sent_out = exchange(out.reshape(n_experts, capacity, -1), axis, use_zip, compress)  # [E, C, d]
    y = jnp.einsum("tec,ecd->td", dispatch * gate[:, :, None], back.astype(x.dtype))
    return y, sent_in + sent_out


def make_loss(mesh, capacity, use_zip, compress=True, axis="expert", wrap=False):
    """jit (params, x, cotangent) -> (sum(layer(x) * cotangent), bytes sent per device);
    differentiable in params and x. wrap: the lax layer (use_zip=False) inside
    zipccl_jax.compressed (its bytes-sent output stays lax's count)."""
    layer = functools.partial(moe_layer, axis=axis, capacity=capacity, use_zip=use_zip, compress=compress)
    specs = {"router": P(), "w_in": P(axis), "w_out": P(axis)}
    sharded = jax.shard_map(layer, mesh=mesh, in_specs=(specs, P(axis)), out_specs=(P(axis), P()))

    def loss(params, x, cotangent):
        y, sent = sharded(params, x)
        return jnp.sum(y * cotangent), (y, sent)

    step = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)
    # GPU_COMPILER_OPTIONS: on GPUs, XLA's latency-hiding scheduler for a module holding the spill's
    # ragged_all_to_all (docs/GPU.md, "The compiled program"). Importing zipccl_jax turns it on in
    # XLA_FLAGS already; the option keeps it on where a user set ZIPCCL_XLA_FLAGS=0. The CPU takes it too.
    return jax.jit(zc.compressed(step, compress=compress, strategy="compressed") if wrap else step,
                   compiler_options=zc.GPU_COMPILER_OPTIONS)


def setup(n_devices=8, tokens_per_device=256, d_model=128, d_ff=256, capacity_factor=1.25, seed=0):
    """The layer's mesh, parameters (one expert per device), tokens, output
    cotangent (all placed on the mesh) and expert capacity."""
    devices, _ = device_choice.choose(n_devices, need=n_devices)
    mesh = jax.make_mesh((n_devices,), ("expert",), devices=devices)
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    params = init_params(k1, d_model, d_ff, n_devices)
    x = jax.random.normal(k2, (n_devices * tokens_per_device, d_model))
    cotangent = jax.random.normal(k3, x.shape)
    capacity = math.ceil(capacity_factor * tokens_per_device / n_devices)
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    params = {k: put(v, P() if k == "router" else P("expert")) for k, v in params.items()}
    return mesh, params, put(x, P("expert")), put(cotangent, P("expert")), capacity


def compare(n_devices=8, **kw):
    """Forward outputs and gradients of the layer on zip_all_to_all (codec
    on and off) and on lax.all_to_all. Returns {name: (y, grads, bytes sent)}."""
    mesh, params, x, cotangent, capacity = setup(n_devices, **kw)
    results = {}
    for name, kw in {"zip": dict(use_zip=True), "zip, codec off": dict(use_zip=True, compress=False),
                     "lax": dict(use_zip=False), "compressed(lax)": dict(use_zip=False, wrap=True)}.items():
        (_, (y, sent)), grads = make_loss(mesh, capacity, **kw)(params, x, cotangent)
        results[name] = (np.asarray(y), jax.tree.map(np.asarray, grads), float(sent))
    return results


def same_bits(a, b):
    return all(np.array_equal(u.view(np.uint8), v.view(np.uint8))
               for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def main():
    devices, note = device_choice.choose(8)
    print(f"devices: {device_choice.describe(devices)}{f' ({note})' if note else ''}, one expert each")
    results = compare(n_devices=len(devices))
    y_lax, g_lax, raw = results["lax"]
    for name, (y, grads, sent) in results.items():
        print(f"{name:15s} bytes sent per device (dispatch + combine, forward): {sent:10,.0f} "
              f"({device_choice.wire_ratio(raw, sent)} than lax); output and gradients bit-identical to lax: "
              f"{same_bits(y, y_lax) and same_bits(grads, g_lax)}")


if __name__ == "__main__":
    main()
