"""Demo: compressed gradient all-reduce with zip_psum on 8 devices.

Each device holds its own bf16 gradients (a pytree, as a model's would be).
zip_psum sums them across the `data` axis inside shard_map: compressed
reduce-scatter, then compressed all-gather. The demo prints the bytes each
device put on the wire against the uncompressed algorithm, checks the result
bit for bit against numpy summing in rank order in float32 and against the
same algorithm with the codec off, and compares it with lax.psum.

Runs on up to 8 GPUs, or on 8 virtual CPU devices when there are fewer than
two GPUs (it says which):
    python examples/demo.py
"""

from zipccl_jax.bench import devices as device_choice

device_choice.ask_for_virtual_cpus(8)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import zipccl_jax as zc  # noqa: E402
from zipccl_jax import reference, strategy  # noqa: E402


def fake_gradients(n_dev: int):
    """Per-device gradient pytrees: [n_dev, ...] leaves of a small transformer."""
    shapes = {"embed": (8192, 256), "attn": (4, 256, 768), "mlp_in": (4, 256, 1024), "mlp_out": (4, 1024, 256),
              "norm": (9, 256)}
    keys = jax.random.split(jax.random.key(0), len(shapes))
    return {name: (jax.random.normal(k, (n_dev, *shape)) * 1e-3).astype(jnp.bfloat16)
            for k, (name, shape) in zip(keys, shapes.items())}


def main():
    devices, note = device_choice.choose(8)
    n_dev = len(devices)
    mesh = jax.make_mesh((n_dev,), ("data",), devices=devices)
    grads = jax.device_put(fake_gradients(n_dev), NamedSharding(mesh, P("data")))
    local = lambda t: jax.tree.map(lambda a: a[0], t)  # noqa: E731

    def all_reduce(compress):
        def body(t):
            out, stats = zc.zip_psum(local(t), "data", compress=compress, strategy="compressed", with_stats=True)
            return out, stats.wire_bytes[None], stats.raw_bytes[None]
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=(P(), P("data"), P("data"))))

    strategy.last_plans(clear=True)
    summed, wire, raw = all_reduce(True)(grads)
    wire, raw = float(np.asarray(wire)[0]), float(np.asarray(raw)[0])
    plans = strategy.last_plans()
    unzipped, _, _ = all_reduce(False)(grads)
    lax_sum = jax.jit(jax.shard_map(lambda t: lax.psum(jax.tree.map(lambda a: a.astype(jnp.float32), local(t)), "data"),
                                    mesh=mesh, in_specs=P("data"), out_specs=P()))(grads)

    exact = all(np.array_equal(np.asarray(summed[k]).view(np.uint16),
                               reference.accumulate(list(np.asarray(grads[k])), np.dtype(jnp.bfloat16)).view(np.uint16))
                for k in grads)
    same = all(np.array_equal(np.asarray(summed[k]).view(np.uint16), np.asarray(unzipped[k]).view(np.uint16))
               for k in grads)
    err = max(float(jnp.max(jnp.abs(summed[k].astype(jnp.float32) - lax_sum[k]))) for k in grads)
    n_values = sum(v.size // n_dev for v in grads.values())
    print(f"devices: {device_choice.describe(devices)}{f' ({note})' if note else ''}; gradients: {len(grads)} leaves, "
          f"{n_values:,} bf16 values per device")
    print(f"plan: {len(plans)} bucket(s), {plans[0].algorithm}")
    print(f"bytes on the wire per device: {wire:,.0f} compressed vs {raw:,.0f} raw "
          f"({device_choice.wire_ratio(raw, wire)})")
    print(f"bit-identical to the rank-ordered fp32 numpy sum: {exact}; to compress=False: {same}")
    print(f"largest difference from lax.psum in float32: {err:.2e}")
    if not (exact and same):
        raise SystemExit("mismatch")


if __name__ == "__main__":
    main()
