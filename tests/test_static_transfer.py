"""The CUDA lowering's transfers (collectives/_transfer.py static_transfer) run on the 8 virtual CPU
devices, with XLA:GPU's ragged_all_to_all emulated: every collective bit-exact for every bit
pattern, the bytes the design promises on the wire, and the same bits as the CPU's ladder under
the transformations lax's collectives take (grad, jvp, vmap, pmap)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from conftest import cpu_devices
from test_collectives import FLOATS, N, bits, emulated_ragged_all_to_all, per_device, rank_sum, run
from zipccl_jax import reference as ref
from zipccl_jax import strategy
from zipccl_jax.bench.data import gaussian, random_bits
from zipccl_jax.collectives import _transfer
from zipccl_jax.collectives._transfer import static_capacity

PARTIAL = [(0, 3), (3, 5), (6, 0)]


@pytest.fixture
def static_on_cpu(monkeypatch):
    monkeypatch.setattr(_transfer, "STATIC_PLATFORMS", frozenset({"cpu"}))
    monkeypatch.setattr(_transfer, "ragged_all_to_all", emulated_ragged_all_to_all)


def data(kind, shape, dtype, seed=0):
    if kind == "gauss":
        return per_device(shape, dtype, seed=seed)
    size = int(np.prod(shape))
    return np.stack([random_bits(size, dtype, seed=seed + i) for i in range(N)]).reshape(N, *shape)


def with_wire(collective):
    """collective(a) -> (result, Stats) as a pair of arrays shard_map can return per device."""
    def fn(a):
        out, stats = collective(a)
        return out, stats.wire_bytes[None]
    return fn


def gathered(x):
    """What every device holds after a (non-tiled) all_gather of x's rows: x, for each device."""
    return np.broadcast_to(x[None], (N, *x.shape)).reshape(N * N, *x.shape[1:])


def permuted(x, perm):
    out = np.zeros_like(x)
    for s, d in perm:
        out[d] = x[s]
    return out


@pytest.mark.parametrize("kind", ["gauss", "random_bits"])
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_every_collective_moves_the_exact_bits(static_on_cpu, dtype, kind):
    """Gaussians fill the static capacity; random bits (NaN payloads, infinities, subnormals) are
    stored raw and spill all but the capacity: both arrive bit for bit."""
    x = data(kind, (8, 600), dtype)
    sums = kind == "gauss"  # sums of random bits hold NaNs whose payloads no sum contract fixes
    if sums:
        psum = run(lambda a: zc.zip_psum(a, "d", strategy="compressed"), x, out_specs=P())
        assert bits(psum) == bits(rank_sum(x, dtype))
        scattered = run(lambda a: zc.zip_psum_scatter(a, "d", strategy="compressed"), x)
        assert bits(scattered) == bits(rank_sum(x, dtype))
    ours = run(lambda a: zc.zip_all_gather(a, "d", strategy="compressed"), x)
    assert bits(ours) == bits(gathered(x))
    ours = run(lambda a: zc.zip_all_to_all(a, "d", 0, 0, strategy="compressed"), x)
    assert bits(ours) == bits(np.swapaxes(x, 0, 1))
    for perm in (PARTIAL, [(i, (i + 3) % N) for i in range(N)]):
        ours = run(lambda a, perm=perm: zc.zip_ppermute(a, "d", perm, strategy="compressed"), x)
        assert bits(ours) == bits(permuted(x, perm))


def spill_bound(dtype, elems):
    """The most a stream sends past the raw bytes: its header, the 4-byte spill length, the capacity's alignment."""
    return ref.HEADER_BYTES + 4 + 8


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_wire_bytes_are_the_static_capacity_or_the_longer_stream(static_on_cpu, dtype):
    """all_gather: each device sends its stream to the 7 others at max(capacity, length) + 4 bytes;
    random bits (stored raw) cost no more than raw plus a small constant per copy."""
    m = 6000
    model = strategy.model_for(("d",), platform="cpu")
    c = static_capacity(model, dtype, m)
    assert c == -(-int(ref.HEADER_BYTES + strategy.static_fraction(model, dtype) * m * np.dtype(dtype).itemsize)
                  // 8) * 8
    for kind in ("gauss", "random_bits"):
        x = data(kind, (m,), dtype, seed=5)
        _, wire = run(with_wire(lambda a: zc.zip_all_gather(a, "d", strategy="compressed", with_stats=True)), x,
                      out_specs=(P("d"), P("d")))
        lengths = [len(ref.compress(x[d])) for d in range(N)]
        assert wire.tolist() == [(N - 1) * (max(length, c) + 4.0) for length in lengths]
        if kind == "random_bits":
            raw = m * np.dtype(dtype).itemsize
            assert all(length > c for length in lengths)  # everything past c spilled
            assert all(w <= (N - 1) * (raw + spill_bound(dtype, m)) for w in wire)


def test_data_compressing_as_expected_spill_nothing(static_on_cpu, monkeypatch):
    """Gaussian bf16 (ratio 1.5, the model's) fits the static capacity: each copy costs exactly the
    capacity and the spill length. With a capacity of the full stream there is no ragged transfer
    in the program at all."""
    m = 8 * 4096
    x = np.stack([gaussian(m, jnp.bfloat16, seed=i) for i in range(N)])
    c = static_capacity(strategy.model_for(("d",), platform="cpu"), jnp.bfloat16, m)
    _, wire = run(with_wire(lambda a: zc.zip_all_gather(a, "d", strategy="compressed", with_stats=True)), x,
                  out_specs=(P("d"), P("d")))
    assert wire.tolist() == [(N - 1) * (c + 4.0)] * N

    def refuse(*args, **kw):
        raise AssertionError("a ragged transfer where nothing can spill")

    monkeypatch.setattr(_transfer, "ragged_all_to_all", refuse)
    monkeypatch.setattr(strategy, "static_fraction", lambda model, dtype: 1.0)
    ours = run(lambda a: zc.zip_all_gather(a, "d", strategy="compressed"), x)
    assert bits(ours) == bits(gathered(x))


def ladder_and_static(fn, *args):
    """fn(*args) with the CPU's ladder, then with the static transfer: (ladder's, static's)."""
    first = fn(*args)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_transfer, "STATIC_PLATFORMS", frozenset({"cpu"}))
        mp.setattr(_transfer, "ragged_all_to_all", emulated_ragged_all_to_all)
        jax.clear_caches()
        second = fn(*args)
    jax.clear_caches()
    return first, second


def test_transformations_give_the_ladders_bits():
    """grad (all_gather's transpose is a compressed psum_scatter, psum's a pvary), jvp, vmap with an
    axis name and pmap run the same algorithm on the static transfer as on the CPU's ladder."""
    mesh = jax.make_mesh((N,), ("d",), devices=cpu_devices())
    x = jax.device_put(per_device((4, 1000), jnp.float32, seed=3), NamedSharding(mesh, P("d")))

    def loss(a):
        g = zc.zip_all_gather(a[0], "d", axis=0, tiled=True, strategy="compressed")
        return jnp.sum(jnp.sin(g) * jnp.arange(g.shape[0])[:, None])[None]

    grad = jax.jit(jax.shard_map(jax.grad(lambda a: loss(a).sum()), mesh=mesh, in_specs=P("d"), out_specs=P("d")))
    jvp = jax.jit(jax.shard_map(lambda a: jax.jvp(loss, (a,), (jnp.cos(a),))[1], mesh=mesh, in_specs=P("d"),
                                out_specs=P("d")))
    vmapped = jax.jit(jax.shard_map(
        lambda a: jax.vmap(lambda r: zc.zip_psum(r, "d", strategy="compressed"))(a[0])[None], mesh=mesh,
        in_specs=P("d"), out_specs=P("d")))
    pmapped = jax.pmap(lambda a: zc.zip_all_to_all(a, "p", 0, 0, strategy="compressed"), axis_name="p",
                       devices=cpu_devices())
    y = per_device((8, 500), jnp.bfloat16, seed=4)
    for fn, arg in ((grad, x), (jvp, x), (vmapped, x), (pmapped, y)):
        ladder, static = ladder_and_static(lambda: np.asarray(fn(arg)))
        assert bits(ladder) == bits(static)
    assert bits(ladder_and_static(lambda: np.asarray(pmapped(y)))[1]) == bits(np.swapaxes(y, 0, 1))


def test_index_groups_and_tuples_of_axes_give_the_ladders_bits():
    """Within axis_index_groups, and over a tuple of axes of a 2-D mesh (rank order row-major), the
    static transfer's positions, spill offsets and receive rows are the ladder's."""
    groups = [[3, 1, 2, 0], [4, 5, 7, 6]]
    x = per_device((8, 700), jnp.bfloat16, seed=6)
    x[:, 1, :] = np.asarray(random_bits(700, jnp.bfloat16, seed=7))  # a row that spills
    calls = [lambda a: zc.zip_psum(a, "d", axis_index_groups=groups, strategy="compressed"),
             lambda a: zc.zip_all_gather(a, "d", axis_index_groups=groups, strategy="compressed"),
             lambda a: zc.zip_psum_scatter(a.reshape(4, -1), "d", axis_index_groups=groups, strategy="compressed")]
    for call in calls:
        ladder, static = ladder_and_static(lambda: run(call, x, check_vma=False))
        assert bits(ladder) == bits(static)
    mesh2 = jax.make_mesh((2, 4), ("a", "b"), devices=cpu_devices())
    y = jax.device_put(per_device((8, 700), jnp.float32, seed=8), NamedSharding(mesh2, P(("a", "b"))))
    gather = jax.jit(jax.shard_map(lambda a: zc.zip_all_gather(a[0], ("a", "b"), strategy="compressed")[None],
                                   mesh=mesh2, in_specs=P(("a", "b")), out_specs=P(("a", "b"))))
    ladder, static = ladder_and_static(lambda: np.asarray(gather(y)))
    assert bits(ladder) == bits(static) == bits(np.broadcast_to(np.asarray(y)[None], (8, 8, 8, 700)))
