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

from .. import _zipccl_cpu, reference
from ..dtypes import DTYPE_CODES
from . import baselines, report
from . import data as bench_data


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
