"""Compressed collectives as JAX primitives that mirror lax's.

Each zip primitive stands for one of lax's collective primitives (psum_p,
all_gather_p, reduce_scatter_p, all_to_all_p, ppermute_p and their
invariant/unreduced/reduced variants) and takes the same parameters plus
`zip` (the Options). It keeps lax's semantics by construction:

- abstract evaluation is lax's own (shapes, dtypes, varying/unreduced/reduced
  mesh axes, effects, and the errors lax raises);
- it is linear: its JVP applies it to the tangents;
- its transpose and batching rules are lax's, run on lax's primitive and
  traced; the collectives they emit (psum -> pvary or psum, all_gather ->
  psum_scatter, ...) are rewritten into zip primitives (_rewrite.py), so the
  backward pass and vmap's collectives are compressed too;
- only its lowering differs: the byte algorithm of its collective family
  (psum.py, all_gather.py, ...), traced with plain types inside the manual
  region (a nested manual region over the mesh's other, non-manual axes).

A zip primitive takes several operands, one per lax bind it replaces
(consecutive independent psums are merged, so a pytree's leaves share
buckets); with `Options.stats` it also returns two float32 scalars: the bytes
this device sent and the bytes the uncompressed algorithm would send.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
from jax._src import config, core, dispatch
from jax._src.interpreters import ad, batching, mlir
from jax.sharding import PartitionSpec as P

from .. import _ffi
from .. import strategy as strategy_lib

DEFAULT_BUCKET_BYTES = 32 << 20
STRATEGIES = (None, "auto", "raw", "compressed")


@dataclasses.dataclass(frozen=True)
class Options:
    """What a zip collective does beyond lax's parameters (hashable: it is a
    primitive parameter). strategy: None (the process default), "auto", "raw",
    "compressed", a strategy.CostModel or a strategy.Pinned plan."""

    compress: bool = True
    strategy: object = None
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    stats: bool = False

    def __post_init__(self):
        if not isinstance(self.strategy, (strategy_lib.CostModel, strategy_lib.Pinned)) and \
                self.strategy not in STRATEGIES:
            raise ValueError("zipccl: strategy must be a CostModel, a Pinned plan, 'auto', 'raw', 'compressed' or "
                             f"None, got {self.strategy!r}")
        if not isinstance(self.bucket_bytes, int) or self.bucket_bytes < 1:
            raise ValueError(f"zipccl: bucket_bytes must be a positive int, got {self.bucket_bytes!r}")


@dataclasses.dataclass(frozen=True)
class Lowering:
    """What a family's byte algorithm is told besides its operands and lax's
    parameters: the options, the platform, and the output shapes and dtypes."""

    options: Options
    platform: str
    out_shapes: tuple
    platforms: tuple  # every platform the module is lowered for (jax.export may name several); platform: the first


MIRRORS: dict = {}  # lax primitive -> zip primitive
LAX_OF: dict = {}  # zip primitive -> lax primitive
GROUPED: set = set()  # lax primitives whose independent binds merge into one zip bind


def mirror(lax_prim, lower, *, grouped: bool = False, collective_dims=lambda params: ((), ())) -> core.Primitive:
    """Defines the zip primitive mirroring `lax_prim`.

    lower(info: Lowering, *xs, **lax_params) -> (outs, wire_bytes, raw_bytes):
    the byte algorithm, traced inside the manual region with plain types.
    collective_dims(lax_params) -> (operand dims, result dims) the collective
    splits, gathers or scatters: they must be whole on each device.
    """
    prim = core.Primitive("zip_" + lax_prim.name)
    prim.multiple_results = True
    prim.def_impl(functools.partial(dispatch.apply_primitive, prim))
    prim.def_effectful_abstract_eval(functools.partial(_abstract_eval, lax_prim))
    ad.primitive_jvps[prim] = functools.partial(_jvp, prim)
    ad.primitive_transposes[prim] = functools.partial(_transpose, lax_prim)
    batching.fancy_primitive_batchers[prim] = functools.partial(_batch, lax_prim)
    mlir.register_lowering(prim, functools.partial(_lower, lower, collective_dims))
    MIRRORS[lax_prim], LAX_OF[prim] = prim, lax_prim
    if grouped:
        GROUPED.add(lax_prim)
    return prim


def _abstract_eval(lax_prim, *avals, zip: Options, **params):
    outs, effects = [], set()
    for aval in avals:
        out, eff = lax_prim.abstract_eval(aval, **params)
        outs.append(out)
        effects |= set(eff)
    if zip.stats:
        outs += [_stats_aval(avals, params.get("axes", params.get("axis_name")))] * 2
    return outs, effects


def _stats_aval(avals, axes):
    """A float32 scalar, the same on every device of the collective's axes (it
    follows from their consensus), varying where the operands do otherwise."""
    axes = set(axes) if isinstance(axes, (tuple, list)) else {axes}
    first = avals[0]
    mat = getattr(first, "manual_axis_type", None)
    kw = {} if mat is None else {"manual_axis_type": type(mat)(varying=frozenset().union(
        *(a.manual_axis_type.varying for a in avals)) - axes)}
    return first.update(shape=(), dtype=np.dtype(np.float32), weak_type=False,
                        sharding=first.sharding.update(spec=P()), **kw)


def _no_stats(params):
    return {**params, "zip": dataclasses.replace(params["zip"], stats=False)}


def _jvp(prim, primals, tangents, **params):
    out = prim.bind(*primals, **params)
    live = [i for i, t in enumerate(tangents) if type(t) is not ad.Zero]
    tangent_out = [ad.Zero(core.typeof(o).to_tangent_aval()) for o in out]
    if live:
        for i, t in zip(live, prim.bind(*[tangents[i] for i in live], **_no_stats(params))):
            tangent_out[i] = t
    return out, tangent_out


def _transpose(lax_prim, cts, *args, **params):
    """lax's transpose of each operand's cotangent, its collectives compressed."""
    from . import _rewrite

    options = params.pop("zip")
    rule = ad.primitive_transposes[lax_prim]
    live = [i for i in range(len(args)) if type(cts[i]) is not ad.Zero]

    def transposed(*live_cts):
        return [rule(ct, args[i], **params)[0] for i, ct in zip(live, live_cts)]

    result = [None] * len(args)
    if live:
        outs, _ = _rewrite.run(transposed, dataclasses.replace(options, stats=False), [cts[i] for i in live])
        for i, ct in zip(live, outs):
            result[i] = ct
    return result


def _batch(lax_prim, axis_data, vals, dims, **params):
    """lax's batching rule per operand, its collectives compressed."""
    from . import _rewrite

    options = params.pop("zip")
    rule = batching.fancy_primitive_batchers[lax_prim]
    out_dims: list = []

    def batched(*xs):
        out_dims.clear()
        outs = []
        for x, d in zip(xs, dims):
            out, out_dim = rule(axis_data, [x], [d], **params)
            outs.append(out)
            out_dims.append(out_dim)
        return outs

    outs, stats = _rewrite.run(batched, options, list(vals))
    if options.stats:
        return [*outs, *stats], [*out_dims, None, None]
    return outs, list(out_dims)


def _lower(lower, collective_dims, ctx, *xs, zip: Options, **params):
    platforms = tuple(ctx.module_context.platforms or ()) or (jax.default_backend(),)
    _check_codec(platforms, zip)
    info = Lowering(zip, platforms[0], tuple((a.shape, a.dtype) for a in ctx.avals_out[:len(xs)]), platforms)

    def algorithm(*operands):
        outs, wire, raw = lower(info, *operands, **params)
        return [*outs, wire, raw] if zip.stats else list(outs)

    body, in_avals = _in_local_region(algorithm, ctx.avals_in, ctx.avals_out, collective_dims(params))
    with config._check_vma(False):
        return mlir.lower_fun(body, multiple_results=True)(ctx.replace(avals_in=in_avals), *xs)


def _check_codec(platforms, options: Options):
    """Lowered for a GPU by a build without the CUDA codec, every strategy but an explicit raw one (XLA's own
    collective, no codec) raises the error naming the cause and the fix, before XLA compiles anything: the
    default strategy does not quietly send raw because the codec is missing."""
    if set(platforms) <= {"cpu"} or _ffi.cuda_module() is not None:
        return
    forced, _ = strategy_lib._forced(options.strategy)
    if forced is not None and forced.split()[0] == "raw":
        return
    raise _ffi.no_cuda_codec(platforms, "a zip collective (any strategy but 'raw', XLA's own collective)")


def _plain(aval):
    return core.ShapedArray(aval.shape, aval.dtype)


def _in_local_region(algorithm, avals_in, avals_out, dims):
    """The algorithm, made to run on each device's own data.

    Inside a shard_map that is manual over only some mesh axes, the other
    axes may still shard the operands. On Explicit axes the sharding is known
    here, and the algorithm (whose reshapes and custom calls need whole local
    arrays) runs in a nested manual region over them, each device on its
    shard, after making whole the dimensions the collective reshapes. Auto
    axes are left to XLA's partitioner. Elsewhere the algorithm runs on plain
    types directly.
    """
    mesh = jax.sharding.get_abstract_mesh()
    manual = getattr(mesh, "manual_axes", ())
    explicit = tuple(a for a, t in zip(getattr(mesh, "axis_names", ()), getattr(mesh, "axis_types", ()))
                     if a not in manual and t == jax.sharding.AxisType.Explicit and mesh.shape[a] > 1)
    if not explicit or not manual:
        return algorithm, [_plain(a) for a in avals_in]
    in_dims, out_dims = dims
    in_specs = [_spec(a) for a in avals_in]
    local_specs = [_whole(spec, in_dims) for spec in in_specs]
    nested = jax.shard_map(algorithm, mesh=mesh, in_specs=tuple(local_specs),
                           out_specs=[_whole(_spec(a), out_dims) for a in avals_out], axis_names=set(explicit),
                           check_vma=False)

    def body(*xs):
        xs = [x if P(*s) == ls else jax.sharding.reshard(x, ls) for x, s, ls in zip(xs, in_specs, local_specs)]
        return nested(*xs)

    return body, list(avals_in)


def _whole(spec, dims) -> P:
    return P(*(None if d in dims else s for d, s in enumerate(spec)))


def _spec(aval) -> tuple:
    spec = tuple(getattr(aval.sharding, "spec", ())) + (None,) * aval.ndim
    return spec[:aval.ndim]
