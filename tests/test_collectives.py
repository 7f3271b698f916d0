"""Compressed collectives on 8 virtual CPU devices against lax and the numpy reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from conftest import cpu_devices
from zipccl_jax import reference as ref
from zipccl_jax import _ffi, _zipccl_cpu, strategy
from zipccl_jax.bench.data import gaussian, random_bits, special_values

FLOATS = [jnp.bfloat16, jnp.float16, jnp.float32]
N = 8


def bits(x):
    return np.asarray(x).view(np.uint8).tobytes()


def mesh1(axis_type=AxisType.Explicit):
    return jax.make_mesh((N,), ("d",), axis_types=(axis_type,), devices=cpu_devices())


def per_device(shape, dtype, seed=0, scale=1.0):
    """[N, *shape] data: Gaussian with the special values planted on device 0."""
    x = np.stack([gaussian(int(np.prod(shape)), dtype, scale=scale, seed=seed + i) for i in range(N)])
    s = special_values(dtype) if np.dtype(dtype).kind == "f" else None
    if s is not None:
        s = s[~np.isnan(s.astype(np.float32))]  # NaN + x payloads are not part of the sum contract
        k = min(s.size, x.shape[1])
        x[0, :k] = s[:k]
    return x.reshape(N, *shape)


def run(fn, x, mesh=None, out_specs=P("d"), check_vma=True):
    """Runs fn on each device's slice x[i] inside shard_map under jit."""
    mesh = mesh or mesh1()
    xs = jax.device_put(x, NamedSharding(mesh, P("d")))
    f = jax.jit(jax.shard_map(lambda a: fn(a[0]), mesh=mesh, in_specs=P("d"), out_specs=out_specs,
                              check_vma=check_vma))
    return jax.tree.map(np.asarray, f(xs))


def rank_sum(x, dtype):
    return ref.accumulate(list(np.asarray(x)), np.dtype(dtype))


# ---------------------------------------------------------------------------- psum

@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_psum_is_the_rank_ordered_fp32_sum_bit_for_bit(dtype):
    x = per_device((3, 1000), dtype)
    out = run(lambda a: zc.zip_psum(a, "d", strategy="compressed"), x, out_specs=P())
    assert out.shape == (3, 1000)
    assert bits(out) == bits(rank_sum(x, dtype))
    raw = run(lambda a: zc.zip_psum(a, "d", strategy="raw"), x, out_specs=P())  # XLA's all-reduce in fp32
    lax_fp32 = run(lambda a: lax.psum(a.astype(jnp.float32), "d").astype(a.dtype), x, out_specs=P())
    assert bits(raw) == bits(lax_fp32)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_psum_with_and_without_codec_and_both_algorithms_agree_bitwise(dtype):
    x = per_device((20_000,), dtype, seed=3)
    slow = dict(link_bandwidth=1e3, reduce_bandwidth=1.0)  # compression pays, over either algorithm
    ag = strategy.CostModel(psum_algorithm="all_gather+local_reduce", **slow)
    rs = strategy.CostModel(psum_algorithm="reduce_scatter+all_gather", **slow)
    results = {}
    for name, kw in {"rs_zip": dict(strategy=rs), "rs_raw": dict(strategy=rs, compress=False),
                     "ag_zip": dict(strategy=ag), "ag_raw": dict(strategy=ag, compress=False)}.items():
        strategy.last_plans(clear=True)
        results[name] = bits(run(lambda a: zc.zip_psum(a, "d", **kw), x, out_specs=P()))
        plan = strategy.last_plans()[-1]
        assert plan.compress  # compress=False keeps the plan and turns the codec off
        assert plan.algorithm == ("reduce_scatter+all_gather" if name.startswith("rs") else "all_gather+local_reduce")
    assert len(set(results.values())) == 1


@pytest.mark.parametrize("groups", [None, [[0, 1, 2, 3], [4, 5, 6, 7]], [[6, 2, 4, 0], [1, 3, 7, 5]]],
                         ids=["no-groups", "groups", "listed-out-of-order"])
@pytest.mark.parametrize("compress", [True, False], ids=["compressed", "uncompressed"])
def test_all_gather_local_reduce_sums_its_own_row_from_its_data(groups, compress):
    """On the CPU the own row of all_gather+local_reduce is not decoded but
    summed from the device's data, at its place in the rank order (its
    index, row-major over a tuple of axes, or its place in its listed
    group); the compressed rungs code with the size pass's plans."""
    x = per_device((20_000,), jnp.bfloat16, seed=11)
    name = f"{'compressed' if compress else 'uncompressed'} all_gather+local_reduce"
    if groups is None:  # a tuple of axes of a 2-D mesh
        mesh = jax.make_mesh((2, 4), ("a", "b"), devices=cpu_devices())
        axes, kw, groups = ("a", "b"), {}, [list(range(N))]
    else:
        mesh, axes, kw = mesh1(AxisType.Explicit), "d", dict(axis_index_groups=groups)
    spec = P(mesh.axis_names)
    f = jax.jit(jax.shard_map(lambda a: zc.zip_psum(a[0], axes, strategy=strategy.Pinned(name), **kw)[None],
                              mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))
    xs = jax.device_put(x, NamedSharding(mesh, spec))
    out, hlo = np.asarray(f(xs)), f.lower(xs).as_text()
    for g in groups:
        want = bits(rank_sum(x[g], jnp.bfloat16))
        assert all(bits(out[i]) == want for i in g), g
    rungs = len(strategy.DEFAULT_LADDER)  # the top one raw (STORED_RAW streams, coded without plans)
    assert hlo.count("local_leaves = 1") == (rungs if compress else 1)  # a decode per branch
    assert hlo.count("planned = true") == (rungs - 1 if compress else 0)


@pytest.mark.parametrize("mapping", ["pmap", "vmap-in-shard_map", "jvp"])
def test_all_gather_local_reduce_own_row_under_transformations(mapping):
    """The own-row shortcut where lax's psum works: under pmap, vmapped over
    a batch inside shard_map, and under jvp (the tangents summed alike)."""
    name = "compressed all_gather+local_reduce"
    x = per_device((2, 3000), jnp.bfloat16, seed=13)
    psum = lambda a: zc.zip_psum(a, "d", strategy=strategy.Pinned(name))  # noqa: E731
    if mapping == "pmap":
        out = np.asarray(jax.pmap(psum, axis_name="d", devices=cpu_devices())(x))
        want = rank_sum(x, jnp.bfloat16)
        assert all(bits(out[i]) == bits(want) for i in range(N))
    elif mapping == "vmap-in-shard_map":
        out = run(lambda a: jax.vmap(psum)(a)[None], x)
        want = np.stack([rank_sum(x[:, b], jnp.bfloat16) for b in range(2)])
        assert all(bits(out[i]) == bits(want) for i in range(N))
    else:  # forward mode: the tangents go through the same psum
        t = per_device((2, 3000), jnp.bfloat16, seed=14)
        mesh = mesh1()
        f = jax.jit(jax.shard_map(lambda a, b: jax.jvp(psum, (a[0],), (b[0],)), mesh=mesh, in_specs=(P("d"), P("d")),
                                  out_specs=(P(), P())))
        put = lambda v: jax.device_put(v, NamedSharding(mesh, P("d")))  # noqa: E731
        primal, tangent = f(put(x), put(t))
        assert bits(primal) == bits(rank_sum(x, jnp.bfloat16)) and bits(tangent) == bits(rank_sum(t, jnp.bfloat16))


@pytest.mark.skipif(_ffi.cuda_module() is None, reason="built without the CUDA codec (CI builds it)")
def test_the_cpu_only_shortcuts_stay_out_of_a_module_lowered_for_cuda_too():
    """Plans and the own row are CPU handlers' inputs: a module lowered for
    CUDA, or for CPU and CUDA at once (jax.export), has neither."""
    mesh = mesh1()
    f = jax.jit(jax.shard_map(lambda a: zc.zip_psum(a[0], "d", strategy=strategy.Pinned(
        "compressed all_gather+local_reduce"))[None], mesh=mesh, in_specs=P("d"), out_specs=P("d")))
    x = jax.device_put(np.zeros((N, 5000), jnp.bfloat16), NamedSharding(mesh, P("d")))
    for platforms, shortcuts in ((("cpu",), True), (("cpu", "cuda"), False), (("cuda",), False)):
        text = f.trace(x).lower(lowering_platforms=platforms).as_text()
        assert ("planned = true" in text) == ("local_leaves = 1" in text) == shortcuts, platforms


@pytest.mark.parametrize("algorithm", strategy.PSUM_ALGORITHMS)
def test_uncompressed_plans_are_the_rank_ordered_sum_of_the_raw_bits_without_consensus(algorithm):
    x = per_device((20_000,), jnp.bfloat16, seed=3)
    mesh = mesh1()
    xs = jax.device_put(x, NamedSharding(mesh, P("d")))
    sums = {}
    for name in (f"uncompressed {algorithm}", f"compressed {algorithm}", "raw all_reduce"):
        f = jax.jit(jax.shard_map(lambda a, name=name: zc.zip_psum(a[0], "d", strategy=strategy.Pinned(name),
                                                                    with_stats=True),
                                  mesh=mesh, in_specs=P("d"), out_specs=P()))
        strategy.last_plans(clear=True)
        hlo = f.lower(xs).as_text()
        assert [p.name for p in strategy.last_plans()] == [name]
        out, stats = f(xs)
        sums[name], wire, raw = bits(out), float(stats.wire_bytes), float(stats.raw_bytes)
        if name.startswith("uncompressed"):
            # no size pass, no pmax (no all-reduce at all), no codec: STORED_RAW streams, raw bytes plus a
            # 16-byte header per stream and phase
            assert "zipccl_stream_sizes" not in hlo and "all_reduce" not in hlo and "all-reduce" not in hlo
            assert wire == raw + (N - 1) * 16 * (2 if algorithm.startswith("reduce") else 1), (wire, raw)
    assert sums[f"uncompressed {algorithm}"] == sums[f"compressed {algorithm}"] == bits(rank_sum(x, jnp.bfloat16))
    lax_fp32 = run(lambda a: lax.psum(a.astype(jnp.float32), "d").astype(a.dtype), x, out_specs=P())
    assert sums["raw all_reduce"] == bits(lax_fp32)  # XLA's own sum (here in the same order: not promised)


def test_psum_agrees_with_lax_psum_within_rounding():
    x = per_device((5000,), jnp.float32, seed=5)
    ours = run(lambda a: zc.zip_psum(a, "d"), x, out_specs=P())
    theirs = run(lambda a: lax.psum(a, "d"), x, out_specs=P())
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-5, atol=1e-5)


def test_psum_passes_integers_through_lax():
    x = np.arange(N * 10, dtype=np.int32).reshape(N, 10)
    out = run(lambda a: zc.zip_psum(a, "d"), x, out_specs=P())
    np.testing.assert_array_equal(np.asarray(out), x.sum(0))


def test_psum_of_a_pytree_packs_leaves_into_few_buckets():
    rng = np.random.default_rng(0)
    shapes = [(int(rng.integers(1, 50)), int(rng.integers(1, 40))) for _ in range(200)]
    tree = {f"w{i}": per_device(s, jnp.bfloat16 if i % 3 else jnp.float32, seed=i) for i, s in enumerate(shapes)}
    tree["step"] = np.arange(N, dtype=np.int32)[:, None]
    mesh = mesh1()
    xs = jax.device_put(tree, NamedSharding(mesh, P("d")))
    strategy.last_plans(clear=True)
    f = jax.jit(jax.shard_map(lambda t: zc.zip_psum(jax.tree.map(lambda a: a[0], t), "d", bucket_bytes=1 << 17,
                                                    strategy="compressed"),
                              mesh=mesh, in_specs=P("d"), out_specs=P()))
    out = f(xs)
    plans = strategy.last_plans()
    total_bytes = sum(np.prod(s) * (2 if i % 3 else 4) for i, s in enumerate(shapes))
    assert 2 <= len(plans) <= total_bytes // (1 << 17) + 2  # per bucket, not per leaf
    for k, v in tree.items():
        expected = v.sum(0).astype(v.dtype) if k == "step" else rank_sum(v, v.dtype)
        assert bits(out[k]) == bits(expected), k
    assert f.lower(xs).as_text().count("zipccl_stream_sizes") < 20


# ---------------------------------------------------------------------------- all_gather / psum_scatter

@pytest.mark.parametrize("dtype", FLOATS + [jnp.int32], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("axis,tiled", [(0, False), (0, True), (1, False), (1, True), (2, False)])
def test_all_gather_equals_lax_bitwise(dtype, axis, tiled):
    x = per_device((6, 700), dtype) if dtype != jnp.int32 else np.arange(N * 4200, dtype=np.int32).reshape(N, 6, 700)
    ours = run(lambda a: zc.zip_all_gather(a, "d", axis=axis, tiled=tiled, strategy="compressed"), x)
    theirs = run(lambda a: lax.all_gather(a, "d", axis=axis, tiled=tiled), x)
    assert ours.shape == theirs.shape and bits(ours) == bits(theirs)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("dim,tiled", [(0, False), (0, True), (1, True)])
def test_psum_scatter_is_each_devices_slice_of_the_rank_ordered_sum(dtype, dim, tiled):
    shape = (N, 900) if (dim == 0 and not tiled) else ((2 * N, 450) if dim == 0 else (3, 8 * 160))
    x = per_device(shape, dtype, seed=11)
    ours = run(lambda a: zc.zip_psum_scatter(a, "d", scatter_dimension=dim, tiled=tiled, strategy="compressed"), x)
    raw = run(lambda a: zc.zip_psum_scatter(a, "d", scatter_dimension=dim, tiled=tiled, compress=False,
                                            strategy="compressed"), x)
    theirs = run(lambda a: lax.psum_scatter(a.astype(jnp.float32), "d", scatter_dimension=dim, tiled=tiled), x)
    assert ours.shape == theirs.shape
    total = rank_sum(x, dtype)
    expected = np.concatenate(np.split(total, N, axis=dim), axis=0) if tiled else total
    assert bits(ours) == bits(expected) == bits(raw)
    np.testing.assert_allclose(np.asarray(ours, np.float32), np.asarray(theirs), rtol=1e-2, atol=1e-2)


# ---------------------------------------------------------------------------- all_to_all / ppermute

@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("split,concat,tiled", [(0, 0, True), (0, 1, True), (1, 0, True), (0, 1, False),
                                                (1, 0, False), (0, 2, False)])
def test_all_to_all_equals_lax_bitwise(dtype, split, concat, tiled):
    shape = {(0, 0): (16, 300), (0, 1): (16, 300), (1, 0): (4, 32, 50)}[(split, concat)] if tiled else \
        {(0, 1): (N, 300), (1, 0): (5, N, 60), (0, 2): (N, 3, 70)}[(split, concat)]
    x = per_device(shape, dtype, seed=2)
    ours = run(lambda a: zc.zip_all_to_all(a, "d", split, concat, tiled=tiled, strategy="compressed"), x)
    theirs = run(lambda a: lax.all_to_all(a, "d", split, concat, tiled=tiled), x)
    assert ours.shape == theirs.shape and bits(ours) == bits(theirs)


def emulated_ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *,
                               axis_name, axis_index_groups=None):
    """lax.ragged_all_to_all's semantics from a dense all_to_all (XLA:CPU has no
    ragged one): each destination's slice travels padded to the operand's
    size, and only its recv_sizes elements are written into the output, at
    the offset its sender chose."""
    n = send_sizes.shape[0]
    width = operand.shape[0]
    kw = {"axis_index_groups": axis_index_groups} if axis_index_groups else {}
    padded = jnp.concatenate([operand, jnp.zeros(width, operand.dtype)])
    rows = jnp.stack([lax.dynamic_slice(padded, (input_offsets[j],), (width,)) for j in range(n)])
    rows = jnp.where(jnp.arange(width)[None] < send_sizes[:, None], rows, 0)
    got = lax.all_to_all(rows, axis_name, 0, 0, tiled=True, **kw)
    at = lax.all_to_all(output_offsets, axis_name, 0, 0, tiled=True, **kw)  # where each source writes here
    pos = jnp.arange(output.shape[0])
    for i in range(n):
        inside = (pos >= at[i]) & (pos < at[i] + recv_sizes[i])
        output = jnp.where(inside, got[i][jnp.clip(pos - at[i], 0, width - 1)], output)
    return output


@pytest.fixture
def static_on_cpu(monkeypatch):
    """The CUDA lowering's transfers (static_transfer) on the CPU devices,
    with ragged_all_to_all emulated."""
    from zipccl_jax.collectives import _transfer
    monkeypatch.setattr(_transfer, "STATIC_PLATFORMS", frozenset({"cpu"}))
    monkeypatch.setattr(_transfer, "ragged_all_to_all", emulated_ragged_all_to_all)


@pytest.mark.parametrize("groups", [None, [[3, 1, 2, 0], [4, 5, 7, 6]]], ids=["no-groups", "groups"])
def test_all_to_all_sends_each_stream_at_the_static_capacity_or_its_length_where_longer(static_on_cpu, groups):
    """The CUDA transfer (modules lowered for CUDA alone; here with an
    emulated ragged_all_to_all on the CPU): lax's bits, and on the wire per
    destination the static capacity, or the stream's exact length where it is
    longer, plus a 4-byte spill length."""
    from zipccl_jax.collectives._transfer import static_capacity
    x = per_device((N, 3000), jnp.bfloat16, seed=9)
    x[:, 1::2, 2000:] = 0  # MoE-like: chunks with empty slots compress far better than full ones
    x[:, 2, :] = np.asarray(random_bits(3000, jnp.bfloat16, seed=3))  # a chunk stored raw: it spills
    n = 4 if groups else N
    kw = {"axis_index_groups": groups} if groups else {}
    def ours_and_wire(a):
        out, stats = zc.zip_all_to_all(a.reshape(n, -1, 3000), "d", 0, 1, tiled=True, with_stats=True,
                                       strategy="compressed", **kw)
        return out, stats.wire_bytes[None]
    ours, wire = run(ours_and_wire, x, out_specs=(P("d"), P("d")), check_vma=not groups)
    as_bits = lambda a: lax.bitcast_convert_type(a, jnp.uint16)  # noqa: E731  (XLA:CPU's bf16 moves lose NaN payloads)
    theirs = run(lambda a: lax.all_to_all(as_bits(a).reshape(n, -1, 3000), "d", 0, 1, tiled=True, **kw), x,
                 check_vma=not groups)
    assert bits(ours) == bits(theirs)
    c = static_capacity(strategy.model_for(("d",), platform="cpu"), jnp.bfloat16, x[0].size // n)
    spilled = 0
    for d in range(N):  # what device d sent: per other device of its group, c or the longer stream, and 4 bytes
        group = next(g for g in (groups or [list(range(N))]) if d in g)
        chunks = x[d].reshape(n, -1)
        lengths = [len(ref.compress(chunks[j])) for j in range(n) if group[j] != d]
        spilled += sum(length > c for length in lengths)
        assert float(wire[d]) == sum(max(length, c) + 4 for length in lengths), d
    assert spilled > 0


@pytest.mark.parametrize("perm", [[(i, (i + 1) % N) for i in range(N)], [(0, 3), (3, 5), (6, 0)]],
                         ids=["ring", "partial"])
def test_ppermute_equals_lax_bitwise_including_devices_nobody_sends_to(perm):
    x = per_device((5000,), jnp.bfloat16, seed=4)
    ours = run(lambda a: zc.zip_ppermute(a, "d", perm, strategy="compressed"), x)
    theirs = run(lambda a: lax.ppermute(a, "d", perm), x)
    assert bits(ours) == bits(theirs)
    # random bits (NaN payloads: the raw rung) arrive as sent; the zeros where no one sends are selected on bits
    r = np.stack([random_bits(5000, jnp.bfloat16, seed=i) for i in range(N)])
    expected = np.zeros_like(r)
    for s, d in perm:
        expected[d] = r[s]
    assert bits(run(lambda a: zc.zip_ppermute(a, "d", perm, strategy="compressed"), r)) == bits(expected)


# ---------------------------------------------------------------------------- the capacity ladder

def spread(m, width, seed):
    """bf16 values whose exponents are uniform over `width` values: the wider,
    the less they compress (from ~1.9x down to none)."""
    rng = np.random.default_rng(seed)
    e = 127 - rng.integers(0, width, m)
    u = (rng.integers(0, 2, m) << 15) | (e << 7) | rng.integers(0, 128, m)
    return u.astype(np.uint16).view(jnp.bfloat16)


def test_every_rung_is_reached_and_wire_bytes_follow_the_largest_stream():
    m = 6000  # elements per device
    cap = ref.max_stream_bytes(m, jnp.bfloat16)
    rungs = list(strategy.capacities(cap, cap - 16))
    mesh = mesh1()
    f = jax.jit(jax.shard_map(lambda a: (lambda r: (r[0], r[1].wire_bytes[None]))(
        zc.zip_all_gather(a[0], "d", strategy="compressed", with_stats=True)), mesh=mesh, in_specs=P("d"),
        out_specs=(P("d"), P("d"))))
    scratch = np.zeros(cap, np.uint8)
    length = lambda a: _zipccl_cpu.compress_into(a.view(np.uint8), 1, scratch)  # noqa: E731 (= the reference's)
    # the others 90% zeros (below the lowest rung since format version 3 implies them)
    base = [np.where(np.random.default_rng(i).random(m) < 0.9, 0, spread(m, 1, seed=i)).astype(jnp.bfloat16)
            for i in range(N)]
    others = max(length(b) for b in base)
    assert others < rungs[0]
    # device 3 decides: its first k values spread over `width` exponents, the rest over one
    candidates = [(m, w) for w in range(1, 257)] + [(k, w) for w in (4, 8, 16, 32, 64) for k in range(0, m, 50)]
    lands = {}  # rung -> the first candidate whose stream lands on it
    for k, width in candidates:
        mine = np.where(np.arange(m) < k, spread(m, width, seed=3), base[3])
        lands.setdefault(next(r for r in rungs if r >= max(length(mine), others)), mine)
    assert set(lands) == set(rungs)
    for rung, mine in sorted(lands.items()):
        x = np.stack([mine if i == 3 else base[i] for i in range(N)])
        out, sent = jax.tree.map(np.asarray, f(jax.device_put(x, NamedSharding(mesh, P("d")))))
        assert bits(out.reshape(N, N, m)[0]) == bits(x)
        assert float(sent[0]) == (rung if rung < cap else 2 * m) * (N - 1)  # the top rung gathers the raw bits


def test_all_gather_raw_rung_keeps_nan_payloads():
    m = 6000
    x = per_device((m,), jnp.bfloat16)
    x[5] = random_bits(m, jnp.bfloat16)  # incompressible on one device only: the raw rung
    out, sent = run(lambda a: (lambda r: (r[0], r[1].wire_bytes[None]))(
        zc.zip_all_gather(a, "d", strategy="compressed", with_stats=True)), x, out_specs=(P("d"), P("d")))
    assert float(sent[0]) == 2 * m * (N - 1)
    assert bits(out.reshape(N, N, m)[0]) == bits(x)


def test_compiled_hlo_moves_only_the_rung_sizes():
    m = 1 << 18
    x = per_device((m,), jnp.bfloat16)
    mesh = mesh1()
    xs = jax.device_put(x, NamedSharding(mesh, P("d")))
    f = jax.jit(jax.shard_map(lambda a: zc.zip_psum(a[0], "d", strategy="compressed"), mesh=mesh,
                              in_specs=P("d"), out_specs=P()))
    hlo = f.lower(xs).compile().as_text()
    chunk_cap = ref.max_stream_bytes(m // N, jnp.bfloat16)
    rungs = strategy.capacities(chunk_cap, chunk_cap - 16)
    a2a = [line for line in hlo.splitlines() if " all-to-all(" in line]
    sizes = sorted({int(line.split("u8[")[1].split("]")[0].split(",")[1]) for line in a2a})
    assert sizes == sorted(rungs)
    assert bits(f(xs)) == bits(rank_sum(x, jnp.bfloat16))


# ---------------------------------------------------------------------------- gradients

def _loss(collective, lax_version, compress):
    def loss(a):
        y = (lax_version or collective)(a) if compress is None else collective(a, compress)
        return jnp.sum(jnp.sin(y.astype(jnp.float32)) * jnp.arange(y.size, dtype=jnp.float32).reshape(y.shape))
    return loss


GRAD_CASES = {
    "psum": (lambda a, c: zc.zip_psum(a, "d", compress=c, strategy="compressed"),
             lambda a: lax.psum(a, "d"), (2000,)),
    "all_gather": (lambda a, c: zc.zip_all_gather(a, "d", tiled=True, compress=c, strategy="compressed"),
                   lambda a: lax.all_gather(a, "d", tiled=True), (2000,)),
    "psum_scatter": (lambda a, c: zc.zip_psum_scatter(a, "d", tiled=True, compress=c, strategy="compressed"),
                     lambda a: lax.psum_scatter(a, "d", tiled=True), (N * 250,)),
    "all_to_all": (lambda a, c: zc.zip_all_to_all(a, "d", 0, 1, tiled=True, compress=c, strategy="compressed"),
                   lambda a: lax.all_to_all(a, "d", 0, 1, tiled=True), (N * 4, 60)),
    "ppermute": (lambda a, c: zc.zip_ppermute(a, "d", [(i, (i + 3) % N) for i in range(N)], compress=c,
                                              strategy="compressed"),
                 lambda a: lax.ppermute(a, "d", [(i, (i + 3) % N) for i in range(N)]), (2000,)),
}


@pytest.mark.parametrize("name", GRAD_CASES)
def test_gradients_match_lax_and_are_bit_identical_without_codec(name):
    collective, lax_version, shape = GRAD_CASES[name]
    x = per_device(shape, jnp.float32, seed=9)
    x[0, :50] = 0.5  # no specials in gradients
    grads = {}
    for key, compress in [("zip", True), ("raw", False), ("lax", None)]:
        loss = _loss(collective, lax_version, compress)
        grads[key] = run(lambda a: jax.grad(lambda b: loss(b))(a)[None], x)
    np.testing.assert_allclose(np.asarray(grads["zip"]), np.asarray(grads["lax"]), rtol=1e-4, atol=1e-3)
    assert bits(grads["zip"]) == bits(grads["raw"])


# ---------------------------------------------------------------------------- transformations and meshes

def test_vmap_scan_and_cond_around_collectives():
    x = per_device((4, 3000), jnp.bfloat16, seed=6)

    def body(a):
        v = jax.vmap(lambda r: zc.zip_psum(r, "d", strategy="compressed"))(a)
        s, _ = lax.scan(lambda c, r: (c + zc.zip_psum(r, "d", strategy="compressed").astype(jnp.float32), None),
                        jnp.zeros(3000, jnp.float32), a)
        pred = lax.psum(jnp.sum(a.astype(jnp.float32)), "d") > -1e9  # invariant predicate
        c = lax.cond(pred, lambda r: zc.zip_psum(r, "d", strategy="compressed"), lambda r: lax.psum(r * 0, "d"), a)
        return v, s, c

    v, s, c = run(body, x, out_specs=(P(), P(), P()))
    total = rank_sum(x, jnp.bfloat16)
    assert bits(v) == bits(total) == bits(c)
    expected_scan = functools.reduce(lambda acc, r: acc + r.astype(np.float32), list(total), np.zeros(3000, np.float32))
    assert bits(s) == bits(expected_scan)


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("axis_type", [AxisType.Explicit, AxisType.Auto])
def test_meshes_and_check_vma(axis_type, check_vma):
    x = per_device((4000,), jnp.bfloat16, seed=8)
    out = run(lambda a: zc.zip_psum(a, "d", strategy="compressed"), x, mesh=mesh1(axis_type),
              out_specs=P(), check_vma=check_vma)
    assert bits(out) == bits(rank_sum(x, jnp.bfloat16))


def test_tuple_axes_on_a_2d_mesh():
    mesh = jax.make_mesh((2, 4), ("a", "b"), devices=cpu_devices())
    x = per_device((2000,), jnp.bfloat16, seed=12).reshape(2, 4, 2000)
    xs = jax.device_put(x, NamedSharding(mesh, P("a", "b")))

    def body(v):
        v = v[0, 0]
        return (zc.zip_psum(v, ("a", "b"), strategy="compressed"),
                zc.zip_all_gather(v, ("a", "b"), strategy="compressed")[None, None],
                lax.all_gather(v, ("a", "b"))[None, None])

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("a", "b"),
                              out_specs=(P(), P("a", "b"), P("a", "b"))))
    total, ours, theirs = f(xs)
    assert bits(total) == bits(rank_sum(x.reshape(N, 2000), jnp.bfloat16))
    assert bits(ours) == bits(theirs)


@pytest.mark.parametrize("data_type", [AxisType.Explicit, AxisType.Auto])
def test_partially_manual_2d_mesh_under_jit(data_type):
    """shard_map manual over 'data' while 'model' stays automatic, as large training code does."""
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(data_type, AxisType.Auto), devices=cpu_devices())
    x = gaussian(4 * 2 * 3000, jnp.bfloat16).reshape(4, 2 * 3000)
    xs = jax.device_put(x, NamedSharding(mesh, P("data", "model")))

    @jax.jit
    def step(a):
        def local(v):
            return zc.zip_psum(v, "data", strategy="compressed")
        return jax.shard_map(local, mesh=mesh, in_specs=P("data", None), out_specs=P(None, None),
                             axis_names={"data"})(a)

    out = step(xs)
    assert bits(out) == bits(ref.accumulate(list(x.reshape(4, 1, -1)), np.dtype(jnp.bfloat16)))
    # the fp32 lax reference (lax.psum of bf16 aborts XLA:CPU in this layout)
    lax_out = jax.jit(lambda a: jax.shard_map(lambda v: lax.psum(v.astype(jnp.float32), "data"), mesh=mesh,
                                              in_specs=P("data", None), out_specs=P(None, None),
                                              axis_names={"data"})(a))(xs)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(lax_out), rtol=1e-2, atol=1e-2)


# ---------------------------------------------------------------------------- misuse

def _error(fn, x, **kw):
    try:
        run(fn, x, **kw)
    except Exception as e:  # noqa: BLE001 - the error itself is what is compared
        return type(e), str(e).split("\n")[0]
    return None


def test_misuse_gets_the_errors_lax_gives():
    x = per_device((N * 10,), jnp.float32)
    cases = [  # (ours, lax's): lax's own checks run, so the same error
        (lambda a: zc.zip_ppermute(a, "d", [(0, 1), (1, 1)]), lambda a: lax.ppermute(a, "d", [(0, 1), (1, 1)])),
        (lambda a: zc.zip_psum_scatter(a[:-1], "d", tiled=True, strategy="compressed"),
         lambda a: lax.psum_scatter(a[:-1], "d", tiled=True)),
        (lambda a: zc.zip_all_to_all(a.reshape(4, 20), "d", 0, 1, strategy="compressed"),
         lambda a: lax.all_to_all(a.reshape(4, 20), "d", 0, 1)),
        (lambda a: zc.zip_all_gather(a, "d", to="sideways"), lambda a: lax.all_gather(a, "d", to="sideways")),
        (lambda a: zc.zip_all_gather(a, "nope"), lambda a: lax.all_gather(a, "nope")),
    ]
    for ours, theirs in cases:
        error = _error(theirs, x)
        assert error is not None and _error(ours, x) == error
    # where lax fails with a bare AssertionError or IndexError, a clear error instead
    with pytest.raises(NameError, match="unbound axis name: nope"):
        run(lambda a: zc.zip_psum(a, "nope"), x, out_specs=P())
    with pytest.raises(ValueError, match=r"must be in range\(axis size 8\)"):
        run(lambda a: zc.zip_ppermute(a, "d", [(0, 9)]), x)
    with pytest.raises(ValueError, match="strategy must be"):
        run(lambda a: zc.zip_psum(a, "d", strategy="fast"), x, out_specs=P())


def test_plans_are_visible_and_small_messages_go_raw():
    x = per_device((64,), jnp.bfloat16)
    strategy.last_plans(clear=True)
    out, stats = run(lambda a: (lambda r: (r[0], r[1].wire_bytes[None]))(zc.zip_psum(a, "d", with_stats=True)), x,
                     out_specs=(P(), P("d")))
    plan = strategy.last_plans()[-1]
    assert not plan.compress and "raw" in plan.reason and plan.widened
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(rank_sum(x, np.float32)), rtol=1e-2)
    # XLA:CPU's all-reduce moves the bf16 values as float32: the Stats count what it sends
    assert float(stats[0]) == 2 * x[0].size * 4 * (N - 1) / N


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_raw_plans_of_psum_and_psum_scatter_count_the_float32_xla_sends(dtype):
    x = per_device((N, 16), dtype)
    wire = {}
    for name, fn in (("psum", lambda a: zc.zip_psum(a, "d", strategy="raw", with_stats=True)),
                     ("psum_scatter", lambda a: zc.zip_psum_scatter(a, "d", strategy="raw", with_stats=True))):
        _, stats = run(lambda a: (lambda r: (r[0], jnp.stack([r[1].wire_bytes, r[1].raw_bytes])[None]))(fn(a)), x,
                       out_specs=(P() if name == "psum" else P("d"), P("d")))
        wire[name] = stats[0].tolist()
    share = x[0].size * 4 * (N - 1) / N  # float32 on CPU, whatever the dtype
    assert wire == {"psum": [2 * share, 2 * share], "psum_scatter": [share, share]}


def test_integers_pass_through_every_collective_raw():
    x = np.arange(N * 2 * N * 3, dtype=np.int32).reshape(N, 2 * N, 3) - 50
    perm = [(i, (i + 2) % N) for i in range(N)]
    pairs = [
        (lambda a: zc.zip_psum(a, "d", strategy="compressed")[None], lambda a: lax.psum(a, "d")[None]),
        (lambda a: zc.zip_all_gather(a, "d", strategy="compressed"), lambda a: lax.all_gather(a, "d")),
        (lambda a: zc.zip_psum_scatter(a, "d", tiled=True, strategy="compressed"),
         lambda a: lax.psum_scatter(a, "d", tiled=True)),
        (lambda a: zc.zip_all_to_all(a, "d", 0, 1, tiled=True, strategy="compressed"),
         lambda a: lax.all_to_all(a, "d", 0, 1, tiled=True)),
        (lambda a: zc.zip_ppermute(a, "d", perm, strategy="compressed"), lambda a: lax.ppermute(a, "d", perm)),
    ]
    strategy.last_plans(clear=True)
    for ours, theirs in pairs:
        assert bits(run(ours, x)) == bits(run(theirs, x))
    assert not any(p.compress for p in strategy.last_plans())
