"""zip_psum: lax.psum with compressed transfers.

Mirrors lax's psum primitives (psum_p; psum_invariant_p under check_vma;
unreduced_psum_p for unreduced operands): their types, batching, transposes
(psum <-> pvary, or psum itself where lax does) and errors are lax's, the
lowering is this module's. Independent psums over the same axes merge, so a
pytree's float leaves are packed per dtype into buckets of `bucket_bytes`.

A bucket the plan sends by a rank-ordered algorithm, compressed or not
(strategy.plan_names), is summed in float32 in rank order
(x_0 + x_1 + ... + x_{n-1}: device index along the axes, row-major for a tuple
of axes, the listed order within an axis_index_group) in one kernel, and
rounded once to the dtype, on every device, by either algorithm:
- reduce_scatter+all_gather: the bucket cut into n chunks (interleaved: chunk
  j takes blocks, or code-table groups, j, j + n, ..., read in place by the
  codec), compressed, all_to_all, fused decode-and-accumulate, then each
  device's reduced chunk compressed, all-gathered and decoded back into
  place;
- all_gather+local_reduce: every device's bucket all-gathered compressed and
  summed locally (fewer steps, for small axes or high latency).
compress=False runs the same algorithm without the codec (the same bits),
which is what the plan's "uncompressed" variants run: they move the raw
bits (bf16 stays 2 bytes, where XLA:CPU's all-reduce moves float32) with no
size consensus. A bucket the plan sends raw ("raw all_reduce"), and integer
operands, go through XLA's own all-reduce: lax's result (on CPU in float32,
which XLA:CPU uses for bf16 and fp16 anyway, and which avoids its abort on
bf16 in a partially manual shard_map).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src.lax import parallel as lax_parallel

from .. import ops, reference
from ..dtypes import is_compressible
from . import _rewrite
from ._mirror import Options, mirror
from ._transfer import Axes, Rows, Stats, f32, gather_rows, gather_streams, ladder, move, plan, reduce_scatter_rows

INTERLEAVE_GROUPS = 4  # code-table groups per chunk from which the layout interleaves whole groups


def _lower(info, *xs, axes, axis_index_groups=None):
    named = tuple(a for a in axes if not isinstance(a, int))
    positional = tuple(a for a in axes if isinstance(a, int))
    if positional:  # axes of a vmap without a name: summed locally, as lax does
        xs = [lax.reduce_sum(x, [a % x.ndim for a in positional]) for x in xs]
    if not named:
        return list(xs), f32(0), f32(0)
    group = Axes.of(named, axis_index_groups, uneven_ok=True)
    outs, wire, raw = list(xs), f32(0), f32(0)
    floats = [i for i, x in enumerate(xs) if is_compressible(x.dtype)]
    for i, x in enumerate(xs):
        if i not in floats:
            outs[i] = lax.psum(x, named, **group.kw())
            n = group.group_size()
            nbytes = 2 * x.size * x.dtype.itemsize * (n - 1) / n
            wire, raw = wire + nbytes, raw + nbytes
    for bucket in buckets([xs[i] for i in floats], info.options.bucket_bytes):
        idx = [floats[j] for j in bucket]
        totals, w, r = _psum_bucket(tuple(xs[i].reshape(-1) for i in idx), group, info)
        wire, raw = wire + w, raw + r
        for i, total in zip(idx, totals):
            outs[i] = total.reshape(xs[i].shape)
    return outs, wire, raw


def buckets(leaves, bucket_bytes):
    """Leaf indices grouped by dtype into buckets of at most bucket_bytes (a
    larger leaf gets a bucket of its own), in leaf order within a dtype."""
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


def _psum_bucket(leaves: tuple, group: Axes, info):
    """psum of a bucket (flat leaves of one float dtype, summed as one array
    that is never joined in memory) by the planned algorithm:
    (the summed leaves, wire, raw)."""
    n, dtype = group.size, leaves[0].dtype
    size = sum(x.size for x in leaves)
    nbytes = size * dtype.itemsize
    decision = plan("psum", jax.ShapeDtypeStruct((size,), dtype), group, info)
    if decision.algorithm == "all_reduce":  # XLA's own, on the bucket as one array
        return _all_reduce(leaves, group, info.platform)
    # an uncompressed plan runs its algorithm as compress=False does: the same bits
    compress, rungs = info.options.compress and decision.compress, ladder(group, info)
    sizes = tuple(x.size for x in leaves)
    if decision.algorithm == "all_gather+local_reduce":
        # the own row is summed from the leaves where the codec runs on the CPU (the same bits, one decode fewer)
        local = (group.position(), leaves) if rungs.cpu else None
        decode = lambda parts: ops.decode_accumulate_rows(parts, sizes, dtype, local=local)  # noqa: E731
        totals, sent = move(Rows(leaves, 1), group, "all_gather", decode, compress, rungs,
                            send=lambda outs: gather_streams(outs, group))
        return totals, sent, f32(nbytes * (n - 1))
    rows = Rows(leaves, n, interleave_unit(n * ops.row_elems(size, n), n))
    (part,), sent_rs = reduce_scatter_rows(rows, group, compress, rungs)
    totals, sent_ag = gather_rows(part, group, compress, rungs, sizes=sizes, unit=rows.unit, raw=False)
    return totals, sent_rs + sent_ag, f32(2 * rows.m * dtype.itemsize * (n - 1))


def _all_reduce(leaves: tuple, group: Axes, platform: str):
    """XLA's all-reduce of a bucket, joined into one array: XLA:CPU runs one
    gloo all-reduce per operand of a multi-operand psum (a bucket of 21
    leaves took as long as 21 syncs: docs/BENCHMARKS.md, "Plans timed in situ"), and in
    float32 on CPU. (the summed leaves, wire, raw)."""
    n, dtype = group.group_size(), leaves[0].dtype
    wide = [x.astype(jnp.float32) if platform == "cpu" else x for x in leaves]
    total = lax.psum(wide[0] if len(wide) == 1 else jnp.concatenate(wide), group.names, **group.kw())
    ends = np.cumsum([x.size for x in leaves])
    raw = jnp.asarray(2 * int(ends[-1]) * total.dtype.itemsize * (n - 1) / n, jnp.float32)  # float32 on CPU
    return [total[end - x.size:end].astype(dtype) for x, end in zip(leaves, ends)], raw, raw


def interleave_unit(size: int, n: int) -> int:
    """The unit of the reduce-scatter's chunk layout (reference.row_order) for
    a bucket of `size` values (padded to a multiple of n): a code-table group
    when every chunk holds INTERLEAVE_GROUPS of them (a group keeps one leaf's
    statistics), else a block. Every chunk then mixes all the bucket's
    leaves, so the n streams (sent at the size of the largest) compress
    alike (docs/BENCHMARKS.md, wire bytes); the codec reads the units in
    place (no copy of the bucket)."""
    group = reference.GROUP_BLOCKS * reference.BLOCK
    return group if size >= n * group * INTERLEAVE_GROUPS else reference.BLOCK


for _prim in (lax_parallel.psum_p, lax_parallel.psum_invariant_p, lax_parallel.unreduced_psum_p):
    mirror(_prim, _lower, grouped=True)


def zip_psum(x, axis_name, *, axis_index_groups=None, compress: bool = True, strategy=None,
             bucket_bytes: int = Options.bucket_bytes, with_stats: bool = False):
    """Compressed `lax.psum(x, axis_name, axis_index_groups=...)` over a pytree.

    Same arguments, result types, transposes and errors as lax.psum. Float
    leaves (bf16, fp16, fp32) are packed per dtype into buckets of at most
    `bucket_bytes`; a bucket the plan sends by a rank-ordered algorithm
    (compressed or uncompressed) is summed in float32 in rank order and
    rounded once; other leaves and raw buckets give lax's result.
    `compress=False` runs the planned algorithm without the codec (the same
    bits). `strategy`: None (the process default), "auto", "raw" (XLA's
    all-reduce), "compressed", a strategy.CostModel or a strategy.Pinned
    plan (strategy.plan_names("psum")). `with_stats=True` returns
    (result, Stats).
    """
    kw = {"axis_index_groups": axis_index_groups} if axis_index_groups is not None else {}
    options = Options(compress, strategy, bucket_bytes, with_stats)
    _rewrite.check_axis_names(axis_name)
    out, stats = _rewrite.run(lambda t: lax.psum(t, axis_name, **kw), options, [x])
    return (out, Stats(*stats)) if with_stats else out
