"""zip_all_gather: lax.all_gather with a compressed transfer.

Mirrors lax's all_gather primitives (all_gather_p; all_gather_invariant_p for
to='invarying'; all_gather_reduced_p for to='reduced'): types, batching,
transposes (all_gather <-> psum_scatter, compressed too) and errors are lax's.
The lowering compresses the operand into one stream, all-gathers the streams
at the smallest rung that fits every device's, and decodes them: the result is
bit-for-bit the operands (a raw plan moves them as integer bits, which XLA:CPU
would otherwise canonicalise for bf16 NaNs).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax._src.lax import parallel as lax_parallel

from . import _rewrite
from ._mirror import Options, mirror
from ._transfer import Axes, Stats, bitwise, f32, gather_rows, ladder, plan, relayout


def _lower(info, x, *, all_gather_dimension, axis_name, axis_size, tiled, axis_index_groups=None):
    axes = Axes.of(axis_name, axis_index_groups)
    dim, n = all_gather_dimension, axes.size
    raw = f32(x.size * x.dtype.itemsize * (n - 1))
    if not plan("all_gather", x, axes, info).compress or not info.options.compress:
        out = bitwise(lambda a: lax.all_gather(a, axes.names, axis=dim, tiled=tiled, **axes.kw()), x)
        return [out], raw, raw
    (rows,), sent = gather_rows(x.reshape(-1), axes, True, ladder(axes, info))  # [n * x.size]
    shape = (*x.shape[:dim], n * x.shape[dim], *x.shape[dim + 1:]) if tiled else (*x.shape[:dim], n, *x.shape[dim:])
    out = relayout(lambda r: jnp.moveaxis(r.reshape(n, *x.shape), 0, dim).reshape(shape), rows)
    return [out], sent, raw


def _gathered_dims(params):
    """The operand and result dimension a tiled gather concatenates into."""
    dims = (params["all_gather_dimension"],) if params["tiled"] else ()
    return dims, dims


for _prim in (lax_parallel.all_gather_p, lax_parallel.all_gather_invariant_p, lax_parallel.all_gather_reduced_p):
    mirror(_prim, _lower, collective_dims=_gathered_dims)


def zip_all_gather(x, axis_name, *, axis_index_groups=None, axis: int = 0, tiled: bool = False, to: str = "varying",
                   compress: bool = True, strategy=None, with_stats: bool = False):
    """Compressed `lax.all_gather(x, axis_name, axis=..., tiled=..., to=...)` over
    a pytree: the same arguments, result types, transposes and errors, and the
    operands' exact bits. `compress`, `strategy`, `with_stats`: as zip_psum."""
    kw = {"axis_index_groups": axis_index_groups} if axis_index_groups is not None else {}
    if to != "varying":
        kw["to"] = to
    options = Options(compress, strategy, stats=with_stats)
    _rewrite.check_axis_names(axis_name)
    out, stats = _rewrite.run(lambda t: lax.all_gather(t, axis_name, axis=axis, tiled=tiled, **kw), options, [x])
    return (out, Stats(*stats)) if with_stats else out
