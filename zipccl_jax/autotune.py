"""`autotune`: measures the job's own links and codec and installs the figures.

    jax.distributed.initialize(...)               # multi-process jobs: first
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    zc.autotune(mesh, data=sample_grads, path="zipccl-profile.json")   # every process, before compiling

What is measured, with real collectives on the job's devices and processes:

- each mesh axis of size > 1: its latency, the time per iteration of a loop of
  tiny all_gathers over that axis only (shard_map over the whole mesh, so every
  group of the axis runs at once, as in the job), and its bandwidth, the same
  loop with a message sized from a 256 KB probe to take ~20 ms (at most
  `link_bytes` received per device). Loops of 1 and 3 (33) iterations are
  timed and differenced, so dispatch cost drops out;
- the codec: compress and decompress rates per device on Gaussian bf16
  (`codec_bytes` per device), all of this process's devices at once (on CPU
  they share the cores, as they do inside a collective);
- ratios, per dtype of the float leaves of `data` (sample tensors, e.g. a
  step's gradients): raw bytes over the largest of 8 streams of this process's
  values (a collective sends the ladder rung its largest stream needs).
  Without `data` the ratios stay the platform default's (Gaussian data).

Every process gathers every process's figures (an all-gather of a few
numbers) and keeps the slowest: largest latency, smallest bandwidth, codec
rates and ratios. So every process installs identical figures and makes
identical plans, as SPMD programs must.

`mesh=None` measures one axis over all devices of the job (jax.devices()) and
installs it for every axis name ("*"): right for pure data parallelism over
all devices; a mesh whose axes run inside and across hosts needs the mesh.
Axes that were not measured (not in the mesh, or of size 1) keep the
platform default's link figures; the measured codec and ratios apply to them.

With `path`, a profile there that describes this mesh (platform, device kind,
axis names and sizes) on every process is loaded instead of measuring (a
restart costs two small all-gathers); otherwise the figures are measured and
written there. `refresh=True` always measures.

Cost: per axis three small compilations and about 16 timed loops (on a
400 Mbit/s link ~1 s), the codec two compilations and 8 runs of `codec_bytes`,
one compilation per dtype of `data`; docs/BENCHMARKS.md has measured totals.
Call it before compiling anything that uses the collectives: a compiled
function keeps the decisions made when it was compiled.
"""

from __future__ import annotations

import json
import time
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from . import ops, strategy
from . import profile as profile_file
from .dtypes import is_compressible
from .profile import DTYPES, Link, Profile

REPEAT = 3  # timed pairs per loop (median)
LATENCY_LOOP = 32  # extra tiny all_gathers in the long latency loop
PROBE_BYTES = 256 << 10  # received per device by the probe that sizes the bandwidth message
SPAN_SECONDS = 0.04  # what the timed loops are sized to take
RATIO_STREAMS = 8
SAMPLE_VALUES = 1 << 23  # of each dtype of `data`, per process


def autotune(mesh: Mesh | None = None, *, data=None, path=None, refresh: bool = False,
             link_bytes: int = 16 << 20, codec_bytes: int = 8 << 20) -> Profile:
    """Measures (or loads from `path`) this job's figures, agrees on them
    across processes, installs them as this process's default and returns
    them. Every process of the job must call it, with the same arguments
    (`data` may differ: it is each process's own sample)."""
    mesh = mesh if mesh is not None else Mesh(np.array(jax.devices()), (profile_file.ANY_AXIS,))
    if path is not None and not refresh:
        loaded = _read_everywhere(Path(path))
        if loaded is not None and _describes(loaded, mesh):
            strategy.install(loaded, f"profile {path}")
            return loaded
    local = _measure(mesh, data, link_bytes, codec_bytes)
    agreed = _combine(_gather(_figures(local)), local)
    strategy.install(agreed, "autotune")
    if path is not None:
        profile_file.write(agreed, path)
    return agreed


def load(path) -> Profile:
    """Installs the profile at path (every process must call it; they agree
    on the figures as autotune does). Unlike autotune it takes the file as it
    is: axes it does not name fall back to its "*" link or the defaults."""
    prof = _read_everywhere(Path(path))
    if prof is None:
        raise ValueError(f"zipccl: no profile at {path} (on at least one process)")
    here = strategy.platform_family(jax.devices()[0].platform)
    if prof.platform != here:
        raise ValueError(f"zipccl: profile {path} is for platform {prof.platform}, this job runs on {here}")
    strategy.install(prof, f"profile {path}")
    return prof


def main(output=None) -> Profile:
    """`python -m zipccl_jax calibrate`: autotune over this process's devices,
    written to the profile file a single-process job reads by default."""
    path = Path(output) if output else strategy.profile_path()
    prof = autotune(path=path, refresh=True)
    print(f"devices: {jax.device_count()} x {jax.devices()[0].device_kind}")
    print(f"  codec: compress {prof.compress_rate / 1e9:.3g} GB/s, decompress {prof.decompress_rate / 1e9:.3g} GB/s "
          "per device")
    for name, link in prof.links or [("(no link: one device)", None)]:
        print(f"  axis {name}: " + (f"{link.size} devices, latency {link.latency * 1e6:.0f} us, "
                                    f"bandwidth {link.bandwidth / 1e9:.3g} GB/s" if link else "not measured"))
    print(f"profile written to {path} (single-process jobs read it; multi-process jobs: "
          "zipccl_jax.autotune(mesh, path=...))")
    return prof


# ---------------------------------------------------------------------------
# agreement across processes


def _gather(vector: np.ndarray) -> np.ndarray:
    """Every process's float64 vector, stacked in process order (one
    all-gather of the raw bits, so every process sees the same numbers)."""
    vector = np.asarray(vector, np.float64)
    if jax.process_count() == 1:
        return vector[None]
    bits = np.asarray(multihost_utils.process_allgather(vector.view(np.uint32)))
    return np.ascontiguousarray(bits).view(np.float64).reshape(jax.process_count(), vector.size)


def _structure(prof: Profile | None) -> float:
    """A number that differs between profiles that cannot be combined."""
    if prof is None:
        return 0.0
    layout = [prof.platform, prof.device_kind, [(name, link.size) for name, link in prof.links], prof.ladder]
    return float(zlib.crc32(json.dumps(layout).encode()))


def _figures(prof: Profile) -> np.ndarray:
    ratios = dict(prof.ratios)
    return np.array([prof.compress_rate, prof.decompress_rate, *(ratios.get(dt, 0.0) for dt in DTYPES),
                     *(x for _, link in prof.links for x in (link.latency, link.bandwidth))])


def _combine(rows: np.ndarray, template: Profile) -> Profile:
    """The slowest figures of all processes, in template's structure."""
    ratios = tuple((dt, float(col[col > 0].min())) for dt, col in zip(DTYPES, rows[:, 2:5].T) if (col > 0).any())
    links = tuple((name, Link(link.size, float(rows[:, 5 + 2 * i].max()), float(rows[:, 6 + 2 * i].min())))
                  for i, (name, link) in enumerate(template.links))
    return Profile(template.platform, template.device_kind, float(rows[:, 0].min()), float(rows[:, 1].min()),
                   ratios, links, template.ladder)


def _read_everywhere(path: Path) -> Profile | None:
    """The profile at path as all processes agree on it; None when some
    process has no file there; ValueError when some process cannot read it or
    the processes' files differ in their axes, platform or ladder."""
    prof, status, problem = None, 0, ""
    try:
        prof = profile_file.read(path) if path.is_file() else None
        status = 0 if prof else 1
    except (ValueError, OSError) as err:
        status, problem = 2, str(err)
    head = _gather([status, _structure(prof)])
    bad = [i for i, s in enumerate(head[:, 0]) if s == 2]
    if bad:
        raise ValueError(f"zipccl: profile {path} is unreadable on process(es) {bad}" + (f": {problem}" if problem
                                                                                       else ""))
    if (head[:, 0] == 1).any():
        return None
    if len(set(head[:, 1])) > 1:
        raise ValueError(f"zipccl: the processes' profiles at {path} differ in platform, device kind, axes or ladder")
    return _combine(_gather(_figures(prof)), prof)


def _describes(prof: Profile, mesh: Mesh) -> bool:
    """Whether prof was measured for this mesh: same platform and device
    kind, and a link of the same size for every axis of size > 1."""
    device = mesh.devices.flat[0]
    links = dict(prof.links)
    return (prof.platform == strategy.platform_family(device.platform) and prof.device_kind == device.device_kind
            and all(name in links and links[name].size == size for name, size in _axes(mesh)))


# ---------------------------------------------------------------------------
# measurements


def _axes(mesh: Mesh) -> list[tuple[str, int]]:
    return [(name, size) for name, size in mesh.shape.items() if size > 1]


def _measure(mesh: Mesh, data, link_bytes: int, codec_bytes: int) -> Profile:
    device = mesh.devices.flat[0]
    links = tuple((name, Link(size, *_measure_link(mesh, name, link_bytes))) for name, size in _axes(mesh))
    compress_rate, decompress_rate = _measure_codec(mesh, codec_bytes)
    ratios = tuple(sorted(_measure_ratios(data).items())) if data is not None else ()
    return Profile(strategy.platform_family(device.platform), device.device_kind, compress_rate, decompress_rate,
                   ratios, links)


def _replicated(mesh: Mesh, value) -> jax.Array:
    value = np.asarray(value)
    return jax.make_array_from_callback(value.shape, NamedSharding(mesh, P()), lambda idx: value[idx])


def _gather_loop(mesh: Mesh, axis: str, elems: int):
    """k -> runs k all_gathers over `axis` of `elems` uint32 per device, each
    depending on the last (so none is hoisted or merged). k is an argument:
    one compilation serves every count."""
    names = tuple(mesh.axis_names)

    def body(x, k):
        def step(_, carry):
            x, c = carry
            x = x.at[0].set(c)
            return x, lax.all_gather(x, axis)[-1, 0] + 1
        return lax.fori_loop(0, k, step, (x, jnp.uint32(0)))[1][None]

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(names), P()), out_specs=P(names), check_vma=False))
    x = jax.make_array_from_callback((mesh.size * elems,), NamedSharding(mesh, P(names)),
                                     lambda idx: np.zeros(elems, np.uint32))
    counts: dict = {}

    def run(k: int):
        if k not in counts:
            counts[k] = _replicated(mesh, np.int32(k))
        return f(x, counts[k])
    return run


def _per_iteration(run, lo: int, hi: int) -> float:
    """Seconds per loop iteration: the median over REPEAT of (t(hi) - t(lo)) /
    (hi - lo), so dispatch drops out; t(hi) / hi if noise makes that <= 0."""
    for k in (lo, hi):
        jax.block_until_ready(run(k))  # compile, connect, and make the counts
    diffs, highs = [], []
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        jax.block_until_ready(run(lo))
        t1 = time.perf_counter()
        jax.block_until_ready(run(hi))
        highs.append(time.perf_counter() - t1)
        diffs.append((highs[-1] - (t1 - t0)) / (hi - lo))
    diff = float(np.median(diffs))
    return diff if diff > 0 else float(np.median(highs)) / hi


def _bandwidth(received: int, seconds: float, latency: float) -> float:
    return received / max(seconds - latency, seconds / 10)  # noise must not make it negative


def _measure_link(mesh: Mesh, axis: str, link_bytes: int) -> tuple[float, float]:
    """(latency s, bytes per second per device) of one mesh axis: estimates
    from short loops size the final ones to take about SPAN_SECONDS."""
    per_elem = 4 * (mesh.shape[axis] - 1)  # bytes a device receives per uint32 it gathers from each other
    tiny, probe_elems = _gather_loop(mesh, axis, 1), max(1, PROBE_BYTES // per_elem)
    probe = _gather_loop(mesh, axis, probe_elems)
    estimates = [_per_iteration(tiny, 1, 1 + LATENCY_LOOP), _per_iteration(probe, 1, 3)]
    # loop lengths and message size must be the same on every process: from the slowest estimates
    latency, t = _gather(estimates).max(axis=0)
    rate = _bandwidth(probe_elems * per_elem, t, latency)
    elems = int(min(max(rate * SPAN_SECONDS / 4, probe_elems * per_elem), link_bytes) // per_elem)
    count = int(np.clip(SPAN_SECONDS / (latency + elems * per_elem / rate), 2, 64))
    latency = _per_iteration(tiny, 1, 1 + int(np.clip(SPAN_SECONDS / latency, LATENCY_LOOP, 2048)))
    loop = probe if elems == probe_elems else _gather_loop(mesh, axis, elems)
    return latency, _bandwidth(elems * per_elem, _per_iteration(loop, 1, 1 + count), latency)


def _gaussian_bf16(n: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(n, np.float32).astype(jnp.bfloat16)


def _median_seconds(fn) -> float:
    jax.block_until_ready(fn())
    times = []
    for _ in range(REPEAT):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def _measure_codec(mesh: Mesh, codec_bytes: int) -> tuple[float, float]:
    """Compress and decompress bytes per second per device, this process's
    devices of the mesh all at once."""
    local = Mesh(np.array(mesh.local_devices), ("local",))
    spec, m = P("local"), codec_bytes // 2
    x = jax.device_put(np.broadcast_to(_gaussian_bf16(m), (local.size, m)), NamedSharding(local, spec))
    compress = jax.jit(jax.shard_map(ops.compress_items, mesh=local, in_specs=spec, out_specs=(spec, spec)))
    decompress = jax.jit(jax.shard_map(lambda p: ops.decompress_items(p, m=m, dtype=jnp.bfloat16), mesh=local,
                                       in_specs=spec, out_specs=spec))
    payload, _ = compress(x)
    return 2 * m / _median_seconds(lambda: compress(x)), 2 * m / _median_seconds(lambda: decompress(payload))


def _local_values(leaf) -> list[np.ndarray]:
    """This process's values of a leaf (one copy of each shard)."""
    if isinstance(leaf, jax.Array):
        return [np.asarray(s.data) for s in leaf.addressable_shards if s.replica_id == 0]
    return [np.asarray(leaf)]


def _measure_ratios(data) -> dict[str, float]:
    """Per float dtype of data: raw bytes over the largest of RATIO_STREAMS
    streams of (up to SAMPLE_VALUES of) this process's values."""
    groups: dict[str, list] = {}
    for leaf in jax.tree.leaves(data):
        for values in _local_values(leaf):
            if is_compressible(values.dtype) and sum(map(len, groups.get(values.dtype.name, []))) < SAMPLE_VALUES:
                groups.setdefault(values.dtype.name, []).append(values.ravel())
    ratios = {}
    for name, parts in groups.items():
        x = np.concatenate(parts)[:SAMPLE_VALUES]
        x = x[: x.size - x.size % RATIO_STREAMS]
        if x.size:
            streams = jax.jit(ops.compress_chunks, static_argnums=1)(x, RATIO_STREAMS)
            ratios[name] = x.nbytes / RATIO_STREAMS / float(np.max(np.asarray(streams.nbytes)))
    return ratios
