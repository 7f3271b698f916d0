"""When to compress, which algorithm, and how many bytes to send.

Every compressed collective asks `plan()` at trace time. The answer comes from
a cost model (latency, link bandwidth, codec throughput, expected ratio)
whose constants are measured by `python -m zipccl_jax calibrate` and stored in
a JSON profile a user can edit, or passed per call as `strategy=CostModel(...)`
or `strategy="raw"` / `"compressed"` to force the choice. The decision and its
reason are recorded so a user can see what was chosen (`last_plans()`).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
from pathlib import Path

import numpy as np

from .dtypes import is_compressible

PROFILE_ENV = "ZIPCCL_PROFILE"

# Capacities (fractions of the raw bytes) the compressed transfer can use; the
# smallest one every device's streams fit is sent. The top rung is raw.
DEFAULT_LADDER = (0.58, 0.62, 0.66, 0.69, 0.72, 0.77, 0.83, 0.9, 1.0)


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Constants of the cost model; times in seconds, rates in bytes per second."""

    latency: float = 50e-6  # one collective's fixed cost (also the size consensus)
    link_bandwidth: float = 1.25e9  # bytes per second per device (10 Gbit/s between hosts)
    compress_rate: float = 1.5e9  # codec input bytes per second (one CPU core)
    decompress_rate: float = 2e9
    ratios: tuple = (("bfloat16", 1.5), ("float16", 1.18), ("float32", 1.2))
    ladder: tuple = DEFAULT_LADDER
    psum_algorithm: str | None = None  # force "reduce_scatter+all_gather" or "all_gather+local_reduce"

    def ratio(self, dtype) -> float:
        return dict(self.ratios).get(np.dtype(dtype).name, 1.0)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a collective will do: compress or not, algorithm, and why."""

    collective: str
    compress: bool
    algorithm: str
    reason: str
    raw_bytes: int
    axis_size: int


_PLANS: collections.deque = collections.deque(maxlen=10_000)  # bounded: traces repeat in long jobs


def last_plans(clear: bool = False) -> list[Plan]:
    """The plans made since the last clear (one per collective traced; the
    newest 10,000 are kept)."""
    plans = list(_PLANS)
    if clear:
        _PLANS.clear()
    return plans


def profile_path() -> Path:
    return Path(os.environ.get(PROFILE_ENV, Path.home() / ".cache" / "zipccl_jax" / "profile.json"))


def load_model(path: Path | None = None) -> CostModel:
    """The calibrated model if a profile exists, else the defaults (read once
    per version of the file: every traced collective asks)."""
    path = path or profile_path()
    return _load(path, path.stat().st_mtime_ns if path.exists() else None)


@functools.lru_cache(maxsize=8)
def _load(path: Path, mtime) -> CostModel:
    if mtime is None:
        return CostModel()
    fields = json.loads(path.read_text())
    fields = {k: tuple(map(tuple, v)) if k == "ratios" else tuple(v) if k == "ladder" else v
              for k, v in fields.items() if k in CostModel.__dataclass_fields__}
    return CostModel(**fields)


def save_model(model: CostModel, path: Path | None = None) -> Path:
    path = path or profile_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dataclasses.asdict(model), indent=2) + "\n")
    return path


def _algorithms(collective: str, nbytes: int, n: int) -> dict:
    """Per algorithm, per device: (collective steps, bytes received, bytes
    compressed, bytes decompressed), for an operand of nbytes per device."""
    share = nbytes * (n - 1) / n
    if collective == "psum":
        return {"reduce_scatter+all_gather": (2, 2 * share, nbytes + nbytes / n, 2 * nbytes),
                "all_gather+local_reduce": (1, nbytes * (n - 1), nbytes, n * nbytes)}
    if collective == "all_gather":
        return {"direct": (1, nbytes * (n - 1), nbytes, n * nbytes)}
    if collective == "ppermute":
        return {"direct": (1, nbytes, nbytes, nbytes)}
    return {"direct": (1, share, nbytes, nbytes)}  # psum_scatter, all_to_all


def model_for(axes, strategy=None, *, platform=None) -> CostModel:
    """The cost model a collective over `axes` uses."""
    return strategy if isinstance(strategy, CostModel) else load_model()


def plan(collective: str, nbytes: int, dtype, axes, axis_size: int, strategy=None, *, platform=None) -> Plan:
    """Decides raw vs compressed, and for psum reduce-scatter+all-gather vs
    all-gather+local-reduce, by comparing modelled times."""
    forced = strategy if isinstance(strategy, str) and strategy != "auto" else None
    if forced not in (None, "raw", "compressed"):
        raise ValueError(f"zipccl: strategy must be a CostModel, 'raw' or 'compressed', got {strategy!r}")
    if strategy is None and os.environ.get("ZIPCCL_STRATEGY", "auto") != "auto":
        forced = os.environ["ZIPCCL_STRATEGY"]
    model = model_for(axes, strategy, platform=platform)
    n, ratio = axis_size, model.ratio(dtype)
    options = []  # (modelled seconds, compress, algorithm)
    for algo, (steps, wire, packed, unpacked) in _algorithms(collective, nbytes, n).items():
        options.append((steps * model.latency + wire / model.link_bandwidth, False, algo))
        codec = packed / model.compress_rate + unpacked / model.decompress_rate
        # each step also pays a pmax that agrees on the size: twice the latency
        options.append((2 * steps * model.latency + wire / ratio / model.link_bandwidth + codec, True, algo))
    why = ""
    if not is_compressible(dtype):
        forced, why = "raw", f"dtype {np.dtype(dtype).name} is not compressed"
    elif n == 1:
        forced, why = "raw", "axis of size 1: nothing crosses a link"
    candidates = [o for o in options if (forced is None or o[1] == (forced == "compressed"))
                  and (collective != "psum" or model.psum_algorithm in (None, o[2]))]
    if not candidates:
        raise ValueError(f"zipccl: unknown psum_algorithm {model.psum_algorithm!r}")
    t, compress, algo = min(candidates)
    if not why:
        raw_best = min(o[0] for o in options if not o[1])
        why = (f"strategy={forced!r}: " if forced else "") + f"modelled {t * 1e6:.0f} us vs {raw_best * 1e6:.0f} us raw"
    result = Plan(collective, compress, algo, why, nbytes, n)
    _PLANS.append(result)
    return result


def capacities(capacity: int, raw_bytes: int, ladder=DEFAULT_LADDER) -> tuple[int, ...]:
    """The ladder in bytes per stream: increasing, 8-byte aligned, the top one
    the full stream capacity (raw plus header), so every stream fits."""
    header = capacity - raw_bytes
    rungs = sorted({min(capacity, -(-int(header + f * raw_bytes) // 8) * 8) for f in ladder if f < 1.0})
    return tuple(r for r in rungs if r < capacity) + (capacity,)
