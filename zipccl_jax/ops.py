"""The codec as JAX operations: compress, decompress and the chunked forms.

Each op is an XLA FFI custom call (CPU and CUDA). They work under jit and
vmap, inside shard_map (outputs keep the input's varying axes), and under jit
with sharded inputs, where custom partitioning keeps them local to each
device's shard of the batch dimensions (see partitioning.py).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from . import _ffi, partitioning
from .dtypes import DTYPE_CODES, dtype_name
from .reference import max_stream_bytes


MAX_STREAM_BYTES = 2**32 - 1  # Compressed.nbytes is uint32


def stream_capacity(n: int, dtype) -> int:
    """Bytes reserved per stream of n elements: raw size plus the header (FORMAT.md §1)."""
    return max_stream_bytes(n, dtype)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Compressed:
    """Compressed streams with the static shape and dtype needed to decode them.

    payload: uint8 [*batch_shape, capacity], one stream per row.
    nbytes: uint32 [*batch_shape], each stream's length (bytes past it are unused).
    shape: the shape of one decoded item; dtype: its dtype.
    """

    payload: jax.Array
    nbytes: jax.Array
    shape: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
    dtype: np.dtype = dataclasses.field(metadata=dict(static=True))

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return tuple(self.nbytes.shape)

    def ratio(self) -> jax.Array:
        """Raw bytes over stream bytes, over all streams."""
        raw = math.prod(self.shape) * np.dtype(self.dtype).itemsize * max(1, math.prod(self.batch_shape))
        return raw / jnp.maximum(jnp.sum(self.nbytes.astype(jnp.float32)), 1.0)


def varying_axes(x) -> frozenset:
    """The shard_map axes along which x varies (jax 0.10: manual_axis_type; later: vma)."""
    aval = jax.typeof(x)
    mat = getattr(aval, "manual_axis_type", None)
    return frozenset(mat.varying) if mat is not None else frozenset(getattr(aval, "vma", ()))


def _result(x, shape, dtype):
    """The FFI call's result type: x's type with a new shape and dtype, so it
    keeps x's varying mesh axes inside shard_map (a bare ShapeDtypeStruct
    would drop them and let a varying result pass as replicated). Outside
    shard_map on an Explicit mesh, jax >= 0.11 carries x's sharding spec into
    update(), which then fails for the new rank: there a plain struct is right
    (custom partitioning assigns the shardings)."""
    try:
        return jax.typeof(x).update(shape=shape, dtype=dtype, weak_type=False)
    except ValueError:
        return jax.ShapeDtypeStruct(shape, dtype)


def _compress_items(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Compresses each row x[..., :] (last axis) as its own stream.

    Returns (payload uint8 [*x.shape[:-1], capacity], nbytes uint32 [*x.shape[:-1]]).
    """
    _ffi.register()
    dtype_name(x.dtype)
    batch, m = x.shape[:-1], x.shape[-1]
    if stream_capacity(m, x.dtype) > MAX_STREAM_BYTES:
        raise ValueError(f"zipccl: a stream of {m} {np.dtype(x.dtype).name} elements could take "
                         f"{stream_capacity(m, x.dtype)} bytes, over the {MAX_STREAM_BYTES} a stream's uint32 "
                         "length can count: split it into streams (compress(x, batch_dims=...) or compress_chunks)")
    call = jax.ffi.ffi_call(
        "zipccl_compress",
        (_result(x, (*batch, stream_capacity(m, x.dtype)), jnp.uint8), _result(x, batch, jnp.uint32)),
        vmap_method="broadcast_all",
    )
    return call(x, item_elems=np.int64(m))


def _decompress_items(payload: jax.Array, m: int, dtype) -> jax.Array:
    """Inverse of compress_items: payload [*batch, capacity] -> [*batch, m] of dtype."""
    _ffi.register()
    dtype = np.dtype(dtype_name(dtype))
    if payload.dtype != jnp.uint8:
        raise TypeError(f"zipccl: payload must be uint8, got {payload.dtype}")
    call = jax.ffi.ffi_call(
        "zipccl_decompress", _result(payload, (*payload.shape[:-1], m), dtype), vmap_method="broadcast_all"
    )
    return call(payload, item_elems=np.int64(m))


def _decompress_accumulate(payload: jax.Array, m: int, dtype, out_dtype=None) -> jax.Array:
    """Decodes payload [*batch, k, capacity] (k streams of m elements) and sums
    the k streams in index order in float32 (FORMAT.md §8) -> [*batch, m]."""
    _ffi.register()
    dtype = np.dtype(dtype_name(dtype))
    out_dtype = np.dtype(out_dtype or dtype)
    if out_dtype not in (dtype, np.dtype(np.float32)):
        raise ValueError(f"zipccl: out_dtype must be {dtype} or float32, got {out_dtype}")
    call = jax.ffi.ffi_call(
        "zipccl_decompress_accumulate",
        _result(payload, (*payload.shape[:-2], m), out_dtype),
        vmap_method="broadcast_all",
    )
    return call(payload, item_elems=np.int64(m), dtype=np.int32(DTYPE_CODES[dtype.name]))


compress_items = partitioning.rowwise(_compress_items, 1, (1, 0))
decompress_items = partitioning.rowwise(_decompress_items, 1, (1,))
decompress_accumulate = partitioning.rowwise(_decompress_accumulate, 2, (1,))


def compress(x: jax.Array, *, batch_dims: int = 0) -> Compressed:
    """Compresses x losslessly.

    The first `batch_dims` axes index independent streams (each item of the
    remaining axes is one stream); with the default 0 the whole array is one
    stream. Under jit with x sharded along its batch axes, each device
    compresses its own shard.
    """
    x = jnp.asarray(x)
    if not 0 <= batch_dims <= x.ndim:
        raise ValueError(f"zipccl: batch_dims={batch_dims} out of range for rank {x.ndim}")
    batch, item = x.shape[:batch_dims], x.shape[batch_dims:]
    payload, nbytes = compress_items(x.reshape(*batch, math.prod(item)))
    return Compressed(payload, nbytes, tuple(item), np.dtype(x.dtype))


def decompress(c: Compressed) -> jax.Array:
    """Inverse of compress: bit-exact, raises on a corrupt payload."""
    flat = decompress_items(c.payload, m=math.prod(c.shape), dtype=c.dtype)
    return flat.reshape(*c.batch_shape, *c.shape)


def compress_chunks(x: jax.Array, num_chunks: int) -> Compressed:
    """Splits flattened x into num_chunks equal chunks, one stream each
    (FORMAT.md §8): payload [num_chunks, capacity], nbytes [num_chunks]."""
    x = jnp.asarray(x)
    if num_chunks < 1 or x.size % num_chunks:
        raise ValueError(f"zipccl: {x.size} elements do not split into {num_chunks} equal chunks")
    return compress(x.reshape(num_chunks, x.size // num_chunks), batch_dims=1)


# ---------------------------------------------------------------------------
# The collectives' row ops: a flat array -- one or more arrays ("leaves", a
# bucket's, end to end, never joined in memory) -- cut into rows, one stream
# each (reference.row_order says which elements a row holds), moved at a
# rung's capacity. They run inside a collective's lowering (plain types, one
# device's data), so they need no batching or partitioning rules.


def row_elems(size: int, rows: int) -> int:
    """Elements per row of a flat array of `size` elements cut into `rows`."""
    return -(-size // rows) if rows else 0


def stream_sizes(leaves, rows: int, *, unit: int = 0) -> jax.Array:
    """The exact length of each row's stream (the size pass): uint32 [rows]."""
    _ffi.register()
    leaves = _check_leaves(leaves, rows)
    call = jax.ffi.ffi_call("zipccl_stream_sizes", _result(leaves[0], (rows,), jnp.uint32))
    return call(*leaves, unit=np.int64(unit))


def encode_rows(leaves, rows: int, capacity: int, *, outputs: int = 1, unit: int = 0,
                raw: bool = False) -> list[jax.Array]:
    """Each row's stream in a row of `capacity` bytes (zero past its end),
    the rows split over `outputs` uint8 arrays [rows / outputs, capacity].
    Every stream must fit (stream_sizes, agreed before): a longer one is an
    error. raw=True writes STORED_RAW streams (capacity: the full one)."""
    _ffi.register()
    leaves = _check_leaves(leaves, rows)
    if rows % outputs:
        raise ValueError(f"zipccl: {rows} rows do not split into {outputs} outputs")
    shape = (rows // outputs, capacity)
    call = jax.ffi.ffi_call("zipccl_encode_rows", [_result(leaves[0], shape, jnp.uint8)] * outputs)
    return list(call(*leaves, rows=np.int64(rows), unit=np.int64(unit), raw=np.bool_(raw)))


def decode_rows(parts, sizes, dtype, *, unit: int = 0) -> list[jax.Array]:
    """Inverse of encode_rows: the rows of the uint8 parts ([r_i, capacity]
    each, in row order) decoded into flat leaves of `sizes` elements."""
    _ffi.register()
    dtype = np.dtype(dtype_name(dtype))
    call = jax.ffi.ffi_call("zipccl_decode_rows", [_result(parts[0], (size,), dtype) for size in sizes])
    return list(call(*parts, unit=np.int64(unit)))


def decode_accumulate_rows(parts, sizes, dtype) -> list[jax.Array]:
    """The rows of the parts (streams of sum(sizes) elements) decoded and
    summed in row order in float32, rounded once to dtype (FORMAT.md §8),
    into flat leaves of `sizes` elements end to end."""
    _ffi.register()
    dtype = np.dtype(dtype_name(dtype))
    call = jax.ffi.ffi_call("zipccl_decode_accumulate_rows", [_result(parts[0], (size,), dtype) for size in sizes])
    return list(call(*parts, dtype=np.int32(DTYPE_CODES[dtype.name])))


def _check_leaves(leaves, rows) -> list:
    leaves = [leaves] if hasattr(leaves, "shape") else leaves  # one array, or a sequence of them
    leaves = [x.reshape(-1) for x in leaves]
    if not leaves or len({x.dtype for x in leaves}) != 1 or rows < 1:
        raise ValueError("zipccl: the row ops take one or more arrays of one dtype and at least one row")
    dtype_name(leaves[0].dtype)
    m = row_elems(sum(x.size for x in leaves), rows)
    if stream_capacity(m, leaves[0].dtype) > MAX_STREAM_BYTES:
        raise ValueError(f"zipccl: a row of {m} {np.dtype(leaves[0].dtype).name} elements could take "
                         f"{stream_capacity(m, leaves[0].dtype)} bytes, over the {MAX_STREAM_BYTES} a stream's "
                         "uint32 length can count")
    return leaves
