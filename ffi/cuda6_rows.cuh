// The CUDA handlers' small kernels around the codec's (cuda6_codec.cuh): the
// verdicts into status words and poison, the collectives' rows gathered from
// and scattered to their leaves (zipccl_rows.h), streams copied at a rung's
// capacity, STORED_RAW rows, and the device array of row pointers the reduce
// step reads. Thread per element or row, grids sized by the caller (ZC_LAUNCH
// in zipccl_cuda.cu), loops over their work.
//
// Included by zipccl_cuda.cu alone, after the CUDA runtime or
// tests/cuda_host_shim.h.
#pragma once

#include <cstdint>

#include "format6.h"
#include "zipccl_rows.h"

namespace zipccl {
namespace cuda6 {

constexpr int kThreads = 256;  // these kernels' CTAs
constexpr int kSpanLeaves = 16;  // leaves (or received parts) one launch takes

// Grid-stride loop of i over [0, n) across all threads of a launch.
#define ZC_FOR_THREADS(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// Loop of unit over [0, n) by CUDA block: every thread of a block sees the same units.
#define ZC_FOR_BLOCKS(unit, n) for (int64_t unit = blockIdx.x; unit < (n); unit += gridDim.x)

// The end of every decode, CTA per item of k rows: each row's status word is
// 0 if its verdict is ~0 (decoded), else the verdict's Status (bits 0-7: the
// decoder's error code, what zipccl_jax.ops reads); an item with a failing
// row has its whole output (item_bytes at out + item * item_bytes) set to
// all-one bytes -- a NaN in bfloat16, float16 and float32, so that a result
// nobody checks cannot pass for data.
__global__ void FinishKernel(const unsigned long long* verdicts, int64_t k, int64_t items, uint32_t* status,
                             uint8_t* out, int64_t item_bytes) {
  ZC_FOR_BLOCKS(item, items) {
    bool corrupt = false;
    for (int64_t j = 0; j < k; ++j) corrupt |= verdicts[item * k + j] != kNoError;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
      const unsigned long long v = verdicts[item * k + j];
      status[item * k + j] = v == kNoError ? 0u : uint32_t(v & 0xFF);
    }
    for (int64_t i = threadIdx.x; corrupt && i < item_bytes; i += blockDim.x) out[item * item_bytes + i] = 0xFF;
  }
}

// Up to kSpanLeaves buffers end to end: leaves of a flat array (elements) or received parts (rows).
struct Span {
  uint8_t* data[kSpanLeaves];
  int64_t end[kSpanLeaves];  // cumulative counts from begin
  int64_t begin;
  int count;
  // The buffer holding item e (from begin) and e's index in it.
  __device__ __forceinline__ int Find(int64_t e, int64_t* at) const {
    int i = 0;
    while (e >= end[i]) ++i;
    *at = e - (i ? end[i - 1] : 0);
    return i;
  }
};

// Moves the span's elements to their places in rows ([k, m], contiguous;
// to_rows) or back from them: thread per element.
__global__ void RowsKernel(RowLayout l, Span span, int eb, uint8_t* rows, bool to_rows) {
  ZC_FOR_THREADS(e, span.end[span.count - 1]) {
    int64_t at, j, i;
    const int leaf = span.Find(e, &at);
    l.locate(span.begin + e, &j, &i);
    uint8_t* row = rows + (j * l.m + i) * eb;
    uint8_t* x = span.data[leaf] + at * eb;
    for (int b = 0; b < eb; ++b) {
      if (to_rows) row[b] = x[b];
      else x[b] = row[b];
    }
  }
}

// The span's rows (received parts of `pitch` bytes a row) as pointers: ptrs[begin + r].
__global__ void RowPointersKernel(Span span, int64_t pitch, const uint8_t** ptrs) {
  ZC_FOR_THREADS(r, span.end[span.count - 1]) {
    int64_t at;
    const int part = span.Find(r, &at);
    ptrs[span.begin + r] = span.data[part] + at * pitch;
  }
}

// `rows` streams (lengths in sizes) from payload (a row every `pitch` bytes)
// into out at `cap` bytes a row, zeros after each stream. A stream longer
// than cap cannot be chosen by the size consensus (the size pass runs the
// same kernels on the same rows); were it, it is cut, and its decoder
// reports it truncated.
__global__ void CopyRowsKernel(const uint8_t* payload, int64_t pitch, const uint32_t* sizes, int64_t rows,
                               uint8_t* out, int64_t cap) {
  ZC_FOR_THREADS(e, rows * cap) {
    const int64_t r = e / cap, b = e % cap;
    out[e] = b < int64_t(sizes[r]) ? payload[r * pitch + b] : 0;
  }
}

// STORED_RAW streams (FORMAT.md §1) of rows of m elements (contiguous at
// in) into out at `cap` bytes a row, zeros after each.
__global__ void RawRowsKernel(int dtype, const uint8_t* in, int64_t m, int64_t rows, uint8_t* out, int64_t cap) {
  const int64_t body = m * v6::layout_of(dtype).elem_bytes;
  ZC_FOR_THREADS(e, rows * cap) {
    const int64_t r = e / cap, b = e % cap;
    if (b == 0) v6::write_header(out + r * cap, dtype, kFlagStoredRaw, m);
    else if (b >= kHeaderBytes) out[e] = b - kHeaderBytes < body ? in[r * body + b - kHeaderBytes] : 0;
  }
}

}  // namespace cuda6
}  // namespace zipccl
