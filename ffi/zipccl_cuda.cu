// CUDA codec for the zipccl byte format (docs/FORMAT.md), as XLA FFI handlers.
//
// Every format decision is a shared function of zipccl_format.h (the same ones
// the CPU codec's generic path runs), so the bytes match the CPU codec and the
// numpy reference; this file only decides which thread runs what and where the
// bytes go. Written for correctness and clarity first: one thread per 4096-
// element block or per 16-block group, serial per-stream bookkeeping on
// thread 0 of a CUDA block. Byte offsets are 64-bit (tensors may exceed 2 GiB).
//
// compress:   EmaxKernel (thread/block) -> ChooseKernel (thread/group) ->
//             EncodeKernel (thread/block, bodies to scratch) ->
//             AssembleKernel (CUDA block/item). No host sync.
// decompress: DecodeKernel (CUDA block/stream), then one sync to read the
//             first device-side error.
// accumulate: per row j, DecodeKernel + AccumulateKernel; then RoundKernel.
#ifndef ZIPCCL_HOST_EMULATION  // tests/cuda_host_shim.h stands in for it on the host
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cstdint>
#include <string>

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
constexpr int64_t kMaxGrid = 65535;
constexpr int64_t kDecodeSlots = 1024;  // DecodeKernel CUDA blocks, each with its own scratch
static_assert(kDecodeSlots <= kMaxGrid, "DecodeKernel's grid must equal its slot count");

// Grid-stride loop of i over [0, n) across all threads of a launch.
#define ZC_FOR_THREADS(i, n)                                                \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

// ---- compress ----

// §7 step 1, thread per block of every item: refs[t] = the block's emax
// (ChooseKernel then overwrites it with the chosen ref).
__global__ void EmaxKernel(int dtype, const uint8_t* x, int64_t n, int64_t nb, int64_t total,
                           uint32_t* refs) {
  const int64_t eb = zc::layout_of(dtype).elem_bytes;
  ZC_FOR_THREADS(t, total) {
    const int64_t item = t / nb, b = t % nb;
    refs[t] = zc::block_emax(dtype, x + (item * n + b * zc::kBlock) * eb, zc::block_count(n, b));
  }
}

// A group's codes for its raw byte planes (§5.4), kMaxPlanes * kPlaneSyms
// lengths and codes per group.
struct PlaneScratch {
  int* masks;
  uint8_t* lens;
  uint16_t* codes;
};

__device__ zc::PlaneCodes GroupPlanes(PlaneScratch ps, int64_t gi) {
  zc::PlaneCodes pc{};
  pc.mask = ps.masks[gi];
  for (int p = 0; p < zc::kMaxPlanes; ++p) {
    pc.lens[p] = ps.lens + (gi * zc::kMaxPlanes + p) * zc::kPlaneSyms;
    pc.codes[p] = ps.codes + (gi * zc::kMaxPlanes + p) * zc::kPlaneSyms;
  }
  return pc;
}

// §7 steps 2-3, thread per group of every item: refs (the group's largest
// emax or each block's own) and sign coding (the candidate best_candidate
// picks), code lengths and canonical codes, and the byte planes it codes.
// Same steps as choose_group_generic and choose_all_planes in codec_cpu.cc.
__global__ void ChooseKernel(int dtype, const uint8_t* x, int64_t n, int64_t nb, int64_t ng,
                             int64_t total_groups, uint32_t* refs, uint8_t* lens, uint16_t* codes,
                             PlaneScratch ps) {
  const int64_t eb = zc::layout_of(dtype).elem_bytes;
  ZC_FOR_THREADS(gi, total_groups) {
    const int64_t item = gi / ng, b0 = (gi % ng) * zc::kGroupBlocks;
    const int64_t b1 = b0 + zc::kGroupBlocks < nb ? b0 + zc::kGroupBlocks : nb;
    const uint8_t* in = x + item * n * eb;
    uint32_t* ref = refs + item * nb;
    uint32_t gmax = 0;
    for (int64_t b = b0; b < b1; ++b) gmax = ref[b] > gmax ? ref[b] : gmax;
    uint32_t counts[zc::kCandidates][zc::kNumSyms] = {};
    uint8_t cand[zc::kCandidates][zc::kNumSyms];
    for (int c = 0; c < zc::kCandidates; ++c) {
      for (int64_t b = b0; b < b1; ++b)
        zc::add_symbol_counts(dtype, in + b * zc::kBlock * eb, zc::block_count(n, b), (c & 1) ? ref[b] : gmax,
                              c >= 2, counts[c]);
      zc::code_lengths(counts[c], cand[c]);
    }
    const int best = zc::best_candidate(counts, cand, zc::layout_of(dtype).exp_bits);
    if (!(best & 1))
      for (int64_t b = b0; b < b1; ++b) ref[b] = gmax;
    uint8_t* l = lens + gi * zc::kNumSyms;
    for (int s = 0; s < zc::kNumSyms; ++s) l[s] = cand[best][s];
    zc::canonical_codes(l, codes + gi * zc::kNumSyms);
    const int64_t first = b0 * zc::kBlock, count = (n - first < zc::kGroupBlocks * int64_t(zc::kBlock))
                                                        ? n - first : zc::kGroupBlocks * int64_t(zc::kBlock);
    uint8_t(*plens)[zc::kPlaneSyms] = reinterpret_cast<uint8_t(*)[zc::kPlaneSyms]>(ps.lens + gi * zc::kMaxPlanes * zc::kPlaneSyms);
    ps.masks[gi] = zc::choose_planes(dtype, in + first * eb, count, plens) | (best >= 2 ? zc::kMaskSign : 0);
    for (int p = 0; p < zc::kMaxPlanes; ++p)
      if ((ps.masks[gi] >> p) & 1) zc::canonical_codes(plens[p], ps.codes + (gi * zc::kMaxPlanes + p) * zc::kPlaneSyms, zc::kPlaneSyms);
  }
}

// §7 step 4, thread per block: encodes into a fixed kBlock-element scratch
// slot (bodies are packed once all sizes are known).
__global__ void EncodeKernel(int dtype, const uint8_t* x, int64_t n, int64_t nb, int64_t ng, int64_t total,
                             const uint32_t* refs, const uint8_t* lens, const uint16_t* codes, PlaneScratch ps,
                             uint8_t* bodies, uint32_t* descs) {
  const int64_t eb = zc::layout_of(dtype).elem_bytes;
  ZC_FOR_THREADS(t, total) {
    const int64_t item = t / nb, b = t % nb, gi = item * ng + b / zc::kGroupBlocks;
    descs[t] = zc::encode_block(dtype, x + (item * n + b * zc::kBlock) * eb, zc::block_count(n, b), refs[t],
                                lens + gi * zc::kNumSyms, codes + gi * zc::kNumSyms,
                                bodies + t * zc::kBlock * eb, GroupPlanes(ps, gi));
  }
}

// CUDA block per item: thread 0 places the group tables (§1), sizes the
// coded form and picks STORED_RAW (§7 step 5); then all threads write
// descriptors, plane masks, tables and bodies. table_at: [batch * ng] scratch.
__global__ void AssembleKernel(int dtype, const uint8_t* x, int64_t n, int64_t nb, int64_t ng, int64_t batch,
                               const uint8_t* lens, PlaneScratch ps, const uint8_t* bodies, const uint32_t* descs,
                               int64_t* table_at, uint8_t* payload, int64_t cap, uint32_t* sizes) {
  __shared__ bool stored_raw;
  __shared__ int flags;
  __shared__ int64_t start;
  const int64_t eb = zc::layout_of(dtype).elem_bytes;
  for (int64_t item = blockIdx.x; item < batch; item += gridDim.x) {
    const uint32_t* d = descs + item * nb;
    const int* masks = ps.masks + item * ng;
    int64_t* at = table_at + item * ng;
    uint8_t* out = payload + item * cap;
    if (threadIdx.x == 0) {
      flags = zc::kFlagMasks;  // §7 step 5: a coded stream always has its masks
      int64_t end = zc::tables_offset(nb, flags);
      for (int64_t g = 0; g < ng; ++g) {
        at[g] = end;
        end += zc::group_table_bytes(masks[g]);
      }
      start = end;
      for (int64_t b = 0; b < nb; ++b) end += d[b] & 0xFFFFu;
      stored_raw = end - zc::kHeaderBytes >= n * eb;
      zc::write_header(out, dtype, stored_raw ? zc::kFlagStoredRaw : flags, uint64_t(n));
      sizes[item] = uint32_t(stored_raw ? zc::kHeaderBytes + n * eb : end);
    }
    __syncthreads();
    if (stored_raw) {
      const uint8_t* src = x + item * n * eb;
      for (int64_t i = threadIdx.x; i < n * eb; i += blockDim.x) out[zc::kHeaderBytes + i] = src[i];
    } else {
      for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) zc::store_u32(out + zc::kHeaderBytes + 4 * b, d[b]);
      for (int64_t g = threadIdx.x; g < ng; g += blockDim.x) {
        const zc::PlaneCodes pc = GroupPlanes(ps, item * ng + g);
        out[zc::kHeaderBytes + 4 * nb + g] = uint8_t(pc.mask);
        zc::pack_table(lens + (item * ng + g) * zc::kNumSyms, out + at[g]);
        for (int p = 0, k = 0; p < zc::kMaxPlanes; ++p)
          if ((pc.mask >> p) & 1) zc::pack_table(pc.lens[p], out + at[g] + zc::kTableBytes + zc::kPlaneTableBytes * k++, zc::kPlaneSyms);
      }
      int64_t off = start;  // every thread tracks the running body offset
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

// ---- decompress ----

// Scratch of one DecodeKernel CUDA block, reused by the streams it handles.
struct DecodeSlot {
  uint64_t* offsets;   // [nb] body offset of each block from the stream start
  uint64_t* table_at;  // [ng] offset of each group's tables
  uint8_t* has_lut;    // [ng] group has a coded block, so its tables were checked
  uint16_t* luts;      // [ng * lut_stride] decode tables: the symbols', then each plane's
};

// Decode tables per group: one for the symbols and one per raw byte plane.
__host__ __device__ inline int64_t LutStride(int dtype) {
  return int64_t(1 + zc::layout_of(dtype).raw_bytes) * zc::kLutSize;
}

// Checks group tables at `at` with mask (§5.3-5.4); builds them into luts if
// luts is not null. Returns a Status.
__device__ int GroupTables(const uint8_t* at, int mask, uint16_t* luts) {
  uint8_t lens[zc::kMaxSyms];
  if (zc::unpack_table(at, lens) != zc::kOk) return zc::kErrTable;
  if (luts) zc::build_lut(lens, luts);
  at += zc::kTableBytes;
  for (int p = 0; p < zc::kMaxPlanes; ++p) {
    if (!((mask >> p) & 1)) continue;
    if (zc::unpack_table(at, lens, zc::kPlaneSyms) != zc::kOk) return zc::kErrTable;
    if (luts) zc::build_lut(lens, luts + (1 + p) * zc::kLutSize, zc::kPlaneSyms);
    at += zc::kPlaneTableBytes;
  }
  return zc::kOk;
}

__device__ void ReportError(unsigned long long* err, int64_t stream, int status) {
  // First error wins: (stream << 8) | status, 0 = none.
  atomicCAS(err, 0ull, (static_cast<unsigned long long>(stream) << 8) | unsigned(status));
}

// Group g's plane mask in a coded stream with these header flags (§1).
__device__ int StreamMask(const uint8_t* in, int64_t nb, int flags, int64_t g) {
  return (flags & zc::kFlagMasks) ? in[zc::kHeaderBytes + 4 * nb + g] : 0;
}

// Checks a stream's header and tables and that its bodies fit in cap, and
// fills the slot's offsets and has_lut. Per block it checks the group table
// (coded blocks only), then the body bounds: the CPU codec's order. Mode,
// body size and bitstream errors come from decode_block. Reads only [in, in + cap).
__device__ int ValidateStream(int dtype, const uint8_t* in, int64_t cap, int64_t n, DecodeSlot slot,
                              bool* stored_raw) {
  int flags = 0, mask_bits = 0;
  const int st = zc::check_header(in, uint64_t(cap), dtype, uint64_t(n), &flags, &mask_bits);
  if (st != zc::kOk) return st;
  *stored_raw = flags & zc::kFlagStoredRaw;
  if (*stored_raw) return zc::max_stream_bytes(n, dtype) <= cap ? zc::kOk : zc::kErrTruncated;
  const int64_t nb = zc::num_blocks(n), ng = zc::num_groups(nb);
  int64_t pos = zc::tables_offset(nb, flags);
  if (pos > cap) return zc::kErrTruncated;
  for (int64_t g = 0; g < ng; ++g) {
    const int mask = StreamMask(in, nb, flags, g);
    if (mask & ~mask_bits) return zc::kErrPlanes;
    slot.has_lut[g] = 0;
    slot.table_at[g] = uint64_t(pos);
    pos += zc::group_table_bytes(mask);
  }
  if (pos > cap) return zc::kErrTruncated;
  for (int64_t b = 0; b < nb; ++b) {
    const uint32_t desc = zc::load_u32(in + zc::kHeaderBytes + 4 * b);
    const int64_t g = b / zc::kGroupBlocks;
    if ((desc >> 24) == 1 && !slot.has_lut[g]) {
      if (GroupTables(in + slot.table_at[g], StreamMask(in, nb, flags, g), nullptr) != zc::kOk) return zc::kErrTable;
      slot.has_lut[g] = 1;
    }
    const int64_t size = desc & 0xFFFFu;
    if (size > cap - pos) return zc::kErrTruncated;
    slot.offsets[b] = uint64_t(pos);
    pos += size;
  }
  return zc::kOk;
}

// CUDA block per stream: thread 0 validates it; the threads build the decode
// tables of its groups, then decode its blocks. Stream s of this launch is
// payload row s * row_stride + row_offset and decodes to out + s * n elements
// (the accumulate handler uses the stride to pick row j of each item).
__global__ void DecodeKernel(int dtype, const uint8_t* payload, int64_t cap, int64_t row_stride,
                             int64_t row_offset, int64_t nstreams, int64_t n, DecodeSlot slots,
                             uint8_t* out, unsigned long long* err) {
  __shared__ int state;  // -1 invalid, 0 coded, 1 stored raw
  __shared__ int flags;
  const int64_t eb = zc::layout_of(dtype).elem_bytes, nb = zc::num_blocks(n), ng = zc::num_groups(nb);
  const int64_t stride = LutStride(dtype);
  const DecodeSlot slot{slots.offsets + blockIdx.x * nb, slots.table_at + blockIdx.x * ng,
                        slots.has_lut + blockIdx.x * ng, slots.luts + blockIdx.x * ng * stride};
  for (int64_t s = blockIdx.x; s < nstreams; s += gridDim.x) {
    const int64_t row = s * row_stride + row_offset;
    const uint8_t* in = payload + row * cap;
    if (threadIdx.x == 0) {
      bool stored_raw = false;
      const int st = ValidateStream(dtype, in, cap, n, slot, &stored_raw);
      if (st != zc::kOk) ReportError(err, row, st);
      state = st != zc::kOk ? -1 : stored_raw ? 1 : 0;
      flags = st == zc::kOk ? in[6] : 0;
    }
    __syncthreads();
    for (int64_t g = threadIdx.x; state == 0 && g < ng; g += blockDim.x) {
      if (slot.has_lut[g])  // checked above
        GroupTables(in + slot.table_at[g], StreamMask(in, nb, flags, g), slot.luts + g * stride);
    }
    __syncthreads();
    for (int64_t b = threadIdx.x; state >= 0 && b < nb; b += blockDim.x) {
      const int count = zc::block_count(n, b);
      uint8_t* dst = out + (s * n + b * zc::kBlock) * eb;
      if (state == 1) {
        const uint8_t* src = in + zc::kHeaderBytes + b * zc::kBlock * eb;
        for (int64_t i = 0; i < count * eb; ++i) dst[i] = src[i];
        continue;
      }
      const int64_t g = b / zc::kGroupBlocks;
      const uint16_t* lut = slot.has_lut[g] ? slot.luts + g * stride : nullptr;
      zc::PlaneCodes pc{};
      pc.mask = StreamMask(in, nb, flags, g);
      for (int p = 0; p < zc::kMaxPlanes; ++p) pc.luts[p] = lut ? lut + (1 + p) * zc::kLutSize : nullptr;
      const int st = zc::decode_block(dtype, in + slot.offsets[b], zc::load_u32(in + zc::kHeaderBytes + 4 * b),
                                      count, lut, dst, pc);
      if (st != zc::kOk) ReportError(err, row, st);
    }
    __syncthreads();  // state and the slot are reused by the next stream
  }
}

// §8: acc = f32(x) for row 0, acc = acc + f32(x) after, in row order. The
// conversions are the shared ones, so sums match the CPU codec bit for bit
// except NaN payloads (GPU arithmetic yields the canonical NaN).
__global__ void AccumulateKernel(int dtype, const uint8_t* x, float* acc, int64_t count, bool first) {
  const int eb = zc::layout_of(dtype).elem_bytes;
  ZC_FOR_THREADS(i, count) {
    const float v = zc::element_to_f32(dtype, zc::load_element(x + i * eb, eb));
    acc[i] = first ? v : acc[i] + v;
  }
}

// Rounds the float32 sums to a 16-bit output dtype (round to nearest even).
__global__ void RoundKernel(const float* acc, int out_dtype, uint16_t* out, int64_t count) {
  ZC_FOR_THREADS(i, count) out[i] = uint16_t(zc::f32_to_element(out_dtype, acc[i]));
}

// ---- host side ----

ffi::Error Invalid(const std::string& msg) { return ffi::Error(ffi::ErrorCode::kInvalidArgument, "zipccl: " + msg); }

ffi::Error NoScratch() {
  return ffi::Error(ffi::ErrorCode::kResourceExhausted, "zipccl: scratch allocation failed");
}

// Returns kInternal with the CUDA error string if expr fails.
#define ZC_CUDA(expr)                                                                \
  do {                                                                               \
    const cudaError_t e_ = (expr);                                                   \
    if (e_ != cudaSuccess)                                                           \
      return ffi::Error(ffi::ErrorCode::kInternal,                                   \
                        std::string("zipccl: ") + #expr + ": " + cudaGetErrorString(e_)); \
  } while (0)

#ifndef ZC_LAUNCH_KERNEL  // the host emulation brings its own
#define ZC_LAUNCH_KERNEL(kernel, grid, threads, stream, ...) kernel<<<grid, threads, 0, stream>>>(__VA_ARGS__)
#endif

// Launches kernel with kThreads threads per CUDA block, enough blocks for
// `work` units of per_block each (capped; kernels loop), none if work == 0.
#define ZC_LAUNCH(kernel, work, per_block, stream, ...)                                           \
  do {                                                                                            \
    if ((work) > 0) {                                                                             \
      const int64_t g_ = std::min<int64_t>(((work) + (per_block) - 1) / (per_block), kMaxGrid);   \
      ZC_LAUNCH_KERNEL(kernel, unsigned(g_), kThreads, stream, __VA_ARGS__);                      \
      ZC_CUDA(cudaGetLastError());                                                                \
    }                                                                                             \
  } while (0)

// Format dtype code of an XLA element type, 0 if unsupported.
int DTypeCode(ffi::DataType t) {
  if (t == ffi::DataType::BF16) return zc::kBF16;
  if (t == ffi::DataType::F16) return zc::kF16;
  if (t == ffi::DataType::F32) return zc::kF32;
  return 0;
}

ffi::Error Unsupported(ffi::DataType t) {
  return Invalid("unsupported dtype (XLA element type " + std::to_string(int(t)) +
                 "); supported: bfloat16, float16, float32");
}

template <typename Dims>
int64_t Product(const Dims& dims, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= dims[i];
  return p;
}

// Scratch for `count` T's (at least one, so an empty request is not null).
template <typename T>
T* Scratch(ffi::ScratchAllocator& scratch, int64_t count) {
  const auto p = scratch.Allocate(size_t(std::max<int64_t>(count, 1)) * sizeof(T), 256);
  return p.has_value() ? static_cast<T*>(*p) : nullptr;
}

// Scratch for `slots` DecodeKernel blocks on streams of n elements.
bool AllocSlots(ffi::ScratchAllocator& scratch, int64_t slots, int64_t n, int dtype, DecodeSlot* s) {
  const int64_t nb = zc::num_blocks(n), ng = zc::num_groups(nb);
  s->offsets = Scratch<uint64_t>(scratch, slots * nb);
  s->table_at = Scratch<uint64_t>(scratch, slots * ng);
  s->has_lut = Scratch<uint8_t>(scratch, slots * ng);
  s->luts = Scratch<uint16_t>(scratch, slots * ng * LutStride(dtype));
  return s->offsets && s->table_at && s->has_lut && s->luts;
}

// Waits for the stream and turns the first device-side error into kDataLoss.
ffi::Error FinishDecode(cudaStream_t stream, const unsigned long long* d_err) {
  unsigned long long err = 0;
  ZC_CUDA(cudaMemcpyAsync(&err, d_err, sizeof(err), cudaMemcpyDeviceToHost, stream));
  ZC_CUDA(cudaStreamSynchronize(stream));
  if (err == 0) return ffi::Error::Success();
  return ffi::Error(ffi::ErrorCode::kDataLoss, "zipccl: corrupt payload (stream " + std::to_string(err >> 8) +
                                                   "): " + zc::error_message(int(err & 0xFF)));
}

ffi::Error Compress(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer x,
                    ffi::Result<ffi::Buffer<ffi::U8>> payload, ffi::Result<ffi::Buffer<ffi::U32>> sizes, int64_t n) {
  const int dtype = DTypeCode(x.element_type());
  if (dtype == 0) return Unsupported(x.element_type());
  const auto dims = payload->dimensions();
  if (dims.size() < 1 || n < 0) return Invalid("compress: bad payload rank or item_elems");
  const int64_t cap = dims[dims.size() - 1], batch = Product(dims, 0, dims.size() - 1);
  if (int64_t(x.element_count()) != batch * n || int64_t(sizes->element_count()) != batch)
    return Invalid("compress: input, payload and sizes shapes disagree with item_elems");
  const int64_t max_bytes = zc::max_stream_bytes(n, dtype);
  if (cap < max_bytes || max_bytes > int64_t(UINT32_MAX))
    return Invalid("compress: payload capacity " + std::to_string(cap) + " is below " + std::to_string(max_bytes) +
                   " or a stream exceeds 4 GiB");
  const int64_t eb = zc::layout_of(dtype).elem_bytes, nb = zc::num_blocks(n), ng = zc::num_groups(nb);
  const int64_t total = batch * nb, total_groups = batch * ng;
  uint32_t* refs = Scratch<uint32_t>(scratch, total);
  uint8_t* lens = Scratch<uint8_t>(scratch, total_groups * zc::kNumSyms);
  uint16_t* codes = Scratch<uint16_t>(scratch, total_groups * zc::kNumSyms);
  uint8_t* bodies = Scratch<uint8_t>(scratch, total * zc::kBlock * eb);
  uint32_t* descs = Scratch<uint32_t>(scratch, total);
  int64_t* table_at = Scratch<int64_t>(scratch, total_groups);
  const PlaneScratch ps{Scratch<int>(scratch, total_groups),
                        Scratch<uint8_t>(scratch, total_groups * zc::kMaxPlanes * zc::kPlaneSyms),
                        Scratch<uint16_t>(scratch, total_groups * zc::kMaxPlanes * zc::kPlaneSyms)};
  if (!refs || !lens || !codes || !bodies || !descs || !table_at || !ps.masks || !ps.lens || !ps.codes)
    return NoScratch();
  const auto* in = static_cast<const uint8_t*>(x.untyped_data());
  ZC_LAUNCH(EmaxKernel, total, kThreads, stream, dtype, in, n, nb, total, refs);
  ZC_LAUNCH(ChooseKernel, total_groups, kThreads, stream, dtype, in, n, nb, ng, total_groups, refs, lens, codes, ps);
  ZC_LAUNCH(EncodeKernel, total, kThreads, stream, dtype, in, n, nb, ng, total, refs, lens, codes, ps, bodies, descs);
  ZC_LAUNCH(AssembleKernel, batch, 1, stream, dtype, in, n, nb, ng, batch, lens, ps, bodies, descs, table_at,
            payload->typed_data(), cap, sizes->typed_data());
  return ffi::Error::Success();
}

ffi::Error Decompress(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::Buffer<ffi::U8> payload,
                      ffi::Result<ffi::AnyBuffer> out, int64_t n) {
  const int dtype = DTypeCode(out->element_type());
  if (dtype == 0) return Unsupported(out->element_type());
  const auto dims = payload.dimensions();
  if (dims.size() < 1 || n < 0) return Invalid("decompress: bad payload rank or item_elems");
  const int64_t cap = dims[dims.size() - 1], nstreams = Product(dims, 0, dims.size() - 1);
  if (int64_t(out->element_count()) != nstreams * n)
    return Invalid("decompress: output size disagrees with payload batch * item_elems");
  const int64_t slots = std::min(nstreams, kDecodeSlots);
  DecodeSlot slot;
  auto* d_err = Scratch<unsigned long long>(scratch, 1);
  if (!AllocSlots(scratch, slots, n, dtype, &slot) || !d_err) return NoScratch();
  ZC_CUDA(cudaMemsetAsync(d_err, 0, sizeof(*d_err), stream));
  ZC_LAUNCH(DecodeKernel, slots, 1, stream, dtype, payload.typed_data(), cap, 1, 0, nstreams, n, slot,
            static_cast<uint8_t*>(out->untyped_data()), d_err);
  return FinishDecode(stream, d_err);
}

ffi::Error DecompressAccumulate(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::Buffer<ffi::U8> payload,
                                ffi::Result<ffi::AnyBuffer> out, int64_t n, int32_t dtype) {
  if (dtype < zc::kBF16 || dtype > zc::kF32) return Invalid("accumulate: bad dtype code");
  const int out_dtype = DTypeCode(out->element_type());
  if (out_dtype != dtype && out_dtype != zc::kF32)
    return Invalid("accumulate: output dtype must be the payload dtype or float32");
  const auto dims = payload.dimensions();
  if (dims.size() < 2 || n < 0) return Invalid("accumulate: bad payload rank or item_elems");
  const int64_t cap = dims[dims.size() - 1], k = dims[dims.size() - 2];
  const int64_t batch = Product(dims, 0, dims.size() - 2), count = batch * n;
  if (int64_t(out->element_count()) != (k > 0 ? count : 0))  // k == 0: nothing to sum, like the CPU codec
    return Invalid("accumulate: output size disagrees with payload batch * item_elems");
  if (k == 0 || count == 0) return ffi::Error::Success();  // out may be null when empty
  const int64_t slots = std::min(batch, kDecodeSlots);
  DecodeSlot slot;
  auto* d_err = Scratch<unsigned long long>(scratch, 1);
  uint8_t* decoded = Scratch<uint8_t>(scratch, count * zc::layout_of(dtype).elem_bytes);
  // Sum straight into out when it is float32; otherwise into f32 scratch.
  float* acc = out_dtype == zc::kF32 ? static_cast<float*>(out->untyped_data()) : Scratch<float>(scratch, count);
  if (!AllocSlots(scratch, slots, n, dtype, &slot) || !d_err || !decoded || !acc) return NoScratch();
  ZC_CUDA(cudaMemsetAsync(d_err, 0, sizeof(*d_err), stream));
  for (int64_t j = 0; j < k; ++j) {
    ZC_LAUNCH(DecodeKernel, slots, 1, stream, dtype, payload.typed_data(), cap, k, j, batch, n, slot, decoded, d_err);
    ZC_LAUNCH(AccumulateKernel, count, kThreads, stream, dtype, decoded, acc, count, j == 0);
  }
  if (out_dtype != zc::kF32)
    ZC_LAUNCH(RoundKernel, count, kThreads, stream, acc, out_dtype, static_cast<uint16_t*>(out->untyped_data()),
              count);
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
