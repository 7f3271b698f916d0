"""Moving streams: the sized transfer every compressed collective is built on.

These functions run while a zip primitive is lowered (see _mirror.py): inside
the manual region, with plain types, so lax's collectives here are the ones
XLA runs (NCCL on GPU, gloo on CPU).

A transfer sizes its rows' streams (a size pass), agrees
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
    def of(cls, names, groups=None, *, uneven_ok: bool = False) -> Axes:
        """uneven_ok: index groups may differ in size (psum's); elsewhere
        they are refused with a clear error where XLA's would name a
        replica id -1."""
        names = tuple(names) if isinstance(names, (tuple, list)) else (names,)
        size = len(groups[0]) if groups else int(np.prod([lax.axis_size(a) for a in names]))
        axes = cls(names, groups, size)
        if axes.uneven and not uneven_ok:
            raise ValueError(f"axis_index_groups must all have the same size, got sizes "
                             f"{[len(g) for g in groups]}: only psum takes groups of different sizes")
        return axes

    @property
    def uneven(self) -> bool:
        """Index groups of different sizes (lax.psum takes them; XLA's all_gather and all_to_all do not)."""
        return bool(self.groups) and len({len(g) for g in self.groups}) > 1

    def group_size(self):
        """The number of devices in this device's group: `size`, or with
        uneven groups a per-device (traced) value."""
        if not self.uneven:
            return self.size
        sizes = np.zeros(sum(len(g) for g in self.groups), np.float32)
        for group in self.groups:
            sizes[list(group)] = len(group)
        return jnp.asarray(sizes)[lax.axis_index(self.names)]

    def kw(self) -> dict:
        """axis_index_groups for the lax collectives that take it."""
        return {"axis_index_groups": self.groups} if self.groups else {}

    def position(self) -> jax.Array:
        """This device's row in an all_gather over these axes: its index
        (row-major over a tuple of axes), or its place in its index group."""
        index = lax.axis_index(self.names)
        if not self.groups:
            return index
        places = np.zeros(sum(len(g) for g in self.groups), np.int32)
        for group in self.groups:
            places[list(group)] = np.arange(len(group), dtype=np.int32)
        return jnp.asarray(places)[index]


def plan(collective, x, axes: Axes, info):
    uneven = ("axis_index_groups of different sizes: the rank-ordered plans need XLA's all_gather and all_to_all, "
              "which take equal groups only") if axes.uneven else None
    return strategy.plan(collective, x.size * x.dtype.itemsize, x.dtype, axes.names, axes.size,
                         info.options.strategy, platform=info.platform, raw_because=uneven,
                         static=static_lowering(info))


STATIC_PLATFORMS = frozenset({"cuda"})  # where transfers go static + spill (XLA:CPU has no ragged_all_to_all)


def static_lowering(info) -> bool:
    """Whether this lowering moves streams by static_transfer: every platform it is for is CUDA."""
    return set(info.platforms) <= STATIC_PLATFORMS
ragged_all_to_all = lax.ragged_all_to_all  # module-level: tests stand in for it on the CPU



@dataclasses.dataclass(frozen=True)
class Sizing:
    """How a transfer sizes its streams. On the CPU: the capacity ladder
    (fractions of raw), a size pass that hands the encoder its choices
    (ops.stream_sizes' plans), and all_gather+local_reduce summing a device's
    own row from its data instead of decoding it. Where the module is lowered
    for CUDA alone (`model` set): static_transfer, each stream's first bytes at
    a capacity fixed when tracing (the model's expected ratio and a margin),
    the rest spilled at its exact length."""

    rungs: tuple
    cpu: bool
    model: strategy.CostModel | None = None


def static_capacity(model: strategy.CostModel, dtype, elems: int) -> int:
    """static_transfer's bytes per stream of `elems` values: the header and
    strategy.static_fraction of the raw bytes, 8-byte aligned, at most the
    full capacity (raw plus the header)."""
    full = ops.stream_capacity(elems, dtype)
    raw = full - reference.HEADER_BYTES
    return min(full, -(-int(reference.HEADER_BYTES + strategy.static_fraction(model, dtype) * raw) // 8) * 8)


def ladder(axes: Axes, info) -> Sizing:
    model = strategy.model_for(axes.names, info.options.strategy, platform=info.platform)
    return Sizing(model.ladder, set(info.platforms) == {"cpu"}, model if static_lowering(info) else None)


def bitwise(collective, x):
    """Runs a data-moving lax collective on x's bits. XLA:CPU moves bf16 as
    float32 and its conversion back replaces NaN payloads by the canonical NaN
    (jax 0.10.2 to 0.12), which would break losslessness."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return collective(x)
    bits = jnp.dtype(f"uint{x.dtype.itemsize * 8}")
    return lax.bitcast_convert_type(collective(lax.bitcast_convert_type(x, bits)), x.dtype)


def relayout(fn, x):
    """fn -- a layout change: transpose, reshape, slice -- applied to x's
    bits. XLA:CPU may flush bf16 subnormals to zero in a plain copy (jax
    0.11.2 does in a transpose that follows a conditional: docs/RELIABILITY.md),
    which would break losslessness. The barriers keep XLA from folding the bitcasts away; they
    would also cost a copy, so a fn that only reshapes runs as it is."""
    if not jnp.issubdtype(x.dtype, jnp.floating) or _only_reshapes(fn, x):
        return fn(x)
    bits = lax.optimization_barrier(lax.bitcast_convert_type(x, jnp.dtype(f"uint{x.dtype.itemsize * 8}")))
    return lax.bitcast_convert_type(lax.optimization_barrier(fn(bits)), x.dtype)


def _only_reshapes(fn, x) -> bool:
    eqns = jax.make_jaxpr(fn)(jax.ShapeDtypeStruct(x.shape, x.dtype)).eqns
    return all(e.primitive.name in ("reshape", "squeeze", "expand_dims") for e in eqns)


@dataclasses.dataclass(frozen=True)
class Rows:
    """A flat array -- one or more leaves of one dtype end to end, never
    joined in memory -- cut into k rows, one stream each, as
    reference.row_order lays them out (unit 0: contiguous; unit > 0:
    zip_psum's interleaved chunks). The codec reads the rows in place and
    decode_rows writes them back in place."""

    leaves: tuple
    k: int
    unit: int = 0

    @property
    def size(self) -> int:
        return sum(x.size for x in self.leaves)

    @property
    def dtype(self):
        return self.leaves[0].dtype

    @property
    def m(self) -> int:
        return ops.row_elems(self.size, self.k)

    @property
    def capacity(self) -> int:
        """A stream's worst case: raw plus the header."""
        return ops.stream_capacity(self.m, self.dtype)


def sized_transfer(rows: Rows, axes: Axes, send, decode, compress: bool, sizing: Sizing, *, raw=None):
    """Moves the rows' streams at the smallest ladder rung that every
    device's streams fit, then decodes. Returns (decoded, bytes per stream sent).

    A size pass gives each stream's exact length; one pmax agrees on the
    largest; in the chosen branch the codec writes each row's stream straight
    into its own buffer of the rung's capacity, one per destination, which
    XLA:CPU's all_to_all sends without a copy (it cuts an array operand into
    per-destination pieces; buffers computed apart are taken as they are). So
    no worst-case payload exists (docs/DESIGN.md, Memory).

    send(outs: k uint8 [1, c] arrays) -> the received parts (a list of uint8
    [r, c]); decode(parts) -> the result. The top rung (and compress=False)
    sends STORED_RAW streams through the same send and decode, or runs
    raw = (function of the leaves giving what decode would, bytes per stream
    it sends): the operand's own bits, without a stream header. On the CPU
    the coded rungs code with the size pass's plans (sizing.cpu)."""
    cap, nleaves = rows.capacity, len(rows.leaves)

    def move(*operands, c, stored_raw=False):
        leaves, plans = operands[:nleaves], (operands[nleaves] if len(operands) > nleaves and not stored_raw else None)
        return decode(send(ops.encode_rows(leaves, rows.k, c, outputs=rows.k, unit=rows.unit, raw=stored_raw,
                                           plans=plans)))

    if not compress:
        return move(*rows.leaves, c=cap, stored_raw=True), f32(cap)
    rungs = strategy.capacities(cap, cap - reference.HEADER_BYTES, sizing.rungs)
    if sizing.cpu:
        sizes, plans = ops.stream_sizes(rows.leaves, rows.k, unit=rows.unit, plans=True)
        operands = (*rows.leaves, plans)
    else:
        sizes, operands = ops.stream_sizes(rows.leaves, rows.k, unit=rows.unit), rows.leaves
    need = lax.pmax(jnp.max(sizes), axes.names, **axes.kw())  # the same on every device: a safe predicate
    index = jnp.sum(need > jnp.asarray(rungs[:-1], jnp.uint32)).astype(jnp.int32)
    branches = [functools.partial(move, c=c) for c in rungs[:-1]]
    sent = list(rungs)
    if raw is None:
        branches.append(functools.partial(move, c=cap, stored_raw=True))
    else:
        branches.append(lambda *operands: raw[0](*operands[:nleaves]))
        sent[-1] = raw[1]
    return lax.switch(index, branches, *operands), jnp.asarray(sent, jnp.float32)[index]


def move(rows: Rows, axes: Axes, route, decode, compress: bool, sizing: Sizing, *, send, raw=None):
    """The rows' streams moved by `route` and decoded: where the module is
    lowered for CUDA alone, static_transfer; elsewhere (and for compress=False)
    sized_transfer with `send` and `raw`. Returns (decoded, the bytes this
    device sent to the others)."""
    if compress and sizing.model is not None:
        return static_transfer(rows, axes, route, decode, sizing)
    out, per_stream = sized_transfer(rows, axes, send, decode, compress, sizing, raw=raw)
    return out, per_stream * (axes.size - 1 if route in ("all_to_all", "all_gather") else 1)


def gather_rows(part, axes: Axes, compress: bool, sizing: Sizing, *, sizes=None, unit=0, raw=True):
    """part [m] on each device -> the devices' parts in rank order, as the
    rows of a flat array: leaves of `sizes` elements (default one of n m:
    [n, m] flattened; reference.row_order with `unit` places the rows,
    dropping padding). Returns (the leaves, bytes sent to the others). raw:
    the ladder's top rung gathers part's bits as they are (else STORED_RAW streams)."""
    sizes = (axes.size * part.size,) if sizes is None else sizes
    decode = lambda parts: ops.decode_rows(parts, sizes, part.dtype, unit=unit)  # noqa: E731
    gather = lambda p: [bitwise(lambda a: lax.all_gather(a, axes.names, axis=0, tiled=True, **axes.kw()), p)]  # noqa: E731
    top = (gather, part.size * part.dtype.itemsize) if raw else None
    return move(Rows((part,), 1), axes, "all_gather", decode, compress, sizing,
                send=lambda outs: gather_streams(outs, axes), raw=top)


def gather_streams(outs, axes: Axes):
    """all_gather of one one-row buffer -> [the n rows] in rank order."""
    return [lax.all_gather(outs[0][0], axes.names, axis=0, tiled=False, **axes.kw())]


def exchange(outs, axes: Axes):
    """all_to_all of k one-row buffers (row j to device j) -> the k received
    rows, in source order, as k parts (so the decode takes them as XLA:CPU's
    all_to_all delivers them, without joining them first)."""
    received = lax.all_to_all(jnp.concatenate(outs), axes.names, 0, 0, tiled=True, **axes.kw())
    return [received[j:j + 1] for j in range(len(outs))]


def static_transfer(rows: Rows, axes: Axes, route, decode, sizing: Sizing):
    """Moves the rows' streams with no branch and no size consensus (GPUs:
    docs/DESIGN.md, "Static transfers on GPUs"): one encode writes each stream
    whole and returns its length; its first `c` bytes (static_capacity: fixed when
    tracing) and the int32 length of what did not fit go by one static-size
    collective, a start/done pair XLA may overlap with compute (docs/GPU.md,
    "The compiled program", says when its scheduler does); the bytes past c
    (the spill: none when the data compress as expected, all but c of a
    STORED_RAW stream) go by ragged_all_to_all at their exact lengths, which
    the receiver reads from the bulk. The receiver joins each stream's two
    parts and decodes.

    The spill lengths travel in the bulk's rows, not in a collective of their
    own: XLA combines small collectives of several calls into one (its
    all-gather combiner does), and one collective that waits for every layer's
    encode leaves no compute to overlap the layers' transfers with.

    route: "all_to_all" (row j to device j), "all_gather" (one row to every
    device) or a ppermute perm (one row to the perm's destination).
    Returns (decoded, the bytes this device sent to the others)."""
    n, k, cap = axes.size, rows.k, rows.capacity
    if k * cap >= 2**31:  # ragged_all_to_all's offsets are int32 here (int64 needs jax_enable_x64)
        raise ValueError(f"zipccl: a compressed transfer of {k} streams of up to {cap} bytes on CUDA needs offsets "
                         "past 2**31 bytes: split the operand, or use strategy='raw' for it")
    c = static_capacity(sizing.model, rows.dtype, rows.m)
    *_, payload, lengths = ops.encode_rows(rows.leaves, k, cap, unit=rows.unit, lengths=True)  # [k, cap], [k]
    spill = jnp.maximum(lengths.astype(jnp.int32) - c, 0)
    me, rest = axes.position(), cap - c
    at = jnp.arange(n, dtype=jnp.int32)
    tail = 4 if rest else 0  # the spill's int32 length, at the end of each bulk row
    bulk_rows = payload[:, :c]
    if rest:
        bulk_rows = jnp.concatenate([bulk_rows, lax.bitcast_convert_type(spill, jnp.uint8)], axis=1)
    per_copy = jnp.float32(c + tail)  # per destination
    if route == "all_to_all":
        bulk = lax.all_to_all(bulk_rows, axes.names, 0, 0, tiled=True, **axes.kw())
        sends, offsets = spill, at * cap + c
        sent = (n - 1) * per_copy + (jnp.sum(spill) - spill[me]).astype(jnp.float32)
    elif route == "all_gather":
        bulk = lax.all_gather(bulk_rows[0], axes.names, axis=0, tiled=False, **axes.kw())
        sends, offsets = jnp.broadcast_to(spill, (n,)), jnp.full((n,), c, jnp.int32)
        sent = (n - 1) * (per_copy + spill[0].astype(jnp.float32))
    else:  # a ppermute perm: (source, destination) pairs
        dest, source = np.full(n, -1, np.int32), np.full(n, -1, np.int32)
        for s, d in route:
            dest[s], source[d] = d, s
        bulk = lax.ppermute(bulk_rows, axes.names, route)
        sends, offsets = jnp.where(at == jnp.asarray(dest)[me], spill[0], 0), jnp.full((n,), c, jnp.int32)
        sent = per_copy + spill[0].astype(jnp.float32)
    r = bulk.shape[0]
    if rest:
        got = lax.bitcast_convert_type(bulk[:, c:], jnp.int32)  # [r]: each source's spill length
        if route in ("all_to_all", "all_gather"):
            recv = got
        else:  # one row, from this device's source (a device no one sends to receives zeros: nothing)
            recv = jnp.where(at == jnp.asarray(source)[me], got[0], 0)
        into = (me if r > 1 else 0) * rest  # where this device's spill lands in each receiver's buffer
        spilled = ragged_all_to_all(payload.reshape(-1), jnp.zeros(r * rest, jnp.uint8), offsets, sends,
                                    jnp.broadcast_to(jnp.asarray(into, jnp.int32), (n,)), recv,
                                    axis_name=axes.names, **axes.kw())
        bulk = jnp.concatenate([bulk[:, :c], spilled.reshape(r, rest)], axis=1)
    if route not in ("all_to_all", "all_gather"):  # a device no one sends to decodes its own stream (then zeroed)
        bulk = jnp.where(jnp.asarray(source)[me] >= 0, bulk, payload)
    return decode([bulk]), sent


def reduce_scatter_rows(rows: Rows, axes: Axes, compress: bool, sizing: Sizing):
    """rows (k = n) on each device -> ([this device's row of the rank-ordered
    sum], bytes sent to the others)."""
    decode = lambda parts: ops.decode_accumulate_rows(parts, (rows.m,), rows.dtype)  # noqa: E731
    return move(rows, axes, "all_to_all", decode, compress, sizing, send=lambda outs: exchange(outs, axes))
