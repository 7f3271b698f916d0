"""The codec as JAX ops: jit, vmap, shard_map typing, sharded jit without gathers, errors."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from conftest import PLATFORMS, cpu_devices, on
from zipccl_jax import reference as ref
from zipccl_jax.ops import varying_axes
from zipccl_jax.bench.data import gaussian, random_bits, special_values
from test_reference import make

DTYPES = [jnp.bfloat16, jnp.float16, jnp.float32]


def bits(x):
    return np.asarray(x).view(np.uint8).tobytes()


def mixed(n, dtype, seed=0):
    """Gaussian data with every special value and a stretch of random bits."""
    x = gaussian(n, dtype, seed=seed)
    s = special_values(dtype)
    x[: s.size] = s
    x[-600:] = random_bits(600, dtype, seed=seed)
    return x


def mesh8(axis_type):
    return jax.make_mesh((8,), ("d",), axis_types=(axis_type,), devices=cpu_devices())


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_jit_round_trip_matches_reference_bytes(dtype, platform):
    x = mixed(7 * 1771, dtype).reshape(-1, 7)
    c = jax.jit(zc.compress)(on(platform, x))
    assert c.payload.shape == (zc.stream_capacity(x.size, dtype),) and c.shape == x.shape
    assert bits(c.payload)[: int(c.nbytes)] == ref.compress(x)
    assert bits(jax.jit(zc.decompress)(c)) == bits(x)


def test_the_cpu_only_mark_passes_through_vmap():
    """A build without the CUDA codec marks every op's operand (ops.codec_guard): vmap of compress must
    still work there, so the mark batches as the identity."""
    from zipccl_jax import ops

    x = jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4)
    for guard in (ops.codec_guard, lambda v: ops.cpu_only(v, "an option")):
        np.testing.assert_array_equal(jax.vmap(guard)(x), x)
        np.testing.assert_array_equal(jax.vmap(guard, in_axes=1, out_axes=1)(x), x)


def test_batch_dims_and_vmap_give_one_stream_per_item():
    x = mixed(4 * 5000, jnp.bfloat16).reshape(4, 50, 100)
    c = zc.compress(x, batch_dims=1)
    cv = jax.vmap(zc.compress)(x)
    assert c.payload.shape == cv.payload.shape == (4, zc.stream_capacity(5000, jnp.bfloat16))
    for i in range(4):
        assert bits(c.payload[i])[: int(c.nbytes[i])] == ref.compress(x[i])
    for i in range(4):  # bytes past a stream's length are unspecified
        assert bits(c.payload[i])[: int(c.nbytes[i])] == bits(cv.payload[i])[: int(cv.nbytes[i])]
    assert bits(zc.decompress(c)) == bits(jax.vmap(zc.decompress)(cv)) == bits(x)
    # vmap over an op that already has batch axes
    c2 = jax.vmap(lambda a: zc.compress(a, batch_dims=1))(x)
    c3 = zc.compress(x, batch_dims=2)
    assert bits(c2.nbytes) == bits(c3.nbytes)
    for i in range(4):
        for j in range(50):
            assert bits(c2.payload[i, j])[: int(c2.nbytes[i, j])] == bits(c3.payload[i, j])[: int(c3.nbytes[i, j])]


def test_incompressible_payload_is_stored_raw_within_capacity():
    x = random_bits(10_000, jnp.float32)
    c = zc.compress(x)
    assert int(c.nbytes) == c.payload.shape[-1] == 16 + x.nbytes
    assert bits(zc.decompress(c)) == bits(x)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("out_dtype", [None, jnp.float32])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_decompress_accumulate_is_bit_exact_with_ordered_fp32_sum(dtype, out_dtype, platform):
    """NaN payloads and signs included (FORMAT.md §7's NaN rule, not the platform's arithmetic)."""
    k, m = 5, 6000
    chunks = np.stack([gaussian(m, dtype, scale=10.0 ** (i - 2), seed=i) for i in range(k)])
    chunks[0, :10] = special_values(dtype)[:10]
    chunks[1:4, 2000:4000] = [make("nans", 2000, dtype, seed=s) for s in range(3)]
    c = zc.compress(on(platform, chunks), batch_dims=1)
    got = jax.jit(lambda p: zc.decompress_accumulate(p, m=m, dtype=dtype, out_dtype=out_dtype))(c.payload)
    expected = ref.accumulate(list(chunks), out_dtype or dtype)
    assert got.dtype == expected.dtype
    assert bits(got) == bits(expected)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_accumulate_adds_subnormals_exactly_despite_xla_flush_to_zero(dtype, platform):
    info = np.finfo(np.dtype(dtype)) if dtype != jnp.bfloat16 else ml_dtypes.finfo(ml_dtypes.bfloat16)
    tiny = np.array([info.smallest_subnormal] * 50 + [-0.0] * 50, np.dtype(dtype))
    rows = np.stack([tiny, tiny * 3, -tiny])
    c = zc.compress(on(platform, rows), batch_dims=1)
    for out in (None, jnp.float32):
        got = zc.decompress_accumulate(c.payload, m=100, dtype=dtype, out_dtype=out)
        assert bits(got) == bits(ref.accumulate(list(rows), out or dtype))
        assert np.any(np.asarray(got, np.float32) != 0)


def test_compress_chunks_splits_the_flat_array():
    x = mixed(4 * 3001, jnp.float16).reshape(4, 3001)
    c = zc.compress_chunks(x.T, 4)
    flat = np.asarray(x.T).ravel()
    for i in range(4):
        assert bits(c.payload[i])[: int(c.nbytes[i])] == ref.compress(flat[i * 3001 : (i + 1) * 3001])
    with pytest.raises(ValueError, match="do not split into 5 equal chunks"):
        zc.compress_chunks(x, 5)


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("axis_type", [AxisType.Explicit, AxisType.Auto])
def test_inside_shard_map_each_device_codes_its_shard(axis_type, check_vma):
    mesh = mesh8(axis_type)
    x = jax.device_put(mixed(8 * 4500, jnp.bfloat16).reshape(8, 4500), NamedSharding(mesh, P("d")))

    def local(xs):
        c = zc.compress(xs)
        return zc.decompress(c), c.nbytes[None], c.payload[None]

    f = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("d"), out_specs=(P("d"), P("d"), P("d")),
                              check_vma=check_vma))
    y, nbytes, payload = map(np.asarray, f(x))
    xh = np.asarray(x)
    assert bits(y) == bits(xh)
    for i in range(8):
        assert bits(payload[i])[: int(nbytes[i])] == ref.compress(xh[i : i + 1])


def test_outputs_inside_shard_map_are_typed_varying():
    mesh = mesh8(AxisType.Explicit)

    def local(xs):
        c = zc.compress(xs)
        assert varying_axes(c.payload) == varying_axes(c.nbytes) == frozenset({"d"})
        assert varying_axes(zc.decompress(c)) == frozenset({"d"})
        return c.nbytes[None]

    x = jax.device_put(jnp.ones((8, 100), jnp.float32), NamedSharding(mesh, P("d")))
    assert jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("d"), out_specs=P("d")))(x).shape == (8,)
    # a varying result cannot be claimed replicated: check_vma catches it
    with pytest.raises(ValueError, match="could not infer replication"):
        jax.jit(jax.shard_map(lambda a: zc.decompress(zc.compress(a)), mesh=mesh, in_specs=P("d"),
                              out_specs=P()))(x)


@pytest.mark.parametrize("axis_type", [AxisType.Explicit, AxisType.Auto])
def test_sharded_jit_keeps_codec_local_without_all_gather(axis_type):
    mesh = mesh8(axis_type)
    x = jax.device_put(mixed(8 * 4 * 3000, jnp.bfloat16).reshape(8, 4, 3000), NamedSharding(mesh, P("d")))

    def round_trip(a):
        c = zc.compress(a, batch_dims=2)
        total = zc.decompress_accumulate(c.payload, m=3000, dtype=jnp.bfloat16, out_dtype=jnp.float32)
        return zc.decompress(c), total

    f = jax.jit(round_trip)
    hlo = f.lower(x).compile().as_text()
    assert "all-gather" not in hlo and "all-to-all" not in hlo and "collective-permute" not in hlo
    assert hlo.count("custom_call_target=\"zipccl_") == 3
    y, total = f(x)
    assert bits(y) == bits(x)
    assert y.sharding.spec[0] == "d" and total.sharding.spec[0] == "d"
    expected = np.stack([ref.accumulate(list(row), np.float32) for row in np.asarray(x)])
    assert bits(total) == bits(expected)


def test_corrupt_payload_raises_a_clear_error():
    c = zc.compress(gaussian(5000, jnp.bfloat16))
    payload = np.asarray(c.payload).copy()
    payload[16 + 7] |= 0x80  # block 0's descriptor: a reserved bit (FORMAT.md §2)
    bad = zc.Compressed(jnp.asarray(payload), c.nbytes, c.shape, c.dtype)
    with pytest.raises(Exception, match="zipccl: corrupt payload \\(stream 0\\): corrupt block descriptor"):
        jax.block_until_ready(zc.decompress(bad))
    wrong_shape = zc.Compressed(c.payload, c.nbytes, (4999,), c.dtype)
    with pytest.raises(Exception, match="element count does not match"):
        jax.block_until_ready(zc.decompress(wrong_shape))


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.float64 if jax.config.x64_enabled else jnp.int8, jnp.bool_])
def test_unsupported_dtypes_are_named(dtype):
    with pytest.raises(ValueError, match=f"unsupported dtype {np.dtype(dtype).name}"):
        zc.compress(jnp.zeros(8, dtype))


def test_ratio_of_gaussian_bf16():
    c = zc.compress(gaussian(1 << 20, ml_dtypes.bfloat16))
    assert float(c.ratio()) >= 1.50
