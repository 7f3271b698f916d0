"""Which dtypes the codec compresses, and their format codes (FORMAT.md §1)."""

from __future__ import annotations

import numpy as np

DTYPE_CODES = {"bfloat16": 1, "float16": 2, "float32": 3}


def dtype_name(dtype) -> str:
    """Canonical name of a dtype the codec supports; ValueError naming it otherwise."""
    name = np.dtype(dtype).name
    if name not in DTYPE_CODES:
        raise ValueError(
            f"zipccl: unsupported dtype {name}; the codec supports bfloat16, float16 and float32"
        )
    return name


def is_compressible(dtype) -> bool:
    return np.dtype(dtype).name in DTYPE_CODES
