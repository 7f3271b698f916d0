"""Peak extra memory of the compressed collectives: XLA's static buffer
assignment (compiled memory_analysis), so the figure is the worst case for any
data (every rung's buffers at their full capacity).

The bound, per device, with message = the bytes of its input:
    lower * message <= temp <= upper * message + 64 KiB.
No worst-case payload exists: a size pass agrees on the rung first, and the
codec writes each stream straight into its own buffer of the rung's capacity
(docs/DESIGN.md, Memory). psum, psum_scatter and all_to_all hold at most the
streams they send and those they receive (upper 2); ppermute what it receives
(1); all_gather the n streams it receives, at most 1.1x its output; psum by
all_gather+local_reduce the n streams it receives and its own (n + 1). The
lower bounds are what the largest compressed rung must hold (its sent and
received streams at 93% of raw), so the measure cannot silently stop
counting them. docs/RELIABILITY.md lists the figures next to lax's."""

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from zipccl_jax import strategy
from conftest import cpu_devices

N = 8
PERM = [(i, (i + 1) % N) for i in range(N)]
PINNED = dict(strategy="compressed")
# compresses (XLA's all-reduce made slower than the byte transfers) by all_gather+local_reduce
GATHER_REDUCE = strategy.CostModel(link_bandwidth=1e6, reduce_bandwidth=1e3, psum_algorithm="all_gather+local_reduce")
COLLECTIVES = {  # name: (ours, lax's, lower, upper) in messages
    "psum": (lambda a: zc.zip_psum(a, "d", **PINNED), lambda a: lax.psum(a, "d"), 1.7, 2),
    "psum_scatter": (lambda a: zc.zip_psum_scatter(a, "d", tiled=True, **PINNED),
                     lambda a: lax.psum_scatter(a, "d", tiled=True), 1.7, 2),
    "all_to_all": (lambda a: zc.zip_all_to_all(a, "d", 0, 0, tiled=True, **PINNED),
                   lambda a: lax.all_to_all(a, "d", 0, 0, tiled=True), 1.7, 2),
    "ppermute": (lambda a: zc.zip_ppermute(a, "d", PERM, **PINNED), lambda a: lax.ppermute(a, "d", PERM), 0.9, 1),
    "all_gather": (lambda a: zc.zip_all_gather(a, "d", tiled=True, **PINNED),
                   lambda a: lax.all_gather(a, "d", tiled=True), 0.9 * N, 1.1 * N),  # 1.1x the output
    "psum_gather_reduce": (lambda a: zc.zip_psum(a, "d", strategy=GATHER_REDUCE), lambda a: lax.psum(a, "d"),
                           0.9 * N, N + 1),
}
SLACK = 64 << 10


def temp_bytes(fn, name, m, dtype):
    mesh = jax.make_mesh((N,), ("d",), devices=cpu_devices())
    x = jax.ShapeDtypeStruct((N * m,), dtype, sharding=NamedSharding(mesh, P("d")))
    summed = name in ("psum", "psum_gather_reduce")
    f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("d"), out_specs=P() if summed else P("d"),
                              check_vma=False))
    return f.lower(x).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("name", COLLECTIVES)
@pytest.mark.parametrize("dtype,m", [(jnp.bfloat16, 1 << 16), (jnp.bfloat16, 1 << 20), (jnp.float32, 1 << 20)],
                         ids=["bf16-128KiB", "bf16-2MiB", "f32-4MiB"])
def test_peak_extra_memory_is_within_the_stated_bound(name, dtype, m):
    ours, _, lower, upper = COLLECTIVES[name]
    message = m * jnp.dtype(dtype).itemsize
    temp = temp_bytes(ours, name, m, dtype)
    assert lower * message <= temp <= upper * message + SLACK, f"{name}: {temp} bytes = {temp / message:.3f}x"


def test_bf16_psum_needs_less_than_lax_on_cpu():
    """lax moves bf16 as float32 on XLA:CPU (4x the message in temporaries)."""
    ours, theirs, _, _ = COLLECTIVES["psum"]
    m = 1 << 20
    assert temp_bytes(ours, "psum", m, jnp.bfloat16) < temp_bytes(theirs, "psum", m, jnp.bfloat16)
