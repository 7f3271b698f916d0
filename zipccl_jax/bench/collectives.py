"""Collectives benchmark: wire bytes and time of each compressed collective
against lax on the local devices (bench/devices.py: the default platform's, or
the virtual CPU devices where it has fewer than two).

    python -m zipccl_jax bench collectives [--sizes 1e6,16e6] [--data gaussian|minilm]
"""

from __future__ import annotations

import numpy as np

from . import data as bench_data
from . import report
from .codec import _median_seconds
from .devices import choose, describe, wire_ratio


def _collective_cases(n):
    """name -> (zip version, lax version, per-device shape for `elements`)."""
    import jax.numpy as jnp
    from jax import lax

    from .. import collectives as zc

    perm = [(i, (i + 1) % n) for i in range(n)]
    return {
        "psum": (lambda a, **k: zc.zip_psum(a, "d", **k), lambda a: lax.psum(a.astype(jnp.float32), "d")),
        "all_gather": (lambda a, **k: zc.zip_all_gather(a, "d", tiled=True, **k),
                       lambda a: lax.all_gather(a, "d", tiled=True)),
        "psum_scatter": (lambda a, **k: zc.zip_psum_scatter(a, "d", tiled=True, **k),
                         lambda a: lax.psum_scatter(a.astype(jnp.float32), "d", tiled=True)),
        "all_to_all": (lambda a, **k: zc.zip_all_to_all(a, "d", 0, 0, tiled=True, **k),
                       lambda a: lax.all_to_all(a, "d", 0, 0, tiled=True)),
        "ppermute": (lambda a, **k: zc.zip_ppermute(a, "d", perm, **k), lambda a: lax.ppermute(a, "d", perm)),
    }


def run_collectives(sizes: list[int], repeat: int, data: str, names=None, json_path=None, plot_path=None,
                    platform=None) -> None:
    """Time and wire bytes of each collective vs lax on the local devices (devices.choose: those of
    `platform`, by default the default platform's, or the CPU's if it has fewer than two)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    devices, note = choose(need=1 if platform else 2, platform=platform)
    n = len(devices)
    mesh = jax.make_mesh((n,), ("d",), devices=devices)
    cases = [c for c in _collective_cases(n) if not names or c in names]
    progress = report.Progress(len(sizes) * len(cases))
    rows = []
    source = bench_data.minilm_concat("bfloat16") if data == "minilm" else None
    for nbytes in sizes:
        m = max(n * 8, nbytes // 2 // (n * 8) * n * 8)
        if source is not None:
            x = np.stack([source[(i * m) % (source.size - m):][:m] for i in range(n)])
        else:
            x = np.stack([bench_data.gaussian(m, "bfloat16", seed=i) for i in range(n)])
        xs = jax.device_put(x, NamedSharding(mesh, P("d")))
        for name, (ours, theirs) in _collective_cases(n).items():
            if name not in cases:
                continue
            progress.start(f"collectives {name} {_size(x[0].nbytes)}")

            def timed(fn):
                f = jax.jit(jax.shard_map(lambda a: fn(a[0]), mesh=mesh, in_specs=P("d"), out_specs=P("d"),
                                          check_vma=False))
                return _median_seconds(lambda: jax.block_until_ready(f(xs)), repeat)

            t_zip = timed(lambda a: ours(a, strategy="compressed")[None])
            t_auto = timed(lambda a: ours(a)[None])
            t_lax = timed(lambda a: theirs(a)[None])
            stats = jax.jit(jax.shard_map(lambda a: ours(a[0], strategy="compressed", with_stats=True)[1].wire_bytes[None],
                                          mesh=mesh, in_specs=P("d"), out_specs=P("d"), check_vma=False))(xs)
            raws = jax.jit(jax.shard_map(lambda a: ours(a[0], compress=False, with_stats=True)[1].raw_bytes[None],
                                         mesh=mesh, in_specs=P("d"), out_specs=P("d"), check_vma=False))(xs)
            wire, raw = float(np.max(stats)), float(np.max(raws))
            rows.append({"collective": name, "bytes/device": int(x[0].nbytes), "raw wire B": int(raw),
                         "zip wire B": int(wire), "wire ratio": raw / wire if wire else None,
                         "lax ms": t_lax * 1e3, "zip ms": t_zip * 1e3, "zip/lax time": t_zip / t_lax,
                         "auto/lax time": t_auto / t_lax})
            progress.finish(f"wire {wire_ratio(raw, wire)}, zip/lax time {t_zip / t_lax:.2f}")
    print(f"## Collectives on {describe(devices)} ({data} bf16 per device), median of {repeat}\n")
    if note:
        print(f"({note})\n")
    print("lax psum and psum_scatter run in float32 (bf16 lax.psum sums in bf16); times include the codec.")
    print("zip: compression forced; auto: the default strategy (raw for small messages).\n")
    print(report.table(rows))
    if json_path:
        report.save_json(json_path, devices=n, platform=devices[0].platform, data=data, repeat=repeat, rows=rows,
                         note=note)
    if plot_path:
        sizes_done = sorted({r["bytes/device"] for r in rows})
        report.line_plot(plot_path, f"zip / lax time on {n} x {devices[0].platform} ({data} bf16; < 1: zip faster)",
                         sizes_done, {c: [r["zip/lax time"] for r in rows if r["collective"] == c] for c in cases},
                         "bytes per device", "time ratio zip / lax (median)")


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"
