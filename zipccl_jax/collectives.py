"""Compressed collectives: drop-in replacements for lax.psum and friends.

Each one compresses its operand into streams (ops.py), agrees with the other
devices on how many bytes per stream to send (one pmax of the largest stream:
the predicate is then the same on every device), and in a `lax.switch` over
the capacity ladder sends that many bytes with XLA's own collective and
decodes. The top rung is raw, so every input fits and arrives bit-exact.

Reductions (zip_psum, zip_psum_scatter) sum in float32 in rank order, in one
kernel (decompress_accumulate), and round once to the dtype: the result is
`round(x_0 + x_1 + ... + x_{n-1})` on every device, with or without
compression, and with either psum algorithm. lax.psum sums in another order
and, for bf16/fp16, in the input precision, so it agrees only to rounding.

Gradients follow lax's transposes and are compressed too: psum <-> pvary,
all_gather <-> psum_scatter, all_to_all <-> all_to_all with the axes
swapped, ppermute <-> the inverse permutation.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import ops, reference, strategy
from .dtypes import DTYPE_CODES, is_compressible

DEFAULT_BUCKET_BYTES = 32 << 20


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Stats:
    """What one call put on the wire, per device: wire_bytes (sent, all phases)
    against raw_bytes (what the uncompressed algorithm sends); plans: the
    static decisions (strategy.Plan) with their reasons."""

    wire_bytes: jax.Array
    raw_bytes: jax.Array
    plans: tuple = dataclasses.field(default=(), metadata=dict(static=True))

    def __add__(self, other: Stats) -> Stats:
        return Stats(self.wire_bytes + other.wire_bytes, self.raw_bytes + other.raw_bytes, self.plans + other.plans)


def _axes(axis_name) -> tuple:
    """The axis names as a tuple; an unbound name raises lax's NameError here."""
    axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    _axis_size(axes)
    return axes


def _axis_size(axes: tuple) -> int:
    return math.prod(lax.axis_size(a) for a in axes)


def _vary(x, axes):
    """Marks x varying over axes it does not vary over yet (lax does the same
    before a collective), so switch branches and custom_vjp types line up."""
    missing = tuple(a for a in axes if a not in ops.varying_axes(x))
    return lax.pcast(x, missing, to="varying") if missing else x


def _f32(n) -> jax.Array:
    return jnp.asarray(float(n), jnp.float32)


# ---------------------------------------------------------------------------
# streams and the sized transfer


def raw_streams(rows: jax.Array) -> tuple[jax.Array, jax.Array]:
    """rows [k, m] -> STORED_RAW streams [k, 16 + m * itemsize] (FORMAT.md §1):
    the uncompressed path runs through the same transfer and decode."""
    k, m = rows.shape
    head = np.frombuffer(reference.header(DTYPE_CODES[rows.dtype.name], reference.FLAG_STORED_RAW, m), np.uint8)
    body = lax.bitcast_convert_type(rows, jnp.uint8).reshape(k, m * rows.dtype.itemsize)
    payload = jnp.concatenate([jnp.broadcast_to(jnp.asarray(head), (k, head.size)), body], axis=1)
    return payload, jnp.full((k,), payload.shape[1], jnp.uint32)


def _streams(rows: jax.Array, compress: bool):
    return ops.compress_items(rows) if compress else raw_streams(rows)


def sized_transfer(payload, nbytes, axes, send, decode, compress: bool, ladder):
    """Sends payload [..., cap] streams with the smallest ladder rung that all
    devices' streams fit, then decodes. Returns (decoded, bytes per stream sent)."""
    cap = payload.shape[-1]
    if not compress:
        return decode(send(payload)), _f32(cap)
    rungs = strategy.capacities(cap, cap - reference.HEADER_BYTES, ladder)

    def run(payload, nbytes, batched: bool):
        # Under vmap the rung must still be one for the whole batch: a batched
        # switch index would run every branch, with streams cut short.
        need = lax.pmax(jnp.max(nbytes), axes)  # invariant across the axes: a safe predicate
        index = jnp.sum(need > jnp.asarray(rungs[:-1], jnp.uint32)).astype(jnp.int32)
        step = lambda q, c: decode(send(q[..., :c]))  # noqa: E731
        branches = [functools.partial(lambda p, c: (jax.vmap(step, (0, None))(p, c) if batched else step(p, c)), c=c)
                    for c in rungs]
        return lax.switch(index, branches, payload), jnp.asarray(rungs, jnp.float32)[index]

    @jax.custom_batching.custom_vmap
    def transfer(payload, nbytes):
        return run(payload, nbytes, batched=False)

    @transfer.def_vmap
    def _(axis_size, in_batched, payload, nbytes):
        payload, nbytes = (a if b else jnp.broadcast_to(a, (axis_size, *a.shape))
                           for a, b in zip((payload, nbytes), in_batched))
        out, sent = run(payload, nbytes, batched=True)
        return (out, sent), (True, False)

    return transfer(payload, nbytes)


def _plan(name, x, axes, n, strategy_arg):
    return strategy.plan(name, x.size * x.dtype.itemsize, x.dtype, axes, n, strategy_arg)


def _model(axes, strategy_arg) -> strategy.CostModel:
    return strategy.model_for(axes, strategy_arg)


# ---------------------------------------------------------------------------
# psum


def _psum_array(x, axes, compress, strategy_arg):
    """psum of one float array by the planned algorithm; returns (sum, Stats)."""
    n = _axis_size(axes)
    plan = _plan("psum", x, axes, n, strategy_arg)
    if not plan.compress:  # small message: XLA's all-reduce, in float32
        raw = _f32(2 * x.size * x.dtype.itemsize * (n - 1) / n)
        return lax.psum(x.astype(jnp.float32), axes).astype(x.dtype), Stats(raw, raw, (plan,))
    ladder = _model(axes, strategy_arg).ladder
    x = _vary(x, axes)
    flat = x.reshape(-1)
    raw_bytes = flat.size * flat.dtype.itemsize
    if plan.algorithm == "all_gather+local_reduce":
        payload, nbytes = _streams(flat[None], compress)
        send = lambda p: _all_gather_invariant(p[0], axes)  # noqa: E731
        decode = lambda r: ops.decompress_accumulate(r, m=flat.size, dtype=flat.dtype)  # noqa: E731
        total, per_stream = sized_transfer(payload, nbytes, axes, send, decode, compress, ladder)
        wire = per_stream * (n - 1)
        raw = _f32(raw_bytes * (n - 1))
    else:
        pad = -flat.size % n
        rows = jnp.pad(flat, (0, pad)).reshape(n, -1)
        part, sent_rs = _reduce_scatter(rows, axes, compress, ladder)
        gathered, sent_ag = _gather(part, axes, compress, ladder, invariant=True)
        total = gathered.reshape(-1)[: flat.size]
        wire = (sent_rs + sent_ag) * (n - 1)
        raw = _f32(2 * (rows.size // n) * flat.dtype.itemsize * (n - 1))
    return total.reshape(x.shape), Stats(wire, raw, (plan,))


def _reduce_scatter(rows, axes, compress, ladder):
    """rows [n, m] on each device -> this device's row of the rank-ordered sum."""
    payload, nbytes = _streams(rows, compress)
    send = lambda p: lax.all_to_all(p, axes, 0, 0, tiled=True)  # noqa: E731
    decode = lambda r: ops.decompress_accumulate(r, m=rows.shape[1], dtype=rows.dtype)  # noqa: E731
    return sized_transfer(payload, nbytes, axes, send, decode, compress, ladder)


def _gather(part, axes, compress, ladder, invariant=False):
    """part [m] on each device -> [n, m], all devices' parts in rank order."""
    payload, nbytes = _streams(part[None], compress)
    if invariant:
        send = lambda p: _all_gather_invariant(p[0], axes)  # noqa: E731
    else:
        send = lambda p: lax.all_gather(p[0], axes, axis=0, tiled=False)  # noqa: E731
    decode = lambda r: ops.decompress_items(r, m=part.size, dtype=part.dtype)  # noqa: E731
    return sized_transfer(payload, nbytes, axes, send, decode, compress, ladder)


def _all_gather_invariant(x, axes):
    """all_gather whose result is typed invariant over axes (it is the same on
    every device), as psum's result must be."""
    return lax.all_gather(x, axes, axis=0, tiled=False, to="invarying")


def _buckets(leaves, bucket_bytes):
    """Groups leaf indices by dtype into buckets of at most bucket_bytes
    (a larger leaf gets a bucket of its own)."""
    by_dtype: dict = {}
    for i, leaf in enumerate(leaves):
        by_dtype.setdefault(leaf.dtype, []).append(i)
    buckets = []
    for idx in by_dtype.values():
        current, size = [], 0
        for i in idx:
            nbytes = leaves[i].size * leaves[i].dtype.itemsize
            if current and size + nbytes > bucket_bytes:
                buckets.append(current)
                current, size = [], 0
            current.append(i)
            size += nbytes
        buckets.append(current)
    return buckets


def _psum_tree(tree, axes, compress, strategy_arg, bucket_bytes):
    leaves, treedef = jax.tree.flatten(tree)
    out = list(leaves)
    stats = Stats(_f32(0), _f32(0))
    floats = [i for i, leaf in enumerate(leaves) if is_compressible(leaf.dtype)]
    for i, leaf in enumerate(leaves):
        if not is_compressible(leaf.dtype):
            out[i] = lax.psum(leaf, axes)  # integers: exact in any order
    for bucket in _buckets([leaves[i] for i in floats], bucket_bytes):
        idx = [floats[j] for j in bucket]
        flat = jnp.concatenate([_vary(leaves[i], axes).reshape(-1) for i in idx])
        total, s = _psum_array(flat, axes, compress, strategy_arg)
        stats = stats + s
        offset = 0
        for i in idx:
            out[i] = total[offset : offset + leaves[i].size].reshape(leaves[i].shape)
            offset += leaves[i].size
    return jax.tree.unflatten(treedef, out), stats


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def _psum_vjp(tree, axes, compress, strategy_arg, bucket_bytes):
    return _psum_tree(tree, axes, compress, strategy_arg, bucket_bytes)


def _psum_fwd(tree, axes, compress, strategy_arg, bucket_bytes):
    return _psum_tree(tree, axes, compress, strategy_arg, bucket_bytes), None


def _psum_bwd(axes, compress, strategy_arg, bucket_bytes, _, cotangents):
    g, _ = cotangents
    return (jax.tree.map(lambda t: _vary(t, axes), g),)


_psum_vjp.defvjp(_psum_fwd, _psum_bwd)


def zip_psum(x, axis_name, *, compress: bool = True, strategy=None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
             with_stats: bool = False):
    """Compressed `lax.psum(x, axis_name)` over a pytree.

    Float leaves (bf16, fp16, fp32) are packed per dtype into buckets of at
    most `bucket_bytes` and summed in float32 in rank order; other dtypes use
    lax.psum. `compress=False` runs the planned algorithm without the codec
    (bit-identical results); buckets the plan sends raw use lax.psum in float32. `strategy`: a strategy.CostModel, or "raw" /
    "compressed" to force the choice. With `with_stats=True` returns
    (result, Stats).
    """
    axes = _axes(axis_name)
    out, stats = _psum_vjp(x, axes, compress, strategy, bucket_bytes)
    return (out, stats) if with_stats else out


# ---------------------------------------------------------------------------
# all_gather and psum_scatter (each other's transpose)


def _bitwise(collective, x):
    """Runs a data-moving lax collective on x's bits. XLA:CPU moves bf16 as
    float32 and its conversion back replaces NaN payloads by the canonical NaN
    (jax 0.10.2 and 0.11.2), which would break losslessness on the raw plan."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return collective(x)
    bits = jnp.dtype(f"uint{x.dtype.itemsize * 8}")
    return lax.bitcast_convert_type(collective(lax.bitcast_convert_type(x, bits)), x.dtype)


def _all_gather_array(x, axes, axis, tiled, compress, strategy_arg):
    n = _axis_size(axes)
    plan = _plan("all_gather", x, axes, n, strategy_arg)
    if not plan.compress or not compress:
        out = _bitwise(lambda a: lax.all_gather(a, axes, axis=axis, tiled=tiled), x)
        return out, Stats(_f32(x.size * x.dtype.itemsize * (n - 1)), _f32(x.size * x.dtype.itemsize * (n - 1)), (plan,))
    rows, sent = _gather(_vary(x, axes).reshape(-1), axes, True, _model(axes, strategy_arg).ladder)
    out = jnp.moveaxis(rows.reshape(n, *x.shape), 0, axis)
    if tiled:
        out = out.reshape(*x.shape[:axis], n * x.shape[axis], *x.shape[axis + 1 :])
    return out, Stats(sent * (n - 1), _f32(x.size * x.dtype.itemsize * (n - 1)), (plan,))


def _psum_scatter_array(x, axes, dim, tiled, compress, strategy_arg):
    n = _axis_size(axes)
    plan = _plan("psum_scatter", x, axes, n, strategy_arg)
    raw = _f32(x.size * x.dtype.itemsize * (n - 1) // n)
    moved = _split_rows(x, axes, dim, tiled, "zip_psum_scatter: scatter_dimension")
    if not plan.compress:  # small message or not a float: XLA's reduce-scatter, floats in float32
        wide = x.astype(jnp.float32) if is_compressible(x.dtype) else x
        return lax.psum_scatter(wide, axes, scatter_dimension=dim, tiled=tiled).astype(x.dtype), Stats(raw, raw, (plan,))
    part, sent = _reduce_scatter(moved.reshape(n, -1), axes, compress, _model(axes, strategy_arg).ladder)
    part = jnp.moveaxis(part.reshape(x.shape[dim] // n, *moved.shape[1:]), 0, dim)
    if not tiled:
        part = part.reshape(*x.shape[:dim], *x.shape[dim + 1 :])
    return part, Stats(sent * (n - 1), raw, (plan,))


def _split_rows(x, axes, dim, tiled, what):
    """x with axis dim moved first, after lax's size check: that axis is cut
    into one piece per device (of size 1 unless tiled)."""
    n, size = _axis_size(axes), x.shape[dim]
    if (not tiled and size != n) or size % n:
        raise ValueError(f"{what} {dim} has size {size}, which must "
                         + (f"be divisible by the axis size {n}" if tiled else f"equal the axis size {n}"))
    return jnp.moveaxis(_vary(x, axes), dim, 0)


def _tree_call(fn, tree):
    """Applies fn(leaf) -> (out, Stats) over a pytree; sums the stats."""
    pairs = [fn(leaf) for leaf in jax.tree.leaves(tree)]
    outs = jax.tree.unflatten(jax.tree.structure(tree), [p[0] for p in pairs])
    stats = functools.reduce(lambda a, b: a + b, [p[1] for p in pairs], Stats(_f32(0), _f32(0)))
    return outs, stats


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4, 5))
def _all_gather_vjp(tree, axes, axis, tiled, compress, strategy_arg):
    return _tree_call(lambda a: _all_gather_array(a, axes, _canon(axis, a, tiled), tiled, compress, strategy_arg), tree)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4, 5))
def _psum_scatter_vjp(tree, axes, dim, tiled, compress, strategy_arg):
    return _tree_call(lambda a: _psum_scatter_array(a, axes, dim % a.ndim, tiled, compress, strategy_arg), tree)


def _canon(axis, x, tiled):
    return axis % (x.ndim if tiled else x.ndim + 1)


_all_gather_vjp.defvjp(
    lambda t, axes, axis, tiled, c, s: (_all_gather_vjp(t, axes, axis, tiled, c, s), t),
    lambda axes, axis, tiled, c, s, primal, ct: (
        jax.tree.map(lambda g, p: _psum_scatter_vjp(g, axes, _canon(axis, p, tiled), True, c, s)[0].reshape(p.shape)
                     if tiled else _psum_scatter_vjp(g, axes, _canon(axis, p, tiled), False, c, s)[0],
                     ct[0], primal),),
)

_psum_scatter_vjp.defvjp(
    lambda t, axes, dim, tiled, c, s: (_psum_scatter_vjp(t, axes, dim, tiled, c, s), t),
    lambda axes, dim, tiled, c, s, primal, ct: (
        jax.tree.map(lambda g, p: _all_gather_vjp(g, axes, dim % p.ndim, tiled, c, s)[0], ct[0], primal),),
)


def zip_all_gather(x, axis_name, *, axis: int = 0, tiled: bool = False, compress: bool = True, strategy=None,
                   with_stats: bool = False):
    """Compressed `lax.all_gather(x, axis_name, axis=axis, tiled=tiled)` over a pytree."""
    out, stats = _all_gather_vjp(x, _axes(axis_name), axis, tiled, compress, strategy)
    return (out, stats) if with_stats else out


def zip_psum_scatter(x, axis_name, *, scatter_dimension: int = 0, tiled: bool = False, compress: bool = True,
                     strategy=None, with_stats: bool = False):
    """Compressed `lax.psum_scatter`: each device gets its slice of the
    rank-ordered float32 sum, rounded once to the dtype."""
    out, stats = _psum_scatter_vjp(x, _axes(axis_name), scatter_dimension, tiled, compress, strategy)
    return (out, stats) if with_stats else out


# ---------------------------------------------------------------------------
# all_to_all


def _all_to_all_array(x, axes, split_axis, concat_axis, tiled, compress, strategy_arg):
    n = _axis_size(axes)
    plan = _plan("all_to_all", x, axes, n, strategy_arg)
    raw = _f32(x.size * x.dtype.itemsize * (n - 1) // n)
    if not plan.compress or not compress:
        out = _bitwise(lambda a: lax.all_to_all(a, axes, split_axis, concat_axis, tiled=tiled), x)
        return out, Stats(raw, raw, (plan,))
    moved = _split_rows(x, axes, split_axis, tiled, "zip_all_to_all: split_axis")
    chunk_shape = (x.shape[split_axis] // n, *moved.shape[1:])
    payload, nbytes = ops.compress_items(moved.reshape(n, -1))
    send = lambda p: lax.all_to_all(p, axes, 0, 0, tiled=True)  # noqa: E731
    decode = lambda r: ops.decompress_items(r, m=math.prod(chunk_shape), dtype=x.dtype)  # noqa: E731
    rows, sent = sized_transfer(payload, nbytes, axes, send, decode, True, _model(axes, strategy_arg).ladder)
    # rows[j]: source j's chunk for this device, shaped like x with split_axis cut
    chunks = jnp.moveaxis(rows.reshape(n, *chunk_shape), 1, split_axis + 1)
    if not tiled:
        chunks = chunks.reshape(n, *x.shape[:split_axis], *x.shape[split_axis + 1 :])
        return jnp.moveaxis(chunks, 0, concat_axis), Stats(sent * (n - 1), raw, (plan,))
    out = jnp.moveaxis(chunks, 0, concat_axis)
    shape = list(chunks.shape[1:])
    shape[concat_axis] *= n
    return out.reshape(shape), Stats(sent * (n - 1), raw, (plan,))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4, 5, 6))
def _all_to_all_vjp(tree, axes, split_axis, concat_axis, tiled, compress, strategy_arg):
    return _tree_call(
        lambda a: _all_to_all_array(a, axes, split_axis % a.ndim, concat_axis % a.ndim, tiled, compress, strategy_arg),
        tree)


_all_to_all_vjp.defvjp(
    lambda t, axes, s_ax, c_ax, tiled, c, s: (_all_to_all_vjp(t, axes, s_ax, c_ax, tiled, c, s), None),
    lambda axes, s_ax, c_ax, tiled, c, s, _, ct: (_all_to_all_vjp(ct[0], axes, c_ax, s_ax, tiled, c, s)[0],),
)


def zip_all_to_all(x, axis_name, split_axis: int, concat_axis: int, *, tiled: bool = False, compress: bool = True,
                   strategy=None, with_stats: bool = False):
    """Compressed `lax.all_to_all(x, axis_name, split_axis, concat_axis, tiled=tiled)`."""
    out, stats = _all_to_all_vjp(x, _axes(axis_name), split_axis, concat_axis, tiled, compress, strategy)
    return (out, stats) if with_stats else out


# ---------------------------------------------------------------------------
# ppermute


def _check_perm(perm, n):
    perm = tuple((int(s), int(d)) for s, d in perm)
    srcs, dsts = [s for s, _ in perm], [d for _, d in perm]
    if len(set(srcs)) != len(srcs) or len(set(dsts)) != len(dsts):
        raise ValueError(f"ppermute sources and destinations must be unique, got perm={perm}")
    if any(not 0 <= i < n for i in srcs + dsts):
        raise ValueError(f"ppermute perm indices must be in range(axis size {n}), got perm={perm}")
    return perm


def _ppermute_array(x, axes, perm, compress, strategy_arg):
    n = _axis_size(axes)
    plan = _plan("ppermute", x, axes, n, strategy_arg)
    raw = _f32(x.size * x.dtype.itemsize)
    if not plan.compress or not compress:
        return _bitwise(lambda a: lax.ppermute(a, axes, perm), x), Stats(raw, raw, (plan,))
    payload, nbytes = ops.compress_items(_vary(x, axes).reshape(1, -1))
    receives = jnp.isin(lax.axis_index(axes), jnp.asarray([d for _, d in perm] or [-1]))

    def decode(r):  # a device no one sends to gets zeros, as lax.ppermute gives
        return lax.cond(receives, lambda p: ops.decompress_items(p, m=x.size, dtype=x.dtype),
                        lambda p: _vary(jnp.zeros((1, x.size), x.dtype), tuple(ops.varying_axes(p))), r)

    send = lambda p: lax.ppermute(p, axes, perm)  # noqa: E731
    out, sent = sized_transfer(payload, nbytes, axes, send, decode, True, _model(axes, strategy_arg).ladder)
    return out.reshape(x.shape), Stats(sent, raw, (plan,))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def _ppermute_vjp(tree, axes, perm, compress, strategy_arg):
    return _tree_call(lambda a: _ppermute_array(a, axes, perm, compress, strategy_arg), tree)


_ppermute_vjp.defvjp(
    lambda t, axes, perm, c, s: (_ppermute_vjp(t, axes, perm, c, s), None),
    lambda axes, perm, c, s, _, ct: (_ppermute_vjp(ct[0], axes, tuple((d, s_) for s_, d in perm), c, s)[0],),
)


def zip_ppermute(x, axis_name, perm, *, compress: bool = True, strategy=None, with_stats: bool = False):
    """Compressed `lax.ppermute(x, axis_name, perm)`."""
    axes = _axes(axis_name)
    perm = _check_perm(perm, _axis_size(axes))
    out, stats = _ppermute_vjp(x, axes, perm, compress, strategy)
    return (out, stats) if with_stats else out
