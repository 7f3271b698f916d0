"""zipccl_jax: lossless compressed collectives for JAX.

The codec (this release): `compress` / `decompress` turn a bf16, fp16 or fp32
array into a small pytree of bytes and back, bit-exactly, as XLA FFI custom
calls on CPU and GPU. `compress_chunks` and `decompress_accumulate` are the
building blocks of the compressed collectives. The byte format is in
docs/FORMAT.md and `zipccl_jax.reference` is its numpy oracle.

Importing it turns on XLA:GPU's latency-hiding scheduler in XLA_FLAGS unless
ZIPCCL_XLA_FLAGS=0 (zipccl_jax/_xla_flags.py says why and when it cannot).
"""

from ._xla_flags import GPU_COMPILER_OPTIONS  # first: before anything could start JAX's backends
from ._ffi import NoCudaCodecError
from .autotune import autotune
from .collectives import (
    Stats,
    compressed,
    zip_all_gather,
    zip_all_to_all,
    zip_ppermute,
    zip_psum,
    zip_psum_scatter,
)
from .dtypes import is_compressible
from .ops import (
    Compressed,
    compress,
    compress_chunks,
    compress_items,
    decompress,
    decompress_accumulate,
    decompress_items,
    stream_capacity,
)

__version__ = "0.1.0"

__all__ = [
    "Compressed",
    "GPU_COMPILER_OPTIONS",
    "compressed",
    "compress",
    "compress_chunks",
    "compress_items",
    "decompress",
    "decompress_accumulate",
    "decompress_items",
    "is_compressible",
    "NoCudaCodecError",
    "stream_capacity",
    "Stats",
    "zip_all_gather",
    "zip_all_to_all",
    "zip_ppermute",
    "zip_psum",
    "zip_psum_scatter",
]
