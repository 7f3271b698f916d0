"""The codec as JAX operations: compress, decompress and the chunked forms.

Each op is an XLA FFI custom call (CPU and CUDA). They work under jit and
vmap, inside shard_map (outputs keep the input's varying axes), and under jit
with sharded inputs, where custom partitioning keeps them local to each
device's shard of the batch dimensions (see partitioning.py).

A corrupt payload: the CPU handlers raise ("zipccl: corrupt payload (stream
i): ..."), wherever they run. The CUDA handlers never wait for the device:
they return a status word per payload row (0, or the decoder's error code)
and fill a corrupt stream's output with all-one bytes, a NaN in every float
dtype. The decoders called eagerly read the words and raise the CPU's error;
under jit, and inside the collectives, the poisoned output is the signal
(`with_status=True` returns the words). docs/GPU.md, "Errors without a sync".
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax._src import core, dispatch
from jax._src.interpreters import batching, mlir

from . import _ffi, partitioning
from . import _zipccl_cpu
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


def _on_gpu(x) -> bool:
    return all(d.platform == "gpu" for d in x.devices())


def _per_platform(operand, cpu, cuda):
    """cpu(operand) or, where the computation runs on a GPU, cuda(operand)
    (operand: an array or a list of arrays). Traced, the choice is made when lowering (lax.platform_dependent: one
    platform's branch reaches XLA); eager, by the operand's devices."""
    if _ffi.cuda_module() is None:  # lowered for a GPU, codec_guard raises the error naming the cause and the fix
        return cpu([_guarded(operand[0]), *operand[1:]] if isinstance(operand, list) else _guarded(operand))
    arrays = jax.tree.leaves(operand)  # an array, or a list of them (the row ops)
    if not any(isinstance(x, jax.core.Tracer) for x in arrays):
        return (cuda if _on_gpu(arrays[0]) else cpu)(operand)
    return lax.platform_dependent(operand, cpu=cpu, cuda=cuda, default=cpu)


def _codec_call(target: str, operand, results: tuple, workspace, *, status: bool = False, **attrs):
    """The FFI call `target`(operand, **attrs) -> results (a tuple), then, if
    `status`, one uint32 status word per payload row (operand.shape[:-1]).

    CPU: the handler raises on a corrupt payload, so its words are zeros. CUDA:
    the handler's results are followed by its status words and its workspace,
    workspace() bytes that XLA allocates and the call drops, so the handler
    allocates nothing and waits for nothing: XLA may capture it into a command
    buffer (docs/GPU.md)."""

    def cpu(x):
        out = tuple(jax.ffi.ffi_call(target, results, vmap_method="broadcast_all")(x, **attrs))
        return (*out, jnp.zeros_like(x[..., 0], jnp.uint32)) if status else out

    def cuda(x):
        words = [_result(x, x.shape[:-1], jnp.uint32)] if status else []
        scratch = _result(x, (workspace(),), jnp.uint8)
        *out, _ = jax.ffi.ffi_call(target, (*results, *words, scratch),
                                   vmap_method="broadcast_all")(x, **attrs)
        return tuple(out)

    return _per_platform(operand, cpu, cuda)


def _workspace(target: str, dtype, batch: int, n: int, rows: int = 1):
    """The bytes of the CUDA handler's workspace result, from the CUDA module
    (rows: the rows an accumulate sums per item)."""
    return lambda: _ffi.cuda_module().workspace_bytes(target, DTYPE_CODES[np.dtype(dtype).name], batch, n, rows)


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
    results = (_result(x, (*batch, stream_capacity(m, x.dtype)), jnp.uint8), _result(x, batch, jnp.uint32))
    return _codec_call("zipccl_compress", x, results, _workspace("zipccl_compress", x.dtype, math.prod(batch), m),
                       item_elems=np.int64(m))


def _decompress_items(payload: jax.Array, m: int, dtype) -> tuple[jax.Array, jax.Array]:
    """Inverse of compress_items: payload [*batch, capacity] -> ([*batch, m] of
    dtype, status uint32 [*batch])."""
    _ffi.register()
    dtype = np.dtype(dtype_name(dtype))
    payload = jnp.asarray(payload)
    if payload.dtype != jnp.uint8:
        raise TypeError(f"zipccl: payload must be uint8, got {payload.dtype}")
    results = (_result(payload, (*payload.shape[:-1], m), dtype),)
    workspace = _workspace("zipccl_decompress", dtype, math.prod(payload.shape[:-1]), m)
    return _codec_call("zipccl_decompress", payload, results, workspace, status=True, item_elems=np.int64(m))


def _decompress_accumulate(payload: jax.Array, m: int, dtype, out_dtype=None) -> tuple[jax.Array, jax.Array]:
    """Decodes payload [*batch, k, capacity] (k streams of m elements) and sums
    the k streams in index order in float32 (FORMAT.md §7) -> ([*batch, m],
    status uint32 [*batch, k])."""
    _ffi.register()
    dtype = np.dtype(dtype_name(dtype))
    out_dtype = np.dtype(out_dtype or dtype)
    if out_dtype not in (dtype, np.dtype(np.float32)):
        raise ValueError(f"zipccl: out_dtype must be {dtype} or float32, got {out_dtype}")
    payload = jnp.asarray(payload)
    results = (_result(payload, (*payload.shape[:-2], m), out_dtype),)
    workspace = _workspace("zipccl_decompress_accumulate", dtype, math.prod(payload.shape[:-2]), m, payload.shape[-2])
    return _codec_call("zipccl_decompress_accumulate", payload, results, workspace, status=True,
                       item_elems=np.int64(m), dtype=np.int32(DTYPE_CODES[dtype.name]))


def _guarded(x):
    """x, marked by codec_guard where this build has no CUDA codec and x is traced or on a GPU."""
    if _ffi.cuda_module() is None and (isinstance(x, jax.core.Tracer) or hasattr(x, "devices") and _on_gpu(x)):
        return codec_guard(x)
    return x


def _rowwise(fn, item_rank_in: int, item_ranks_out: tuple[int, ...]):
    """partitioning.rowwise(fn, ...), its operand guarded first: custom partitioning lowers fn inside XLA's
    partitioner, where the missing CUDA codec would surface as XLA's INTERNAL error."""
    op = partitioning.rowwise(fn, item_rank_in, item_ranks_out)
    return lambda x, **static: op(_guarded(x), **static)


compress_items = _rowwise(_compress_items, 1, (1, 0))
_decode_items = _rowwise(_decompress_items, 1, (1, 0))
_decode_accumulate = _rowwise(_decompress_accumulate, 2, (1, 1))


def corrupt_payload_error(status, rows_per_item: int = 1) -> str | None:
    """The CPU codec's error for the first corrupt item of these status words
    (0: decoded; else the decoder's error code), or None. An item is
    rows_per_item payload rows (decompress_accumulate: its k rows)."""
    words = np.asarray(status, np.uint32).reshape(-1, max(rows_per_item, 1))
    bad = np.flatnonzero(words.any(axis=1))
    if not bad.size:
        return None
    row = words[bad[0]]
    return f"zipccl: corrupt payload (stream {bad[0]}): {_zipccl_cpu.error_message(int(row[row != 0][0]))}"


def _checked(out, status, with_status: bool, rows_per_item: int = 1):
    """The decoders' result: (out, status) when asked for; else out, after
    raising the CPU codec's error for a corrupt payload decoded eagerly on a
    GPU (traced, the words are not known yet: the poisoned output stands)."""
    if with_status:
        return out, status
    if not isinstance(status, jax.core.Tracer) and _on_gpu(status):
        error = corrupt_payload_error(status, rows_per_item)
        if error:
            raise jax.errors.JaxRuntimeError(f"DATA_LOSS: {error}")
    return out


def decompress_items(payload: jax.Array, m: int, dtype, *, with_status: bool = False):
    """Inverse of compress_items: payload [*batch, capacity] -> [*batch, m] of
    dtype; with_status: (that, status uint32 [*batch]), 0 for each stream that
    decoded (see the module's docstring for what a corrupt payload does)."""
    out, status = _decode_items(payload, m=m, dtype=dtype)
    return _checked(out, status, with_status)


def decompress_accumulate(payload: jax.Array, m: int, dtype, out_dtype=None, *, with_status: bool = False):
    """Decodes payload [*batch, k, capacity] (k streams of m elements) and sums
    the k streams in index order in float32 (FORMAT.md §7) -> [*batch, m] of
    out_dtype (dtype or float32; default dtype); with_status: (that, status
    uint32 [*batch, k]). A corrupt row makes its item's whole sum NaN on a GPU."""
    out, status = _decode_accumulate(payload, m=m, dtype=dtype, out_dtype=out_dtype)
    return _checked(out, status, with_status, rows_per_item=payload.shape[-2])


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


def decompress(c: Compressed, *, with_status: bool = False):
    """Inverse of compress: bit-exact. A corrupt payload raises when decoded
    eagerly or on the CPU; under jit on a GPU its streams decode to NaN (all-one
    bytes). with_status: (array, status uint32 [*batch_shape]), 0 per stream
    that decoded, else the decoder's error code."""
    flat, status = decompress_items(c.payload, m=math.prod(c.shape), dtype=c.dtype, with_status=True)
    out = flat.reshape(*c.batch_shape, *c.shape)
    return _checked(out, status.reshape(c.batch_shape), with_status)


def compress_chunks(x: jax.Array, num_chunks: int) -> Compressed:
    """Splits flattened x into num_chunks equal chunks, one stream each
    (FORMAT.md §7): payload [num_chunks, capacity], nbytes [num_chunks]."""
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


def _rows_call(target: str, operands: list, results: list, workspace, status_rows: int = 0, cpu_attrs=None,
               **attrs) -> list:
    """The row op `target`(*operands, **attrs) -> results (the CPU handler
    also gets cpu_attrs). CUDA: the handler's
    results are followed by, for the decoders, a status word per row (dropped
    here: a corrupt row's elements come back poisoned, as in the public
    decoders under jit), and its workspace of workspace() bytes (_codec_call)."""

    def cpu(xs):
        return list(jax.ffi.ffi_call(target, results)(*xs, **attrs, **(cpu_attrs or {})))

    def cuda(xs):
        extra = [_result(xs[0], (status_rows,), jnp.uint32)] if status_rows else []
        extra.append(_result(xs[0], (workspace(),), jnp.uint8))
        return list(jax.ffi.ffi_call(target, [*results, *extra])(*xs, **attrs))[:len(results)]

    return _per_platform(list(operands), cpu, cuda)


def _row_workspace(target: str, dtype, rows: int, size: int, unit: int, leaves: int, part_rows: int = 0):
    return lambda: _ffi.cuda_module().row_workspace_bytes(target, DTYPE_CODES[np.dtype(dtype).name], rows, size,
                                                          unit, leaves, part_rows)


# A CPU-only option of a row op marks its operand with cpu_only_p: the
# identity where the computation is lowered for the CPU, a clear error (naming
# the option and the platform) when it is lowered for any other, before XLA
# compiles anything -- not the CUDA handler's confusing one at run time. A
# build without the CUDA codec marks every op's operand the same way
# (codec_guard: option None), so that lowering one for a GPU names the missing
# codec and how to rebuild instead of XLA's "no registered implementation".
cpu_only_p = core.Primitive("zipccl_cpu_only")
cpu_only_p.def_impl(functools.partial(dispatch.apply_primitive, cpu_only_p))
cpu_only_p.def_abstract_eval(lambda x, *, option: x)


def _refuse_off_cpu(ctx, x, *, option):
    platforms = tuple(ctx.module_context.platforms)
    if option is None:
        raise _ffi.no_cuda_codec(platforms)
    raise NotImplementedError(f"zipccl: {option} runs on the CPU only; this computation is lowered for "
                              f"{', '.join(platforms)}: call it without that option there")


mlir.register_lowering(cpu_only_p, _refuse_off_cpu)
mlir.register_lowering(cpu_only_p, lambda ctx, x, *, option: [x], platform="cpu")
# under vmap (compress of a batch, a build without the CUDA codec): the batched operand, marked as one
batching.primitive_batchers[cpu_only_p] = lambda args, dims, *, option: (cpu_only_p.bind(args[0], option=option), dims[0])


def cpu_only(x: jax.Array, option: str) -> jax.Array:
    """x, in a computation lowered for the CPU alone; lowering it for another
    platform raises NotImplementedError naming `option` and the platform."""
    return cpu_only_p.bind(x, option=option)


def codec_guard(x: jax.Array) -> jax.Array:
    """x, in a computation lowered for the CPU; lowering it for another
    platform raises _ffi.NoCudaCodecError (used by builds without the CUDA codec)."""
    return cpu_only_p.bind(x, option=None)


def stream_sizes(leaves, rows: int, *, unit: int = 0, plans: bool = False):
    """The exact length of each row's stream (the size pass): uint32 [rows].

    plans=True (CPU only: for a computation lowered for the CPU) returns
    (sizes, plans): also the encoder's choices for each row (FORMAT.md §6
    steps 1-3; uint8 [rows, plan bytes]), which encode_rows of the same
    leaves codes with instead of choosing again."""
    _ffi.register()
    leaves = _check_leaves(leaves, rows)
    size = sum(x.size for x in leaves)
    sizes = _result(leaves[0], (rows,), jnp.uint32)
    if plans:
        planned = _result(leaves[0], (rows, _zipccl_cpu.plan_bytes(row_elems(size, rows))), jnp.uint8)
        leaves = [cpu_only(leaves[0], "stream_sizes(plans=True)"), *leaves[1:]]
        return tuple(jax.ffi.ffi_call("zipccl_stream_sizes", [sizes, planned])(*leaves, unit=np.int64(unit)))
    workspace = _row_workspace("zipccl_stream_sizes", leaves[0].dtype, rows, size, unit, len(leaves))
    return _rows_call("zipccl_stream_sizes", leaves, [sizes], workspace, unit=np.int64(unit))[0]


def encode_rows(leaves, rows: int, capacity: int, *, outputs: int = 1, unit: int = 0,
                raw: bool = False, plans=None, lengths: bool = False) -> list[jax.Array]:
    """Each row's stream in a row of `capacity` bytes (zero past its end),
    the rows split over `outputs` uint8 arrays [rows / outputs, capacity].
    Every stream must fit (stream_sizes, agreed before): a longer one is an
    error. raw=True writes STORED_RAW streams (capacity: the full one).
    plans (CPU only): stream_sizes(..., plans=True)'s plans of these leaves
    and rows; a plan of other data is checked only for memory safety (its
    streams would not decode to these leaves). lengths=True appends each
    stream's length (uint32 [rows]): the CUDA encoder returns the lengths it
    wrote, the CPU counts them first (stream_sizes)."""
    _ffi.register()
    leaves = _check_leaves(leaves, rows)
    if rows % outputs:
        raise ValueError(f"zipccl: {rows} rows do not split into {outputs} outputs")
    shape = (rows // outputs, capacity)
    results = [_result(leaves[0], shape, jnp.uint8)] * outputs
    attrs = dict(rows=np.int64(rows), unit=np.int64(unit), raw=np.bool_(raw))
    if lengths:
        if raw or plans is not None:
            raise ValueError("zipccl: encode_rows(lengths=True) takes neither raw nor plans")
        return _encode_rows_with_lengths(leaves, results, attrs)
    if plans is not None:
        plans = cpu_only(plans, "encode_rows(plans=...)")
        return list(jax.ffi.ffi_call("zipccl_encode_rows", results)(*leaves, plans, planned=np.bool_(True), **attrs))
    size = sum(x.size for x in leaves)
    workspace = _row_workspace("zipccl_encode_rows_raw" if raw else "zipccl_encode_rows", leaves[0].dtype, rows, size,
                               unit, len(leaves))
    return _rows_call("zipccl_encode_rows", leaves, results, workspace, cpu_attrs=dict(planned=np.bool_(False)),
                      **attrs)


def _encode_rows_with_lengths(leaves, results, attrs) -> list[jax.Array]:
    rows, unit = int(attrs["rows"]), int(attrs["unit"])
    lengths = _result(leaves[0], (rows,), jnp.uint32)

    def cpu(xs):
        sizes = jax.ffi.ffi_call("zipccl_stream_sizes", [lengths])(*xs, unit=attrs["unit"])[0]
        return [*jax.ffi.ffi_call("zipccl_encode_rows", results)(*xs, planned=np.bool_(False), **attrs), sizes]

    def cuda(xs):
        size = sum(x.size for x in xs)
        workspace = _row_workspace("zipccl_encode_rows", xs[0].dtype, rows, size, unit, len(xs))()
        return list(jax.ffi.ffi_call("zipccl_encode_rows", [*results, lengths, _result(xs[0], (workspace,), jnp.uint8)])(
            *xs, **attrs))[:-1]

    return _per_platform(list(leaves), cpu, cuda)


def decode_rows(parts, sizes, dtype, *, unit: int = 0) -> list[jax.Array]:
    """Inverse of encode_rows: the rows of the uint8 parts ([r_i, capacity]
    each, in row order) decoded into flat leaves of `sizes` elements."""
    _ffi.register()
    dtype = np.dtype(dtype_name(dtype))
    rows = [math.prod(p.shape[:-1]) for p in parts]
    workspace = _row_workspace("zipccl_decode_rows", dtype, sum(rows), sum(sizes), unit, len(sizes), max(rows))
    return _rows_call("zipccl_decode_rows", parts, [_result(parts[0], (size,), dtype) for size in sizes], workspace,
                      status_rows=sum(rows), unit=np.int64(unit))


def decode_accumulate_rows(parts, sizes, dtype, *, local=None) -> list[jax.Array]:
    """The rows of the parts (streams of sum(sizes) elements) decoded and
    summed in row order in float32, rounded once to dtype (FORMAT.md §7),
    into flat leaves of `sizes` elements end to end.

    local (CPU only): (index, leaves): row `index` (an int32 scalar) holds
    these leaves' elements, which are summed in its place instead of
    decoding it (the same bits: an all-gather's own row)."""
    _ffi.register()
    dtype = np.dtype(dtype_name(dtype))
    rows = sum(math.prod(p.shape[:-1]) for p in parts)
    results = [_result(parts[0], (size,), dtype) for size in sizes]
    code = np.int32(DTYPE_CODES[dtype.name])
    if local is not None:
        index, leaves = local[0], _check_leaves(local[1], 1)
        index = cpu_only(jnp.asarray(index, jnp.int32).reshape(1), "decode_accumulate_rows(local=...)")
        return list(jax.ffi.ffi_call("zipccl_decode_accumulate_rows", results)(
            *parts, index, *leaves, dtype=code, local_leaves=np.int64(len(leaves))))
    workspace = _row_workspace("zipccl_decode_accumulate_rows", dtype, 1, sum(sizes), 0, len(sizes), rows)
    return _rows_call("zipccl_decode_accumulate_rows", parts, results, workspace, status_rows=rows,
                      cpu_attrs=dict(local_leaves=np.int64(0)), dtype=code)


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
