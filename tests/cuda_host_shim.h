// Just enough of CUDA to compile ffi/zipccl_cuda.cu with a host compiler
// (-DZIPCCL_HOST_EMULATION) and run its kernels on the CPU; used by
// tests/cuda_emulation.cc.
//
// A launch runs the grid's blocks one after another. A block of one thread
// runs the kernel on the calling thread, where __syncthreads has nothing to
// wait for; a block of several threads runs them as std::threads meeting at
// a std::barrier, so __shared__ variables (function statics) are shared by
// the block's threads and by nothing else at that time. "Device" memory is
// host memory: cudaMemcpyAsync is a memcpy, streams are ignored.
#pragma once

#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __shared__ static

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};

inline dim3 gridDim, blockDim, blockIdx;
inline thread_local dim3 threadIdx;
inline std::barrier<>* zc_emu_block_barrier = nullptr;

inline void __syncthreads() {
  if (zc_emu_block_barrier) zc_emu_block_barrier->arrive_and_wait();
}

inline unsigned long long atomicCAS(unsigned long long* address, unsigned long long compare,
                                    unsigned long long val) {
  std::atomic_ref<unsigned long long>(*address).compare_exchange_strong(compare, val);
  return compare;  // the old value, as CUDA's atomicCAS returns
}

// The launch shape every emulated launch uses: threads per block, and a cap
// on the grid the handler asks for (grid-stride loops still cover all work).
inline unsigned zc_emu_threads = 1;
inline unsigned zc_emu_max_grid = 1u << 31;

template <typename Kernel, typename... Args>
void zc_emu_launch(unsigned grid, Kernel kernel, Args... args) {
  gridDim.x = grid < zc_emu_max_grid ? grid : zc_emu_max_grid;
  blockDim.x = zc_emu_threads;
  for (blockIdx.x = 0; blockIdx.x < gridDim.x; ++blockIdx.x) {
    if (blockDim.x == 1) {
      threadIdx.x = 0;
      kernel(args...);
      continue;
    }
    std::barrier<> barrier(blockDim.x);
    zc_emu_block_barrier = &barrier;
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < blockDim.x; ++t)
      threads.emplace_back([&, t] {
        threadIdx.x = t;
        kernel(args...);
      });
    for (auto& th : threads) th.join();
    zc_emu_block_barrier = nullptr;
  }
}

// zipccl_cuda.cu's launch macro calls this instead of kernel<<<...>>>.
#define ZC_LAUNCH_KERNEL(kernel, grid, threads, stream, ...) zc_emu_launch(grid, kernel, __VA_ARGS__)

// The runtime API the handlers call.
using cudaStream_t = struct zc_emu_stream*;
enum cudaError_t { cudaSuccess = 0 };
enum cudaMemcpyKind { cudaMemcpyDeviceToHost = 2 };
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t) { return "no error"; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t) {
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
