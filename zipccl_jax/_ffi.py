"""Loads the native modules and registers their XLA FFI targets once."""

from __future__ import annotations

import functools
import importlib

import jax

TARGETS = ("zipccl_compress", "zipccl_decompress", "zipccl_decompress_accumulate", "zipccl_stream_sizes",
           "zipccl_encode_rows", "zipccl_decode_rows", "zipccl_decode_accumulate_rows")


@functools.cache
def register() -> tuple[str, ...]:
    """Registers the CPU targets, and the CUDA ones when they were built.

    Returns the platforms registered. Called lazily by the ops so that
    importing zipccl_jax does not initialise a JAX backend.
    """
    from . import _zipccl_cpu

    platforms = [("cpu", _zipccl_cpu)]
    try:
        platforms.append(("CUDA", importlib.import_module("zipccl_jax._zipccl_cuda")))
    except ImportError:
        pass  # built without a CUDA compiler: the CPU codec still works
    for platform, module in platforms:
        for name, capsule in module.registrations().items():
            jax.ffi.register_ffi_target(name, capsule, platform=platform)
    return tuple(p for p, _ in platforms)
