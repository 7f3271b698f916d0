"""Fully sharded data parallelism: parameters gathered with zip_all_gather, gradients
reduced with zip_psum_scatter, under jit on a 2-D mesh.

    python examples/fsdp.py           # 8 GPUs, or 8 virtual CPU devices, as a 4 (fsdp) x 2 (model) mesh

The float32 master parameters live sharded over `fsdp` (dimension 0) and
`model` (dimension 1). A shard_map is manual over `fsdp` only, so `model`
stays automatic: XLA partitions the matmuls over it. Each step gathers the
parameters in bf16 (zip_all_gather), computes the local batch's gradients,
reduces them in bf16 to each device's shard (zip_psum_scatter: float32 sums
in rank order, rounded once) and updates the shard with SGD.

The same step on lax.all_gather / lax.psum_scatter (float32: a bf16 psum in a
partially manual shard_map aborts XLA:CPU) gives the same losses bit for bit
(all_gather moves bytes) and the same parameters to rounding (the reduction
orders differ); with the codec off (compress=False) zip gives the same bits.
"""

import functools

from zipccl_jax.bench import devices as device_choice

device_choice.ask_for_virtual_cpus(8)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import zipccl_jax as zc  # noqa: E402

WIRE_DTYPE = jnp.bfloat16
PARAM_SPECS = {"w1": P("fsdp", "model"), "w2": P("fsdp", None)}


def init_params(key, d_in, d_hidden):
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (d_in, d_hidden)) / np.sqrt(d_in),
            "w2": jax.random.normal(k2, (d_hidden, d_in)) / np.sqrt(d_hidden)}


def mse(params, x, y):
    return jnp.mean((jax.nn.gelu(x @ params["w1"]) @ params["w2"] - y) ** 2)


def gather(shards, use_zip, compress):
    if use_zip:
        return zc.zip_all_gather(shards, "fsdp", tiled=True, compress=compress, strategy="compressed",
                                 with_stats=True)
    full = lax.all_gather(shards, "fsdp", tiled=True)
    return full, zc.Stats(jnp.float32(0), jnp.float32(0))


def reduce_scatter(grads, use_zip, compress):
    if use_zip:
        return zc.zip_psum_scatter(grads, "fsdp", tiled=True, compress=compress, strategy="compressed",
                                   with_stats=True)
    out = jax.tree.map(lambda g: lax.psum_scatter(g.astype(jnp.float32), "fsdp", tiled=True), grads)
    return out, zc.Stats(jnp.float32(0), jnp.float32(0))


def local_step(shards, x, y, *, lr, use_zip, compress):
    """One SGD step inside shard_map (manual over fsdp): shards and the batch
    rows are this fsdp rank's. Returns (new shards, mean loss, wire, raw bytes)."""
    n = lax.axis_size("fsdp")
    full, gathered = gather(jax.tree.map(lambda w: w.astype(WIRE_DTYPE), shards), use_zip, compress)
    full = {k: lax.with_sharding_constraint(w, P(None, *PARAM_SPECS[k][1:])) for k, w in full.items()}
    loss, grads = jax.value_and_grad(mse)(jax.tree.map(lambda w: w.astype(jnp.float32), full), x, y)
    grads, reduced = reduce_scatter(jax.tree.map(lambda g: g.astype(WIRE_DTYPE), grads), use_zip, compress)
    shards = jax.tree.map(lambda w, g: w - lr * g.astype(jnp.float32) / n, shards, grads)
    stats = gathered + reduced
    return shards, lax.pmean(loss, "fsdp"), stats.wire_bytes, stats.raw_bytes


def make_step(mesh, lr=0.1, use_zip=True, compress=True):
    """jit (params, x, y) -> (params, loss, wire bytes, raw bytes) per fsdp rank."""
    body = functools.partial(local_step, lr=lr, use_zip=use_zip, compress=compress)
    specs = {k: P("fsdp") for k in PARAM_SPECS}  # only the manual axis; `model` stays automatic
    # GPU_COMPILER_OPTIONS: on GPUs, XLA's latency-hiding scheduler for a module holding the spill's
    # ragged_all_to_all (docs/GPU.md, "The compiled program"). Importing zipccl_jax turns it on in
    # XLA_FLAGS already; the option keeps it on where a user set ZIPCCL_XLA_FLAGS=0. The CPU takes it too.
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(specs, P("fsdp"), P("fsdp")),
                                 out_specs=(specs, P(), P(), P()), axis_names={"fsdp"}),
                   compiler_options=zc.GPU_COMPILER_OPTIONS)


def make_mesh(fsdp=4, model=2):
    """The default platform's first fsdp * model devices, or the CPU's if it has fewer."""
    devices, _ = device_choice.choose(fsdp * model, need=fsdp * model)
    return jax.make_mesh((fsdp, model), ("fsdp", "model"), axis_types=(AxisType.Auto, AxisType.Auto), devices=devices)


def problem(d_in=256, d_hidden=512, batch=256, seed=0):
    """Initial float32 parameters and a batch (x, y) of a fixed random teacher."""
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(k2, (batch, d_in))
    return init_params(k1, d_in, d_hidden), x, jnp.sin(x @ jax.random.normal(k3, (d_in, d_in)) / np.sqrt(d_in))


def train(steps=3, d_in=256, d_hidden=512, batch=256, seed=0, **kw):
    """Trains on a fixed random teacher; returns (losses, params, wire, raw bytes per step)."""
    mesh = make_mesh()
    params, x, y = problem(d_in, d_hidden, batch, seed)
    params = {k: jax.device_put(v, NamedSharding(mesh, PARAM_SPECS[k])) for k, v in params.items()}
    x, y = (jax.device_put(a, NamedSharding(mesh, P("fsdp"))) for a in (x, y))
    step = make_step(mesh, **kw)
    losses = []
    for _ in range(steps):
        params, loss, wire, raw = step(params, x, y)
        losses.append(np.asarray(loss))
    return losses, jax.tree.map(np.asarray, params), float(wire), float(raw)


def main():
    runs = {"zip": train(), "zip, codec off": train(compress=False), "lax": train(use_zip=False)}
    z_losses, z_params, wire, raw = runs["zip"]
    devices, note = device_choice.choose(8, need=8)
    print(f"mesh 4 (fsdp) x 2 (model) of {device_choice.describe(devices)}{f' ({note})' if note else ''}; zip bytes "
          f"per step per device: {wire:,.0f} vs {raw:,.0f} raw ({device_choice.wire_ratio(raw, wire)})")
    for name, (losses, params, _, _) in runs.items():
        same = all(np.array_equal(a.view(np.uint32), b.view(np.uint32))
                   for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(z_params)))
        diff = max(np.abs(a - b).max() for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(z_params)))
        print(f"{name:15s} losses {[f'{v:.6f}' for v in losses]}; params bit-identical to zip: {same} "
              f"(largest difference {diff:.2e})")


if __name__ == "__main__":
    main()
