"""lax's collectives, carried out by the zip primitives: in a jaxpr at any depth,
and in a function (`compressed`).

A jaxpr is rewritten, not re-traced: each lax collective equation becomes the
zip primitive that mirrors it (same operands, parameters and result types,
plus the Options), and sub-jaxprs (jit, shard_map, scan, cond, while_loop,
remat, custom_jvp/custom_vjp, ...) are rewritten the same way. Custom rules
are functions JAX calls later: their jaxprs (custom_jvp's rule, custom_vjp's
forward) are rewritten when produced, and custom_vjp's backward function runs
through `run`. Independent psums of the same axes (a pytree's leaves) merge
into one zip equation, so their leaves share buckets.

A rewritten jaxpr runs with `evaluate`, which can also collect the bytes each
zip equation puts on the wire (Stats).
"""

from __future__ import annotations

import dataclasses
import functools
import weakref

import jax
import numpy as np
from jax._src import core, source_info_util
from jax._src import linear_util as lu

from ._mirror import GROUPED, LAX_OF, MIRRORS, Options
from ._transfer import f32

_REWRITTEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # jaxpr -> {Options: jaxpr}
_THUNK_KEYS = ("jvp_jaxpr_fun", "jvp_jaxpr_thunk", "fwd_jaxpr_thunk")
# jax < 0.12 pairs a Jaxpr with its constants in a ClosedJaxpr; from 0.12 a Jaxpr holds them
_CLOSED = getattr(core, "ClosedJaxpr", None)
_JAXPRS = (core.Jaxpr,) if _CLOSED is None else (core.Jaxpr, _CLOSED)


def rewrite(jaxpr: core.Jaxpr, options: Options) -> core.Jaxpr:
    """jaxpr with its lax collectives (at any depth) replaced by zip ones; the
    same object when it has none."""
    per_options = _REWRITTEN.setdefault(jaxpr, {})
    if options not in per_options:
        per_options[options] = _rewrite(jaxpr, options)
    return per_options[options]


def _rewrite(jaxpr: core.Jaxpr, options: Options) -> core.Jaxpr:
    eqns: list = []
    groups: dict = {}  # open groups of mergeable collectives: key -> [eqn]
    produced: dict = {}  # outvar of an open group's member -> the group's key
    changed = False

    def close(key):
        members = groups.pop(key)
        for e in members:
            for v in e.outvars:
                produced.pop(v, None)
        eqns.append(_zip_eqn(members, options))

    for eqn in jaxpr.eqns:
        for key in {produced[v] for v in eqn.invars if isinstance(v, core.Var) and v in produced}:
            close(key)
        if eqn.primitive in GROUPED:
            key = (eqn.primitive, tuple(sorted(eqn.params.items())))
            groups.setdefault(key, []).append(eqn)
            produced.update((v, key) for v in eqn.outvars)
            changed = True
        elif eqn.primitive in MIRRORS:
            eqns.append(_zip_eqn([eqn], options))
            changed = True
        else:
            params = _rewrite_params(eqn.params, options)
            changed |= params is not eqn.params
            eqns.append(eqn if params is eqn.params else eqn.replace(params=params))
    for key in list(groups):
        close(key)
    return jaxpr.replace(eqns=eqns) if changed else jaxpr


def _zip_eqn(members, options):
    first = members[0]
    effects = set().union(*(e.effects for e in members))
    return core.new_jaxpr_eqn([v for e in members for v in e.invars], [v for e in members for v in e.outvars],
                              MIRRORS[first.primitive], {**first.params, "zip": options}, effects,
                              first.source_info, first.ctx)


def _rewrite_params(params: dict, options: Options) -> dict:
    new = {k: _rewrite_param(k, v, options) for k, v in params.items()}
    return params if all(new[k] is params[k] for k in params) else new


def _rewrite_param(key, value, options):
    if isinstance(value, core.Jaxpr):
        return rewrite(value, options)
    if _CLOSED is not None and isinstance(value, _CLOSED):
        jaxpr = rewrite(value.jaxpr, options)
        return value if jaxpr is value.jaxpr else value.replace(jaxpr=jaxpr)
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, _JAXPRS) for v in value):
        new = type(value)(_rewrite_param(key, v, options) for v in value)
        return value if all(a is b for a, b in zip(new, value)) else new
    if isinstance(value, lu.WrappedFun) and key in _THUNK_KEYS:
        return _rewritten_thunk(value, options)
    if isinstance(value, lu.WrappedFun) and key == "bwd":
        return lu.wrap_init(functools.partial(_run_wrapped, value, options), debug_info=value.debug_info)
    return value


def _rewritten_thunk(thunk: lu.WrappedFun, options: Options) -> lu.WrappedFun:
    """A custom rule's jaxpr thunk whose jaxpr (first result) is rewritten."""

    def rewritten(*args):
        first, *rest = thunk.call_wrapped(*args)
        return (_rewrite_param("jaxpr", first, options), *rest)

    return lu.wrap_init(rewritten, debug_info=thunk.debug_info)


def _run_wrapped(fun: lu.WrappedFun, options: Options, *args):
    return run(lambda *a: fun.call_wrapped(*a), options, list(args))[0]


# ---------------------------------------------------------------------------
# running


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, core.Tracer))


def run(fn, options: Options, args: list):
    """fn(*args) with its lax collectives carried out by zip primitives.

    Array leaves of args are traced; other leaves (Python scalars, objects)
    stay as they are, as in a plain call; so do outputs that are not arrays.
    Returns (outputs, (wire_bytes, raw_bytes)); the bytes are summed over the
    top-level collectives when options.stats, else None.
    """
    leaves, tree = jax.tree.flatten(args)
    dynamic = [i for i, leaf in enumerate(leaves) if _is_array(leaf)]
    out_info: list = []

    def traced(*values):
        filled = list(leaves)
        for i, v in zip(dynamic, values):
            filled[i] = v
        out_leaves, out_tree = jax.tree.flatten(fn(*jax.tree.unflatten(tree, filled)))
        out_info[:] = [out_tree, out_leaves]
        return [leaf for leaf in out_leaves if _is_array(leaf)]

    closed = jax.make_jaxpr(traced)(*[leaves[i] for i in dynamic])
    outs, stats = evaluate(rewrite(closed.jaxpr, options), closed.consts, [leaves[i] for i in dynamic],
                           options.stats)
    out_tree, out_leaves = out_info
    outs = iter(outs)
    result = [next(outs) if _is_array(leaf) else leaf for leaf in out_leaves]
    return jax.tree.unflatten(out_tree, result), stats


def evaluate(jaxpr: core.Jaxpr, consts, args, with_stats: bool = False):
    """Runs a (rewritten) jaxpr; with_stats: also the bytes its top-level zip
    equations send and would send raw, summed (float32 scalars)."""
    env: dict = {}

    def read(v):
        return v.val if isinstance(v, core.Literal) else env[v]

    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    wire, raw = f32(0), f32(0)
    for eqn in jaxpr.eqns:
        take = with_stats and eqn.primitive in LAX_OF
        params = {**eqn.params, "zip": dataclasses.replace(eqn.params["zip"], stats=True)} if take else eqn.params
        name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
        with source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack), eqn.ctx.manager:
            out = eqn.primitive.bind(*map(read, eqn.invars), **eqn.primitive.get_bind_params(params))
        out = out if eqn.primitive.multiple_results else [out]
        if take:
            out, (w, r) = out[:-2], out[-2:]
            wire, raw = wire + w, raw + r
        env.update(zip(eqn.outvars, out))
    return [read(v) for v in jaxpr.outvars], ((wire, raw) if with_stats else None)


def check_axis_names(axis_name) -> None:
    """NameError for an axis name no enclosing shard_map, pmap or vmap binds
    (lax raises a bare AssertionError for some collectives under check_vma)."""
    for name in axis_name if isinstance(axis_name, (tuple, list)) else (axis_name,):
        if not isinstance(name, int):
            jax.lax.axis_size(name)


def compressed(fn=None, *, compress: bool = True, strategy=None, bucket_bytes: int | None = None):
    """`fn` with every lax.psum, all_gather, psum_scatter, all_to_all and
    ppermute inside it (in shard_map bodies, scans, conds, jit-ed and custom
    functions, at any depth) carried out by the zip collectives with these
    options. Integer operands, and messages the strategy sends raw (XLA's
    collective), give lax's results; sums by a rank-ordered plan are the
    rank-ordered float32 sum (zip_psum). Usable as a decorator, with or
    without arguments.

    fn's array arguments are traced once per call (wrap the result in jax.jit
    to trace once per shape, as usual); its other arguments are passed as they
    are, as in a plain call.
    """
    options = Options(compress, strategy, *(() if bucket_bytes is None else (bucket_bytes,)))
    if fn is None:
        return functools.partial(compressed, compress=compress, strategy=strategy, bucket_bytes=bucket_bytes)

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        return run(lambda a, k: fn(*a, **k), options, [list(args), kwargs])[0]

    return wrapped

