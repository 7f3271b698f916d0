"""Peak extra memory of the compressed collectives: XLA's static buffer
assignment (compiled memory_analysis), so the figure is the worst case for any
data (every payload buffer at its full, raw-sized capacity).

The bound, per device, with message = the bytes of its input:
    temp <= K * message + 64 KiB,
K = 3 for psum, psum_scatter and all_to_all (the payload, the slices XLA:CPU's
all_to_all cuts from it and the received rows: docs/DESIGN.md says what would
bring it to 2), 2 for ppermute, and N + 1 for all_gather (the N rows it
receives are its output's size: 1.125x the output on 8 devices).
docs/RELIABILITY.md lists the figures next to lax's."""

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from conftest import cpu_devices

N = 8
PERM = [(i, (i + 1) % N) for i in range(N)]
PINNED = dict(strategy="compressed")
COLLECTIVES = {  # name: (ours, lax's, K)
    "psum": (lambda a: zc.zip_psum(a, "d", **PINNED), lambda a: lax.psum(a, "d"), 3),
    "psum_scatter": (lambda a: zc.zip_psum_scatter(a, "d", tiled=True, **PINNED),
                     lambda a: lax.psum_scatter(a, "d", tiled=True), 3),
    "all_to_all": (lambda a: zc.zip_all_to_all(a, "d", 0, 0, tiled=True, **PINNED),
                   lambda a: lax.all_to_all(a, "d", 0, 0, tiled=True), 3),
    "ppermute": (lambda a: zc.zip_ppermute(a, "d", PERM, **PINNED), lambda a: lax.ppermute(a, "d", PERM), 2),
    "all_gather": (lambda a: zc.zip_all_gather(a, "d", tiled=True, **PINNED),
                   lambda a: lax.all_gather(a, "d", tiled=True), N + 1),
}
SLACK = 64 << 10


def temp_bytes(fn, name, m, dtype):
    mesh = jax.make_mesh((N,), ("d",), devices=cpu_devices())
    x = jax.ShapeDtypeStruct((N * m,), dtype, sharding=NamedSharding(mesh, P("d")))
    f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("d"), out_specs=P() if name == "psum" else P("d"),
                              check_vma=False))
    return f.lower(x).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("name", COLLECTIVES)
@pytest.mark.parametrize("dtype,m", [(jnp.bfloat16, 1 << 16), (jnp.bfloat16, 1 << 20), (jnp.float32, 1 << 20)],
                         ids=["bf16-128KiB", "bf16-2MiB", "f32-4MiB"])
def test_peak_extra_memory_is_within_the_stated_bound(name, dtype, m):
    ours, _, k = COLLECTIVES[name]
    message = m * jnp.dtype(dtype).itemsize
    temp = temp_bytes(ours, name, m, dtype)
    assert temp <= k * message + SLACK, f"{name}: {temp} bytes = {temp / message:.2f}x the message"
    assert temp >= min(k - 1, 2) * message  # the payload and received buffers are counted: the measure is real


def test_bf16_psum_needs_less_than_lax_on_cpu():
    """lax moves bf16 as float32 on XLA:CPU (4x the message in temporaries)."""
    ours, theirs, _ = COLLECTIVES["psum"]
    m = 1 << 20
    assert temp_bytes(ours, "psum", m, jnp.bfloat16) < temp_bytes(theirs, "psum", m, jnp.bfloat16)
