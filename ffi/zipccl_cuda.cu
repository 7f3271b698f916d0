// CUDA codec for the zipccl byte format (docs/FORMAT.md), exposed as XLA FFI
// handlers. The block coder itself is the shared zipccl_format.h, so the bytes
// match the CPU codec and the numpy reference exactly; this file only decides
// which thread runs which block and where the bytes go.
//
// Written for correctness and clarity first: one thread per 4096-element block,
// serial per-stream bookkeeping on thread 0 of a CUDA block. All byte offsets
// are 64-bit, because tensors and payloads may exceed 2^31 bytes.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

// The XLA FFI headers trip nvcc and gcc warnings (no return after an
// exhaustive switch, always_inline on templates); they are not ours to fix.
#pragma nv_diagnostic push
#pragma nv_diag_suppress 940
#pragma nv_diag_suppress 2473
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wreturn-type"
#include "xla/ffi/api/ffi.h"
#pragma GCC diagnostic pop
#pragma nv_diagnostic pop
#include "zipccl_format.h"

namespace ffi = xla::ffi;
namespace zc = zipccl;

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = 65535;  // kernels below are grid-stride loops

// Code lengths are compile-time data; codes and decode tables are derived from
// them once per device by InitTablesKernel with the shared canonical_codes /
// build_lut (so they cannot disagree with the CPU codec).
__device__ const uint8_t g_lens[zc::kNumTables][zc::kNumSyms] = ZC_CODE_LENGTHS;
__device__ uint16_t g_codes[zc::kNumTables][zc::kNumSyms];
__device__ uint16_t g_lut[zc::kNumTables * zc::kLutSize];

__global__ void InitTablesKernel() {
  const int t = threadIdx.x;
  if (t >= zc::kNumTables) return;
  zc::canonical_codes(g_lens[t], g_codes[t]);
  zc::build_lut(g_lens[t], g_lut + t * zc::kLutSize);
}

// WORKAROUND: zc::write_header / zc::check_header index the namespace-scope
// constexpr array zc::kMagic, which nvcc rejects in device code ("identifier
// zipccl::kMagic is undefined in device code"). These copies read the magic
// from a string literal instead; replace them with the shared functions once
// zipccl_format.h does the same.
__device__ void WriteHeader(uint8_t* out, int dtype, int flags, uint64_t n) {
  for (int i = 0; i < 4; ++i) out[i] = uint8_t("ZCCL"[i]);
  out[4] = zc::kVersion;
  out[5] = uint8_t(dtype);
  out[6] = uint8_t(flags);
  out[7] = zc::kBlockLog2;
  for (int i = 0; i < 8; ++i) out[8 + i] = uint8_t(n >> (8 * i));
}

__device__ int CheckHeader(const uint8_t* in, uint64_t size, int dtype, uint64_t n, int* flags) {
  if (size < uint64_t(zc::kHeaderBytes)) return zc::kErrTruncated;
  for (int i = 0; i < 4; ++i)
    if (in[i] != uint8_t("ZCCL"[i])) return zc::kErrMagic;
  if (in[4] != zc::kVersion || in[7] != zc::kBlockLog2) return zc::kErrVersion;
  if (in[5] != dtype) return zc::kErrDType;
  uint64_t count = 0;
  for (int i = 0; i < 8; ++i) count |= uint64_t(in[8 + i]) << (8 * i);
  if (count != n) return zc::kErrCount;
  if (in[6] & ~zc::kFlagStoredRaw) return zc::kErrFlags;
  *flags = in[6];
  return zc::kOk;
}

// First device-side error, packed as (stream index << 8) | Status; 0 = none.
__device__ void ReportError(unsigned long long* err, int64_t stream, int status) {
  atomicCAS(err, 0ull, (static_cast<unsigned long long>(stream) << 8) | unsigned(status));
}

// Elements in block b of an n-element stream (only the last is short).
__device__ int64_t BlockCount(int64_t n, int64_t b) {
  const int64_t rest = n - b * zc::kBlock;
  return rest < zc::kBlock ? rest : zc::kBlock;
}

// One thread per block of every item: encodes into a fixed kBlock-element slot
// of scratch (bodies are packed later, once all sizes are known).
__global__ void EncodeKernel(int dtype, const uint8_t* x, int64_t n, int64_t nb, int64_t total,
                             uint8_t* bodies, uint32_t* descs) {
  const int64_t eb = zc::layout_of(dtype).elem_bytes;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t item = t / nb, b = t % nb;
    const uint8_t* in = x + (item * n + b * zc::kBlock) * eb;
    descs[t] = zc::encode_block(dtype, in, int(BlockCount(n, b)), g_lens, g_codes,
                                bodies + t * zc::kBlock * eb);
  }
}

// One CUDA block per item: thread 0 sums the body sizes and picks STORED_RAW
// (FORMAT.md §7 step 5); then all threads write descriptors and copy bodies.
__global__ void AssembleKernel(int dtype, const uint8_t* x, int64_t n, int64_t nb, int64_t batch,
                               const uint8_t* bodies, const uint32_t* descs, uint8_t* payload,
                               int64_t cap, uint32_t* sizes) {
  __shared__ bool stored_raw;
  const int64_t eb = zc::layout_of(dtype).elem_bytes;
  for (int64_t item = blockIdx.x; item < batch; item += gridDim.x) {
    const uint32_t* d = descs + item * nb;
    uint8_t* out = payload + item * cap;
    if (threadIdx.x == 0) {
      int64_t coded = 4 * nb;
      for (int64_t b = 0; b < nb; ++b) coded += d[b] & 0xFFFFu;
      stored_raw = coded >= n * eb;
      WriteHeader(out, dtype, stored_raw ? zc::kFlagStoredRaw : 0, uint64_t(n));
      sizes[item] = uint32_t(zc::kHeaderBytes + (stored_raw ? n * eb : coded));
    }
    __syncthreads();
    if (stored_raw) {
      const uint8_t* src = x + item * n * eb;
      for (int64_t i = threadIdx.x; i < n * eb; i += blockDim.x) out[zc::kHeaderBytes + i] = src[i];
    } else {
      for (int64_t b = threadIdx.x; b < nb; b += blockDim.x)
        zc::store_u32(out + zc::kHeaderBytes + 4 * b, d[b]);
      int64_t off = zc::kHeaderBytes + 4 * nb;  // every thread tracks the running offset
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* src = bodies + (item * nb + b) * zc::kBlock * eb;
        const int64_t size = d[b] & 0xFFFFu;
        for (int64_t i = threadIdx.x; i < size; i += blockDim.x) out[off + i] = src[i];
        off += size;
      }
    }
    __syncthreads();  // stored_raw is rewritten for the next item
  }
}

// Checks a stream's header and that its descriptors and bodies fit in cap,
// and writes each block's body offset (from the stream start) to off. Nothing
// is read past in + cap.
__device__ int ValidateStream(int dtype, const uint8_t* in, int64_t cap, int64_t n, uint64_t* off,
                              bool* stored_raw) {
  int flags = 0;
  const int st = CheckHeader(in, uint64_t(cap), dtype, uint64_t(n), &flags);
  if (st != zc::kOk) return st;
  *stored_raw = flags & zc::kFlagStoredRaw;
  const int64_t raw_end = zc::kHeaderBytes + n * zc::layout_of(dtype).elem_bytes;
  if (*stored_raw) return raw_end <= cap ? zc::kOk : zc::kErrTruncated;
  const int64_t nb = zc::num_blocks(n);
  int64_t pos = zc::kHeaderBytes + 4 * nb;
  if (pos > cap) return zc::kErrTruncated;
  // Only the body sizes matter here (they place the bodies and must stay
  // inside cap); decode_block checks each descriptor's mode and size itself.
  for (int64_t b = 0; b < nb; ++b) {
    const uint32_t size = zc::load_u32(in + zc::kHeaderBytes + 4 * b) & 0xFFFFu;
    if (size > cap - pos) return zc::kErrTruncated;
    off[b] = uint64_t(pos);
    pos += size;
  }
  return zc::kOk;
}

// One CUDA block per stream: thread 0 validates it and records the body
// offsets; then the threads decode its blocks in parallel. Stream s of this
// launch is payload row s * row_stride + row_offset and decodes to out + s * n
// elements (the accumulate handler uses the stride to pick row j of each item).
__global__ void DecodeKernel(int dtype, const uint8_t* payload, int64_t cap, int64_t row_stride,
                             int64_t row_offset, int64_t nstreams, int64_t n, uint64_t* offsets,
                             uint8_t* out, unsigned long long* err) {
  __shared__ int state;  // -1 invalid, 0 coded, 1 stored raw
  const int64_t eb = zc::layout_of(dtype).elem_bytes, nb = zc::num_blocks(n);
  for (int64_t s = blockIdx.x; s < nstreams; s += gridDim.x) {
    const int64_t row = s * row_stride + row_offset;
    const uint8_t* in = payload + row * cap;
    uint64_t* off = offsets + s * nb;
    if (threadIdx.x == 0) {
      bool stored_raw = false;
      const int st = ValidateStream(dtype, in, cap, n, off, &stored_raw);
      if (st != zc::kOk) ReportError(err, row, st);
      state = st != zc::kOk ? -1 : stored_raw ? 1 : 0;
    }
    __syncthreads();
    for (int64_t b = threadIdx.x; state >= 0 && b < nb; b += blockDim.x) {
      const int64_t count = BlockCount(n, b);
      uint8_t* dst = out + (s * n + b * zc::kBlock) * eb;
      if (state == 1) {
        const uint8_t* src = in + zc::kHeaderBytes + b * zc::kBlock * eb;
        for (int64_t i = 0; i < count * eb; ++i) dst[i] = src[i];
        continue;
      }
      const uint32_t desc = zc::load_u32(in + zc::kHeaderBytes + 4 * b);
      const int st = zc::decode_block(dtype, in + off[b], desc, int(count), g_lut, dst);
      if (st != zc::kOk) ReportError(err, row, st);
    }
    __syncthreads();  // state is rewritten for the next stream
  }
}

// acc = f32(x) for the first stream, acc += f32(x) after (FORMAT.md §8 order).
// Conversions are the shared ones, so results match the CPU codec bit for bit
// (up to NaN payloads: GPU arithmetic returns the canonical NaN).
__global__ void AccumulateKernel(int dtype, const uint8_t* x, float* acc, int64_t count, bool first) {
  const int eb = zc::layout_of(dtype).elem_bytes;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = zc::element_to_f32(dtype, zc::load_element(x + i * eb, eb));
    acc[i] = first ? v : acc[i] + v;
  }
}

// Rounds the f32 sums to a 16-bit output dtype (round to nearest even).
__global__ void RoundKernel(const float* acc, int out_dtype, uint16_t* out, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = uint16_t(zc::f32_to_element(out_dtype, acc[i]));
}

// ---- host side ----

ffi::Error Invalid(const std::string& msg) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, "zipccl: " + msg);
}

#define ZC_CUDA(expr)                                                                          \
  do {                                                                                         \
    const cudaError_t e_ = (expr);                                                             \
    if (e_ != cudaSuccess)                                                                     \
      return ffi::Error(ffi::ErrorCode::kInternal,                                             \
                        std::string("zipccl: ") + #expr + ": " + cudaGetErrorString(e_));     \
  } while (0)

// Launches kernel<<<grid, kThreads>>> for `work` units (none if work == 0) and
// checks the launch.
#define ZC_LAUNCH(kernel, work, per_block, stream, ...)                                        \
  do {                                                                                         \
    if ((work) > 0) {                                                                          \
      const int64_t g_ = std::min<int64_t>(((work) + (per_block) - 1) / (per_block), kMaxGrid); \
      kernel<<<unsigned(g_), kThreads, 0, stream>>>(__VA_ARGS__);                              \
      ZC_CUDA(cudaGetLastError());                                                             \
    }                                                                                          \
  } while (0)

// zipccl dtype code of an XLA element type, 0 if unsupported.
int DTypeCode(ffi::DataType t) {
  if (t == ffi::DataType::BF16) return zc::kBF16;
  if (t == ffi::DataType::F16) return zc::kF16;
  if (t == ffi::DataType::F32) return zc::kF32;
  return 0;
}

ffi::Error Unsupported(ffi::DataType t) {
  return Invalid("unsupported dtype (XLA element type " + std::to_string(int(t)) +
                 "); expected bfloat16, float16 or float32");
}

// Product of dims[begin, end).
template <typename Dims>
int64_t Product(const Dims& dims, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= dims[i];
  return p;
}

// Scratch device memory for `count` T's (at least one, so it is never null
// for an empty request).
template <typename T>
T* Scratch(ffi::ScratchAllocator& scratch, int64_t count) {
  const auto p = scratch.Allocate(size_t(std::max<int64_t>(count, 1)) * sizeof(T), 256);
  return p.has_value() ? static_cast<T*>(*p) : nullptr;
}

// Builds the decode tables on the current device once. Synchronizes so that
// later calls on other streams see them.
ffi::Error EnsureTables(cudaStream_t stream) {
  static std::mutex mu;
  static std::vector<bool> ready;  // per device ordinal
  int device = 0;
  ZC_CUDA(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  if (size_t(device) < ready.size() && ready[device]) return ffi::Error::Success();
  InitTablesKernel<<<1, zc::kNumTables, 0, stream>>>();
  ZC_CUDA(cudaGetLastError());
  ZC_CUDA(cudaStreamSynchronize(stream));
  if (ready.size() <= size_t(device)) ready.resize(device + 1, false);
  ready[device] = true;
  return ffi::Error::Success();
}

// Waits for the stream and turns the first recorded device error into kDataLoss.
ffi::Error FinishDecode(cudaStream_t stream, const unsigned long long* d_err) {
  unsigned long long err = 0;
  ZC_CUDA(cudaMemcpyAsync(&err, d_err, sizeof(err), cudaMemcpyDeviceToHost, stream));
  ZC_CUDA(cudaStreamSynchronize(stream));
  if (err == 0) return ffi::Error::Success();
  return ffi::Error(ffi::ErrorCode::kDataLoss, "zipccl: corrupt payload (stream " +
                                                   std::to_string(err >> 8) +
                                                   "): " + zc::error_message(int(err & 0xFF)));
}

ffi::Error NoScratch() {
  return ffi::Error(ffi::ErrorCode::kResourceExhausted, "zipccl: scratch allocation failed");
}

ffi::Error Compress(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer x,
                    ffi::Result<ffi::Buffer<ffi::U8>> payload, ffi::Result<ffi::Buffer<ffi::U32>> sizes,
                    int64_t n) {
  const int dtype = DTypeCode(x.element_type());
  if (dtype == 0) return Unsupported(x.element_type());
  const auto dims = payload->dimensions();
  if (dims.size() < 1 || n < 0) return Invalid("compress: bad payload rank or item_elems");
  const int64_t cap = dims[dims.size() - 1], batch = Product(dims, 0, dims.size() - 1);
  if (int64_t(x.element_count()) != batch * n || int64_t(sizes->element_count()) != batch)
    return Invalid("compress: input, payload and sizes shapes disagree with item_elems");
  const int64_t max_bytes = zc::max_stream_bytes(n, dtype);
  if (cap < max_bytes || max_bytes > int64_t(UINT32_MAX))
    return Invalid("compress: payload capacity " + std::to_string(cap) + " is below " +
                   std::to_string(max_bytes) + " or a stream exceeds 4 GiB");
  if (ffi::Error e = EnsureTables(stream); e.failure()) return e;
  const int64_t eb = zc::layout_of(dtype).elem_bytes, nb = zc::num_blocks(n), total = batch * nb;
  uint8_t* bodies = Scratch<uint8_t>(scratch, total * zc::kBlock * eb);
  uint32_t* descs = Scratch<uint32_t>(scratch, total);
  if (!bodies || !descs) return NoScratch();
  const auto* in = static_cast<const uint8_t*>(x.untyped_data());
  ZC_LAUNCH(EncodeKernel, total, kThreads, stream, dtype, in, n, nb, total, bodies, descs);
  ZC_LAUNCH(AssembleKernel, batch, 1, stream, dtype, in, n, nb, batch, bodies, descs,
            payload->typed_data(), cap, sizes->typed_data());
  return ffi::Error::Success();
}

ffi::Error Decompress(cudaStream_t stream, ffi::ScratchAllocator scratch,
                      ffi::Buffer<ffi::U8> payload, ffi::Result<ffi::AnyBuffer> out, int64_t n) {
  const int dtype = DTypeCode(out->element_type());
  if (dtype == 0) return Unsupported(out->element_type());
  const auto dims = payload.dimensions();
  if (dims.size() < 1 || n < 0) return Invalid("decompress: bad payload rank or item_elems");
  const int64_t cap = dims[dims.size() - 1], nstreams = Product(dims, 0, dims.size() - 1);
  if (int64_t(out->element_count()) != nstreams * n)
    return Invalid("decompress: output size disagrees with payload batch * item_elems");
  if (ffi::Error e = EnsureTables(stream); e.failure()) return e;
  uint64_t* offsets = Scratch<uint64_t>(scratch, nstreams * zc::num_blocks(n));
  auto* d_err = Scratch<unsigned long long>(scratch, 1);
  if (!offsets || !d_err) return NoScratch();
  ZC_CUDA(cudaMemsetAsync(d_err, 0, sizeof(*d_err), stream));
  ZC_LAUNCH(DecodeKernel, nstreams, 1, stream, dtype, payload.typed_data(), cap, 1, 0, nstreams, n,
            offsets, static_cast<uint8_t*>(out->untyped_data()), d_err);
  return FinishDecode(stream, d_err);
}

ffi::Error DecompressAccumulate(cudaStream_t stream, ffi::ScratchAllocator scratch,
                                ffi::Buffer<ffi::U8> payload, ffi::Result<ffi::AnyBuffer> out,
                                int64_t n, int32_t dtype) {
  if (dtype < zc::kBF16 || dtype > zc::kF32) return Invalid("accumulate: bad dtype code");
  const int out_dtype = DTypeCode(out->element_type());
  if (out_dtype != dtype && out_dtype != zc::kF32)
    return Invalid("accumulate: output dtype must be the payload dtype or float32");
  const auto dims = payload.dimensions();
  if (dims.size() < 2 || n < 0) return Invalid("accumulate: bad payload rank or item_elems");
  const int64_t cap = dims[dims.size() - 1], k = dims[dims.size() - 2];
  const int64_t batch = Product(dims, 0, dims.size() - 2), count = batch * n;
  if (int64_t(out->element_count()) != (k > 0 ? count : 0))  // k == 0: nothing to sum
    return Invalid("accumulate: output size disagrees with payload batch * item_elems");
  if (k == 0) return ffi::Error::Success();
  if (ffi::Error e = EnsureTables(stream); e.failure()) return e;
  const int64_t eb = zc::layout_of(dtype).elem_bytes;
  uint64_t* offsets = Scratch<uint64_t>(scratch, batch * zc::num_blocks(n));
  auto* d_err = Scratch<unsigned long long>(scratch, 1);
  uint8_t* decoded = Scratch<uint8_t>(scratch, count * eb);
  // Sum straight into out when it is float32; otherwise in f32 scratch.
  float* acc = out_dtype == zc::kF32 ? static_cast<float*>(out->untyped_data())
                                     : Scratch<float>(scratch, count);
  if (!offsets || !d_err || !decoded || !acc) return NoScratch();
  ZC_CUDA(cudaMemsetAsync(d_err, 0, sizeof(*d_err), stream));
  for (int64_t j = 0; j < k; ++j) {
    ZC_LAUNCH(DecodeKernel, batch, 1, stream, dtype, payload.typed_data(), cap, k, j, batch, n,
              offsets, decoded, d_err);
    ZC_LAUNCH(AccumulateKernel, count, kThreads, stream, dtype, decoded, acc, count, j == 0);
  }
  if (out_dtype != zc::kF32)
    ZC_LAUNCH(RoundKernel, count, kThreads, stream, acc, out_dtype,
              static_cast<uint16_t*>(out->untyped_data()), count);
  return FinishDecode(stream, d_err);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclCompressCuda, Compress,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::Buffer<ffi::U32>>()
                                  .Attr<int64_t>("item_elems"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclDecompressCuda, Decompress,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("item_elems"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclDecompressAccumulateCuda, DecompressAccumulate,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("item_elems")
                                  .Attr<int32_t>("dtype"));
