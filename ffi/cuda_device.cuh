// The CUDA codec's device helpers: launch shapes, warp and block scans, grid loops.
//
// Included by zipccl_cuda.cu alone (one translation unit for nvcc and for the host
// emulation), after the CUDA runtime or tests/cuda_host_shim.h and its ZC_* macros.
#pragma once

#include <cstdint>

#include "zipccl_format.h"

namespace zc = zipccl;

namespace {

constexpr int kWarp = 32;
constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr int kThreads = 128;      // every kernel: 4 warps
constexpr int kDecodeBlocks = kThreads / zc::kLanes;  // blocks a CUDA block codes at once, a thread per lane
constexpr int kThreadsPerSm = 2048;
constexpr unsigned long long kNoError = ~0ull;

template <typename T>
__host__ __device__ T Min(T a, T b) {
  return a < b ? a : b;
}
template <typename T>
__host__ __device__ T Max(T a, T b) {
  return a < b ? b : a;
}

__device__ int Lane() { return threadIdx.x % kWarp; }
__device__ int WarpId() { return threadIdx.x / kWarp; }

template <typename T>
__device__ T WarpSum(T v) {
  for (int d = kWarp / 2; d > 0; d /= 2) v += __shfl_xor_sync(kFull, v, d);
  return v;
}

template <typename T>
__device__ T WarpMax(T v) {
  for (int d = kWarp / 2; d > 0; d /= 2) {
    const T o = __shfl_xor_sync(kFull, v, d);
    v = o > v ? o : v;
  }
  return v;
}

template <typename T>
__device__ T WarpInclusiveScan(T v) {
  for (int d = 1; d < kWarp; d *= 2) {
    const T o = __shfl_up_sync(kFull, v, d);
    if (Lane() >= d) v += o;
  }
  return v;
}

// Exclusive prefix sum of v over the CUDA block's threads (a multiple of 32);
// *total receives the sum. sums: shared, one slot per warp. All threads call it.
__device__ int64_t BlockExclusiveScan(int64_t v, int64_t* sums, int64_t* total) {
  const int64_t inclusive = WarpInclusiveScan(v);
  if (Lane() == kWarp - 1) sums[WarpId()] = inclusive;
  __syncthreads();
  int64_t before = 0, all = 0;
  for (int w = 0; w < int(blockDim.x) / kWarp; ++w) {
    before += w < WarpId() ? sums[w] : 0;
    all += sums[w];
  }
  __syncthreads();  // sums is reused by the next call
  *total = all;
  return inclusive - v + before;
}

// Grid-stride loop of i over [0, n) across all threads of a launch.
#define ZC_FOR_THREADS(i, n)                                                \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

// Loop of unit over [0, n) by CUDA block: every thread of a block sees the
// same units, so the body may hold __syncthreads.
#define ZC_FOR_BLOCKS(unit, n) for (int64_t unit = blockIdx.x; unit < (n); unit += gridDim.x)

}  // namespace
