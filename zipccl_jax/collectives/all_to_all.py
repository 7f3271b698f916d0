"""zip_all_to_all: lax.all_to_all with a compressed transfer.

Mirrors lax's all_to_all_p: types, batching, the transpose (all_to_all with
split and concat axes swapped, compressed too) and errors are lax's. The
lowering cuts the operand along split_axis into one stream per destination,
all_to_all's them at the smallest rung that fits every device's, decodes, and
concatenates the received chunks along concat_axis in source order: the
operands' exact bits (a raw plan moves them as integer bits).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax._src.lax import parallel as lax_parallel

from .. import ops
from . import _rewrite
from ._mirror import Options, mirror
from ._transfer import Axes, Rows, Stats, bitwise, exchange, f32, ladder, move, plan, relayout


def _lower(info, x, *, split_axis, concat_axis, axis_name, tiled, axis_index_groups=None):
    del tiled  # the primitive always splits and concatenates in place (lax.all_to_all reshapes around it)
    axes = Axes.of(axis_name, axis_index_groups)
    n = axes.size
    raw = f32(x.size * x.dtype.itemsize * (n - 1) // n)
    if not plan("all_to_all", x, axes, info).compress or not info.options.compress:
        out = bitwise(lambda a: lax.all_to_all(a, axes.names, split_axis, concat_axis, tiled=True, **axes.kw()), x)
        return [out], raw, raw
    moved = relayout(lambda a: jnp.moveaxis(a, split_axis, 0), x)
    chunk_shape = (x.shape[split_axis] // n, *moved.shape[1:])
    decode = lambda parts: ops.decode_rows(parts, (x.size,), x.dtype)  # noqa: E731
    bits = lambda a: [bitwise(lambda b: lax.all_to_all(b, axes.names, 0, 0, tiled=True, **axes.kw()),  # noqa: E731
                              a.reshape(n, -1)).reshape(-1)]
    raw_rung = (bits, x.size * x.dtype.itemsize // n)
    (rows,), sent = move(Rows((moved,), n), axes, "all_to_all", decode, True, ladder(axes, info),
                         send=lambda outs: exchange(outs, axes), raw=raw_rung)
    # rows[j]: source j's chunk for this device, shaped like x with split_axis cut
    shape = list(x.shape)
    shape[split_axis] //= n
    shape[concat_axis] *= n

    def place(r):  # [n (source), chunk_shape] -> the chunks along concat_axis in source order
        chunks = jnp.moveaxis(r.reshape(n, *chunk_shape), 1, split_axis + 1)
        return jnp.moveaxis(chunks, 0, concat_axis).reshape(shape)
    return [relayout(place, rows)], sent, raw


def _moved_dims(params):
    dims = (params["split_axis"], params["concat_axis"])
    return dims, dims


mirror(lax_parallel.all_to_all_p, _lower, collective_dims=_moved_dims)


def zip_all_to_all(x, axis_name, split_axis: int, concat_axis: int, *, axis_index_groups=None, tiled: bool = False,
                   compress: bool = True, strategy=None, with_stats: bool = False):
    """Compressed `lax.all_to_all(x, axis_name, split_axis, concat_axis, tiled=...)`
    over a pytree: the same arguments, result types, transposes and errors,
    and the operands' exact bits. `compress`, `strategy`, `with_stats`: as
    zip_psum."""
    kw = {"axis_index_groups": axis_index_groups} if axis_index_groups is not None else {}
    options = Options(compress, strategy, stats=with_stats)
    _rewrite.check_axis_names(axis_name)
    out, stats = _rewrite.run(lambda t: lax.all_to_all(t, axis_name, split_axis, concat_axis, tiled=tiled, **kw),
                              options, [x])
    return (out, Stats(*stats)) if with_stats else out
