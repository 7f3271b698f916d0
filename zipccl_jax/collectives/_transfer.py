"""Moving streams: the sized transfer every compressed collective is built on.

These functions run while a zip primitive is lowered (see _mirror.py): inside
the manual region, with plain types, so lax's collectives here are the ones
XLA runs (NCCL on GPU, gloo on CPU).

A transfer compresses its rows into streams (worst-case capacity), agrees
with the other devices on the largest stream with one `pmax` (a value that is
the same on every device: the only safe predicate for a collective inside a
branch), and in a `lax.switch` over the capacity ladder sends that many bytes
per stream and decodes. The top rung is raw, so every input fits.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import ops, reference, strategy
from ..dtypes import DTYPE_CODES


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Stats:
    """What one call put on the wire, per device: wire_bytes (sent, all
    phases) against raw_bytes (what the uncompressed algorithm sends).
    The decisions behind them are in strategy.last_plans()."""

    wire_bytes: jax.Array
    raw_bytes: jax.Array

    def __add__(self, other: Stats) -> Stats:
        return Stats(self.wire_bytes + other.wire_bytes, self.raw_bytes + other.raw_bytes)


def f32(n) -> jax.Array:
    return jnp.asarray(float(n), jnp.float32)


@dataclasses.dataclass(frozen=True)
class Axes:
    """The devices a collective spans: mesh axis names, optional index groups,
    and the number of devices in one group."""

    names: tuple
    groups: tuple | None
    size: int

    @classmethod
    def of(cls, names, groups=None) -> Axes:
        names = tuple(names) if isinstance(names, (tuple, list)) else (names,)
        size = len(groups[0]) if groups else int(np.prod([lax.axis_size(a) for a in names]))
        return cls(names, groups, size)

    def kw(self) -> dict:
        """axis_index_groups for the lax collectives that take it."""
        return {"axis_index_groups": self.groups} if self.groups else {}


def plan(collective, x, axes: Axes, info):
    return strategy.plan(collective, x.size * x.dtype.itemsize, x.dtype, axes.names, axes.size,
                         info.options.strategy, platform=info.platform)


def ladder(axes: Axes, info) -> tuple:
    return strategy.model_for(axes.names, info.options.strategy, platform=info.platform).ladder


def bitwise(collective, x):
    """Runs a data-moving lax collective on x's bits. XLA:CPU moves bf16 as
    float32 and its conversion back replaces NaN payloads by the canonical NaN
    (jax 0.10.2 to 0.12), which would break losslessness."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return collective(x)
    bits = jnp.dtype(f"uint{x.dtype.itemsize * 8}")
    return lax.bitcast_convert_type(collective(lax.bitcast_convert_type(x, bits)), x.dtype)


def raw_streams(rows: jax.Array) -> tuple[jax.Array, jax.Array]:
    """rows [k, m] -> STORED_RAW streams [k, 16 + m * itemsize] (FORMAT.md §1):
    the uncompressed path runs through the same transfer and decode."""
    k, m = rows.shape
    head = np.frombuffer(reference.header(DTYPE_CODES[rows.dtype.name], reference.FLAG_STORED_RAW, m), np.uint8)
    body = lax.bitcast_convert_type(rows, jnp.uint8).reshape(k, m * rows.dtype.itemsize)
    payload = jnp.concatenate([jnp.broadcast_to(jnp.asarray(head), (k, head.size)), body], axis=1)
    return payload, jnp.full((k,), payload.shape[1], jnp.uint32)


def streams(rows: jax.Array, compress: bool):
    return ops.compress_items(rows) if compress else raw_streams(rows)


def sized_transfer(payload, nbytes, axes: Axes, send, decode, compress: bool, rungs_from, *, raw=None):
    """Sends payload [..., cap] streams with the smallest ladder rung that all
    devices' streams fit, then decodes. Returns (decoded, bytes per stream sent).
    rungs_from: the ladder (fractions of the raw size). raw: (function of no
    argument giving what decode would, bytes per stream it sends), run instead
    of the top rung: it moves the operand's own bits, without a stream header."""
    cap = payload.shape[-1]
    if not compress:
        return decode(send(payload)), f32(cap)
    rungs = strategy.capacities(cap, cap - reference.HEADER_BYTES, rungs_from)
    need = lax.pmax(jnp.max(nbytes), axes.names, **axes.kw())  # the same on every device: a safe predicate
    index = jnp.sum(need > jnp.asarray(rungs[:-1], jnp.uint32)).astype(jnp.int32)
    branches = [functools.partial(lambda p, c: decode(send(p[..., :c])), c=c) for c in rungs]
    sent = list(rungs)
    if raw is not None:
        top, sent[-1] = raw
        branches[-1] = lambda p: top()
    return lax.switch(index, branches, payload), jnp.asarray(sent, jnp.float32)[index]


def gather_rows(part, axes: Axes, compress: bool, rungs_from):
    """part [m] on each device -> [n, m], the devices' parts in rank order.
    The top rung gathers part's bits as they are."""
    payload, nbytes = streams(part[None], compress)
    send = lambda p: lax.all_gather(p[0], axes.names, axis=0, tiled=False, **axes.kw())  # noqa: E731
    decode = lambda r: ops.decompress_items(r, m=part.size, dtype=part.dtype)  # noqa: E731
    raw = (lambda: bitwise(lambda a: lax.all_gather(a, axes.names, axis=0, tiled=False, **axes.kw()), part),
           part.size * part.dtype.itemsize)
    return sized_transfer(payload, nbytes, axes, send, decode, compress, rungs_from, raw=raw)


def reduce_scatter_rows(rows, axes: Axes, compress: bool, rungs_from):
    """rows [n, m] on each device -> this device's row of the rank-ordered sum."""
    payload, nbytes = streams(rows, compress)
    send = lambda p: lax.all_to_all(p, axes.names, 0, 0, tiled=True, **axes.kw())  # noqa: E731
    decode = lambda r: ops.decompress_accumulate(r, m=rows.shape[1], dtype=rows.dtype)  # noqa: E731
    return sized_transfer(payload, nbytes, axes, send, decode, compress, rungs_from)
