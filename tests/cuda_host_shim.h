// Just enough of CUDA to compile ffi/zipccl_cuda.cu with a host compiler
// (-DZIPCCL_HOST_EMULATION) and run its kernels on the CPU the way a GPU
// would; used by tests/cuda_emulation.cc.
//
// Every CUDA thread is a std::thread (of a pool). A launch keeps `resident` CUDA blocks
// running at once (each its threads and its own shared memory, filled with
// garbage before every block), the rest of the grid following as blocks
// finish, so ThreadSanitizer sees blocks race on global memory as they would
// on a GPU. Threads of a warp meet at every warp intrinsic (__shfl*_sync,
// __ballot_sync, __syncwarp): the 32 lanes exchange their values there in
// lockstep. __syncthreads is a barrier of the whole block. A lane that
// reaches a different intrinsic than its warp, or leaves the kernel while
// its warp or block waits for it, or a barrier that does not complete within
// kTimeoutSeconds, ends the process with a message naming the block, warp,
// lanes and intrinsic: the test fails rather than hangs. Shared-memory and
// global atomics are std::atomic_ref. "Device" memory is host memory:
// cudaMemcpyAsync is a memcpy, streams are ignored, and events read a host
// clock when recorded (launches return when their kernel has run). Every call
// that would make the host wait for the device or move bytes between host and
// device (stream and event synchronisation, host<->device copies) is counted
// in zc_emu::host_syncs: the handlers must make none.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __launch_bounds__(...)
#define __forceinline__ inline

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};

inline dim3 gridDim, blockDim;  // set before a launch's threads start
inline thread_local dim3 blockIdx, threadIdx;

namespace zc_emu {

constexpr unsigned kWarp = 32;
constexpr size_t kSmemBytes = 48 << 10;  // static shared memory a CUDA block may declare
// Dynamic shared memory: a block's at most (cudaDevAttrMaxSharedMemoryPerBlockOptin, an H100's or
// H200's 227 KB unless a test says otherwise), and an SM's (cudaDevAttrMaxSharedMemoryPerMultiprocessor).
inline size_t smem_optin = 232448, smem_per_sm = 233472;
constexpr int kTimeoutSeconds = 60;
constexpr int kSpins = 64;

// The emulated device: SMs, and CUDA blocks resident at once in a launch.
inline int sms = 2;
inline unsigned resident = 2;
// Which deliberately broken kernel variant runs (0: none); see ZC_INJECTED.
inline int inject = 0;

// What the threads of each kernel executed, summed over its launches (the
// performance model of docs/GPU.md): warp intrinsics, __syncthreads and
// atomics, counted per thread as a GPU issues them.
struct Counts {
  uint64_t launches = 0, threads = 0, warp_ops = 0, barriers = 0, atomics = 0;
};
inline std::mutex counts_mutex;
inline std::vector<std::pair<std::string, Counts>> counts;
inline std::atomic<uint64_t> warp_ops{0}, barriers{0}, atomics{0};
inline std::atomic<uint64_t> host_syncs{0};

[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "cuda emulation: block %u: %s\n", blockIdx.x, what.c_str());
  std::fflush(stderr);
  std::_Exit(3);
}

enum State : uint8_t { kRunning, kAtWarp, kAtBlock, kExited };

// A warp's meeting point: the lanes' values at the intrinsic they wait at.
struct Warp {
  std::mutex m;
  std::condition_variable cv;
  unsigned arrived = 0;
  uint64_t gen = 0;
  const char* op = nullptr;
  std::array<uint64_t, kWarp> value{}, result{};
};

// One resident CUDA block: its warps, its barrier and its shared memory.
struct Block {
  Block(unsigned n, size_t dynamic) : state(n), warps((n + kWarp - 1) / kWarp), dsmem(dynamic, 0xA5) {
    for (auto& s : state) s = kRunning;
    std::memset(smem, 0xA5, sizeof(smem));
  }
  std::vector<std::atomic<State>> state;  // each thread's, read by its warp's waiting lanes
  std::vector<Warp> warps;
  std::mutex m;  // the block barrier's
  std::condition_variable cv;
  unsigned block_arrived = 0, exited = 0;
  uint64_t block_gen = 0, exit_gen = 0;
  alignas(64) unsigned char smem[kSmemBytes];
  std::vector<unsigned char> dsmem;  // the launch's dynamic shared memory (garbage as smem)
};

inline thread_local Block* block = nullptr;

inline unsigned WarpLanes(unsigned w) { return std::min(kWarp, blockDim.x - w * kWarp); }

inline std::string LaneList(unsigned w, State s) {
  std::string out;
  for (unsigned l = 0; l < WarpLanes(w); ++l)
    if (block->state[w * kWarp + l] == s) out += (out.empty() ? "" : ",") + std::to_string(l);
  return out;
}

// Waits on cv until done(); fails with why() if stuck() or after the timeout.
template <typename Done, typename Stuck, typename Why>
void Wait(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, Done done, Stuck stuck, Why why) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kTimeoutSeconds);
  for (int spin = 0; spin < kSpins && !done(); ++spin) {  // cheaper than sleeping when the others are close
    lock.unlock();
    std::this_thread::yield();
    lock.lock();
  }
  while (!done()) {
    if (stuck()) Fail(why());
    if (cv.wait_until(lock, deadline) == std::cv_status::timeout && !done()) Fail(why() + " (timed out)");
  }
}

// The warp's lanes meet at intrinsic `op`, each with value v; returns all
// lanes' values.
inline std::array<uint64_t, kWarp> Exchange(const char* op, unsigned mask, uint64_t v) {
  const unsigned t = threadIdx.x, w = t / kWarp, lanes = WarpLanes(w);
  const unsigned full = lanes == kWarp ? 0xFFFFFFFFu : (1u << lanes) - 1;
  warp_ops.fetch_add(1, std::memory_order_relaxed);
  if (mask != full) Fail(std::string(op) + ": only full-warp masks are emulated");
  Warp& warp = block->warps[w];
  std::unique_lock<std::mutex> lock(warp.m);
  if (warp.arrived && std::strcmp(warp.op, op) != 0)
    Fail("warp " + std::to_string(w) + " lane " + std::to_string(t % kWarp) + " reached " + op + " while lanes " +
         LaneList(w, kAtWarp) + " wait at " + warp.op);
  warp.op = op;
  warp.value[t % kWarp] = v;
  block->state[t] = kAtWarp;
  const uint64_t gen = warp.gen;
  if (++warp.arrived == lanes) {
    warp.result = warp.value;
    for (unsigned l = 0; l < lanes; ++l) block->state[w * kWarp + l] = kRunning;
    warp.arrived = 0;
    ++warp.gen;
    warp.cv.notify_all();
  } else {
    Wait(warp.cv, lock, [&] { return warp.gen != gen; },
         [&] { return !LaneList(w, kExited).empty() || !LaneList(w, kAtBlock).empty(); },
         [&] {
           return "warp " + std::to_string(w) + ": lanes " + LaneList(w, kAtWarp) + " wait at " + op +
                  "; lanes that left the kernel: [" + LaneList(w, kExited) + "], lanes at __syncthreads: [" +
                  LaneList(w, kAtBlock) + "]";
         });
  }
  return warp.result;
}

// __syncthreads, or (at_exit) the end of the block, where every thread waits
// for all others to finish before the next block reuses the shared memory.
inline void BlockBarrier(bool at_exit) {
  Block& b = *block;
  {  // a warp waiting on this lane learns that it will not come
    Warp& warp = b.warps[threadIdx.x / kWarp];
    std::lock_guard<std::mutex> lock(warp.m);
    b.state[threadIdx.x] = at_exit ? kExited : kAtBlock;
    warp.cv.notify_all();
  }
  std::unique_lock<std::mutex> lock(b.m);
  unsigned& arrived = at_exit ? b.exited : b.block_arrived;
  uint64_t& gen_ref = at_exit ? b.exit_gen : b.block_gen;
  const uint64_t gen = gen_ref;
  b.cv.notify_all();  // as may a barrier waiting on it
  if (++arrived == blockDim.x) {
    arrived = 0;
    ++gen_ref;
    for (auto& s : b.state) s = kRunning;
    if (at_exit) std::memset(b.smem, 0xA5, sizeof(b.smem)), std::fill(b.dsmem.begin(), b.dsmem.end(), 0xA5);
    b.cv.notify_all();
    return;
  }
  const State other = at_exit ? kAtBlock : kExited;
  Wait(b.cv, lock, [&] { return gen_ref != gen; },
       [&] {
         for (auto& s : b.state)
           if (s == other) return true;
         return false;
       },
       [&] {
         std::string who;
         for (unsigned t = 0; t < blockDim.x; ++t)
           if (b.state[t] == other) who += (who.empty() ? "" : ",") + std::to_string(t);
         return std::string(at_exit ? "threads " + who + " wait at __syncthreads after others left the kernel"
                                    : "__syncthreads: threads " + who + " left the kernel without reaching it");
       });
}

// The emulated device's threads, kept between launches (creating hundreds
// of threads per launch would dominate the tests' time).
class Pool {
 public:
  // Runs job(0) .. job(workers - 1), each on its own thread; returns when all have.
  void Run(unsigned workers, std::function<void(unsigned)> job) {
    std::unique_lock<std::mutex> lock(m_);
    while (threads_.size() < workers) threads_.emplace_back([this, id = unsigned(threads_.size())] { Work(id); });
    job_ = std::move(job);
    active_ = remaining_ = workers;
    ++gen_;
    start_.notify_all();
    done_.wait(lock, [&] { return remaining_ == 0; });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(m_);
      quit_ = true;
      start_.notify_all();
    }
    for (auto& t : threads_) t.join();
  }

 private:
  void Work(unsigned id) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      start_.wait(lock, [&] { return quit_ || gen_ != seen; });
      if (quit_) return;
      seen = gen_;
      if (id >= active_) continue;
      const auto job = job_;
      lock.unlock();
      job(id);
      lock.lock();
      if (--remaining_ == 0) done_.notify_all();
    }
  }
  std::mutex m_;
  std::condition_variable start_, done_;
  std::vector<std::thread> threads_;
  std::function<void(unsigned)> job_;
  unsigned active_ = 0, remaining_ = 0;
  uint64_t gen_ = 0;
  bool quit_ = false;
};

inline Pool pool;

// The largest dynamic shared memory each kernel was allowed (cudaFuncSetAttribute), by its address.
inline std::mutex allowed_mutex;
inline std::vector<std::pair<const void*, size_t>> allowed;

template <typename Kernel, typename... Args>
void LaunchSmem(const char* name, unsigned grid, unsigned threads, size_t dynamic, Kernel kernel, Args... args) {
  if (dynamic > kSmemBytes) {  // past 48 KB a kernel must have been allowed it, and the device must have it
    std::lock_guard<std::mutex> lock(allowed_mutex);
    const auto it = std::find_if(allowed.begin(), allowed.end(),
                                 [&](const auto& a) { return a.first == reinterpret_cast<const void*>(kernel); });
    if (it == allowed.end() || it->second < dynamic || dynamic > smem_optin)
      Fail(std::string(name) + ": " + std::to_string(dynamic) + " bytes of dynamic shared memory not allowed");
  }
  gridDim.x = grid;
  blockDim.x = threads;
  warp_ops = barriers = atomics = 0;
  const unsigned r = std::min(resident, grid);
  std::vector<std::unique_ptr<Block>> blocks;
  for (unsigned i = 0; i < r; ++i) blocks.push_back(std::make_unique<Block>(threads, dynamic));
  pool.Run(r * threads, [&](unsigned worker) {
    const unsigned i = worker / threads;
    block = blocks[i].get();
    threadIdx.x = worker % threads;
    for (unsigned id = i; id < grid; id += r) {
      blockIdx.x = id;
      kernel(args...);
      BlockBarrier(true);
    }
  });
  std::lock_guard<std::mutex> lock(counts_mutex);
  auto it = std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == name; });
  if (it == counts.end()) it = counts.insert(counts.end(), {name, Counts{}});
  it->second.launches += 1;
  it->second.threads += uint64_t(grid) * threads;
  it->second.warp_ops += warp_ops;
  it->second.barriers += barriers;
  it->second.atomics += atomics;
}

template <typename Kernel, typename... Args>
void Launch(const char* name, unsigned grid, unsigned threads, Kernel kernel, Args... args) {
  LaunchSmem(name, grid, threads, 0, kernel, args...);
}

template <typename T>
uint64_t Bits(T v) {
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(T));
  return u;
}

template <typename T>
T FromBits(uint64_t u) {
  T v;
  std::memcpy(&v, &u, sizeof(T));
  return v;
}

// A CUDA device's float32 add (__fadd_rn, and `+` in device code): the
// IEEE sum rounded to nearest even, subnormals kept (nvcc's default, no
// -ftz), and every NaN result the canonical NaN 0x7FFFFFFF, whatever the
// operands' payloads and signs -- unlike x86, which the host's `+` is.
inline float CudaFadd(float a, float b) {
  const float s = a + b;
  return s != s ? FromBits<float>(0x7FFFFFFFu) : s;
}

inline float CanonicalNan(float f) { return f != f ? FromBits<float>(0x7FFFFFFFu) : f; }

}  // namespace zc_emu

// The format header's add (zipccl_format.h, ZC_FADD) is the GPU's, as on a device.
#define ZC_HOST_FADD(a, b) zc_emu::CudaFadd(a, b)

// The hardware's fp16 widening (ffi/cuda6_device.cuh, ZC_F16_TO_F32): exact for numbers; a NaN
// here the canonical NaN whatever its payload, the worst a device may do (expanded where
// zipccl::f16_to_f32 is in scope).
#define ZC_HOST_F16_TO_F32(h) zc_emu::CanonicalNan(f16_to_f32(h))

// A kernel's shared memory: one struct per CUDA block, in the block's arena.
#define ZC_SHARED(Type, name)                                                 \
  static_assert(sizeof(Type) <= zc_emu::kSmemBytes, "shared memory too big"); \
  Type& name = *reinterpret_cast<Type*>(zc_emu::block->smem)

// A kernel's dynamic shared memory (the launch's bytes), in the block's arena.
#define ZC_DYNAMIC_SHARED(name) unsigned char* name = zc_emu::block->dsmem.data()

#define ZC_INJECTED(k) (zc_emu::inject == (k))

inline void __syncthreads() {
  zc_emu::barriers.fetch_add(1, std::memory_order_relaxed);
  zc_emu::BlockBarrier(false);
}
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu) { zc_emu::Exchange("__syncwarp", mask, 0); }

template <typename T>
T __shfl_sync(unsigned mask, T v, int src) {
  return zc_emu::FromBits<T>(zc_emu::Exchange("__shfl_sync", mask, zc_emu::Bits(v))[unsigned(src) % zc_emu::kWarp]);
}

template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta) {
  const unsigned lane = threadIdx.x % zc_emu::kWarp;
  const auto all = zc_emu::Exchange("__shfl_up_sync", mask, zc_emu::Bits(v));
  return lane >= delta ? zc_emu::FromBits<T>(all[lane - delta]) : v;
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  const unsigned src = (threadIdx.x % zc_emu::kWarp) ^ unsigned(lane_mask);
  const auto all = zc_emu::Exchange("__shfl_xor_sync", mask, zc_emu::Bits(v));
  return src < zc_emu::WarpLanes(threadIdx.x / zc_emu::kWarp) ? zc_emu::FromBits<T>(all[src]) : v;
}

inline unsigned __ballot_sync(unsigned mask, int predicate) {
  const auto all = zc_emu::Exchange("__ballot_sync", mask, predicate != 0);
  unsigned bits = 0;
  for (unsigned l = 0; l < zc_emu::kWarp; ++l) bits |= unsigned(all[l] != 0) << l;
  return bits;
}

inline int __popc(unsigned v) { return __builtin_popcount(v); }

template <typename T>
T atomicAdd(T* address, T val) {
  zc_emu::atomics.fetch_add(1, std::memory_order_relaxed);
  return std::atomic_ref<T>(*address).fetch_add(val);
}

template <typename T>
T atomicOr(T* address, T val) {
  zc_emu::atomics.fetch_add(1, std::memory_order_relaxed);
  return std::atomic_ref<T>(*address).fetch_or(val);
}

template <typename T>
T atomicMax(T* address, T val) {
  zc_emu::atomics.fetch_add(1, std::memory_order_relaxed);
  std::atomic_ref<T> a(*address);
  T old = a.load();
  while (val > old && !a.compare_exchange_weak(old, val)) {
  }
  return old;
}

template <typename T>
T atomicMin(T* address, T val) {
  zc_emu::atomics.fetch_add(1, std::memory_order_relaxed);
  std::atomic_ref<T> a(*address);
  T old = a.load();
  while (val < old && !a.compare_exchange_weak(old, val)) {
  }
  return old;
}

// zipccl_cuda.cu's launch macro calls this instead of kernel<<<...>>>.
#define ZC_LAUNCH_KERNEL(kernel, grid, threads, stream, ...) \
  zc_emu::Launch(#kernel, grid, threads, kernel, __VA_ARGS__)
#define ZC_LAUNCH_KERNEL_SMEM(kernel, grid, threads, smem, stream, ...) \
  zc_emu::LaunchSmem(#kernel, grid, threads, smem, kernel, __VA_ARGS__)

// The workspace's arrays (ffi/zipccl_cuda.cu) are each followed by a gap that
// AddressSanitizer reports when touched, as it would a separate allocation.
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define ZC_WORKSPACE_GAP 64
#define ZC_POISON_GAP(address, bytes) ASAN_POISON_MEMORY_REGION(address, size_t(bytes))
#else
#define ZC_WORKSPACE_GAP 0
#define ZC_POISON_GAP(address, bytes) (void)0
#endif

// The runtime API the handlers and the timing call.
using cudaStream_t = struct zc_emu_stream*;
using cudaEvent_t = struct zc_emu_event*;
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3 };
enum cudaDeviceAttr {
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
constexpr unsigned cudaStreamNonBlocking = 1;
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : e == cudaErrorInvalidValue ? "invalid argument" : "out of memory";
}
inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int) { return cudaSuccess; }
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  *value = attr == cudaDevAttrMultiProcessorCount ? zc_emu::sms
           : attr == cudaDevAttrMaxSharedMemoryPerBlockOptin ? int(zc_emu::smem_optin)
                                                              : int(zc_emu::smem_per_sm);
  return cudaSuccess;
}
template <typename Kernel>
cudaError_t cudaFuncSetAttribute(Kernel kernel, cudaFuncAttribute, int bytes) {
  if (bytes < 0 || size_t(bytes) > zc_emu::smem_optin) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> lock(zc_emu::allowed_mutex);
  const void* key = reinterpret_cast<const void*>(kernel);
  const auto it = std::find_if(zc_emu::allowed.begin(), zc_emu::allowed.end(), [&](const auto& a) { return a.first == key; });
  if (it == zc_emu::allowed.end()) zc_emu::allowed.emplace_back(key, size_t(bytes));
  else it->second = size_t(bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = std::malloc(bytes);
  if (*p) std::memset(*p, 0xA5, bytes);  // garbage, as device memory holds
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = nullptr;
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) {
  ++zc_emu::host_syncs;
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  if (kind != cudaMemcpyDeviceToDevice) ++zc_emu::host_syncs;
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
// An event: the host clock when it was recorded.
struct zc_emu_event {
  std::chrono::steady_clock::time_point at;
};
inline cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new zc_emu_event;
  return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  e->at = std::chrono::steady_clock::now();
  return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t) {
  ++zc_emu::host_syncs;
  return cudaSuccess;
}
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
  return cudaSuccess;
}
