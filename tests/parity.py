"""Shared by the tests that hold zip_* to lax's behaviour (test_autodiff,
test_pmap, test_meshes, test_transforms, test_compressed).

- The five collectives under one interface (`LAX`, `zip_ops()`), called with
  the same arguments (`collective`), so a test runs one program twice: with
  lax's collectives and with ours.
- Per-device data whose results numpy computes exactly (`expected`): values
  that are moved are Gaussian with the special values planted, values that are
  summed are small integers, so a float sum is exact in any order and
  precision and must equal numpy's bit for bit whatever the strategy chose.
- Outcomes (results or errors) compared with lax's (`assert_same_outcome`).
- The compiled HLO: the codec's presence (`assert_compressed`) and the device
  groups of its collectives (`collectives`, `assert_collectives_only_over`).
"""

from __future__ import annotations

import functools
import math
import re
from types import SimpleNamespace

import jax
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from zipccl_jax import reference
from zipccl_jax.bench.data import gaussian, special_values

N = 8
COMPRESS_CALL = 'custom_call_target="zipccl_stream_sizes"'  # the size pass: one per compressed transfer

LAX = SimpleNamespace(psum=lax.psum, all_gather=lax.all_gather, psum_scatter=lax.psum_scatter,
                      all_to_all=lax.all_to_all, ppermute=lax.ppermute)


def zip_ops(**options) -> SimpleNamespace:
    """The zip_* collectives under lax's names, each called with `options`."""
    bind = functools.partial
    return SimpleNamespace(psum=bind(zc.zip_psum, **options), all_gather=bind(zc.zip_all_gather, **options),
                           psum_scatter=bind(zc.zip_psum_scatter, **options),
                           all_to_all=bind(zc.zip_all_to_all, **options), ppermute=bind(zc.zip_ppermute, **options))


# ---------------------------------------------------------------------------- the five collectives

# name -> (operand kind, lax keyword arguments). "moved" operands are Gaussian,
# "summed" ones small integers. A block of [2n, 3] per rank suits them all.
FIVE = {
    "psum": ("summed", {}),
    "all_gather": ("moved", dict(axis=1, tiled=True)),
    "psum_scatter": ("summed", dict(scatter_dimension=0, tiled=True)),
    "all_to_all": ("moved", dict(split_axis=0, concat_axis=1, tiled=True)),
    "ppermute": ("moved", {}),
}


def ring(n: int, shift: int = 1) -> list[tuple[int, int]]:
    return [(i, (i + shift) % n) for i in range(n)]


def collective(c, name: str, x, axis_name, n: int, **kwargs):
    """Collective `name` of namespace c with FIVE's arguments (overridden by
    kwargs); ppermute shifts by one along the n ranks unless given perm."""
    kwargs = {**FIVE[name][1], **kwargs}
    if name == "ppermute":
        kwargs.setdefault("perm", ring(n))
    return getattr(c, name)(x, axis_name, **kwargs)


def all_five(c, axis_name, n: int, moved_x, summed_x) -> dict:
    """The five collectives of c over axis_name, each on its kind of operand."""
    return {name: collective(c, name, moved_x if FIVE[name][0] == "moved" else summed_x, axis_name, n)
            for name in FIVE}


def expected_five(moved_xs: np.ndarray, summed_xs: np.ndarray) -> dict:
    """expected() of each of all_five's results."""
    return {name: expected(name, moved_xs if FIVE[name][0] == "moved" else summed_xs) for name in FIVE}


def expected(name: str, xs: np.ndarray, **kwargs) -> np.ndarray:
    """What collective `name` returns on each of the n ranks, given each rank's
    input xs[r] ([n, *block]): [n, *result]. Sums are reference.accumulate's
    (float32 in rank order, rounded once), which is exact for summed data."""
    kwargs = {**FIVE[name][1], **kwargs}
    n = xs.shape[0]
    if name == "psum":
        return np.stack([reference.accumulate(list(xs), xs.dtype)] * n)
    if name == "all_gather":
        join = np.concatenate if kwargs.get("tiled") else np.stack
        return np.stack([join(list(xs), axis=kwargs.get("axis", 0))] * n)
    if name == "psum_scatter":
        total, dim = reference.accumulate(list(xs), xs.dtype), kwargs.get("scatter_dimension", 0)
        parts = np.split(total, n, axis=dim) if kwargs.get("tiled") else [np.take(total, r, axis=dim) for r in range(n)]
        return np.stack(parts)
    if name == "all_to_all":
        split, concat = kwargs["split_axis"], kwargs["concat_axis"]
        if kwargs.get("tiled"):
            return np.stack([np.concatenate([np.split(x, n, axis=split)[r] for x in xs], axis=concat)
                             for r in range(n)])
        return np.stack([np.stack([np.take(x, r, axis=split) for x in xs], axis=concat) for r in range(n)])
    out = np.zeros_like(xs)
    for src, dst in kwargs.get("perm") or ring(n):
        out[dst] = xs[src]
    return out


# ---------------------------------------------------------------------------- programs

def per_rank(mesh, body, *xs, spec=P("d"), check_vma=True, **kwargs):
    """jit(shard_map(body)) on arrays of per-rank blocks [ranks, ...] sharded
    by spec; body sees one block and its results come back per rank."""
    f = jax.shard_map(lambda *b: jax.tree.map(lambda r: r[None], body(*(v[0] for v in b))), mesh=mesh,
                      in_specs=spec, out_specs=spec, check_vma=check_vma, **kwargs)
    return jax.jit(f), [jax.device_put(x, NamedSharding(mesh, spec)) for x in xs]


# ---------------------------------------------------------------------------- data

def moved(shape, dtype=np.dtype("bfloat16"), seed=0) -> np.ndarray:
    """Gaussian values with every special value of the dtype planted at the
    front, NaNs excepted: XLA:CPU's collectives change NaN payloads, so lax
    is no reference for them (test_collectives checks NaNs against the input)."""
    x = gaussian(math.prod(shape), dtype, seed=seed)
    s = special_values(dtype)
    s = s[~np.isnan(s.astype(np.float32))][: x.size]
    x[: s.size] = s
    return x.reshape(shape)


def summed(shape, dtype=np.dtype("bfloat16"), seed=0) -> np.ndarray:
    """Integers in [-8, 8]: a sum of N of them is exact in any order, in bf16 too."""
    return np.random.default_rng(seed).integers(-8, 9, size=shape).astype(dtype)


def operand(name: str, shape, dtype=np.dtype("bfloat16"), seed=0) -> np.ndarray:
    return (moved if FIVE[name][0] == "moved" else summed)(shape, dtype, seed)


def bits(x) -> tuple:
    x = np.asarray(x)
    return x.dtype.name, x.shape, x.tobytes()


def assert_bits(actual, want, what: str = ""):
    """Same dtype, shape and bytes, leaf by leaf."""
    a, w = jax.tree.leaves(actual), jax.tree.leaves(want)
    assert len(a) == len(w), f"{what}: {len(a)} results, expected {len(w)}"
    for i, (x, y) in enumerate(zip(a, w)):
        x, y = np.asarray(x), np.asarray(y)
        assert (x.dtype, x.shape) == (y.dtype, y.shape), f"{what}[{i}]: {x.dtype}{x.shape} vs {y.dtype}{y.shape}"
        assert x.tobytes() == y.tobytes(), f"{what}[{i}]: values differ\n{x}\nexpected\n{y}"


def manual_type(x) -> tuple[frozenset, frozenset, frozenset]:
    """The (varying, unreduced, reduced) mesh axes of x's type inside shard_map."""
    m = jax.typeof(x).mat
    return frozenset(m.varying), frozenset(m.unreduced), frozenset(m.reduced)


# ---------------------------------------------------------------------------- outcomes

_LAX_OUTCOMES: dict = {}


def outcome(fn, *args):
    """fn's results as numpy arrays, or the exception it raised."""
    try:
        return jax.tree.map(np.asarray, fn(*args))
    except Exception as e:  # noqa: BLE001 - the error is the outcome compared
        return e


def lax_outcome(key, fn, *args):
    """outcome(fn, *args) for a program of lax's, computed once per key: it
    does not depend on the strategy the tests run under."""
    if key not in _LAX_OUTCOMES:
        _LAX_OUTCOMES[key] = outcome(fn, *args)
    return _LAX_OUTCOMES[key]


def assert_same_outcome(ours, theirs, what: str = ""):
    """Where lax raises, ours raises the same type with the same message;
    where lax returns, ours returns the same bits."""
    if isinstance(theirs, Exception):
        assert isinstance(ours, Exception), f"{what}: lax raises {theirs!r}, ours returned"
        assert (type(ours), str(ours)) == (type(theirs), str(theirs)), f"{what}: {ours!r} instead of lax's {theirs!r}"
    else:
        assert not isinstance(ours, Exception), f"{what}: lax returns, ours raised {ours!r}"
        assert_bits(ours, theirs, what)


# ---------------------------------------------------------------------------- compiled HLO

def compile_and_run(fn, *args):
    """(results, compiled HLO text) of a jitted or pmapped fn, compiled once."""
    compiled = fn.lower(*args).compile()
    return compiled(*args), compiled.as_text()


def assert_compressed(hlo: str, strategy: str):
    """Under ZIPCCL_STRATEGY=compressed a program with a float collective must
    run the codec: a silent fallback to lax's collectives cannot pass."""
    if strategy == "compressed":
        assert COMPRESS_CALL in hlo, "ZIPCCL_STRATEGY=compressed, yet the compiled program never sizes a stream (zipccl_stream_sizes)"


_OP = re.compile(r"= .*? (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute|collective-broadcast)"
                 r"(?:-start)?\(")
_GROUPS = re.compile(r"replica_groups=(\{\}|\{\{[\d,{}]*\}\}|\[\d+,\d+\]<=\[[\d,]+\](?:T\([\d,]+\))?"
                     r"|mesh\[[^\]]*\]\s*\{[^}]*\})")


def replica_groups(text: str) -> list[list[int]] | None:
    """Device groups of an HLO replica_groups value, in any of XLA's three
    spellings: explicit lists, iota ([g,s]<=[dims]T(perm)) and, from jax
    0.10, named mesh axes (mesh['a'=4,'b'=2] {'a'}: groups vary 'a')."""
    if text == "{}":
        return None  # one group of every device
    if text.startswith("{{"):
        return [[int(d) for d in g.split(",")] for g in re.findall(r"\{([\d,]+)\}", text)]
    if text.startswith("["):
        g, s, dims, perm = re.fullmatch(r"\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text).groups()
        ids = np.arange(math.prod(map(int, dims.split(",")))).reshape([int(d) for d in dims.split(",")])
        return (ids.transpose([int(p) for p in perm.split(",")]) if perm else ids).reshape(int(g), int(s)).tolist()
    axes, grouped = re.fullmatch(r"mesh\[([^\]]*)\]\s*\{([^}]*)\}", text).groups()
    names = re.findall(r"'([^']+)'=\d+", axes)
    shape = [int(s) for s in re.findall(r"'[^']+'=(\d+)", axes)]
    inner = [names.index(a) for a in re.findall(r"'([^']+)'", grouped)]
    outer = [i for i in range(len(names)) if i not in inner]
    ids = np.arange(math.prod(shape)).reshape(shape).transpose(outer + inner)
    return ids.reshape(-1, math.prod(shape[i] for i in inner)).tolist()


def collectives(hlo: str) -> list[tuple[str, list[list[int]] | None, str]]:
    """(op, device groups, op_name) of each collective in compiled HLO text.
    Groups hold logical device ids (the partition ids XLA uses with
    use_global_device_ids), i.e. positions in mesh.devices in row-major order;
    a collective-permute's groups are its (source, target) pairs."""
    found = []
    for line in hlo.splitlines():
        op = _OP.search(line)
        if not op:
            continue
        pairs = re.search(r"source_target_pairs=\{([\d,{}]*)\}", line)
        if pairs:
            groups = [[int(a), int(b)] for a, b in re.findall(r"\{(\d+),(\d+)\}", pairs[1])]
        else:
            spelled = _GROUPS.search(line)
            assert spelled, f"cannot read the device groups of: {line.strip()[:300]}"
            groups = replica_groups(spelled[1])
        name = re.search(r'op_name="([^"]*)"', line)
        found.append((op[1], groups, name[1] if name else ""))
    return found


def assert_collectives_only_over(hlo: str, mesh, axes: set):
    """Each collective of the shard_map body (not the resharding jax inserts
    at its boundary, whose op_name is the shard_map's own) only groups
    devices that differ in the mesh axes `axes`; at least one does."""
    shape, names = mesh.devices.shape, mesh.axis_names
    others = [i for i, a in enumerate(names) if a not in axes]
    body = [(op, g, name) for op, g, name in collectives(hlo) if not re.fullmatch(r"jit\([^)]*\)/shard_map", name)]
    assert body, f"no collective over {axes} in the compiled program"
    everyone = [list(range(math.prod(shape)))]
    for op, groups, name in body:
        for group in groups or everyone:
            fixed = {tuple(np.array(np.unravel_index(d, shape))[others]) for d in group}
            assert len(fixed) == 1, f"{op} ({name}) groups devices {group}, which differ outside {axes}"
