"""Several compressed collectives in flight in one jitted step, on different
axes of a 2-D mesh: each result is checked bit for bit against numpy."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from conftest import cpu_devices
from zipccl_jax import reference as ref
from zipccl_jax.bench.data import gaussian, random_bits

D, M, L = 2, 4, 8192  # data axis, model axis, elements per device


def test_five_collectives_on_two_axes_in_one_step():
    mesh = jax.make_mesh((D, M), ("data", "model"), devices=cpu_devices())
    x = np.stack([gaussian(L, "bfloat16", seed=i) for i in range(D * M)]).reshape(D, M, L)
    x[1, 2, :300] = random_bits(300, "bfloat16", seed=9)  # NaN payloads and all
    y = np.stack([gaussian(L, "float32", seed=50 + i) for i in range(D * M)]).reshape(D, M, L)
    pinned = dict(strategy="compressed")

    def step(a, b):
        a, b = a[0, 0], b[0, 0]
        outs = (zc.zip_psum(b, "data", **pinned),
                zc.zip_all_gather(a, "model", tiled=True, **pinned),
                zc.zip_ppermute(a, "data", [(0, 1), (1, 0)], **pinned),
                zc.zip_all_to_all(a.reshape(M, -1), "model", 0, 0, tiled=True, **pinned),
                zc.zip_psum_scatter(b, "model", tiled=True, **pinned))
        return tuple(o[None, None] for o in outs)

    spec = P("data", "model")
    f = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(spec, spec), out_specs=(spec,) * 5))
    psum, gathered, permuted, exchanged, scattered = map(np.asarray, f(
        jax.device_put(x, NamedSharding(mesh, spec)), jax.device_put(y, NamedSharding(mesh, spec))))

    def same(a, b):
        return a.shape == b.shape and a.tobytes() == b.tobytes()

    for i in range(D):
        for j in range(M):
            assert same(psum[i, j], ref.accumulate([y[k, j] for k in range(D)], np.float32))
            assert same(gathered[i, j], np.concatenate(list(x[i])))
            assert same(permuted[i, j], x[1 - i, j])
            assert same(exchanged[i, j], np.concatenate([x[i, k].reshape(M, -1)[j:j + 1] for k in range(M)]))
            total = ref.accumulate([y[i, k] for k in range(M)], np.float32)
            assert same(scattered[i, j], np.split(total, M)[j])
