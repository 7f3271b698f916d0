"""One process of a multi-process run of the compressed collectives (gloo on CPU).

    python multiprocess_worker.py COORDINATOR NUM_PROCESSES PROCESS_ID LOCAL_DEVICES

Every process builds the same global data, runs each collective over all
devices of all processes, checks its own shards against numpy and lax, and
prints "ok <process id>".
"""

import os
import sys

coordinator, num_processes, process_id, local_devices = sys.argv[1], *map(int, sys.argv[2:5])
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={local_devices}"
os.environ["JAX_PLATFORMS"] = "cpu"  # gloo across processes, also on a GPU host

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id,
                           initialization_timeout=60)

import zipccl_jax as zc  # noqa: E402
from zipccl_jax import reference  # noqa: E402
from zipccl_jax.bench.data import gaussian  # noqa: E402

n = jax.device_count()
mesh = jax.make_mesh((n,), ("d",))
m = 6000
x = np.stack([gaussian(m, "bfloat16", seed=i) for i in range(n)])
xs = jax.make_array_from_callback(x.shape, NamedSharding(mesh, P("d")), lambda idx: x[idx])
perm = [(i, (i + 1) % n) for i in range(n)]

cases = {
    "psum": (lambda a: zc.zip_psum(a, "d", strategy="compressed")[None], lambda a: lax.psum(a.astype(jnp.float32), "d")[None]),
    "all_gather": (lambda a: zc.zip_all_gather(a, "d", strategy="compressed")[None], lambda a: lax.all_gather(a, "d")[None]),
    "psum_scatter": (lambda a: zc.zip_psum_scatter(a, "d", tiled=True, strategy="compressed"),
                     lambda a: lax.psum_scatter(a.astype(jnp.float32), "d", tiled=True)),
    "all_to_all": (lambda a: zc.zip_all_to_all(a, "d", 0, 0, tiled=True, strategy="compressed"),
                   lambda a: lax.all_to_all(a, "d", 0, 0, tiled=True)),
    "ppermute": (lambda a: zc.zip_ppermute(a, "d", perm, strategy="compressed"), lambda a: lax.ppermute(a, "d", perm)),
}
total = reference.accumulate(list(x), x.dtype)
for name, (ours_fn, lax_fn) in cases.items():
    outs = []
    for fn in (ours_fn, lax_fn):
        f = jax.jit(jax.shard_map(lambda a: fn(a[0]), mesh=mesh, in_specs=P("d"), out_specs=P("d")))
        outs.append(f(xs))
    for ours, theirs in zip(outs[0].addressable_shards, outs[1].addressable_shards):
        a, b = np.asarray(ours.data), np.asarray(theirs.data)
        if name in ("psum", "psum_scatter"):
            expected = total[None] if name == "psum" else total[ours.index[0]]
            assert a.view(np.uint16).tobytes() == np.asarray(expected).view(np.uint16).tobytes(), name
            np.testing.assert_allclose(a.astype(np.float32), b, rtol=2e-2, atol=2e-2)
        else:
            assert a.tobytes() == b.tobytes(), name
print(f"ok {process_id}", flush=True)
jax.distributed.shutdown()
