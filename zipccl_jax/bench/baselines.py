"""Baselines that zipccl_jax's compression ratio and speed are judged against.

* zstd: the generic byte compressor a collective library would reach for first.
* ZipNN: byte grouping + Huffman, the closest published CPU codec for weights.
* Per-tensor exponent Huffman: the size DFloat11's scheme reaches (exponent
  Huffman-coded with one code per tensor, sign and mantissa stored raw).
* Exponent entropy: the bound for any coder that models exponents as i.i.d.
"""

import heapq
import warnings

import ml_dtypes
import numpy as np

# ZipNN Huffman-codes each byte group of a chunk as one block, and its Huffman
# coder caps blocks at 128 KiB: chunks above 256 KiB are silently stored raw.
# Decompression must be configured with the same chunk size.
ZIPNN_CHUNK = 256 * 1024


def _zstandard():
    """zstandard, imported when a zstd baseline runs (the `bench` extra)."""
    try:
        import zstandard
    except ImportError as err:
        raise RuntimeError('the zstd baseline needs zstandard: pip install "zipccl_jax[bench]"') from err
    return zstandard


def zstd_compress(buf, level=1):
    """Single-threaded zstd frame of a bytes-like `buf` (content size recorded)."""
    return _zstandard().ZstdCompressor(level=level).compress(buf)


def zstd_decompress(data):
    """Inverse of `zstd_compress`."""
    return _zstandard().ZstdDecompressor().decompress(data)


def _zipnn(dtype, threads):
    """A ZipNN codec on raw bytes of `dtype`; imported lazily as zipnn pulls in torch.

    The dtype makes ZipNN apply its float byte grouping (exponent byte apart
    from sign/mantissa); it is recorded in the header too.
    """
    with warnings.catch_warnings():  # torch warns about deprecated jit APIs on import
        warnings.simplefilter("ignore", FutureWarning)
        from zipnn import ZipNN
    # method only matters for non-float data: float byte groups are always
    # Huffman-coded by zipnn_core, whatever `method` says.
    return ZipNN(method="huffman", input_format="byte", bytearray_dtype=np.dtype(dtype).name,
                 threads=threads, compression_chunk=ZIPNN_CHUNK)


def zipnn_compress(arr, threads=1):
    """ZipNN-compressed bytes of a float array (threads=1 for per-core timing).

    zipnn_core reorders bits *in place* in whatever buffer it is handed (even
    an immutable `bytes`), so it must get a private copy, never `arr` itself.
    """
    return _zipnn(arr.dtype, threads).compress(np.ascontiguousarray(arr).tobytes())


def zipnn_decompress(data, like, threads=1):
    """Inverse of `zipnn_compress`: an array with the dtype and shape of `like`."""
    raw = _zipnn(like.dtype, threads).decompress(data)
    return np.frombuffer(raw, dtype=like.dtype).reshape(like.shape)


def huffman_code_lengths(counts):
    """Optimal (unlimited-length) Huffman code length for each nonzero count.

    A lone symbol still gets one bit, as a real Huffman coder would emit.
    """
    if len(counts) == 1:
        return np.ones(1, dtype=np.int64)
    lengths = np.zeros(len(counts), dtype=np.int64)
    # (weight, unique tie-break, member symbols): members are disjoint, so the
    # tie-break never repeats and lists are never compared.
    heap = [(int(c), i, [i]) for i, c in enumerate(counts)]
    heapq.heapify(heap)
    while len(heap) > 1:
        w1, tie, left = heapq.heappop(heap)
        w2, _, right = heapq.heappop(heap)
        lengths[left + right] += 1
        heapq.heappush(heap, (w1 + w2, tie, left + right))
    return lengths


def _tensors(arr):
    """Accept one array or a dict name -> array."""
    return list(arr.values()) if isinstance(arr, dict) else [arr]


def _exponent_counts(x):
    """Histogram over every biased exponent value (zeros kept so histograms add)."""
    info = ml_dtypes.finfo(x.dtype)
    bits = np.ascontiguousarray(x).view(f"uint{info.bits}").ravel()
    exponents = (bits >> info.nmant) & ((1 << info.nexp) - 1)
    return np.bincount(exponents, minlength=1 << info.nexp)


def _exponent_huffman_tensor_bytes(x):
    """Huffman-coded exponents + raw sign/mantissa + 1 byte per table entry."""
    info = ml_dtypes.finfo(x.dtype)
    counts = _exponent_counts(x)
    counts = counts[counts > 0]
    exponent_bits = int(np.dot(counts, huffman_code_lengths(counts)))
    raw_bits = x.size * (info.bits - info.nexp)
    return -(-(exponent_bits + raw_bits) // 8) + len(counts)


def per_tensor_exponent_huffman_bytes(arr):
    """Size in bytes DFloat11's scheme reaches, one Huffman code per tensor."""
    return sum(_exponent_huffman_tensor_bytes(x) for x in _tensors(arr))


def exponent_entropy_bits(arr):
    """Empirical entropy of the exponent field, bits/element, pooled over tensors.

    Raw bits / (raw bits - exponent bits + this) bounds the ratio of any
    coder that keeps sign/mantissa raw and codes exponents with one static
    model for all of `arr`.
    """
    counts = sum(_exponent_counts(x) for x in _tensors(arr))
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum())
