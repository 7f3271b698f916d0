"""Property tests (hypothesis): random shapes, dtypes, bit patterns and chunk counts
round-trip bit-exactly through every codec entry point and every collective.

Examples are derandomized (the same in every CI run) and bounded so the file
stays within a minute or two; compiled programs are cached per shape, and the
collectives draw their data from a few shapes so compile time stays small.
"""

import functools

import jax
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from conftest import cpu_devices
from zipccl_jax import _zipccl_cpu as cpu
from zipccl_jax import reference as ref
from zipccl_jax.bench.data import special_values
from zipccl_jax.dtypes import DTYPE_CODES

DTYPES = ("bfloat16", "float16", "float32")
N = 8


def bounded(max_examples):
    """The same examples in every run, no per-example deadline (compiles vary)."""
    return settings(max_examples=max_examples, derandomize=True, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def uint_of(dtype):
    return np.dtype(f"uint{np.dtype(dtype).itemsize * 8}")


@st.composite
def bit_patterns(draw, n, dtype):
    """n elements of dtype: small arrays with every bit drawn by hypothesis, larger
    ones from a drawn generator (Gaussian at a drawn scale, random bits, special
    values, a constant) with planted special values."""
    u = uint_of(dtype)
    if n <= 64 and draw(st.booleans()):
        top = np.iinfo(u).max
        return np.array(draw(st.lists(st.integers(0, top), min_size=n, max_size=n)), u).view(dtype)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["gaussian", "random", "special", "constant"]))
    if kind == "gaussian":
        scale = np.float32(2.0) ** draw(st.integers(-30, 30))
        with np.errstate(over="ignore"):
            x = (rng.standard_normal(n, dtype=np.float32) * scale).astype(dtype)
    elif kind == "random":
        x = rng.integers(0, np.iinfo(u).max, n, dtype=u, endpoint=True).view(dtype)
    elif kind == "special":
        x = rng.choice(special_values(dtype), n)
    else:
        x = np.full(n, draw(st.integers(0, np.iinfo(u).max)), u).view(dtype)
    planted = draw(st.integers(0, min(n, 16)))  # specials at random places
    if planted:
        x[rng.integers(0, n, planted)] = rng.choice(special_values(dtype), planted)
    return x


@st.composite
def tensors(draw, max_elems=20_000):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = tuple(draw(st.lists(st.integers(0, 40), min_size=0, max_size=3)))
    if draw(st.booleans()):  # long vectors: several blocks and groups
        shape = (draw(st.integers(0, max_elems)),)
    n = int(np.prod(shape)) if shape else 1
    return draw(bit_patterns(n, dtype)).reshape(shape)


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


compress_jit, decompress_jit = jax.jit(zc.compress), jax.jit(zc.decompress)


@bounded(60)
@given(tensors())
def test_every_codec_entry_point_round_trips_bit_exact(x):
    flat = x.reshape(-1)
    stream = ref.compress(flat)
    assert len(stream) <= zc.stream_capacity(flat.size, x.dtype)
    assert same_bits(ref.decompress(stream, x.dtype, flat.size), flat)
    code = DTYPE_CODES[x.dtype.name]
    for generic in (False, True):  # the fast CPU coder and the shared (CUDA) one
        out = np.zeros(zc.stream_capacity(flat.size, x.dtype), np.uint8)
        length = cpu.compress_into(flat.view(np.uint8), code, out, generic=generic)
        assert out[:length].tobytes() == stream
        back = np.zeros(flat.nbytes, np.uint8)
        cpu.decompress_into(out[:length], code, back, generic=generic)
        assert back.tobytes() == flat.tobytes()
    c = compress_jit(x)
    assert c.shape == x.shape and int(c.nbytes) == len(stream)
    assert np.asarray(c.payload)[: len(stream)].tobytes() == stream
    assert same_bits(decompress_jit(c), x)


@st.composite
def chunked(draw):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    k = draw(st.integers(1, 9))
    m = draw(st.sampled_from([0, 1, 3, 100, 4096, 5000]))
    return draw(bit_patterns(k * m, dtype)), k


@bounded(40)
@given(chunked())
def test_chunked_streams_and_accumulation_match_the_reference(case):
    x, k = case
    m = x.size // k
    c = zc.compress_chunks(x, k)
    payload, nbytes = np.asarray(c.payload), np.asarray(c.nbytes)
    chunks = x.reshape(k, m)
    for i in range(k):
        assert payload[i, : nbytes[i]].tobytes() == ref.compress(chunks[i])
    assert same_bits(decompress_jit(c).reshape(k, m), chunks)
    got = np.asarray(zc.decompress_accumulate(c.payload, m=m, dtype=x.dtype))
    expected = ref.accumulate(list(chunks), x.dtype)
    nan = np.isnan(expected.astype(np.float32))
    assert np.array_equal(np.isnan(got.astype(np.float32)), nan)  # NaN payloads of sums are not promised
    assert got[~nan].tobytes() == expected[~nan].tobytes()


# ------------------------------------------------------------------ collectives

SHAPES = [(8, 24), (16, 600)]  # per device; few shapes, so few compiled programs


def mesh():
    return jax.make_mesh((N,), ("d",), devices=cpu_devices())


PERM = [(i, (3 * i + 1) % N) for i in range(N)]


@functools.cache
def collective(name, shape, dtype, plan):
    """The jitted shard_map of one collective, pinned to a plan, on [N, *shape] data."""
    fn = {
        "all_gather": lambda a: zc.zip_all_gather(a, "d", tiled=True, strategy=plan),
        "all_to_all": lambda a: zc.zip_all_to_all(a, "d", 0, 0, tiled=True, strategy=plan),
        "ppermute": lambda a: zc.zip_ppermute(a, "d", PERM, strategy=plan),
        "psum": lambda a: zc.zip_psum(a, "d", strategy=plan)[None],
        "psum_scatter": lambda a: zc.zip_psum_scatter(a, "d", tiled=True, strategy=plan),
    }[name]
    return jax.jit(jax.shard_map(lambda a: fn(a[0]), mesh=mesh(), in_specs=P("d"), out_specs=P("d")))


def moved(name, x):
    """What the transfer delivers, device by device (concatenated along axis 0), in numpy."""
    if name == "all_gather":
        return np.concatenate([np.concatenate(list(x))] * N)
    if name == "all_to_all":
        return np.concatenate([np.concatenate([np.split(x[i], N)[j] for i in range(N)]) for j in range(N)])
    source = {d: s for s, d in PERM}
    return np.concatenate([x[source[j]] for j in range(N)])


@st.composite
def device_data(draw):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = draw(st.sampled_from(SHAPES))
    n = int(np.prod(shape))
    return np.stack([draw(bit_patterns(n, dtype)) for _ in range(N)]).reshape(N, *shape)


def run(name, x, plan="compressed"):
    xs = jax.device_put(x, NamedSharding(mesh(), P("d")))
    return np.asarray(collective(name, x.shape[1:], x.dtype, plan)(xs))


@bounded(15)
@given(st.sampled_from(["all_gather", "all_to_all", "ppermute"]), st.sampled_from(["compressed", "raw"]), device_data())
def test_transfers_deliver_every_bit(name, plan, x):
    """Against numpy, not lax: lax's bf16 transfers on XLA:CPU replace NaN payloads
    (docs/RELIABILITY.md); the raw plan moves bits, not floats."""
    assert same_bits(run(name, x, plan), moved(name, x))


@bounded(10)
@given(st.sampled_from(["psum", "psum_scatter"]), device_data())
def test_reductions_are_the_rank_ordered_sum(name, x):
    got = run(name, x)
    total = ref.accumulate(list(x), x.dtype)
    # psum: every device holds the total; psum_scatter (tiled): device i holds its rows of it
    expected = np.stack([total] * N) if name == "psum" else total
    nan = np.isnan(expected.astype(np.float32))
    assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
    assert got[~nan].tobytes() == expected[~nan].tobytes()


def test_raw_plan_keeps_bf16_nan_payloads():
    """Regression: the raw plan used lax's collectives on bf16, which XLA:CPU runs in
    float32, so every NaN payload arrived as 0x7FC0."""
    x = np.random.default_rng(0).integers(0, 2**16, (N, 8, 24), dtype=np.uint16).view("bfloat16")
    u = x.view(np.uint16)
    assert np.sum((u & 0x7F80 == 0x7F80) & (u & 0x7F != 0) & (u & 0x7FFF != 0x7FC0)) > 0  # payloads to lose
    for name in ("all_gather", "all_to_all", "ppermute"):
        assert same_bits(run(name, x, "raw"), moved(name, x)), name
