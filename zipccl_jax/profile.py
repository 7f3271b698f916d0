"""The profile file: the figures `autotune` measured, as versioned JSON.

    {"zipccl_jax_profile": 4, "platform": "cpu", "device_kind": "cpu",
     "codec": {"compress_rate": 2.1e9, "decompress_rate": 3.2e9, "size_rate": 2.1e9, "copy_rate": 8e9},
     "ratios": {"bfloat16": 1.45, "float16": 1.18, "float32": 1.2},
     "links": {"data": {"size": 2, "latency": 0.0004, "bandwidth": 4.8e7, "consensus": 0.0001,
                        "reduce_latency": 0.0005, "reduce_bandwidth": 4.5e7}},
     "measured": [{"collective": "psum", "axes": ["data"], "axis_size": 2, "dtype": "bfloat16",
                   "bytes": 936448, "seconds": {"raw all_reduce": 0.0061, "compressed all_gather+local_reduce":
                   0.0112, ...}}],
     "ladder": null}

Rates are bytes per second per device, times are seconds. The codec's
size_rate (the size pass before a compressed transfer's consensus) and
copy_rate (packing and unpacking STORED_RAW streams, what the uncompressed
plans do) are optional. Per link (a mesh axis; the name "*", what
`autotune(mesh=None)` measures, applies to every axis without an entry of
its own), what the plans pay (Link):
- latency and bandwidth: the fixed cost and the rate of a transfer of bytes
  (all_to_all / all_gather of uint8: what the compressed plans, and the raw
  plans of the data-moving collectives, send), bytes received per device;
- consensus: a tiny pmax, which every sized transfer pays once (the size
  agreement);
- reduce_latency and reduce_bandwidth: XLA's own all-reduce (the raw psum and
  psum_scatter plans), in bytes each device sends (2 (n - 1) / n of the operand).
The last three are optional in a file (a hand-written profile may give only
latency and bandwidth, which then stand for them). `measured` (optional):
the plans autotune timed in situ on the job's own buckets, per call (the
collective, its axes and their size, the dtype and the bytes per device),
seconds per plan name (strategy.plan_names). `ladder` (optional) replaces
the capacity ladder.

Version 4. Files of versions 2 and 3 (zipccl_jax before the per-plan figures,
and before the size pass, copy rate and plans measured in situ) are refused
with OutdatedProfile, which says to measure again; `autotune(path=...)` then
measures and overwrites it. A file that is not JSON, has another version, an
unknown key or a figure out of range is a ValueError naming the file and the
problem.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

VERSION = 4
VERSION_KEY = "zipccl_jax_profile"
ANY_AXIS = "*"
PLATFORMS = ("cpu", "gpu")
DTYPES = ("bfloat16", "float16", "float32")


LINK_FIGURES = ("latency", "bandwidth", "consensus", "reduce_latency", "reduce_bandwidth")


class OutdatedProfile(ValueError):
    """A profile file of an older version: measure again."""


@dataclasses.dataclass(frozen=True)
class Link:
    """One mesh axis: its size and what a collective over it pays (module
    docstring). None: latency (for consensus, reduce_latency) or bandwidth
    (for reduce_bandwidth) stands for the figure."""

    size: int
    latency: float  # fixed cost of a byte transfer (s)
    bandwidth: float  # bytes received per second per device by a byte transfer
    consensus: float | None = None  # a tiny pmax (s)
    reduce_latency: float | None = None  # XLA's all-reduce: fixed cost (s)
    reduce_bandwidth: float | None = None  # and bytes sent per second per device


@dataclasses.dataclass(frozen=True)
class Measured:
    """The times of a collective's plans, measured in situ by autotune for
    one call: the collective over `axes` (their size), `nbytes` per device
    of `dtype`; `seconds`: (plan name, seconds), the slowest process's median."""

    collective: str
    axes: tuple[str, ...]
    axis_size: int
    dtype: str
    nbytes: int
    seconds: tuple[tuple[str, float], ...]

    @staticmethod
    def key_of(collective: str, axes: tuple, axis_size: int, dtype: str, nbytes: int) -> tuple:
        return (collective, tuple(axes), int(axis_size), dtype, int(nbytes))

    @property
    def key(self) -> tuple:
        return self.key_of(self.collective, self.axes, self.axis_size, self.dtype, self.nbytes)


@dataclasses.dataclass(frozen=True)
class Profile:
    """What autotune measured (or a profile file holds) for one platform."""

    platform: str  # "cpu" or "gpu"
    device_kind: str  # jax's Device.device_kind: a profile is reused only on the same kind
    compress_rate: float
    decompress_rate: float
    ratios: tuple[tuple[str, float], ...]
    links: tuple[tuple[str, Link], ...]
    ladder: tuple[float, ...] | None = None  # None: strategy.DEFAULT_LADDER
    size_rate: float | None = None  # the size pass (None: the CostModel's default, compress_rate)
    copy_rate: float | None = None  # STORED_RAW pack / unpack (None: the platform default's)
    measured: tuple[Measured, ...] = ()  # plans timed in situ

    def link(self, axis: str) -> Link | None:
        """The axis's link, else the one measured for every axis ("*"), else None."""
        links = dict(self.links)
        return links.get(axis, links.get(ANY_AXIS))


def write(profile: Profile, path) -> Path:
    """Writes atomically (every process of a job may write the same file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    codec = {"compress_rate": profile.compress_rate, "decompress_rate": profile.decompress_rate,
             "size_rate": profile.size_rate, "copy_rate": profile.copy_rate}
    doc = {VERSION_KEY: VERSION, "platform": profile.platform, "device_kind": profile.device_kind,
           "codec": {k: v for k, v in codec.items() if v is not None}, "ratios": dict(profile.ratios),
           "links": {name: {k: v for k, v in dataclasses.asdict(link).items() if v is not None}
                     for name, link in profile.links},
           "measured": [{"collective": m.collective, "axes": list(m.axes), "axis_size": m.axis_size, "dtype": m.dtype,
                         "bytes": m.nbytes, "seconds": dict(m.seconds)} for m in profile.measured],
           "ladder": list(profile.ladder) if profile.ladder else None}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def read(path) -> Profile:
    """The profile at path; ValueError naming the file and what is wrong."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"zipccl: profile {path} is not valid JSON: {err}") from None
    try:
        return _parse(doc)
    except ValueError as err:  # OutdatedProfile stays one
        raise type(err)(f"zipccl: profile {path}: {err}") from None


def _parse(doc) -> Profile:
    if not isinstance(doc, dict) or VERSION_KEY not in doc:
        raise ValueError(f"not a zipccl_jax profile (no {VERSION_KEY!r} version field; a profile from an older "
                         "zipccl_jax? run `python -m zipccl_jax calibrate` again)")
    if doc[VERSION_KEY] in (1, 2, 3):
        lacks = ("link figures this one does not use" if doc[VERSION_KEY] < 3 else
                 "figures lack the size pass, the copy rate and the plans measured in situ")
        raise OutdatedProfile(f"version {doc[VERSION_KEY]}, written by an older zipccl_jax whose {lacks} (this one "
                              f"reads version {VERSION}); measure again: `python -m zipccl_jax calibrate`, or "
                              "zipccl_jax.autotune(..., path=...), which replaces the file")
    if doc[VERSION_KEY] != VERSION:
        raise ValueError(f"version {doc[VERSION_KEY]!r}, this zipccl_jax reads version {VERSION}")
    _keys(doc, {VERSION_KEY, "platform", "device_kind", "codec", "ratios", "links"}, "the profile",
          {"ladder", "measured"})
    if doc["platform"] not in PLATFORMS:
        raise ValueError(f"platform {doc['platform']!r}, expected one of {', '.join(PLATFORMS)}")
    if not isinstance(doc["device_kind"], str):
        raise ValueError(f"device_kind must be a string, got {doc['device_kind']!r}")
    codec = _keys(doc["codec"], {"compress_rate", "decompress_rate"}, "codec", {"size_rate", "copy_rate"})
    ratios = _keys(doc["ratios"], set(), "ratios", set(DTYPES))
    links = doc["links"]
    if not isinstance(links, dict):
        raise ValueError(f"links must be an object of axis name -> link, got {links!r}")
    for name, link in links.items():
        _keys(link, {"size", "latency", "bandwidth"}, f"link {name!r}", set(LINK_FIGURES))
        if not isinstance(link["size"], int) or isinstance(link["size"], bool) or link["size"] < 2:
            raise ValueError(f"link {name!r}: size must be an integer >= 2, got {link['size']!r}")
        for figure in set(LINK_FIGURES) & set(link):
            _number(link[figure], f"link {name!r} {figure}", allow_zero=not figure.endswith("bandwidth"))
    ladder = doc.get("ladder")
    if ladder is not None and (not isinstance(ladder, list) or not ladder or ladder[-1] != 1.0
                               or any(not 0 < _number(f, "ladder rung") <= 1 for f in ladder)
                               or ladder != sorted(set(ladder))):
        raise ValueError(f"ladder must be increasing fractions in (0, 1] ending with 1.0, got {ladder!r}")
    optional = {k: _number(codec[k], k) for k in ("size_rate", "copy_rate") if k in codec}
    return Profile(doc["platform"], doc["device_kind"], _number(codec["compress_rate"], "compress_rate"),
                   _number(codec["decompress_rate"], "decompress_rate"),
                   tuple((dt, _number(ratios[dt], f"ratio of {dt}")) for dt in DTYPES if dt in ratios),
                   tuple((name, Link(link["size"], **{k: float(link[k]) for k in LINK_FIGURES if k in link}))
                         for name, link in sorted(links.items())),
                   tuple(float(f) for f in ladder) if ladder else None, **optional,
                   measured=tuple(_measured(entry, i) for i, entry in enumerate(doc.get("measured") or [])))


def _measured(entry, i: int) -> Measured:
    what = f"measured[{i}]"
    _keys(entry, {"collective", "axes", "axis_size", "dtype", "bytes", "seconds"}, what)
    axes, seconds = entry["axes"], entry["seconds"]
    if not isinstance(entry["collective"], str) or entry["dtype"] not in DTYPES:
        raise ValueError(f"{what}: collective must be a name and dtype one of {', '.join(DTYPES)}, got "
                         f"{entry['collective']!r}, {entry['dtype']!r}")
    if not isinstance(axes, list) or not axes or not all(isinstance(a, str) for a in axes):
        raise ValueError(f"{what}: axes must be a list of axis names, got {axes!r}")
    for k in ("axis_size", "bytes"):
        if not isinstance(entry[k], int) or isinstance(entry[k], bool) or entry[k] < 1:
            raise ValueError(f"{what}: {k} must be a positive integer, got {entry[k]!r}")
    if not isinstance(seconds, dict) or not seconds:
        raise ValueError(f"{what}: seconds must be an object of plan name -> seconds, got {seconds!r}")
    return Measured(entry["collective"], tuple(axes), entry["axis_size"], entry["dtype"], entry["bytes"],
                    tuple((str(name), _number(t, f"{what} seconds of {name!r}")) for name, t in seconds.items()))


def _keys(obj, required: set, what: str, optional: set = frozenset()) -> dict:
    if not isinstance(obj, dict):
        raise ValueError(f"{what} must be an object, got {obj!r}")
    unknown, missing = set(obj) - required - optional, required - set(obj)
    if unknown or missing:
        raise ValueError(f"{what}: " + "; ".join(filter(None, [
            unknown and f"unknown key(s) {', '.join(sorted(unknown))}",
            missing and f"missing key(s) {', '.join(sorted(missing))}"])))
    return obj


def _number(v, what: str, allow_zero: bool = False) -> float:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (v > 0 or allow_zero and v == 0)
    if not ok:
        raise ValueError(f"{what} must be a finite number {'>= 0' if allow_zero else '> 0'}, got {v!r}")
    return float(v)
