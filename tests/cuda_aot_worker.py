"""Compiles zipccl programs for 8 H100s without a GPU (../shared/gpu/AOT.md): run by test_cuda_aot.py
in a subprocess with JAX_PLATFORMS=cpu and jax's CUDA plugin installed. Prints one JSON object.

    python cuda_aot_worker.py register   # the CUDA targets register; programs compile; HLO's custom calls
    python cuda_aot_worker.py no-cuda    # as a build without _zipccl_cuda: what lowering each one raises
"""

import json
import os
import re
import sys

os.environ["JAX_PLATFORMS"] = "cpu"  # the plugin answers topology requests without a GPU (AOT.md)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import zipccl_jax as zc  # noqa: E402
from zipccl_jax import _ffi, strategy  # noqa: E402
from zipccl_jax.bench.schedule import gpu_mesh  # noqa: E402  (8 compile-only H100s)

M = 8 * 4096  # bf16 elements per device


def collective(name, **options):
    """shard_map'd zip collective `name` over "d" of one device's row (check_vma off: every output P("d"))."""
    perm = [(i, (i + 1) % 8) for i in range(8)]
    calls = {
        "zip_psum": lambda a: zc.zip_psum(a, "d", **options),
        "zip_all_gather": lambda a: zc.zip_all_gather(a, "d", tiled=True, **options),
        "zip_psum_scatter": lambda a: zc.zip_psum_scatter(a, "d", tiled=True, **options),
        "zip_all_to_all": lambda a: zc.zip_all_to_all(a, "d", 0, 0, tiled=True, **options),
        "zip_ppermute": lambda a: zc.zip_ppermute(a, "d", perm, **options),
        "compressed(lax.psum)": lambda a: zc.compressed(lambda b: lax.psum(b, "d"), **options)(a),
    }
    return lambda a: calls[name](a[0])[None]


def programs(mesh):
    """name -> (function, argument specs): every op, and every collective under every strategy."""
    row = jax.ShapeDtypeStruct((8, M), jnp.bfloat16, sharding=NamedSharding(mesh, P("d")))
    one = jax.ShapeDtypeStruct((M,), jnp.bfloat16, sharding=NamedSharding(mesh, P()))
    c = jax.eval_shape(zc.compress, jax.ShapeDtypeStruct((M,), jnp.bfloat16))
    payload = jax.ShapeDtypeStruct(c.payload.shape, c.payload.dtype, sharding=NamedSharding(mesh, P()))
    nbytes = jax.ShapeDtypeStruct(c.nbytes.shape, c.nbytes.dtype, sharding=NamedSharding(mesh, P()))
    chunks = jax.eval_shape(lambda x: zc.compress_chunks(x, 4), jax.ShapeDtypeStruct((M,), jnp.bfloat16))
    rows = jax.ShapeDtypeStruct(chunks.payload.shape, jnp.uint8, sharding=NamedSharding(mesh, P()))
    out = {
        "compress": (zc.compress, [one]),
        "decompress": (lambda p, n: zc.decompress(zc.Compressed(p, n, (M,), jnp.dtype(jnp.bfloat16))),
                       [payload, nbytes]),
        "compress_chunks": (lambda x: zc.compress_chunks(x, 4), [one]),
        "compress_items": (lambda x: zc.compress_items(x.reshape(4, -1)), [one]),
        "decompress_items": (lambda p: zc.decompress_items(p, M // 4, jnp.bfloat16), [rows]),
        "decompress_accumulate": (lambda p: zc.decompress_accumulate(p, M // 4, jnp.bfloat16), [rows]),
    }
    strategies = {"default": {}, "auto": dict(strategy="auto"), "compressed": dict(strategy="compressed"),
                  "CostModel": dict(strategy=strategy.CostModel()), "compress=False": dict(compress=False),
                  "raw": dict(strategy="raw")}
    for name in ("zip_psum", "zip_all_gather", "zip_psum_scatter", "zip_all_to_all", "zip_ppermute",
                 "compressed(lax.psum)"):
        for label, options in strategies.items():
            fn = jax.shard_map(collective(name, **options), mesh=mesh, in_specs=P("d"), out_specs=P("d"),
                               check_vma=False)
            out[f"{name} strategy={label}"] = (fn, [row])
    pinned = jax.shard_map(collective("zip_psum", strategy=strategy.Pinned("uncompressed reduce_scatter+all_gather")),
                           mesh=mesh, in_specs=P("d"), out_specs=P("d"), check_vma=False)
    out["zip_psum strategy=Pinned(uncompressed reduce_scatter+all_gather)"] = (pinned, [row])
    return out


def custom_calls(hlo: str) -> list[str]:
    return sorted(set(re.findall(r'custom_call_target="([^"]+)"', hlo)))


def register(mesh) -> dict:
    """Registers the targets with the CUDA plugin and compiles an op and two collectives for 8 H100s."""
    result = {"jax": jax.__version__, "platforms": list(_ffi.register()), "hlo": {},
              "traits": sorted(name for platform, name in _ffi.WITH_TRAITS if platform == "CUDA"),
              "compatible": sorted(_ffi.cuda_module().command_buffer_compatible)}
    every = programs(mesh)
    for name in ("compress", "decompress_accumulate", "zip_psum strategy=compressed",
                 "zip_all_to_all strategy=compressed"):
        fn, specs = every[name]
        result["hlo"][name] = custom_calls(jax.jit(fn).lower(*specs).compile().as_text())
    return result


def no_cuda(mesh) -> dict:
    """What lowering each program for the GPUs raises where the build has no CUDA codec."""
    _ffi.cuda_module = lambda: None  # as a build without _zipccl_cuda
    result = {"platforms": list(_ffi.register()), "lowered": {}}
    for name, (fn, specs) in programs(mesh).items():
        try:
            lowered = jax.jit(fn).lower(*specs)  # the error comes here, before XLA compiles anything
        except Exception as e:  # noqa: BLE001 -- reported to the test
            result["lowered"][name] = {"error": type(e).__name__, "message": str(e)}
        else:
            result["lowered"][name] = {"ok": custom_calls(lowered.compile().as_text())}
    try:
        zc.autotune(mesh)
        result["autotune"] = {"ok": []}
    except Exception as e:  # noqa: BLE001
        result["autotune"] = {"error": type(e).__name__, "message": str(e)}
    cpu = jax.jit(zc.compress)(jnp.ones((M,), jnp.bfloat16))  # the CPU codec still runs, and the collectives
    cpus = jax.make_mesh((8,), ("d",), devices=jax.devices("cpu")[:8])
    psum = jax.jit(jax.shard_map(collective("zip_psum", strategy="compressed"), mesh=cpus, in_specs=P("d"),
                                 out_specs=P("d"), check_vma=False))
    ones = jax.device_put(jnp.ones((8, M), jnp.bfloat16), NamedSharding(cpus, P("d")))
    result["cpu_round_trip"] = bool((zc.decompress(cpu) == 1).all() and (psum(ones) == 8).all())
    return result


if __name__ == "__main__":
    print(json.dumps({"register": register, "no-cuda": no_cuda}[sys.argv[1]](gpu_mesh())))
