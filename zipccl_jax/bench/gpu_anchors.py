"""The GPU codecs a user would pick instead of zipccl_jax's, timed beside it by `bench gpu` where
their packages are installed (none is a dependency of zipccl_jax):

- nvCOMP's batched ANS after ZipNN's byte split, as the cuZipNN package runs it
  (`pip install cuzipnn nvidia-libnvcomp-cu13`; needs torch and triton). Compress: cuZipNN's split
  kernel and nvCOMP's batched ANS compress into preallocated device buffers, no host sync (its
  compress_tensor syncs to size its output; we time the device work a collective would run).
  Decompress: cuZipNN's decompress_tensor of a device blob (it reads the blob's header on the host:
  one small sync per call). Ratio: the raw bytes over the ANS chunks' bytes (a chunk that ANS grows
  counts raw, as cuZipNN stores it). Also its ratio on every installed real model of
  bench.data.MODELS in each dtype (cuZipNN's compress_tensor, whole blobs), beside zipccl_jax's.
- DFloat11's published decode kernel (`pip install dfloat11 cupy-cuda13x`: its decode.ptx), on data
  DFloat11's way encoded (Huffman-coded bf16 exponents, sign+mantissa bytes, per-thread bit gaps,
  per-block positions) given as an .npz with --df11-data: DFloat11 encodes in its model loader, not
  through an API a benchmark can call, so the data is prepared beforehand (arrays luts, encoded,
  other, positions, gaps, shm, n and `original`: every max(1, n // 65536)-th input word, checked).

Each returns table rows with the same keys; `attempt` turns a missing package into a row saying so.
"""

from __future__ import annotations

import importlib.util
import math
import os

import numpy as np

from . import data

KEYS = ("codec", "elements", "compress GB/s", "decompress GB/s", "ratio", "round trip", "note")


def row(codec: str, n: int, compress=float("nan"), decompress=float("nan"), ratio=float("nan"), ok=None,
        note="") -> dict:
    return dict(zip(KEYS, (codec, n, compress, decompress, ratio, {None: "-", True: "ok", False: "WRONG"}[ok],
                           note)))


def _events_seconds(fn, repeat: int) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(repeat):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / repeat / 1e3


def _nvidia_namespace() -> None:
    """Lets `nvidia.libnvcomp` import where an `nvidia` regular package elsewhere on the path shadows
    the namespace package pip installs it into."""
    import nvidia

    for p in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        d = os.path.join(p, "nvidia")
        if os.path.isdir(d) and d not in list(nvidia.__path__):
            nvidia.__path__.append(d)


def nvcomp_ans(sizes, repeat: int, _df11=None) -> list[dict]:
    import torch

    _nvidia_namespace()
    import cuzipnn
    from cuzipnn import _codec, _kernels, _nvcomp

    name, dev, out = "nvCOMP ANS (cuZipNN split)", torch.device("cuda"), []
    for n in sizes:
        x = torch.from_numpy(data.gaussian(n, "bfloat16", seed=1).view(np.uint16).copy()).to(dev)
        chunk, planes = 1 << 17, 2
        chunks = -(-n // chunk)
        total, sub = planes * chunks, _codec._sub_chunks(chunk, 8192)
        planar = torch.empty(total * chunk, dtype=torch.uint8, device=dev)
        slot = _codec._align8(_nvcomp.max_compressed_chunk_bytes(chunk, sub))
        comp = torch.zeros(total * slot, dtype=torch.uint8, device=dev)
        ins = torch.arange(planar.data_ptr(), planar.data_ptr() + total * chunk, chunk, dtype=torch.int64, device=dev)
        outs = torch.arange(comp.data_ptr(), comp.data_ptr() + total * slot, slot, dtype=torch.int64, device=dev)
        raw = _codec._raw_bytes(planes, chunks, n, chunk, 1, dev)
        lens = torch.empty(total, dtype=torch.int64, device=dev)
        status = torch.empty(total, dtype=torch.int32, device=dev)

        def compress():
            _kernels.split(x.view(torch.bfloat16).view(-1), planar, chunks * chunk, True)
            _nvcomp.compress(ins, raw, chunk, planes * n, outs, lens, status, sub)

        tc = _events_seconds(compress, repeat)
        ratio = planes * n / float(torch.minimum(lens, raw).sum())
        blob = cuzipnn.compress_tensor(x.view(torch.bfloat16)).to(dev)
        same = torch.equal(cuzipnn.decompress_tensor(blob).view(torch.int16), x.view(torch.int16))
        td = _events_seconds(lambda: cuzipnn.decompress_tensor(blob), repeat)
        out.append(row(name, n, 2 * n / tc / 1e9, 2 * n / td / 1e9, ratio, same, "bf16 Gaussians"))
    return out


def real_models() -> dict:
    """Each installed model of bench.data.MODELS, its float tensors concatenated in sorted-name order."""
    out = {}
    for name in data.MODELS:
        try:
            tensors = data.model_tensors(name)
        except (RuntimeError, OSError):  # not installed, or its reader missing
            continue
        out[name] = np.concatenate([tensors[k].ravel() for k in sorted(tensors)])
    return out


def nvcomp_model_ratios(_sizes, _repeat: int, _df11=None) -> list[dict]:
    """nvCOMP's ANS after ZipNN's split (cuZipNN's compress_tensor) on every installed real model in
    each dtype, beside zipccl_jax's ratio of the same bytes (CPU codec: the streams are the same)."""
    import ml_dtypes
    import torch

    _nvidia_namespace()
    import cuzipnn

    from .codec import zipccl_bytes

    torch_dtypes = {"bfloat16": (np.uint16, torch.bfloat16), "float16": (np.float16, torch.float16),
                    "float32": (np.float32, torch.float32)}
    out = []
    for name, flat in real_models().items():
        for dtype, (view, tdtype) in torch_dtypes.items():
            x = flat.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
            t = torch.from_numpy(x.view(view).copy()).cuda().view(tdtype)
            blob = cuzipnn.compress_tensor(t)
            out.append(row("nvCOMP ANS (cuZipNN), ratio only", x.size, ratio=x.nbytes / blob.numel(),
                           note=f"{name} {dtype}; zipccl {x.nbytes / zipccl_bytes(x):.4f}"))
    return out


def df11_ptx() -> str:
    """The decode kernel shipped in the dfloat11 package, found without importing it (its import
    pulls in torch and transformers)."""
    spec = importlib.util.find_spec("dfloat11")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("dfloat11 is not installed (pip install dfloat11)")
    path = os.path.join(spec.submodule_search_locations[0], "decode.ptx")
    if not os.path.isfile(path):
        raise ImportError(f"dfloat11 has no {path}")
    return path


def dfloat11(_sizes, repeat: int, df11_data: str | None) -> list[dict]:
    name = "DFloat11 decoder"
    ptx = df11_ptx()
    if not df11_data:
        return [row(name, 0, note="needs --df11-data: data encoded DFloat11's way (bench/gpu_anchors.py)")]
    import cupy as cp

    z = np.load(df11_data)
    kernel = cp.RawModule(path=ptx).get_function("decode")
    luts, enc, other, pos, gaps = (cp.asarray(z[a]) for a in ("luts", "encoded", "other", "positions", "gaps"))
    n, shm = int(z["n"]), int(z["shm"])
    out = cp.empty(n, cp.uint16)
    args = (luts, enc, other, pos, gaps, out, np.uint32(luts.shape[0]), np.uint32(enc.size), np.uint32(n))
    launch = lambda: kernel((math.ceil(enc.size / 4096),), (512,), args, shared_mem=shm)  # noqa: E731
    launch()
    same = bool(np.array_equal(cp.asnumpy(out)[:: max(1, n // 65536)], z["original"]))
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record()
    for _ in range(repeat):
        launch()
    b.record()
    b.synchronize()
    seconds = cp.cuda.get_elapsed_time(a, b) / repeat / 1e3
    ratio = 2 * n / (enc.size + other.size + pos.size * 4 + gaps.size)
    return [row(name, n, decompress=2 * n / seconds / 1e9, ratio=ratio, ok=same, note=os.path.basename(df11_data))]


ANCHORS = {"nvCOMP ANS (cuZipNN)": nvcomp_ans, "nvCOMP ANS on real models": nvcomp_model_ratios,
           "DFloat11 decoder": dfloat11}


def attempt(name: str, fn, sizes, repeat: int, df11_data: str | None = None) -> list[dict]:
    """fn's rows, or one row saying why it did not run (a package missing, an error): one anchor
    failing must not hide the others or zipccl_jax's own figures."""
    try:
        return fn(sizes, repeat, df11_data)
    except ImportError as e:
        return [row(name, 0, note=f"not run: {e}")]
    except Exception as e:  # noqa: BLE001 -- reported in the table, not raised
        return [row(name, 0, note=f"failed: {type(e).__name__}: {str(e)[:200]}")]
