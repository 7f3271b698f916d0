"""Plans measured in situ: zip_psum's candidate plans timed on the job's own buckets.

`autotune(mesh, data=...)` calls measure(): the float leaves of `data` (e.g.
a step's gradients, as each device holds them: a jax.Array's shards, or a
host array standing for every device's values) are bucketed as zip_psum
buckets them (`bucket_bytes`), and for each mesh axis of size > 1 and each
distinct bucket (dtype, bytes per device; at most MAX_BUCKETS, those that
carry the most bytes) every plan of strategy.plan_names("psum") is compiled
(strategy=Pinned(plan), the default ladder and the installed figures) and
run over that axis with the real collectives, in this job, on those values.
What a model of the pieces cannot see is in these times: the codec's share
of the cores beside the collective library's threads, scheduler ticks, how
gloo or NCCL treats each message size.

Timing: one untimed call of each plan (connections, caches), then rounds of
one call of each plan in turn (a change in the machine's load falls on all
alike; each round starts one plan later, so no plan always follows the
same one), each call started after a barrier across processes; per plan the
median. The number of rounds is sized from the untimed calls to take about
PLAN_SECONDS per plan, between MIN_ROUNDS and MAX_ROUNDS, and agreed across
processes. Every process then gathers every process's medians and keeps the
largest (a collective ends when its slowest process does), so every process
installs the same times and strategy.plan picks the same plan (ties:
plan_names' order).
"""

from __future__ import annotations

import json
import time
import zlib

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from . import strategy
from .collectives import psum as psum_module
from .collectives import zip_psum
from .collectives._mirror import DEFAULT_BUCKET_BYTES
from .dtypes import is_compressible
from .profile import Measured

MAX_BUCKETS = 4  # distinct bucket sizes timed per axis
PLAN_SECONDS = 0.3  # of timed calls per plan, roughly
MIN_ROUNDS, MAX_ROUNDS = 7, 15


def device_leaves(data) -> list:
    """The float leaves of data, each as (dtype, elements per device, values
    for a device: device -> flat numpy array): a jax.Array's shard on that
    device (else its first shard on this process), a host array as it is."""
    out = []
    for leaf in jax.tree.leaves(data):
        if isinstance(leaf, jax.Array):
            shards = {s.device: s.data for s in leaf.addressable_shards}
            first = leaf.addressable_shards[0].data
            values = lambda d, shards=shards, first=first: np.asarray(shards.get(d, first)).reshape(-1)  # noqa: E731
            size, dtype = first.size, first.dtype
        else:
            array = np.asarray(leaf)
            values = lambda d, a=array: a.reshape(-1)  # noqa: E731
            size, dtype = array.size, array.dtype
        if is_compressible(dtype) and size:
            out.append((np.dtype(dtype), size, values))
    return out


def buckets(leaves, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[tuple[str, int, list[int]]]:
    """(dtype name, bytes per device, leaf indices) of the distinct buckets
    zip_psum makes of the leaves (the first of each size), at most
    MAX_BUCKETS: those that carry the most bytes in all."""
    shapes = [jax.ShapeDtypeStruct((size,), dtype) for dtype, size, _ in leaves]
    found: dict = {}
    for idx in psum_module.buckets(shapes, bucket_bytes):
        key = (shapes[idx[0]].dtype.name, sum(shapes[i].size for i in idx) * shapes[idx[0]].dtype.itemsize)
        count, first = found.get(key, (0, idx))
        found[key] = (count + 1, first)
    heaviest = sorted(found.items(), key=lambda kv: (-kv[1][0] * kv[0][1], kv[0]))[:MAX_BUCKETS]
    return [(dtype, nbytes, idx) for (dtype, nbytes), (_, idx) in heaviest]


def structure(leaves, bucket_bytes: int) -> float:
    """A number that differs between processes whose data would time different programs."""
    return float(zlib.crc32(json.dumps([[d, b] for d, b, _ in buckets(leaves, bucket_bytes)]).encode()))


def measure(mesh: Mesh, leaves, bucket_bytes: int, gather) -> tuple[Measured, ...]:
    """The plans of zip_psum timed on the leaves' buckets over each mesh axis
    of size > 1 (module docstring). gather(vector) -> every process's vector,
    stacked (autotune's all-gather of raw bits)."""
    names = strategy.plan_names("psum")
    measured, medians = [], []
    for axis, size in ((a, s) for a, s in mesh.shape.items() if s > 1):
        for dtype, nbytes, idx in buckets(leaves, bucket_bytes):
            xs = [_global(mesh, leaves[i]) for i in idx]
            medians.append(_time_plans(mesh, axis, xs, names, gather))
            measured.append((axis, size, dtype, nbytes))
    if not measured:
        return ()
    slowest = gather(np.concatenate(medians)).max(axis=0).reshape(len(measured), len(names))
    return tuple(Measured("psum", (axis,), size, dtype, nbytes, tuple(zip(names, map(float, row))))
                 for (axis, size, dtype, nbytes), row in zip(measured, slowest))


def _global(mesh: Mesh, leaf) -> jax.Array:
    """The leaf as a [devices * size] array, each device's block its own values."""
    dtype, size, values = leaf
    sharding = NamedSharding(mesh, P(tuple(mesh.axis_names)))
    arrays = [jax.device_put(values(d)[:size], d) for d in sharding.addressable_devices]
    return jax.make_array_from_single_device_arrays((mesh.size * size,), sharding, arrays)


def _time_plans(mesh: Mesh, axis: str, xs: list, names, gather) -> np.ndarray:
    """Median seconds per call of each plan of zip_psum over axis on xs."""
    spec = P(tuple(mesh.axis_names))
    calls = []
    for name in names:
        body = lambda *leaves, name=name: zip_psum(list(leaves), axis, strategy=strategy.Pinned(name))  # noqa: E731
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))
        calls.append(f.lower(*xs).compile())
    first = []
    for call in calls:
        jax.block_until_ready(call(*xs))  # untimed: connections, caches
        first.append(_timed(call, xs))
    rounds = int(np.clip(PLAN_SECONDS / gather(np.array(first)).max(), MIN_ROUNDS, MAX_ROUNDS))
    times = np.zeros((rounds, len(calls)))
    for r in range(rounds):
        for j in np.roll(np.arange(len(calls)), -r):  # each round starts with the next plan: no plan always follows
            times[r, j] = _timed(calls[j], xs)        # the same one
    return np.median(times, axis=0)


def _timed(call, xs) -> float:
    """Seconds of one call, started when every process is ready for it."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("zipccl_jax.autotune: plans in situ")
    t = time.perf_counter()
    jax.block_until_ready(call(*xs))
    return time.perf_counter() - t
