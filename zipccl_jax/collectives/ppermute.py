"""zip_ppermute: lax.ppermute with a compressed transfer.

Mirrors lax's ppermute_p: types, batching, the transpose (ppermute with the
inverse permutation, compressed too) and errors are lax's. The lowering
compresses the operand into one stream, permutes it (_transfer.move: at a
ladder rung all devices agree on, or on CUDA at a static size plus a spill)
and decodes; a device no one sends to gets zeros, as with lax.ppermute. The
result is the sources' exact bits.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax._src.lax import parallel as lax_parallel

from .. import ops
from . import _rewrite
from ._mirror import Options, mirror
from ._transfer import Axes, Rows, Stats, bitwise, f32, ladder, move, plan, relayout


def _lower(info, x, *, axis_name, perm):
    axes = Axes.of(axis_name)
    raw = f32(x.size * x.dtype.itemsize)
    if not plan("ppermute", x, axes, info).compress or not info.options.compress:
        return [bitwise(lambda a: lax.ppermute(a, axes.names, perm), x)], raw, raw
    receives = jnp.isin(lax.axis_index(axes.names), jnp.asarray([d for _, d in perm] or [-1]))
    decode = lambda parts: ops.decode_rows(parts, (x.size,), x.dtype)  # noqa: E731
    # a device no one sends to decodes its own stream, then returns zeros: a select, no branch
    send = lambda outs: [jnp.where(receives, lax.ppermute(outs[0], axes.names, perm), outs[0])]  # noqa: E731
    bits = (lambda a: [bitwise(lambda b: lax.ppermute(b, axes.names, perm), a).reshape(-1)], x.size * x.dtype.itemsize)
    (out,), sent = move(Rows((x,), 1), axes, perm, decode, True, ladder(axes, info), send=send, raw=bits)
    # zeros where no one sends, selected on the bits: XLA:CPU computes a bf16 select in float32 (NaN payloads lost)
    return [relayout(lambda o: jnp.where(receives, o, jnp.zeros_like(o)).reshape(x.shape), out)], sent, raw


mirror(lax_parallel.ppermute_p, _lower)


def _check_perm(perm, axis_name) -> None:
    """lax.ppermute's lowering fails with a bare IndexError for an index out of
    the axis: say what is wrong instead (negative indices count from the end,
    as lax lets them)."""
    n = Axes.of(axis_name).size
    if any(not -n <= int(i) < n for pair in perm for i in pair):
        raise ValueError(f"ppermute perm indices must be in range(axis size {n}), got perm={tuple(map(tuple, perm))}")


def zip_ppermute(x, axis_name, perm, *, compress: bool = True, strategy=None, with_stats: bool = False):
    """Compressed `lax.ppermute(x, axis_name, perm)` over a pytree: the same
    arguments, result types, transposes and errors, and the sources' exact
    bits. `compress`, `strategy`, `with_stats`: as zip_psum."""
    options = Options(compress, strategy, stats=with_stats)
    _rewrite.check_axis_names(axis_name)
    perm = tuple(tuple(pair) for pair in perm)  # any iterable, read once (a zip, a generator), as lax takes it
    _check_perm(perm, axis_name)
    out, stats = _rewrite.run(lambda t: lax.ppermute(t, axis_name, perm), options, [x])
    return (out, Stats(*stats)) if with_stats else out
