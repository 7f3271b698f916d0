"""Loads the native modules and registers their XLA FFI targets once."""

from __future__ import annotations

import functools
import importlib

import jax

# the collectives' row ops (ops.stream_sizes, ...): their CUDA workspace is sized by row_workspace_bytes
ROW_TARGETS = ("zipccl_stream_sizes", "zipccl_encode_rows", "zipccl_decode_rows", "zipccl_decode_accumulate_rows")
TARGETS = ("zipccl_compress", "zipccl_decompress", "zipccl_decompress_accumulate") + ROW_TARGETS


REBUILD = ("rebuild it with the CUDA codec: ZIPCCL_CUDA=ON pip install -v --force-reinstall --no-deps "
           "<zipccl_jax's source> (on Linux x86_64 pip fetches CUDA 13's nvcc from PyPI; elsewhere name an nvcc "
           "with CUDACXX=/path/to/nvcc; docs/GPU.md, \"Building\")")


class NoCudaCodecError(RuntimeError):
    """A computation that needs the CUDA codec was lowered for a GPU by a build without it."""


def no_cuda_codec(platforms, what: str = "the codec") -> NoCudaCodecError:
    """The error for `what` lowered for `platforms` by a build without _zipccl_cuda: the cause and the fix."""
    return NoCudaCodecError(
        f"zipccl: {what} cannot run on {', '.join(platforms)}: this build of zipccl_jax has no CUDA codec "
        f"(zipccl_jax._zipccl_cuda was not built: no nvcc was found when it was installed); {REBUILD}")


@functools.cache
def cuda_module():
    """The CUDA codec's module, or None when this build has no CUDA codec."""
    try:
        return importlib.import_module("zipccl_jax._zipccl_cuda")
    except ImportError:
        return None  # built without a CUDA compiler: the CPU codec still works


def _command_buffer_traits():
    """XLA's trait for handlers it may capture into command buffers (CUDA graphs).
    The handlers declare it themselves; it is passed at registration too, for
    jaxlibs that read it only there."""
    from jaxlib import xla_client

    return xla_client.CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE


@functools.cache
def register() -> tuple[str, ...]:
    """Registers the CPU targets, and the CUDA ones when they were built.

    Returns the platforms registered. Called lazily by the ops so that
    importing zipccl_jax does not initialise a JAX backend.
    """
    from . import _zipccl_cpu

    platforms = [("cpu", _zipccl_cpu)]
    if cuda_module() is not None:
        platforms.append(("CUDA", cuda_module()))
    for platform, module in platforms:
        compatible = getattr(module, "command_buffer_compatible", ())
        for name, capsule in module.registrations().items():
            traits = {"traits": _command_buffer_traits()} if name in compatible else {}
            _register_target(name, capsule, platform, traits)
    return tuple(p for p, _ in platforms)


WITH_TRAITS: set = set()  # (platform, target) registered with the command-buffer trait


def _register_target(name, capsule, platform, traits):
    """Registers one handler, passing the command-buffer trait where the platform's
    plugin takes traits. jaxlib 0.10.2's CUDA plugin refuses any ("The plugin does
    not support custom call traits"); there the handler's own declaration
    (XLA_FFI_DEFINE_HANDLER's traits) is what XLA reads."""
    try:
        jax.ffi.register_ffi_target(name, capsule, platform=platform, **traits)
        if traits:
            WITH_TRAITS.add((platform, name))
    except jax.errors.JaxRuntimeError as e:
        if not traits or "does not support custom call traits" not in str(e):
            raise
        jax.ffi.register_ffi_target(name, capsule, platform=platform)
