"""zip_psum_scatter: lax.psum_scatter with compressed transfers.

Mirrors lax's reduce_scatter primitives (reduce_scatter_p;
unreduced_reduce_scatter_p for unreduced operands): types, batching,
transposes (psum_scatter <-> all_gather, compressed too) and errors are lax's.
The lowering cuts the operand along scatter_dimension into one stream per
device, all_to_all's them at the smallest rung that fits every device's, and
decodes and sums the received streams in float32 in rank order in one kernel,
rounding once: each device gets its slice of the same sum zip_psum computes.
A raw plan uses XLA's reduce-scatter (in float32 on CPU, as for psum).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax._src.lax import parallel as lax_parallel

from ..dtypes import is_compressible
from . import _rewrite
from ._mirror import Options, mirror
from ._transfer import Axes, Rows, Stats, f32, ladder, plan, reduce_scatter_rows, relayout


def _lower(info, x, *, scatter_dimension, axis_name, axis_size, tiled, axis_index_groups=None):
    axes = Axes.of(axis_name, axis_index_groups)
    dim, n = scatter_dimension, axes.size
    raw = f32(x.size * x.dtype.itemsize * (n - 1) // n)
    decision = plan("psum_scatter", x, axes, info)
    if not decision.compress:
        wide = x.astype(jnp.float32) if info.platform == "cpu" and is_compressible(x.dtype) else x
        out = lax.psum_scatter(wide, axes.names, scatter_dimension=dim, tiled=tiled, **axes.kw())
        sent = f32(x.size * wide.dtype.itemsize * (n - 1) // n)  # what XLA sends: float32 on CPU
        return [out.astype(x.dtype)], sent, sent
    moved = relayout(lambda a: jnp.moveaxis(a, dim, 0), x)
    (part,), sent = reduce_scatter_rows(Rows((moved,), n), axes, info.options.compress, ladder(axes, info))
    shape = (*x.shape[:dim], x.shape[dim] // n, *x.shape[dim + 1:]) if tiled else (*x.shape[:dim], *x.shape[dim + 1:])
    part = relayout(lambda p: jnp.moveaxis(p.reshape(x.shape[dim] // n, *moved.shape[1:]), 0, dim).reshape(shape), part)
    return [part], sent, raw


def _scattered_dims(params):
    dim = params["scatter_dimension"]
    return (dim,), ((dim,) if params["tiled"] else ())


for _prim in (lax_parallel.reduce_scatter_p, lax_parallel.unreduced_reduce_scatter_p):
    mirror(_prim, _lower, collective_dims=_scattered_dims)


def zip_psum_scatter(x, axis_name, *, scatter_dimension: int = 0, axis_index_groups=None, tiled: bool = False,
                     compress: bool = True, strategy=None, with_stats: bool = False):
    """Compressed `lax.psum_scatter`: the same arguments, result types,
    transposes and errors; a float operand the plan compresses gives each
    device its slice of the float32 rank-ordered sum, rounded once (as
    zip_psum). `compress`, `strategy`, `with_stats`: as zip_psum."""
    kw = {"axis_index_groups": axis_index_groups} if axis_index_groups is not None else {}
    options = Options(compress, strategy, stats=with_stats)
    _rewrite.check_axis_names(axis_name)
    out, stats = _rewrite.run(
        lambda t: lax.psum_scatter(t, axis_name, scatter_dimension=scatter_dimension, tiled=tiled, **kw),
        options, [x])
    return (out, Stats(*stats)) if with_stats else out
