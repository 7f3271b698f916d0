"""Codec benchmark: ratio and single-core speed, side by side with the baselines.

    python -m zipccl_jax bench codec [--elements N] [--repeat R] [--core C]

Every codec runs on the same bytes in one process, pinned to one core. The
zipccl kernels are timed on reused output buffers (first-touching fresh memory
costs ~1 ms/MB on the shared VMs and would hide the kernel); ZipNN and zstd
return new buffers through their own APIs, as a user would call them. Speeds
are GB/s of uncompressed input and, to cancel machine noise, ratios to a
numpy copy of the same bytes timed in the same run.
"""

from __future__ import annotations

import os
import time

import numpy as np

from . import _zipccl_cpu, baselines, bench_data, reference, report
from .dtypes import DTYPE_CODES


def _median_seconds(fn, repeat: int) -> float:
    fn()  # warm: caches, lazy imports, page faults
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def zipccl_bytes(x: np.ndarray) -> int:
    raw = np.ascontiguousarray(x).view(np.uint8).ravel()
    out = np.empty(reference.max_stream_bytes(x.size, x.dtype), np.uint8)
    return _zipccl_cpu.compress_into(raw, DTYPE_CODES[x.dtype.name], out)


def ratios(name: str, data) -> dict:
    """Compression ratios of every codec on one dataset (dict of tensors or an array)."""
    tensors = data if isinstance(data, dict) else {name: data}
    flat = np.concatenate([t.ravel() for t in tensors.values()])
    raw = flat.nbytes
    row = {"data": name, "dtype": flat.dtype.name, "MB": raw / 1e6}
    row["zipccl"] = raw / zipccl_bytes(flat)
    row["zipnn"] = raw / len(baselines.zipnn_compress(flat))
    row["zstd-1"] = raw / len(baselines.zstd_compress(flat.tobytes(), 1))
    row["zstd-3"] = raw / len(baselines.zstd_compress(flat.tobytes(), 3))
    row["exp-huffman/tensor"] = raw / baselines.per_tensor_exponent_huffman_bytes(tensors)
    bits = flat.dtype.itemsize * 8
    exp_bits = 5 if flat.dtype == np.float16 else 8
    row["exp-entropy bound"] = bits / (bits - exp_bits + baselines.exponent_entropy_bits(tensors))
    return row


def speeds(x: np.ndarray, repeat: int) -> dict:
    """Single-core GB/s of each codec on x, and each as a fraction of a numpy copy."""
    raw = np.ascontiguousarray(x).view(np.uint8).ravel()
    code = DTYPE_CODES[x.dtype.name]
    out = np.empty(reference.max_stream_bytes(x.size, x.dtype), np.uint8)
    back = np.empty_like(raw)
    copy = np.empty_like(raw)
    _zipccl_cpu.compress_into(raw, code, out)
    zn = baselines.zipnn_compress(x)
    zs = baselines.zstd_compress(raw.tobytes(), 1)
    timings = {
        "numpy copy": lambda: np.copyto(copy, raw),
        "zipccl compress": lambda: _zipccl_cpu.compress_into(raw, code, out),
        "zipccl decompress": lambda: _zipccl_cpu.decompress_into(out, code, back),
        "zipnn compress": lambda: baselines.zipnn_compress(x),
        "zipnn decompress": lambda: baselines.zipnn_decompress(zn, x),
        "zstd-1 compress": lambda: baselines.zstd_compress(raw, 1),
        "zstd-1 decompress": lambda: baselines.zstd_decompress(zs),
    }
    gbs = {k: raw.nbytes / 1e9 / _median_seconds(f, repeat) for k, f in timings.items()}
    if not np.array_equal(back, raw):
        raise AssertionError("zipccl round trip is not bit-exact")
    return {k: (v, v / gbs["numpy copy"]) for k, v in gbs.items()}


def _ratio_cell(v):
    return f"{v:.4f}" if isinstance(v, float) else v


def run_codec(elements: int, repeat: int, core: int | None, json_path=None, plot_path=None) -> None:
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    datasets = [(f"gaussian {dt}", bench_data.gaussian(elements, dt)) for dt in ("bfloat16", "float16", "float32")]
    try:
        weights = bench_data.minilm_tensors()
        for dt in ("bfloat16", "float32"):
            datasets.append((f"MiniLM {dt}", {k: v.astype(bench_data._dtype(dt)) for k, v in weights.items()}))
    except RuntimeError as err:
        print(f"(MiniLM rows skipped: {err})")
    progress = report.Progress(2 * len(datasets))
    ratio_rows = []
    for name, data in datasets:
        progress.start(f"codec ratios {name}")
        ratio_rows.append(ratios(name, data))
        progress.finish(f"zipccl {ratio_rows[-1]['zipccl']:.4f}x")
    speed_rows = []
    for name, data in datasets:  # the real weights too: fp32 groups with byte-plane codes take the generic path
        progress.start(f"codec speed {name}")
        x = np.concatenate([t.ravel() for t in data.values()]) if isinstance(data, dict) else data
        s = speeds(x, repeat)
        speed_rows.append({"data": name, **{k: f"{v:.2f} ({f:.3f})" for k, (v, f) in s.items()}})
        progress.finish(f"compress {s['zipccl compress'][0]:.2f} GB/s")
    print(f"## Ratios (raw bytes / compressed bytes), {elements:,} Gaussian values per dtype\n")
    print(report.table([{k: _ratio_cell(v) for k, v in r.items()} for r in ratio_rows]))
    print(f"\n## Single-core speed, GB/s of input (median of {repeat}), and fraction of numpy copy\n")
    print(report.table(speed_rows))
    if json_path:
        report.save_json(json_path, elements=elements, repeat=repeat, ratios=ratio_rows, speeds=speed_rows)
    if plot_path:
        codecs = [k for k in ratio_rows[0] if k not in ("data", "dtype", "MB")]
        report.bar_plot(plot_path, "Compression ratio (raw / compressed bytes)", [r["data"] for r in ratio_rows],
                        {c: [r[c] for r in ratio_rows] for c in codecs}, "ratio")


# ---------------------------------------------------------------------------
# collectives


def _collective_cases(n):
    """name -> (zip version, lax version, per-device shape for `elements`)."""
    import jax.numpy as jnp
    from jax import lax

    from . import collectives as zc

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


def run_collectives(sizes: list[int], repeat: int, data: str, names=None, json_path=None, plot_path=None) -> None:
    """Time and wire bytes of each collective vs lax on all local devices."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = jax.devices()
    n = len(devices)
    mesh = jax.make_mesh((n,), ("d",))
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
                         "zip wire B": int(wire), "wire ratio": raw / wire, "lax ms": t_lax * 1e3,
                         "zip ms": t_zip * 1e3, "zip/lax time": t_zip / t_lax, "auto/lax time": t_auto / t_lax})
            progress.finish(f"wire {raw / wire:.3f}x, zip/lax time {t_zip / t_lax:.2f}")
    print(f"## Collectives on {n} x {devices[0].platform} ({data} bf16 per device), median of {repeat}\n")
    print("lax psum and psum_scatter run in float32 (bf16 lax.psum sums in bf16); times include the codec.")
    print("zip: compression forced; auto: the default strategy (raw for small messages).\n")
    print(report.table(rows))
    if json_path:
        report.save_json(json_path, devices=n, platform=devices[0].platform, data=data, repeat=repeat, rows=rows)
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
