"""`autotune`: measures the job's own links and codec and installs the figures.

    jax.distributed.initialize(...)               # multi-process jobs: first
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    zc.autotune(mesh, data=sample_grads, path="zipccl-profile.json")   # every process, before compiling

What is measured, with real collectives on the job's devices and processes:

- each mesh axis of size > 1, the figures the cost model uses (strategy.py),
  each with the collective the plans run over that axis only (shard_map over
  the whole mesh, so every group of the axis runs at once, as in the job):
  - consensus: a tiny pmax, what every sized transfer pays once to agree on
    its size;
  - latency and bandwidth of a byte transfer: all_to_all and all_gather of
    uint8, each after a tiny pmax as in a compressed plan, at two sizes
    (`link_bytes` and 1/16 of it received per device); the fixed cost is the
    intercept less the consensus, the bandwidth the slope (received bytes),
    the two collectives averaged (a reduce-scatter+all-gather runs one of each);
  - reduce_latency and reduce_bandwidth: XLA's own all-reduce of float32 (the
    raw psum / psum_scatter plans; on CPU a 16-bit operand is reduced as
    float32) at two sizes, intercept and slope (bytes each device sends).
  Each probe is a loop of the collective; loops of 1 and 1 + k iterations are
  timed (the fastest of 3 each: noise only adds time) and differenced, so
  dispatch drops out, with k sized from a first run to take ~20 ms. All probes of an axis are one compiled
  program (a loop per probe, its trip count an argument);
- the codec: compress and decompress rates per device on Gaussian bf16
  (`codec_bytes` per device), all of this process's devices at once (on CPU
  they share the cores, as they do inside a collective); the size pass
  (the row op a compressed transfer runs before its consensus: a full
  compress today, an analysis-only count once the codec has one, measured
  as it is); packing and summing STORED_RAW streams (the uncompressed plans);
- ratios, per dtype of the float leaves of `data` (sample tensors, e.g. a
  step's gradients): raw bytes over the largest of 8 streams of this process's
  values (a collective sends the ladder rung its largest stream needs).
  Without `data` the ratios stay the platform default's (Gaussian data);
- with `data` (and measure_plans=True), zip_psum's plans in situ: every
  candidate plan timed on data's own buckets over each mesh axis with the
  real collectives (insitu.py); strategy.plan prefers these times over the
  model for calls of the same collective, axes, dtype and bytes.

Every process gathers every process's figures (an all-gather of a few
numbers) and keeps the slowest: the largest of each fixed cost and time
measured in situ, the smallest of each bandwidth, codec rate and ratio. So
every process installs identical figures and makes identical plans, as SPMD
programs must.

`mesh=None` measures one axis over all devices of the job (jax.devices()) and
installs it for every axis name ("*"): right for pure data parallelism over
all devices; a mesh whose axes run inside and across hosts needs the mesh.
Axes that were not measured (not in the mesh, or of size 1) keep the
platform default's link figures; the measured codec and ratios apply to them.

With `path`, a profile there that describes this mesh (platform, device
kind, axis names and sizes) on every process, and holds the plans measured
in situ for data's buckets where data is given, is loaded instead of
measuring (a restart costs two small all-gathers); otherwise the figures are
measured and written there. A profile of an older version (profile.py) is
measured again and replaced, with a warning. `refresh=True` always measures.

Cost: per axis one compilation and 7 probes (~0.2 s unshaped, ~1 s at
200 Mbit/s: the larger probe then takes ~20 ms an iteration), the codec five
compilations and 20 runs of `codec_bytes`, one compilation per dtype of
`data`; in situ, per axis and distinct bucket size (at most 4), 5
compilations of zip_psum (the default 32-rung ladder: ~0.1-0.3 s each on
CPU) and 9-17 calls of each plan (about 0.3 s of timed calls per plan, at
least 9 calls: on a slow link that is 9 syncs of each plan);
docs/BENCHMARKS.md has measured totals. Call it before compiling anything
that uses the collectives: a compiled function keeps the decisions made
when it was compiled.
"""

from __future__ import annotations

import dataclasses
import json
import time
import warnings
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from . import _ffi, insitu, ops, strategy
from . import profile as profile_file
from .collectives._mirror import DEFAULT_BUCKET_BYTES
from .dtypes import is_compressible
from .profile import DTYPES, LINK_FIGURES, Link, Measured, OutdatedProfile, Profile

REPEAT = 3  # timed pairs per loop (the fastest of each length)
SPAN_SECONDS = 0.02  # what each timed loop is sized to take
MAX_LOOP = 256  # iterations of the longer timed loop, at most
SMALL_FRACTION = 16  # the smaller probe moves 1/16 of the larger
RATIO_STREAMS = 8
SAMPLE_VALUES = 1 << 23  # of each dtype of `data`, per process


def autotune(mesh: Mesh | None = None, *, data=None, path=None, refresh: bool = False,
             link_bytes: int = 512 << 10, codec_bytes: int = 8 << 20, measure_plans: bool = True,
             bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Profile:
    """Measures (or loads from `path`) this job's figures, agrees on them
    across processes, installs them as this process's default and returns
    them. Every process of the job must call it, with the same arguments
    (`data` may differ in values: it is each process's own sample; its float
    leaves' dtypes and sizes per device must be the same everywhere).
    `link_bytes`: what each device receives in the larger byte-transfer
    probe. measure_plans: time zip_psum's plans in situ on data's buckets
    (of `bucket_bytes`, as the job's zip_psum calls make them)."""
    mesh = mesh if mesh is not None else Mesh(np.array(jax.devices()), (profile_file.ANY_AXIS,))
    platforms = sorted({d.platform for d in mesh.devices.flat})
    if platforms != ["cpu"] and _ffi.cuda_module() is None:  # before measuring or loading anything
        raise _ffi.no_cuda_codec(platforms, "autotune")
    if link_bytes < SMALL_FRACTION * 64:
        raise ValueError(f"zipccl: link_bytes must be at least {SMALL_FRACTION * 64}, got {link_bytes}")
    timing = data is not None and measure_plans
    leaves = insitu.device_leaves(data) if timing else []
    if timing and len(set(_gather([insitu.structure(leaves, bucket_bytes)])[:, 0])) > 1:
        raise ValueError("zipccl: autotune's data must have the same float leaves (dtypes and sizes per device) on "
                         "every process to time the plans in situ; the processes' data differ")
    wanted = _plan_keys(mesh, leaves, bucket_bytes)
    if path is not None and not refresh:
        try:
            loaded = _read_everywhere(Path(path))
        except OutdatedProfile as err:
            warnings.warn(f"{err}; measuring again", stacklevel=2)
            loaded = None
        if loaded is not None and _describes(loaded, mesh) and wanted <= {m.key for m in loaded.measured}:
            strategy.install(loaded, f"profile {path}")
            return loaded
    local = _measure(mesh, data, link_bytes, codec_bytes)
    agreed = _combine(_gather(_figures(local)), local)
    strategy.install(agreed, "autotune")
    if leaves:  # with the agreed figures installed: the plans compile with them
        agreed = dataclasses.replace(agreed, measured=insitu.measure(mesh, leaves, bucket_bytes, _gather))
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


def main(output=None, platform=None) -> Profile:
    """`python -m zipccl_jax calibrate`: autotune over this process's devices
    (of `platform`; by default the default platform's), written to the profile
    file a single-process job on that platform reads by default."""
    path = Path(output) if output else strategy.profile_path()
    devices = jax.devices(platform)
    prof = autotune(Mesh(np.array(devices), (profile_file.ANY_AXIS,)), path=path, refresh=True)
    print(f"devices: {len(devices)} x {devices[0].device_kind}")
    print(f"  codec: compress {prof.compress_rate / 1e9:.3g} GB/s, decompress {prof.decompress_rate / 1e9:.3g} GB/s, "
          f"size pass {prof.size_rate / 1e9:.3g} GB/s, stored-stream copy {prof.copy_rate / 1e9:.3g} GB/s per device")
    for name, link in prof.links or [("(no link: one device)", None)]:
        print(f"  axis {name}: " + (describe_link(link) if link else "not measured"))
    print(f"profile written to {path} (single-process jobs read it; multi-process jobs: "
          "zipccl_jax.autotune(mesh, path=...))")
    return prof


def _plan_keys(mesh: Mesh, leaves, bucket_bytes: int) -> set:
    """The calls insitu.measure times for these leaves on this mesh."""
    return {Measured.key_of("psum", (axis,), size, dtype, nbytes) for axis, size in _axes(mesh)
            for dtype, nbytes, _ in insitu.buckets(leaves, bucket_bytes)} if leaves else set()


def describe_link(link: Link) -> str:
    """One line: the link's figures as the cost model uses them."""
    us = lambda s: f"{s * 1e6:.0f} us"  # noqa: E731
    rate = lambda b: f"{b / 1e6:.4g} MB/s"  # noqa: E731
    return (f"{link.size} devices, consensus (tiny pmax) {us(link.consensus)}, byte transfer {us(link.latency)} + "
            f"{rate(link.bandwidth)} received, XLA all-reduce {us(link.reduce_latency)} + "
            f"{rate(link.reduce_bandwidth)} sent")


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
    layout = [prof.platform, prof.device_kind, [(name, link.size) for name, link in prof.links], prof.ladder,
              [(m.key, [name for name, _ in m.seconds]) for m in prof.measured]]
    return float(zlib.crc32(json.dumps(layout).encode()))


CODEC_FIGURES = ("compress_rate", "decompress_rate", "size_rate", "copy_rate")


def _figures(prof: Profile) -> np.ndarray:
    """The profile's figures as one vector (a figure left to another, None, as -1)."""
    ratios = dict(prof.ratios)
    optional = lambda v: -1.0 if v is None else v  # noqa: E731
    return np.array([*(optional(getattr(prof, f)) for f in CODEC_FIGURES), *(ratios.get(dt, 0.0) for dt in DTYPES),
                     *(optional(getattr(link, f)) for _, link in prof.links for f in LINK_FIGURES),
                     *(t for m in prof.measured for _, t in m.seconds)], np.float64)


def _slowest(col: np.ndarray, figure: str) -> float | None:
    if (col < 0).any():  # not given by some process's file: stands for another figure there
        return None
    return float(col.min() if figure.endswith(("bandwidth", "rate")) else col.max())


def _combine(rows: np.ndarray, template: Profile) -> Profile:
    """The slowest figures of all processes, in template's structure."""
    columns = iter(rows.T)
    codec = {f: _slowest(next(columns), f) for f in CODEC_FIGURES}
    ratios = tuple((dt, float(col[col > 0].min())) for dt, col in zip(DTYPES, [next(columns) for _ in DTYPES])
                   if (col > 0).any())
    links = tuple((name, Link(link.size, **{f: _slowest(next(columns), f) for f in LINK_FIGURES}))
                  for name, link in template.links)
    measured = tuple(dataclasses.replace(m, seconds=tuple((name, _slowest(next(columns), "seconds"))
                                                          for name, _ in m.seconds)) for m in template.measured)
    return Profile(template.platform, template.device_kind, ratios=ratios, links=links, ladder=template.ladder,
                   measured=measured, **codec)


def _read_everywhere(path: Path) -> Profile | None:
    """The profile at path as all processes agree on it; None when some
    process has no file there; OutdatedProfile when some process's file is of
    an older version (and none is unreadable); ValueError when some process
    cannot read it or the processes' files differ in their axes, platform or
    ladder."""
    prof, status, problem = None, 0, ""
    try:
        prof = profile_file.read(path) if path.is_file() else None
        status = 0 if prof else 1
    except OutdatedProfile as err:
        status, problem = 3, str(err)
    except (ValueError, OSError) as err:
        status, problem = 2, str(err)
    head = _gather([status, _structure(prof)])
    bad = [i for i, s in enumerate(head[:, 0]) if s == 2]
    if bad:
        raise ValueError(f"zipccl: profile {path} is unreadable on process(es) {bad}" + (f": {problem}" if problem
                                                                                       else ""))
    if (head[:, 0] == 3).any():
        raise OutdatedProfile(problem or f"zipccl: profile {path} is of an older version on process(es) "
                                         f"{[i for i, s in enumerate(head[:, 0]) if s == 3]}")
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
    links = tuple((name, _measure_link(mesh, name, link_bytes)) for name, size in _axes(mesh))
    codec = _measure_codec(mesh, codec_bytes)
    ratios = tuple(sorted(_measure_ratios(data).items())) if data is not None else ()
    return Profile(strategy.platform_family(device.platform), device.device_kind, ratios=ratios, links=links, **codec)


def _replicated(mesh: Mesh, value) -> jax.Array:
    value = np.asarray(value)
    return jax.make_array_from_callback(value.shape, NamedSharding(mesh, P()), lambda idx: value[idx])


def _probes(axis: str, n: int, link_bytes: int) -> list[tuple[str, object, np.dtype, int, int]]:
    """(name, one iteration, dtype, elements per device, bytes each device
    receives or, for the all-reduce, sends) of each probe over an axis of n."""
    def consensus(x):
        return lax.pmax(x, axis) + 1

    def agreed(x):  # every sized transfer follows the pmax of its size: so do these
        return x.at[0].set(lax.pmax(x[0], axis) + 1)

    def exchange(x):  # what a reduce-scatter phase runs
        return lax.all_to_all(agreed(x).reshape(n, -1), axis, 0, 0, tiled=True).reshape(-1)

    def gather(x):  # what an all-gather phase runs
        return lax.all_gather(agreed(x), axis, axis=0, tiled=True)[-x.size:]

    def reduce(x):  # the raw psum: XLA's all-reduce, in float32 on CPU
        return lax.psum(x, axis) * 0.5

    probes = [("consensus", consensus, np.dtype(np.uint32), 1, 0)]
    for size in (link_bytes // SMALL_FRACTION, link_bytes):
        m = max(1, size // (n - 1))  # uint8 per row: each device receives (n - 1) m bytes
        probes += [("exchange", exchange, np.dtype(np.uint8), n * m, (n - 1) * m),
                   ("gather", gather, np.dtype(np.uint8), m, (n - 1) * m)]
    for size in (link_bytes // SMALL_FRACTION, link_bytes):
        e = max(1, size * n // (8 * (n - 1)))  # float32 values: each device sends 2 (n - 1) / n of 4 e bytes
        probes.append(("reduce", reduce, np.dtype(np.float32), e, 8 * e * (n - 1) // n))
    return probes


def _probe_program(mesh: Mesh, probes):
    """run(counts) -> runs probe i counts[i] times in a row (each iteration
    depends on the last, so none is hoisted or merged), all in one compiled
    program; a count of 0 skips the probe."""
    names = tuple(mesh.axis_names)
    ops = [op for _, op, _, _, _ in probes]

    def body(counts, *xs):
        outs = [lax.fori_loop(0, counts[i], lambda _, x, op=op: op(x), x)[:1].astype(jnp.float32)
                for i, (op, x) in enumerate(zip(ops, xs))]
        return jnp.concatenate(outs)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), *(P(names),) * len(probes)), out_specs=P(names),
                              check_vma=False))
    xs = [jax.make_array_from_callback((mesh.size * elems,), NamedSharding(mesh, P(names)),
                                       lambda idx, d=dtype, e=elems: np.zeros(e, d))
          for _, _, dtype, elems, _ in probes]
    cache: dict = {}

    def run(counts: tuple):
        if counts not in cache:
            cache[counts] = _replicated(mesh, np.array(counts, np.int32))
        return f(cache[counts], *xs)
    return run


def _per_iteration(run, lo: int, hi: int) -> float:
    """Seconds per loop iteration: (t(hi) - t(lo)) / (hi - lo), so dispatch
    drops out, each t the fastest of REPEAT runs (noise, from other work on
    the machine or a wait for the scheduler, only ever adds time);
    t(hi) / hi if what remains makes that <= 0."""
    lows, highs = [], []
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        jax.block_until_ready(run(lo))
        t1 = time.perf_counter()
        jax.block_until_ready(run(hi))
        highs.append(time.perf_counter() - t1)
        lows.append(t1 - t0)
    diff = (min(highs) - min(lows)) / (hi - lo)
    return diff if diff > 0 else min(highs) / hi


def fit(small: tuple[float, float], large: tuple[float, float]) -> tuple[float, float]:
    """(intercept s, bytes per second) of t = intercept + bytes / rate through
    two (bytes, seconds) points. Noise must not make the rate negative or
    unbounded: the rise between the points counts as at least a tenth of the
    larger time, the intercept is at least 0."""
    (b1, t1), (b2, t2) = small, large
    slope = max(t2 - t1, t2 / 10) / (b2 - b1)
    return max(t1 - slope * b1, 0.0), 1.0 / slope


def _measure_link(mesh: Mesh, axis: str, link_bytes: int) -> Link:
    """One axis's figures (module docstring). The loops' lengths are sized
    from a first run and agreed across processes (the programs must match)."""
    n = mesh.shape[axis]
    probes = _probes(axis, n, link_bytes)
    run = _probe_program(mesh, probes)
    only = lambda i, k: tuple(k if j == i else 0 for j in range(len(probes)))  # noqa: E731
    jax.block_until_ready(run(only(-1, 0)))  # compile
    first = []
    for i in range(len(probes)):
        jax.block_until_ready(run(only(i, 1)))  # connect, warm
        t0 = time.perf_counter()
        jax.block_until_ready(run(only(i, 0)))
        t1 = time.perf_counter()
        jax.block_until_ready(run(only(i, 1)))
        first.append(max(time.perf_counter() - 2 * t1 + t0, 1e-6))
    loops = np.clip(SPAN_SECONDS / _gather(first).max(axis=0), 1, MAX_LOOP).astype(int)
    t = [_per_iteration(lambda k, i=i: run(only(i, k)), 1, 1 + int(loops[i])) for i in range(len(probes))]
    moved = [nbytes for *_, nbytes in probes]
    consensus = t[0]
    # exchange and gather at each size, averaged: a reduce-scatter+all-gather runs one of each
    transfer = fit((moved[1], (t[1] + t[2]) / 2), (moved[3], (t[3] + t[4]) / 2))
    reduce = fit((moved[5], t[5]), (moved[6], t[6]))
    return Link(n, max(transfer[0] - consensus, 0.0), transfer[1], consensus, *reduce)


def _gaussian_bf16(n: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(n, np.float32).astype(jnp.bfloat16)


def _fastest_seconds(fn, span: float = SPAN_SECONDS, most: int = MAX_LOOP) -> float:
    """The fastest run of fn, after one untimed (noise only adds time): at
    least REPEAT runs and as many more as fit in `span` seconds (up to
    `most`), so that a burst of other work on the core (another process's,
    a collective library's thread) cannot cover every run. Three runs of
    ~0.3 ms did: two processes autotuning together on a 2-core machine read
    decompression at 2.4-3.7 GB/s over 8 autotunes (bench net: 0.47 in 3 of
    12), runs filling 20 ms at 3.3-3.8 (docs/BENCHMARKS.md)."""
    jax.block_until_ready(fn())
    times, spent = [], 0.0
    while len(times) < REPEAT or (spent < span and len(times) < most):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
        spent += times[-1]
    return min(times)


def _measure_codec(mesh: Mesh, codec_bytes: int) -> dict[str, float]:
    """Bytes per second per device (CODEC_FIGURES), this process's devices of
    the mesh all at once: compress and decompress; the size pass of a
    transfer (its row op, as the collectives run it); packing STORED_RAW
    streams and decoding and summing them (the uncompressed plans), one
    rate for the two (bytes over their summed time)."""
    local = Mesh(np.array(mesh.local_devices), ("local",))
    spec, m, rows = P("local"), codec_bytes // 2, RATIO_STREAMS
    x = jax.device_put(np.broadcast_to(_gaussian_bf16(m), (local.size, m)), NamedSharding(local, spec))
    each = lambda f, out=spec: jax.jit(jax.shard_map(f, mesh=local, in_specs=spec, out_specs=out))  # noqa: E731
    compress = each(ops.compress_items, (spec, spec))
    decompress = each(lambda p: ops.decompress_items(p, m=m, dtype=jnp.bfloat16))
    sizes = each(lambda x: ops.stream_sizes([x[0]], rows)[None])
    capacity = ops.stream_capacity(ops.row_elems(m, rows), jnp.bfloat16)
    pack = each(lambda x: ops.encode_rows([x[0]], rows, capacity, raw=True)[0][None])
    unpack = each(lambda p: ops.decode_accumulate_rows([p[0]], (ops.row_elems(m, rows),), jnp.bfloat16)[0][None])
    payload, _ = compress(x)
    packed = pack(x)
    copy = _fastest_seconds(lambda: pack(x)) + _fastest_seconds(lambda: unpack(packed))
    return {"compress_rate": 2 * m / _fastest_seconds(lambda: compress(x)),
            "decompress_rate": 2 * m / _fastest_seconds(lambda: decompress(payload)),
            "size_rate": 2 * m / _fastest_seconds(lambda: sizes(x)), "copy_rate": 4 * m / copy}


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
