"""`python -m zipccl_jax selftest`: the first thing to run on a new machine, GPU or not.

On the local devices (the GPUs when JAX sees any, else the CPU devices) it checks:

1. the codec against the numpy reference, byte for byte: streams of every dtype and several data
   kinds and sizes, their decoding, the decoding of reference streams, the rejection of a corrupt one;
2. every collective (zip_psum, zip_all_gather, zip_psum_scatter, zip_all_to_all, zip_ppermute, the
   compressed path forced) on a mesh of all local devices, against results built from the inputs;
3. the codec's speed next to a plain copy of the same bytes, so its GB/s reads against what the
   device's memory can do. On a GPU: CUDA events around `repeat` back-to-back calls of the CUDA
   handlers on one stream, in device buffers of their own, after a warm-up call (the CUDA module's
   time_codec), next to as many device-to-device cudaMemcpyAsync of the input; GPU time per call,
   no host or XLA overhead. On a CPU: wall-clock medians of jitted calls (block_until_ready, fresh
   outputs) next to a jitted XOR that reads and writes the same bytes;
4. `zipccl_jax.autotune.autotune` over the local devices, when this build has it, and the plans the
   strategy then makes for a few message sizes.

It prints one line per check and a verdict, says what it could not check, and returns 1 if anything
was wrong.
"""

from __future__ import annotations

import importlib
import importlib.util
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from . import _ffi, _xla_flags, reference, strategy
from .collectives import zip_all_gather, zip_all_to_all, zip_ppermute, zip_psum, zip_psum_scatter
from .dtypes import DTYPE_CODES
from .ops import Compressed, compress, corrupt_payload_error, decompress, stream_capacity

DTYPES = (ml_dtypes.bfloat16, np.float16, np.float32)
SIZES = (0, 1, 4095, 4097, 16 * 4096 + 1)  # empty, one element, partial and several blocks, two groups


def _data(kind: str, n: int, dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "gaussian":
        return rng.standard_normal(n).astype(dtype)
    if kind == "random_bits":
        return rng.integers(0, 256, n * np.dtype(dtype).itemsize, np.uint8).view(dtype)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-45, 65504, 3.0e38], np.float32)
    with np.errstate(over="ignore"):  # "specials": overflow to inf where the dtype is narrow
        return np.resize(specials.astype(dtype), n)


def _bits(x) -> bytes:
    return np.asarray(x).view(np.uint8).tobytes()


def _decodes_to(c: Compressed, x: np.ndarray) -> bool:
    try:
        return _bits(jax.jit(decompress)(c)) == _bits(x)
    except Exception:  # noqa: BLE001 -- XLA wraps the handler's error in its own exception types
        return False


def check_codec(device) -> list[str]:
    """The codec on `device` against the reference; returns what went wrong."""
    wrong = []
    cases = [(kind, n) for kind in ("gaussian", "random_bits", "specials") for n in SIZES[3:]]
    cases += [("gaussian", n) for n in SIZES[:3]]
    for dtype in DTYPES:
        for seed, (kind, n) in enumerate(cases):
            name = f"{np.dtype(dtype).name} {kind} n={n}"
            x = _data(kind, n, dtype, seed)
            c = jax.jit(compress)(jax.device_put(x, device))
            expected = reference.compress(x)
            if _bits(c.payload)[: int(c.nbytes)] != expected:
                wrong.append(f"{name}: stream differs from the reference")
            if not _decodes_to(c, x):
                wrong.append(f"{name}: does not decode to its input")
            padded = np.zeros(max(stream_capacity(n, dtype), len(expected)), np.uint8)
            padded[: len(expected)] = np.frombuffer(expected, np.uint8)
            if not _decodes_to(Compressed(jax.device_put(padded, device), len(expected), x.shape, np.dtype(dtype)), x):
                wrong.append(f"{name}: the reference's stream does not decode to the input")
    return wrong + check_corrupt_payload(device)


def check_corrupt_payload(device) -> list[str]:
    """A stream whose block 0 has a reserved descriptor bit set: decoded eagerly it raises the CPU
    codec's error; on a GPU, under jit, the handler does not wait for the device: the stream decodes
    to all-one bytes (NaN) and its status word holds the error. Returns what went wrong."""
    c = compress(jax.device_put(_data("gaussian", 9000, np.float32, 0), device))
    bad = np.asarray(c.payload).copy()
    bad[reference.HEADER_BYTES + reference.DESC_BYTES - 1] |= 0x80  # block 0's descriptor: bit 63, reserved (§2)
    corrupt = Compressed(jax.device_put(bad, device), c.nbytes, c.shape, c.dtype)
    expected = ("zipccl: corrupt payload (stream 0): corrupt block descriptor (reserved bits, a field out of range, "
                "or its offsets)")
    wrong = []
    try:
        jax.block_until_ready(decompress(corrupt))
        wrong.append("a corrupt payload was accepted")
    except Exception as e:  # noqa: BLE001
        if expected not in str(e):
            wrong.append(f"a corrupt payload was rejected with an unclear error: {e}")
    if device.platform == "gpu":
        out, status = jax.jit(lambda p: decompress(p, with_status=True))(corrupt)
        if corrupt_payload_error(status) != expected:
            wrong.append(f"under jit, a corrupt payload's status words {np.asarray(status)} do not name its error")
        if not (np.asarray(out).view(np.uint32) == 0xFFFFFFFF).all():
            wrong.append("under jit, a corrupt payload's output is not poisoned (all-one bytes)")
    return wrong


def check_collectives(devices) -> list[str]:
    """Every collective, compressed path forced, on a mesh of `devices`; returns what went wrong."""
    n, dtype, m = len(devices), ml_dtypes.bfloat16, 4 * 4096 + 7
    mesh = jax.make_mesh((n,), ("d",), devices=devices)
    x = np.stack([_data("gaussian", n * m, dtype, i) for i in range(n)])  # device i holds x[i]
    xs = jax.device_put(x, NamedSharding(mesh, P("d")))
    perm = [(i, (i + 1) % n) for i in range(n)]
    chunks = x.reshape(n, n, m)  # [device, chunk, m]
    total = reference.accumulate(list(x), np.dtype(dtype)).reshape(n, m)
    expected = {  # from the inputs: XLA's own collectives are not a bit reference on every platform
        "zip_psum": (lambda a: zip_psum(a, "d", strategy="compressed"), np.stack([total.reshape(-1)] * n)),
        "zip_all_gather": (lambda a: zip_all_gather(a, "d", tiled=True, strategy="compressed"),
                           np.stack([x.reshape(-1)] * n)),
        "zip_psum_scatter": (lambda a: zip_psum_scatter(a, "d", tiled=True, strategy="compressed"), total),
        "zip_all_to_all": (lambda a: zip_all_to_all(a, "d", 0, 0, tiled=True, strategy="compressed"),
                           chunks.transpose(1, 0, 2).reshape(n, n * m)),
        "zip_ppermute": (lambda a: zip_ppermute(a, "d", perm, strategy="compressed"), np.roll(x, 1, axis=0)),
    }
    wrong = []
    for name, (fn, want) in expected.items():
        run = jax.jit(jax.shard_map(lambda a, fn=fn: fn(a[0])[None], mesh=mesh, in_specs=P("d"), out_specs=P("d")))
        try:
            got = np.asarray(run(xs))
        except Exception as e:  # noqa: BLE001 -- reported, not raised: the other checks still run
            wrong.append(f"{name}: raised {type(e).__name__}: {str(e)[:200]}")
            continue
        if _bits(got) != _bits(want):
            wrong.append(f"{name}: result differs from the one built from the inputs")
    return wrong


def _median_seconds(fn, *args, repeat: int) -> float:
    jax.block_until_ready(fn(*args))  # compile and warm up
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def time_codec(device, elements: int, repeat: int) -> dict:
    """The codec's speed on `device` in GB/s of raw bfloat16 input, next to a copy of the same bytes,
    with the stream's ratio and how it was measured (the module's docstring, item 3)."""
    x = _data("gaussian", elements, ml_dtypes.bfloat16, 0)
    if device.platform == "gpu":
        ordinal = getattr(device, "local_hardware_id", None)
        raw = _ffi.cuda_module().time_codec(device.id if ordinal is None else ordinal,
                                            DTYPE_CODES["bfloat16"], x.view(np.uint8), repeat)
        return speed_from_cuda_events(raw)
    x = jax.device_put(x, device)
    c = jax.jit(compress)(x)
    copy = jax.jit(lambda a: (a.view(jnp.uint16) ^ jnp.uint16(1)).view(a.dtype))
    gb = x.size * x.dtype.itemsize / 1e9
    return {"compress": gb / _median_seconds(jax.jit(compress), x, repeat=repeat),
            "decompress": gb / _median_seconds(jax.jit(decompress), c, repeat=repeat),
            "copy": gb / _median_seconds(copy, x, repeat=repeat), "copy_name": "read+write pass",
            "ratio": float(c.ratio()), "round_trip": True,
            "how": f"wall-clock medians of {repeat} jitted calls (fresh outputs); the pass is a jitted XOR "
                   "reading and writing the same bytes"}


def speed_from_cuda_events(raw: dict) -> dict:
    """The CUDA module's time_codec result (GPU milliseconds per call between CUDA events) as time_codec's
    GB/s of raw input bytes."""
    gb = raw["bytes"] / 1e9
    rate = lambda ms: gb / (ms / 1e3) if ms > 0 else float("inf")  # noqa: E731
    return {"compress": rate(raw["compress_ms"]), "decompress": rate(raw["decompress_ms"]),
            "copy": rate(raw["copy_ms"]), "copy_name": "device-to-device copy",
            "ratio": raw["bytes"] / max(raw["compressed_bytes"], 1), "round_trip": bool(raw["round_trip"]),
            "how": f"CUDA events around {raw['repeat']} back-to-back calls on one stream after a warm-up, device "
                   "buffers reused; the copy is cudaMemcpyAsync device to device of the input"}


def speed_lines(device, elements: int, speed: dict) -> list[str]:
    """What the selftest prints for time_codec's result."""
    return [f"speed on {device} ({elements} bfloat16 Gaussians, ratio {speed['ratio']:.3f}): "
            f"compress {speed['compress']:.1f} GB/s, decompress {speed['decompress']:.1f} GB/s, "
            f"{speed['copy_name']} {speed['copy']:.1f} GB/s",
            f"  measured with {speed['how']}"]


def run_autotune(devices) -> tuple[str, object]:
    """Calls zipccl_jax.autotune.autotune on a mesh of `devices` if this build has it."""
    try:
        autotune = importlib.import_module("zipccl_jax.autotune")
    except ImportError:
        return "not in this build (zipccl_jax.autotune); the strategy uses its stored or default profile", None
    mesh = jax.make_mesh((len(devices),), ("d",), devices=devices)
    return "measured and installed", autotune.autotune(mesh)


def _local_devices(platform: str) -> list:
    try:
        return jax.local_devices(backend=platform)
    except RuntimeError:  # no such platform here
        return []


NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")  # present where an NVIDIA driver is loaded


def cuda_plugin_installed() -> bool:
    """Whether jax's CUDA 13 or 12 plugin is installed (importable; not necessarily working)."""
    try:
        return any(importlib.util.find_spec(f"jax_plugins.xla_cuda{v}") for v in (13, 12))
    except ModuleNotFoundError:  # no jax_plugins package at all: CPU-only jax
        return False


def no_gpu_seen(driver_file: Path) -> str | None:
    """Why JAX sees no GPU on a host with an NVIDIA driver (driver_file exists), and the fix; else None."""
    if not Path(driver_file).exists():
        return None
    why = ("jax's CUDA plugin is installed but did not start (its warning above says why; is JAX_PLATFORMS set?)"
           if cuda_plugin_installed() else "the installed jax is CPU-only")
    return (f"this host has an NVIDIA driver ({driver_file}) but JAX sees no GPU: {why}. Install GPU jax: "
            f'pip install "jax[cuda13]=={jax.__version__}" (or pip install ".[cuda13]" from zipccl_jax\'s source)')


def main(elements: int = 1 << 24, repeat: int = 5, platform: str | None = None,
         driver_file: Path = NVIDIA_DRIVER) -> int:
    """Runs every check, prints the report; returns 0 if all were correct, else 1. platform: check
    that platform's local devices ("cpu" or "gpu"); by default the GPUs, else the CPU's, unless the
    host has an NVIDIA driver (driver_file): then JAX not seeing its GPUs is a failure."""
    platforms = _ffi.register()
    gpus = _local_devices("gpu") if platform in (None, "gpu") else []
    if platform is None and not gpus and (why := no_gpu_seen(driver_file)):
        print(f"FAIL: {why}")
        return 1
    devices = gpus if platform == "gpu" or gpus else _local_devices("cpu")
    if not devices:
        print(f"FAIL: JAX sees no {platform} device here")
        return 1
    where = f"{len(devices)} {devices[0].platform} device(s) ({devices[0].device_kind})"
    print(f"zipccl_jax selftest on {where}; codecs registered for: {', '.join(platforms)}")
    not_checked = []
    if not gpus:
        not_checked.append("the CUDA codec: " + ("JAX sees no GPU here, so only the CPU half ran" if platform is None
                                                 else "--platform cpu"))
    elif "CUDA" not in platforms:
        print(f"FAIL: JAX sees GPUs but this build of zipccl_jax has no CUDA codec; {_ffi.REBUILD}")
        return 1
    wrong = []
    for d in gpus or devices[:1]:  # every GPU; one CPU device stands for all (the same code, the same cores)
        problems = check_codec(d)
        print(f"codec on {d}: {'correct' if not problems else 'WRONG'}")
        wrong += [f"codec on {d}: {p}" for p in problems]
    mesh = devices
    if len(devices) == 1:
        not_checked.append(f"collectives across {devices[0].platform} devices: one local device")
        cpus = _local_devices("cpu") if platform is None and gpus else []
        mesh = cpus if len(cpus) > 1 else []  # one GPU: the collectives' logic still runs, on the CPU devices
    if mesh:
        problems = check_collectives(mesh)
        print(f"collectives on {len(mesh)} {mesh[0].platform} devices: {'correct' if not problems else 'WRONG'}")
        wrong += problems
    try:
        speed = time_codec(devices[0], elements, repeat)
    except RuntimeError as e:  # e.g. no device memory left beside XLA's preallocation
        not_checked.append(f"the codec's speed on {devices[0]}: {e}")
    else:
        print("\n".join(speed_lines(devices[0], elements, speed)))
        if not speed["round_trip"]:
            wrong.append(f"speed on {devices[0]}: the timed stream did not decode to its input")
    how, _ = run_autotune(devices)
    print(f"autotune: {how}")
    for size in (64 << 10, 16 << 20):
        plan = strategy.plan("psum", size, ml_dtypes.bfloat16, ("devices",), max(len(devices), 2))
        print(f"strategy: psum of {size >> 10} KiB bfloat16 over {plan.axis_size} devices -> "
              f"{plan.name} ({plan.reason})")
    if gpus:
        print(f"XLA's latency-hiding scheduler for GPU programs: {_xla_flags.describe()}")
    not_checked.append("links between hosts: run it under jax.distributed for those")
    for line in wrong:
        print(f"WRONG: {line}")
    for line in not_checked:
        print(f"not checked: {line}")
    print("verdict: " + ("correct" if not wrong else f"{len(wrong)} problem(s), see WRONG above"))
    return 1 if wrong else 0
