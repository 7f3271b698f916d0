"""The CUDA codec (format version 6) against the numpy reference (zipccl_jax/reference.py), byte for byte;
the sums against reference.accumulate (format-independent). Runs where JAX sees a GPU."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zipccl_jax as zc
from zipccl_jax import reference as ref
from zipccl_jax import reference as r6
from zipccl_jax.bench.data import gaussian, random_bits, special_values


def _gpus():
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


pytestmark = pytest.mark.skipif(not _gpus(), reason="no GPU visible to JAX: the CUDA codec is only compile-checked")
DTYPES = [jnp.bfloat16, jnp.float16, jnp.float32]


def on_gpu(x):
    return jax.device_put(x, _gpus()[0])


def bits(x):
    return np.asarray(x).view(np.uint8).tobytes()


def cases(dtype):
    yield "gauss", gaussian(100_003, dtype)
    yield "random_bits", random_bits(20_000, dtype)
    yield "specials", np.resize(special_values(dtype), 9000)
    yield "zeros", np.zeros(4097, dtype)
    for n in [0, 1, 4095, 4096, 4097, 16 * 4096 + 1]:
        yield f"n={n}", gaussian(n, dtype, seed=n)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_cuda_streams_are_byte_identical_to_reference_and_decode_each_other(dtype):
    for name, x in cases(dtype):
        c = jax.jit(zc.compress)(on_gpu(x))
        stream = bits(c.payload)[: int(c.nbytes)]
        assert stream == r6.compress(x), name
        back = jax.jit(zc.decompress)(c)
        assert bits(back) == bits(x), name
        padded = np.zeros(zc.stream_capacity(x.size, dtype), np.uint8)
        padded[: len(stream)] = np.frombuffer(stream, np.uint8)
        from_ref = zc.Compressed(on_gpu(padded), c.nbytes, x.shape, np.dtype(dtype))
        assert bits(jax.jit(zc.decompress)(from_ref)) == bits(x), name


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_cuda_accumulate_matches_rank_ordered_sum(dtype):
    """Bit for bit, NaN payloads and signs included: the GPU's own add would make every NaN
    0x7FFFFFFF; the kernels follow FORMAT.md §8's rule."""
    from test_reference import make

    chunks = np.stack([gaussian(30_000, dtype, seed=i) for i in range(6)])
    chunks[1:5, :9000] = [make("nans", 9000, dtype, seed=s) for s in range(4)]
    c = zc.compress(on_gpu(chunks), batch_dims=1)
    got = jax.jit(lambda p: zc.decompress_accumulate(p, m=30_000, dtype=dtype))(c.payload)
    assert bits(got) == bits(ref.accumulate(list(chunks), np.dtype(dtype)))


BAD_DESCRIPTOR = ("zipccl: corrupt payload (stream {}): corrupt block descriptor (reserved bits, a field out of "
                  "range, or its offsets)")


def with_bad_descriptor(row: np.ndarray, n: int) -> None:
    """A reserved bit set in block 0's descriptor of a coded stream of n elements (FORMAT.md §2)."""
    assert row[6] == 0 and r6.read_descriptor(row.tobytes(), 0)["reserved"] == 0, "a coded stream"
    row[r6.HEADER_BYTES + 7] |= 2
    with pytest.raises(r6.CorruptPayload, match="descriptor"):
        r6.decompress(row.tobytes(), np.dtype(jnp.bfloat16), n)


def test_cuda_rejects_a_corrupt_payload_with_a_clear_error():
    c = zc.compress(on_gpu(gaussian(9000, jnp.bfloat16)))
    payload = np.asarray(c.payload).copy()
    with_bad_descriptor(payload, 9000)
    with pytest.raises(Exception, match=re.escape(BAD_DESCRIPTOR.format(0))):
        jax.block_until_ready(zc.decompress(zc.Compressed(on_gpu(payload), c.nbytes, c.shape, c.dtype)))


def test_cuda_decoders_under_jit_poison_a_corrupt_item_and_return_its_status():
    """No host sync inside the handlers: under jit a corrupt stream decodes to all-one bytes and its
    status word holds the decoder's code; the other streams decode; the accumulate poisons the sum
    of the item with the bad row only."""
    x = np.stack([gaussian(9000, jnp.bfloat16, seed=i) for i in range(4)])
    c = zc.compress(on_gpu(x), batch_dims=1)
    payload = np.asarray(c.payload).copy()
    with_bad_descriptor(payload[1], 9000)
    bad = zc.Compressed(on_gpu(payload), c.nbytes, c.shape, c.dtype)
    out, status = jax.jit(lambda b: zc.decompress(b, with_status=True))(bad)
    assert zc.ops.corrupt_payload_error(status) == BAD_DESCRIPTOR.format(1)
    out = np.asarray(out)
    assert (out[1].view(np.uint16) == 0xFFFF).all() and bits(out[[0, 2, 3]]) == bits(x[[0, 2, 3]])
    sums, words = jax.jit(lambda p: zc.decompress_accumulate(p, m=9000, dtype=jnp.bfloat16, with_status=True))(
        on_gpu(payload.reshape(2, 2, -1)))
    assert np.asarray(words).tolist() == [[0, 13], [0, 0]]  # the decoder's status alone: kErrDescriptor
    assert (np.asarray(sums)[0].view(np.uint16) == 0xFFFF).all()
    assert bits(np.asarray(sums)[1]) == bits(ref.accumulate(list(x[2:]), np.dtype(jnp.bfloat16)))


def test_collectives_on_the_gpu_mesh():
    """Every collective on a mesh of all visible GPUs (one GPU: an axis of size 1)."""
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    gpus = _gpus()
    n = len(gpus)
    mesh = jax.make_mesh((n,), ("d",), devices=gpus)
    x = np.stack([gaussian(n * 4000, jnp.bfloat16, seed=i) for i in range(n)])
    xs = jax.device_put(x, NamedSharding(mesh, P("d")))
    perm = [(i, (i + 1) % n) for i in range(n)]
    pairs = {
        "psum": (lambda a: zc.zip_psum(a, "d", strategy="compressed")[None], None),
        "all_gather": (lambda a: zc.zip_all_gather(a, "d", strategy="compressed")[None],
                       lambda a: lax.all_gather(a, "d")[None]),
        "all_to_all": (lambda a: zc.zip_all_to_all(a, "d", 0, 0, tiled=True, strategy="compressed"),
                       lambda a: lax.all_to_all(a, "d", 0, 0, tiled=True)),
        "ppermute": (lambda a: zc.zip_ppermute(a, "d", perm, strategy="compressed"), lambda a: lax.ppermute(a, "d", perm)),
    }
    for name, (ours, theirs) in pairs.items():
        run = lambda fn: np.asarray(jax.jit(jax.shard_map(lambda a: fn(a[0]), mesh=mesh, in_specs=P("d"),  # noqa: E731
                                                           out_specs=P("d")))(xs))
        got = run(ours)
        expected = np.stack([ref.accumulate(list(x), np.dtype(jnp.bfloat16))] * n) if theirs is None else run(theirs)
        assert bits(got) == bits(expected), name


def test_cpu_only_options_raise_a_clear_error_on_the_gpu():
    """The row ops' CPU-only options name themselves and the platform before XLA runs anything."""
    x = on_gpu(gaussian(2 * ref.BLOCK, jnp.bfloat16))
    cap = ref.max_stream_bytes(ref.BLOCK, np.dtype(jnp.bfloat16))
    with pytest.raises(NotImplementedError, match=re.escape("zipccl: stream_sizes(plans=True) runs on the CPU only; "
                                                            "this computation is lowered for cuda")):
        jax.jit(lambda a: zc.ops.stream_sizes(a, 2, plans=True))(x)
    plans = on_gpu(np.zeros((2, zc.ops._zipccl_cpu.plan_bytes(ref.BLOCK)), np.uint8))
    with pytest.raises(NotImplementedError, match=re.escape("zipccl: encode_rows(plans=...) runs on the CPU only")):
        jax.jit(lambda a, p: zc.ops.encode_rows(a, 2, cap, plans=p))(x, plans)
    part = on_gpu(np.zeros((2, cap), np.uint8))
    with pytest.raises(NotImplementedError, match=re.escape("zipccl: decode_accumulate_rows(local=...) runs on the "
                                                            "CPU only")):
        jax.jit(lambda p, a: zc.ops.decode_accumulate_rows([p], (ref.BLOCK,), jnp.bfloat16, local=(0, [a])))(
            part, x[:ref.BLOCK])
