// CUDA codec for the zipccl byte format (docs/FORMAT.md), as XLA FFI handlers.
//
// Every format decision is a shared function of zipccl_format.h (the same ones
// the CPU codec's generic path runs), so the bytes match the CPU codec and the
// numpy reference; this file (the host side) and the kernels it includes,
// cuda_encode.cuh and cuda_decode.cuh, only decide which threads run what and
// where the bytes go. docs/GPU.md has the performance model of each kernel.
//
// compress:   EmaxKernel (warp per 4096-element block) -> ChooseKernel (CUDA
//             block per 16-block group: shared histograms, a warp per code) ->
//             SizeKernel (thread per lane: each lane's bits, each block's
//             size) -> LayoutKernel (CUDA block per item: scans of table and
//             body offsets) -> PrepKernel (the words lanes share, zeroed) ->
//             MetaKernel (CUDA block per block: descriptors, tables, raw
//             bodies) -> BodyKernel (thread per lane: its bits straight to
//             their place in the payload).
// decompress: ValidateKernel (CUDA block per stream) -> TableKernel (warp per
//             group: its decode tables) -> DecodeKernel (thread per lane, the
//             16 lanes of a block storing 16 consecutive elements a step)
//             -> PoisonKernel; each stream's first error (lowest block, lane)
//             lands in its status word, a result of the handler, and
//             PoisonKernel fills a corrupt stream's output with all-one
//             bytes (a NaN in every float format).
// accumulate: the decode kernels over every row at once, then SumRowsKernel
//             (each sum once, over its rows in order) and PoisonKernel (a
//             corrupt row poisons its sum).
// Grids are sized from the device's SM count; kernels loop over their work.
// Byte offsets are 64-bit (tensors may exceed 2 GiB). The handlers never wait
// for the device and allocate nothing (their working arrays are a result XLA
// allocates), so XLA may capture them into command buffers (docs/GPU.md).
#ifndef ZIPCCL_HOST_EMULATION  // tests/cuda_host_shim.h stands in for it on the host
#include <cuda_runtime.h>
// A kernel's shared memory, one struct; the emulation gives each CUDA block its own.
#define ZC_SHARED(Type, name) __shared__ Type name
// Deliberately broken variants exist only in the host emulation's tests.
#define ZC_INJECTED(k) false
// The emulation puts an unaddressable gap after each workspace array, for ASan.
#define ZC_WORKSPACE_GAP 0
#define ZC_POISON_GAP(address, bytes) (void)0
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
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
#include "zipccl_cuda_host.h"
#include "zipccl_format.h"
#include "zipccl_rows.h"

namespace ffi = xla::ffi;
namespace zc = zipccl;

#include "cuda_decode.cuh"
#include "cuda_encode.cuh"

namespace {

// ---- host side ----

ffi::Error Invalid(const std::string& msg) { return ffi::Error(ffi::ErrorCode::kInvalidArgument, "zipccl: " + msg); }

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

// Launches kernel on `threads`-thread CUDA blocks, as many as the device's
// SMs hold at once (kThreadsPerSm each) or one per unit of work if fewer;
// none if work == 0. Kernels loop over their work.
#define ZC_LAUNCH(kernel, work, threads, stream, ...)                                                  \
  do {                                                                                                 \
    if ((work) > 0) {                                                                                  \
      int device_ = 0, sms_ = 0;                                                                       \
      ZC_CUDA(cudaGetDevice(&device_));                                                                \
      ZC_CUDA(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device_));                 \
      const int64_t g_ = Min<int64_t>(work, int64_t(sms_) * (kThreadsPerSm / (threads)));               \
      ZC_LAUNCH_KERNEL(kernel, unsigned(g_), threads, stream, __VA_ARGS__);                            \
      ZC_CUDA(cudaGetLastError());                                                                     \
    }                                                                                                  \
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

// ---- workspace: the handlers' working arrays ----

// A handler's working arrays, carved in a fixed order out of its last result,
// a uint8 buffer that XLA allocates (zipccl_jax/ops.py sizes it with
// *WorkspaceBytes, which run the same carving on a Workspace that only
// measures). A handler that allocated device memory itself could not be
// captured into a command buffer: the memory would be freed when the handler
// returns and the captured kernels replayed on it later (docs/GPU.md).
class Workspace {
 public:
  static constexpr int64_t kAlign = 256;

  Workspace() = default;  // measures only
  Workspace(void* base, int64_t bytes) {
    const auto b = reinterpret_cast<uintptr_t>(base);
    const uintptr_t start = (b + kAlign - 1) / kAlign * kAlign;  // any alignment of base will do: needed() has room
    start_ = reinterpret_cast<uint8_t*>(start);
    capacity_ = bytes - int64_t(start - b);
  }

  // count T's (at least one, so that an empty array is not null); null once
  // the buffer is too small.
  template <typename T>
  T* Take(int64_t count) {
    const int64_t at = used_, bytes = std::max<int64_t>(count, 1) * int64_t(sizeof(T));
    used_ += (bytes + ZC_WORKSPACE_GAP + kAlign - 1) / kAlign * kAlign;
    if (!start_ || used_ > capacity_) return nullptr;
    ZC_POISON_GAP(start_ + at + bytes, used_ - at - bytes);
    return reinterpret_cast<T*>(start_ + at);
  }

  int64_t needed() const { return used_ + kAlign - 1; }  // bytes a buffer of any alignment needs
  bool ok() const { return start_ && used_ <= capacity_; }

 private:
  uint8_t* start_ = nullptr;
  int64_t capacity_ = 0, used_ = 0;
};

Workspace WorkspaceOf(ffi::Result<ffi::Buffer<ffi::U8>>& buffer) {
  return Workspace(buffer->typed_data(), int64_t(buffer->element_count()));
}

ffi::Error TooSmall(const char* op, ffi::Result<ffi::Buffer<ffi::U8>>& buffer, const Workspace& ws) {
  return Invalid(std::string(op) + ": workspace of " + std::to_string(buffer->element_count()) + " bytes, " +
                 std::to_string(ws.needed()) + " needed");
}

// Compress's arrays for `total` blocks in `total_groups` groups of `batch` items.
struct CompressArrays {
  uint32_t* refs;
  uint8_t* lens;
  uint16_t* codes;
  uint32_t* lane_bits;
  uint32_t* descs;
  int64_t* table_at;
  int64_t* body_at;
  uint8_t* stored_raw;
  PlaneScratch ps;
};

CompressArrays TakeCompressArrays(Workspace& ws, int dtype, int64_t batch, int64_t n) {
  const int64_t nb = zc::num_blocks(n), total = batch * nb, total_groups = batch * zc::num_groups(nb);
  CompressArrays a;
  a.refs = ws.Take<uint32_t>(total);
  a.lens = ws.Take<uint8_t>(total_groups * zc::kMaxSyms);
  a.codes = ws.Take<uint16_t>(total_groups * zc::kMaxSyms);
  a.lane_bits = ws.Take<uint32_t>(total * zc::kLanes);
  a.descs = ws.Take<uint32_t>(total);
  a.table_at = ws.Take<int64_t>(total_groups);
  a.body_at = ws.Take<int64_t>(total);
  a.stored_raw = ws.Take<uint8_t>(batch);
  a.ps.masks = ws.Take<int>(total_groups);
  a.ps.lens = ws.Take<uint8_t>(total_groups * zc::kMaxPlanes * zc::kPlaneSyms);
  a.ps.codes = ws.Take<uint16_t>(total_groups * zc::kMaxPlanes * zc::kPlaneSyms);
  a.ps.table_bytes = ws.Take<uint32_t>(total_groups);
  return a;
}

// What ValidateKernel learns of `streams` streams of n elements.
StreamInfo TakeStreamInfo(Workspace& ws, int dtype, int64_t streams, int64_t n) {
  const int64_t nb = zc::num_blocks(n), ng = zc::num_groups(nb);
  StreamInfo info;
  info.luts_per_group = 1 + zc::layout_of(dtype).raw_bytes;  // the symbols', then each byte plane's
  info.state = ws.Take<int8_t>(streams);
  info.body_at = ws.Take<int64_t>(streams * nb);
  info.table_at = ws.Take<int64_t>(streams * ng);
  info.table_ok = ws.Take<uint8_t>(streams * ng);
  info.refs = ws.Take<uint8_t>(streams * ng * zc::kGroupBlocks);
  info.luts = ws.Take<uint16_t>(streams * ng * info.luts_per_group * zc::kLutSize);
  return info;
}

// DecompressAccumulate's arrays: every row of every item decoded side by side.
struct AccumulateArrays {
  StreamInfo info;
  uint8_t* decoded;
};

AccumulateArrays TakeAccumulateArrays(Workspace& ws, int dtype, int64_t batch, int64_t k, int64_t n) {
  AccumulateArrays a;
  a.info = TakeStreamInfo(ws, dtype, batch * k, n);
  a.decoded = ws.Take<uint8_t>(batch * k * n * zc::layout_of(dtype).elem_bytes);
  return a;
}

// ---- handlers ----

// f(std::integral_constant<int, DT>()) for the dtype code's DT: the kernels
// that do work per element are compiled for each dtype (their layout folds to
// constants).
template <class F>
ffi::Error ForDtype(int dtype, F&& f) {
  if (dtype == zc::kBF16) return f(std::integral_constant<int, zc::kBF16>());
  if (dtype == zc::kF16) return f(std::integral_constant<int, zc::kF16>());
  return f(std::integral_constant<int, zc::kF32>());
}

// Validates and decodes streams s = 0.. nstreams - 1 (payload rows s * row_stride + row_offset) into out;
// errors go to status[row].
ffi::Error LaunchDecode(cudaStream_t stream, int dtype, const uint8_t* payload, int64_t cap, int64_t row_stride,
                        int64_t row_offset, int64_t nstreams, int64_t n, StreamInfo info, uint8_t* out,
                        uint32_t* status) {
  const int64_t ng = zc::num_groups(zc::num_blocks(n));
  ZC_LAUNCH(ValidateKernel, nstreams, kThreads, stream, dtype, payload, cap, row_stride, row_offset, nstreams, n,
            info, status);
  ZC_LAUNCH(TableKernel, (nstreams * ng + kThreads / kWarp - 1) / (kThreads / kWarp), kThreads, stream, payload, cap,
            row_stride, row_offset, nstreams, n, info);
  return ForDtype(dtype, [&](auto dt) {
    constexpr int DT = decltype(dt)::value;
    ZC_LAUNCH(DecodeKernel<DT>, nstreams * 2 * ng, kThreads, stream, payload, cap, row_stride, row_offset, nstreams,
              n, info, out, status);
    return ffi::Error::Success();
  });
}

// Compresses `batch` items of n elements at in into rows of `cap` bytes of
// out (a row holds at least the header), their lengths into sizes, with a's
// arrays. write = false stops after the layout: the headers and the lengths
// only (the size pass; out then needs only 16 bytes per row).
ffi::Error LaunchCompress(cudaStream_t stream, const CompressArrays& a, int dtype, const uint8_t* in, int64_t n,
                          int64_t batch, uint8_t* out, int64_t cap, uint32_t* sizes, bool write) {
  const int64_t nb = zc::num_blocks(n), ng = zc::num_groups(nb), total = batch * nb, total_groups = batch * ng;
  return ForDtype(dtype, [&](auto dt) {
    constexpr int DT = decltype(dt)::value;
    ZC_LAUNCH(EmaxKernel, (total + kThreads / kWarp - 1) / (kThreads / kWarp), kThreads, stream, dtype, in, n, nb,
              total, a.refs);
    ZC_LAUNCH(ChooseKernel<DT>, total_groups, kThreads, stream, in, n, nb, ng, total_groups, a.refs, a.lens, a.codes,
              a.ps);
    ZC_LAUNCH(SizeKernel<DT>, batch * 2 * ng, kThreads, stream, in, n, nb, ng, batch, a.refs, a.lens, a.codes, a.ps,
              a.lane_bits, a.descs);
    ZC_LAUNCH(LayoutKernel, batch, kThreads, stream, dtype, n, nb, ng, batch, a.ps.table_bytes, a.descs, a.table_at,
              a.body_at, a.stored_raw, out, cap, sizes);
    if (!write) return ffi::Error::Success();
    const int eb = zc::layout_of(dtype).elem_bytes;
    ZC_LAUNCH(PrepKernel, (total + kThreads - 1) / kThreads, kThreads, stream, nb, ng, batch, a.lane_bits, a.descs,
              a.body_at, a.stored_raw, out, cap, eb, n);
    ZC_LAUNCH(MetaKernel, total, kThreads, stream, dtype, in, n, nb, ng, total, a.refs, a.lens, a.ps, a.descs,
              a.table_at, a.body_at, a.stored_raw, out, cap);
    ZC_LAUNCH(BodyKernel<DT>, batch * 2 * ng, kThreads, stream, in, n, nb, ng, batch, a.refs, a.lens, a.codes, a.ps,
              a.lane_bits, a.descs, a.body_at, a.stored_raw, out, cap);
    return ffi::Error::Success();
  });
}

ffi::Error Compress(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::Buffer<ffi::U8>> payload,
                    ffi::Result<ffi::Buffer<ffi::U32>> sizes, ffi::Result<ffi::Buffer<ffi::U8>> workspace,
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
    return Invalid("compress: payload capacity " + std::to_string(cap) + " is below " + std::to_string(max_bytes) +
                   " or a stream exceeds 4 GiB");
  Workspace ws = WorkspaceOf(workspace);
  const CompressArrays a = TakeCompressArrays(ws, dtype, batch, n);
  if (!ws.ok()) return TooSmall("compress", workspace, ws);
  return LaunchCompress(stream, a, dtype, static_cast<const uint8_t*>(x.untyped_data()), n, batch,
                        payload->typed_data(), cap, sizes->typed_data(), true);
}

ffi::Error Decompress(cudaStream_t stream, ffi::Buffer<ffi::U8> payload, ffi::Result<ffi::AnyBuffer> out,
                      ffi::Result<ffi::Buffer<ffi::U32>> status, ffi::Result<ffi::Buffer<ffi::U8>> workspace,
                      int64_t n) {
  const int dtype = DTypeCode(out->element_type());
  if (dtype == 0) return Unsupported(out->element_type());
  const auto dims = payload.dimensions();
  if (dims.size() < 1 || n < 0) return Invalid("decompress: bad payload rank or item_elems");
  const int64_t cap = dims[dims.size() - 1], nstreams = Product(dims, 0, dims.size() - 1);
  if (int64_t(out->element_count()) != nstreams * n)
    return Invalid("decompress: output size disagrees with payload batch * item_elems");
  if (int64_t(status->element_count()) != nstreams) return Invalid("decompress: one status word per stream expected");
  Workspace ws = WorkspaceOf(workspace);
  const StreamInfo info = TakeStreamInfo(ws, dtype, nstreams, n);
  if (!ws.ok()) return TooSmall("decompress", workspace, ws);
  if (nstreams == 0) return ffi::Error::Success();
  uint32_t* words = status->typed_data();
  auto* decoded = static_cast<uint8_t*>(out->untyped_data());
  ZC_CUDA(cudaMemsetAsync(words, 0, nstreams * sizeof(uint32_t), stream));
  const ffi::Error launched = LaunchDecode(stream, dtype, payload.typed_data(), cap, 1, 0, nstreams, n, info, decoded, words);
  if (launched.failure()) return launched;
  ZC_LAUNCH(PoisonKernel, nstreams, kThreads, stream, words, 1, nstreams, decoded, n * zc::layout_of(dtype).elem_bytes);
  return ffi::Error::Success();
}

ffi::Error DecompressAccumulate(cudaStream_t stream, ffi::Buffer<ffi::U8> payload, ffi::Result<ffi::AnyBuffer> out,
                                ffi::Result<ffi::Buffer<ffi::U32>> status,
                                ffi::Result<ffi::Buffer<ffi::U8>> workspace, int64_t n, int32_t dtype) {
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
  if (int64_t(status->element_count()) != batch * k) return Invalid("accumulate: one status word per row expected");
  Workspace ws = WorkspaceOf(workspace);
  const AccumulateArrays a = TakeAccumulateArrays(ws, dtype, batch, k, n);
  if (!ws.ok()) return TooSmall("accumulate", workspace, ws);
  if (k == 0 || batch == 0) return ffi::Error::Success();  // no rows; out may be null when empty
  uint32_t* words = status->typed_data();
  auto* sums = static_cast<uint8_t*>(out->untyped_data());
  ZC_CUDA(cudaMemsetAsync(words, 0, batch * k * sizeof(uint32_t), stream));
  // every row at once (n == 0 too: the headers are still checked, as the CPU codec does), then each sum once
  const ffi::Error launched = LaunchDecode(stream, dtype, payload.typed_data(), cap, 1, 0, batch * k, n, a.info,
                                           a.decoded, words);
  if (launched.failure()) return launched;
  ZC_LAUNCH(SumRowsKernel, (count + kThreads - 1) / kThreads, kThreads, stream, dtype, a.decoded, batch, k, n, 0, n,
            out_dtype, sums);
  ZC_LAUNCH(PoisonKernel, batch, kThreads, stream, words, k, batch, sums, n * zc::layout_of(out_dtype).elem_bytes);
  return ffi::Error::Success();
}

// ---- the collectives' row ops: ffi/zipccl_cpu.cc says what each computes ----
//
// A row op's workspace holds what it cannot take from its operands and
// results: the rows gathered from the leaves (unless one leaf holds them as
// they are), the compressor's arrays, the worst-case streams an encode
// assembles before copying c bytes of each, the decoder's stream info. The
// decoders return a status word per row and poison a corrupt row's elements
// (decode_rows) or the whole sum (decode_accumulate_rows), as Decompress does.

// The leaves of a flat array: a handler's variadic buffers, of one dtype.
struct LeafList {
  std::vector<uint8_t*> data;
  std::vector<int64_t> size;
  int dtype = 0;
  int64_t total = 0;
};

template <typename Get>
ffi::ErrorOr<LeafList> Leaves(size_t count, Get get) {
  LeafList l;
  for (size_t i = 0; i < count; ++i) {
    auto b = get(i);
    if (b.has_error()) return ffi::Unexpected(b.error());
    const int d = DTypeCode(b->element_type());
    if (d == 0) return ffi::Unexpected(Unsupported(b->element_type()));
    if (i && d != l.dtype) return ffi::Unexpected(Invalid("the leaves differ in dtype"));
    l.dtype = d;
    l.data.push_back(static_cast<uint8_t*>(b->untyped_data()));
    l.size.push_back(int64_t(b->element_count()));
    l.total += l.size.back();
  }
  if (count == 0) return ffi::Unexpected(Invalid("the row ops need an array"));
  return l;
}

ffi::ErrorOr<LeafList> ArgLeaves(const ffi::RemainingArgs& args) {
  return Leaves(args.size(), [&](size_t i) { return args.get<ffi::AnyBuffer>(i); });
}

// The results but the last `skip` (status words, workspace) as leaves.
ffi::ErrorOr<LeafList> RetLeaves(const ffi::RemainingRets& rets, size_t skip) {
  return Leaves(rets.size() - skip, [&](size_t i) -> ffi::ErrorOr<ffi::AnyBuffer> {
    auto r = rets.get<ffi::AnyBuffer>(i);
    if (r.has_error()) return ffi::Unexpected(r.error());
    return **r;
  });
}

// Result i of rets as a uint8 or uint32 buffer (status words, workspace).
template <ffi::DataType T>
ffi::ErrorOr<ffi::Result<ffi::Buffer<T>>> RetAt(const ffi::RemainingRets& rets, size_t i) {
  return rets.get<ffi::Buffer<T>>(i);
}

// Whether the rows are one leaf as it lies: [k, m], no padding, no interleaving.
bool InPlace(const zc::RowLayout& l, int64_t leaves) {
  return leaves == 1 && (l.unit == 0 || l.main == 0) && l.size == l.rows * l.m;
}

ffi::Error CheckRows(const zc::RowLayout& l, int dtype) {
  if (l.rows < 1) return Invalid("the row ops need at least one row");
  if (zc::max_stream_bytes(l.m, dtype) > int64_t(UINT32_MAX)) return Invalid("a row's stream could exceed 4 GiB");
  return ffi::Error::Success();
}

// The row ops' workspace arrays; null where an op needs none.
struct RowArrays {
  uint8_t* rows = nullptr;     // the rows' elements [k, m], unless in place
  CompressArrays compress{};   // size pass and encode
  uint8_t* streams = nullptr;  // size pass: k headers; encode: k worst-case streams
  uint32_t* lengths = nullptr;  // encode
  StreamInfo info{};            // decoders
  uint8_t* decoded = nullptr;   // accumulate: every row, side by side
};

enum class RowOp { kSizes, kEncode, kEncodeRaw, kDecode, kAccumulate };

// part_rows: the most rows one received part holds (decode).
RowArrays TakeRowArrays(Workspace& ws, RowOp op, int dtype, const zc::RowLayout& l, int64_t leaves,
                        int64_t part_rows) {
  RowArrays a;
  const int64_t eb = zc::layout_of(dtype).elem_bytes;
  if (op != RowOp::kAccumulate && !InPlace(l, leaves)) a.rows = ws.Take<uint8_t>(l.rows * l.m * eb);
  if (op == RowOp::kSizes || op == RowOp::kEncode) a.compress = TakeCompressArrays(ws, dtype, l.rows, l.m);
  if (op == RowOp::kSizes) a.streams = ws.Take<uint8_t>(l.rows * zc::kHeaderBytes);
  if (op == RowOp::kEncode) {
    a.streams = ws.Take<uint8_t>(l.rows * zc::max_stream_bytes(l.m, dtype));
    a.lengths = ws.Take<uint32_t>(l.rows);
  }
  if (op == RowOp::kDecode) a.info = TakeStreamInfo(ws, dtype, part_rows, l.m);
  if (op == RowOp::kAccumulate) {  // l: the summed elements as one row; part_rows: all the rows
    a.info = TakeStreamInfo(ws, dtype, part_rows, l.m);
    a.decoded = ws.Take<uint8_t>(part_rows * l.m * eb);
  }
  return a;
}

// Moves elements between the leaves and rows ([k, m], contiguous): RowsKernel per span of leaves.
ffi::Error MoveRows(cudaStream_t stream, const zc::RowLayout& l, const LeafList& leaves, uint8_t* rows, bool to_rows) {
  const int eb = zc::layout_of(leaves.dtype).elem_bytes;
  int64_t begin = 0;
  for (size_t first = 0; first < leaves.data.size(); first += kSpanLeaves) {
    LeafSpan span{};
    span.begin = begin;
    for (size_t i = first; i < leaves.data.size() && span.count < kSpanLeaves; ++i, ++span.count) {
      span.data[span.count] = leaves.data[i];
      span.end[span.count] = (span.count ? span.end[span.count - 1] : 0) + leaves.size[i];
    }
    const int64_t n = span.end[span.count - 1];
    ZC_LAUNCH(RowsKernel, (n + kThreads - 1) / kThreads, kThreads, stream, l, span, eb, rows, to_rows);
    begin += n;
  }
  return ffi::Error::Success();
}

// The rows' elements, [k, m] contiguous: the leaf itself, or gathered into
// a.rows with the padding zeroed.
ffi::ErrorOr<const uint8_t*> RowsIn(cudaStream_t stream, const zc::RowLayout& l, const LeafList& leaves,
                                    const RowArrays& a) {
  if (!a.rows) return static_cast<const uint8_t*>(leaves.data[0]);
  const int64_t bytes = l.rows * l.m * zc::layout_of(leaves.dtype).elem_bytes;
  if (l.size < l.rows * l.m && cudaMemsetAsync(a.rows, 0, size_t(bytes), stream) != cudaSuccess)
    return ffi::Unexpected(Invalid("cudaMemsetAsync of the padding failed"));
  if (const ffi::Error e = MoveRows(stream, l, leaves, a.rows, true); e.failure()) return ffi::Unexpected(e);
  return static_cast<const uint8_t*>(a.rows);
}

// Buffers of whole rows of one capacity: encode_rows' outputs, or the received parts.
struct RowBuffers {
  std::vector<uint8_t*> data;
  std::vector<int64_t> first;  // the first row of each
  std::vector<int64_t> rows;
  int64_t cap = -1, total = 0, most = 0;

  template <typename Dims>
  bool Add(uint8_t* p, const Dims& dims, int64_t elements) {
    const int64_t c = dims.size() ? dims[dims.size() - 1] : 0;
    if (c <= 0 || (cap >= 0 && c != cap)) return false;
    cap = c;
    data.push_back(p);
    first.push_back(total);
    rows.push_back(elements / c);
    total += elements / c;
    most = std::max(most, elements / c);
    return true;
  }
};

ffi::ErrorOr<RowBuffers> Parts(const ffi::RemainingArgs& parts) {
  RowBuffers r;
  for (size_t i = 0; i < parts.size(); ++i) {
    auto b = parts.get<ffi::Buffer<ffi::U8>>(i);
    if (b.has_error()) return ffi::Unexpected(b.error());
    if (!r.Add(b->typed_data(), b->dimensions(), int64_t(b->element_count())))
      return ffi::Unexpected(Invalid("received parts differ in capacity"));
  }
  return r;
}

ffi::Error StreamSizes(cudaStream_t stream, ffi::RemainingArgs args, ffi::Result<ffi::Buffer<ffi::U32>> sizes,
                       ffi::Result<ffi::Buffer<ffi::U8>> workspace, int64_t unit) {
  auto leaves = ArgLeaves(args);
  if (leaves.has_error()) return leaves.error();
  const auto l = zc::RowLayout::of(leaves->total, int64_t(sizes->element_count()), unit);
  if (auto e = CheckRows(l, leaves->dtype); e.failure()) return e;
  Workspace ws = WorkspaceOf(workspace);
  const RowArrays a = TakeRowArrays(ws, RowOp::kSizes, leaves->dtype, l, int64_t(leaves->data.size()), 0);
  if (!ws.ok()) return TooSmall("stream_sizes", workspace, ws);
  auto in = RowsIn(stream, l, *leaves, a);
  if (in.has_error()) return in.error();
  return LaunchCompress(stream, a.compress, leaves->dtype, *in, l.m, l.rows, a.streams, zc::kHeaderBytes,
                        sizes->typed_data(), false);
}

// Results: the row buffers, optionally each stream's length (uint32 [rows]: the
// static transfer's split into a bulk and a spill), then the workspace.
ffi::Error EncodeRows(cudaStream_t stream, ffi::RemainingArgs args, ffi::RemainingRets outs, int64_t rows, int64_t unit,
                      bool raw) {
  auto leaves = ArgLeaves(args);
  if (leaves.has_error()) return leaves.error();
  const int dtype = leaves->dtype;
  const auto l = zc::RowLayout::of(leaves->total, rows, unit);
  if (auto e = CheckRows(l, dtype); e.failure()) return e;
  if (outs.size() < 2) return Invalid("encode_rows: row buffers and a workspace expected");
  uint32_t* lengths = nullptr;
  size_t buffers = outs.size() - 1;
  if (auto b = RetAt<ffi::DataType::U32>(outs, buffers - 1); buffers > 1 && !b.has_error()) {
    if (int64_t((*b)->element_count()) != rows) return Invalid("encode_rows: one length per row expected");
    if (raw) return Invalid("encode_rows: raw streams have no lengths to return");
    lengths = (*b)->typed_data();
    --buffers;
  }
  RowBuffers out;
  for (size_t i = 0; i < buffers; ++i) {
    auto b = outs.get<ffi::Buffer<ffi::U8>>(i);
    if (b.has_error()) return b.error();
    if (!out.Add((*b)->typed_data(), (*b)->dimensions(), int64_t((*b)->element_count())))
      return Invalid("encode_rows outputs differ in capacity");
  }
  if (out.total != rows) return Invalid("encode_rows outputs do not hold the rows");
  const int64_t max_bytes = zc::max_stream_bytes(l.m, dtype), eb = zc::layout_of(dtype).elem_bytes;
  if (raw && out.cap < max_bytes) return Invalid("encode_rows: raw streams need their full capacity");
  auto workspace = RetAt<ffi::DataType::U8>(outs, outs.size() - 1);
  if (workspace.has_error()) return workspace.error();
  Workspace ws = WorkspaceOf(*workspace);
  const RowArrays a = TakeRowArrays(ws, raw ? RowOp::kEncodeRaw : RowOp::kEncode, dtype, l,
                                    int64_t(leaves->data.size()), 0);
  if (!ws.ok()) return TooSmall("encode_rows", *workspace, ws);
  auto in = RowsIn(stream, l, *leaves, a);
  if (in.has_error()) return in.error();
  if (!raw)
    if (const ffi::Error e = LaunchCompress(stream, a.compress, dtype, *in, l.m, rows, a.streams, max_bytes, a.lengths,
                                            true);
        e.failure())
      return e;
  if (lengths) ZC_CUDA(cudaMemcpyAsync(lengths, a.lengths, size_t(rows) * sizeof(uint32_t), cudaMemcpyDeviceToDevice,
                                       stream));
  for (size_t o = 0; o < out.data.size(); ++o) {
    const int64_t first = out.first[o], n = out.rows[o];
    if (raw)
      ZC_LAUNCH(RawRowsKernel, (n * out.cap + kThreads - 1) / kThreads, kThreads, stream, dtype, *in + first * l.m * eb,
                l.m, n, out.data[o], out.cap);
    else
      ZC_LAUNCH(CopyRowsKernel, (n * out.cap + kThreads - 1) / kThreads, kThreads, stream,
                a.streams + first * max_bytes, max_bytes, a.lengths + first, n, out.data[o], out.cap);
  }
  return ffi::Error::Success();
}

// Results: the leaves, a status word per row, the workspace.
ffi::Error DecodeRows(cudaStream_t stream, ffi::RemainingArgs args, ffi::RemainingRets outs, int64_t unit) {
  if (outs.size() < 3) return Invalid("decode_rows: leaves, status words and a workspace expected");
  auto leaves = RetLeaves(outs, 2);
  if (leaves.has_error()) return leaves.error();
  auto parts = Parts(args);
  if (parts.has_error()) return parts.error();
  auto status = RetAt<ffi::DataType::U32>(outs, outs.size() - 2);
  auto workspace = RetAt<ffi::DataType::U8>(outs, outs.size() - 1);
  if (status.has_error()) return status.error();
  if (workspace.has_error()) return workspace.error();
  const int dtype = leaves->dtype;
  const auto l = zc::RowLayout::of(leaves->total, parts->total, unit);
  if (auto e = CheckRows(l, dtype); e.failure()) return e;
  if (int64_t((*status)->element_count()) != l.rows) return Invalid("decode_rows: one status word per row expected");
  Workspace ws = WorkspaceOf(*workspace);
  const RowArrays a = TakeRowArrays(ws, RowOp::kDecode, dtype, l, int64_t(leaves->data.size()), parts->most);
  if (!ws.ok()) return TooSmall("decode_rows", *workspace, ws);
  const int64_t row_bytes = l.m * zc::layout_of(dtype).elem_bytes;
  uint8_t* rows = a.rows ? a.rows : leaves->data[0];
  uint32_t* words = (*status)->typed_data();
  ZC_CUDA(cudaMemsetAsync(words, 0, size_t(l.rows) * sizeof(uint32_t), stream));
  for (size_t p = 0; p < parts->data.size(); ++p) {
    const ffi::Error launched = LaunchDecode(stream, dtype, parts->data[p], parts->cap, 1, 0, parts->rows[p], l.m,
                                             a.info, rows + parts->first[p] * row_bytes, words + parts->first[p]);
    if (launched.failure()) return launched;
  }
  ZC_LAUNCH(PoisonKernel, l.rows, kThreads, stream, words, 1, l.rows, rows, row_bytes);
  if (a.rows) return MoveRows(stream, l, *leaves, a.rows, false);
  return ffi::Error::Success();
}

// Results: the leaves (the sums), a status word per row, the workspace.
ffi::Error DecodeAccumulateRows(cudaStream_t stream, ffi::RemainingArgs args, ffi::RemainingRets outs, int32_t dtype) {
  if (dtype < zc::kBF16 || dtype > zc::kF32) return Invalid("accumulate: bad dtype code");
  if (outs.size() < 3) return Invalid("accumulate: sums, status words and a workspace expected");
  auto leaves = RetLeaves(outs, 2);
  if (leaves.has_error()) return leaves.error();
  if (leaves->dtype != dtype && leaves->dtype != zc::kF32)
    return Invalid("accumulate: output dtype must be the payload dtype or float32");
  auto parts = Parts(args);
  if (parts.has_error()) return parts.error();
  auto status = RetAt<ffi::DataType::U32>(outs, outs.size() - 2);
  auto workspace = RetAt<ffi::DataType::U8>(outs, outs.size() - 1);
  if (status.has_error()) return status.error();
  if (workspace.has_error()) return workspace.error();
  if (parts->total < 1) return Invalid("accumulate: needs at least one row");
  if (int64_t((*status)->element_count()) != parts->total) return Invalid("accumulate: one status word per row expected");
  const int64_t m = leaves->total, rows = parts->total, eb = zc::layout_of(dtype).elem_bytes;
  const auto l = zc::RowLayout::of(m, 1, 0);
  Workspace ws = WorkspaceOf(*workspace);
  const RowArrays a = TakeRowArrays(ws, RowOp::kAccumulate, dtype, l, int64_t(leaves->data.size()), rows);
  if (!ws.ok()) return TooSmall("accumulate", *workspace, ws);
  uint32_t* words = (*status)->typed_data();
  ZC_CUDA(cudaMemsetAsync(words, 0, size_t(rows) * sizeof(uint32_t), stream));
  for (size_t p = 0; p < parts->data.size(); ++p) {  // each part's rows at once (m == 0: the headers are checked)
    const ffi::Error launched = LaunchDecode(stream, dtype, parts->data[p], parts->cap, 1, 0, parts->rows[p], m, a.info,
                                             a.decoded + parts->first[p] * m * eb, words + parts->first[p]);
    if (launched.failure()) return launched;
  }
  // each leaf's sums once, over the rows in order; a corrupt row poisons every sum (the words keep
  // their status once the last leaf is poisoned)
  int64_t at = 0;
  for (size_t i = 0; i < leaves->data.size(); at += leaves->size[i++]) {
    const int64_t count = leaves->size[i];
    ZC_LAUNCH(SumRowsKernel, (count + kThreads - 1) / kThreads, kThreads, stream, dtype, a.decoded, 1, rows, m, at,
              count, leaves->dtype, leaves->data[i]);
    ZC_LAUNCH(PoisonKernel, 1, kThreads, stream, words, rows, 1, leaves->data[i], count * zc::layout_of(leaves->dtype).elem_bytes);
  }
  return ffi::Error::Success();
}

}  // namespace

// The handlers launch the same kernels for the same shapes and attributes,
// wait for nothing and allocate nothing: compatible with XLA's command buffers.
XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclCompressCuda, Compress,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::U8>>()   // payload
                                  .Ret<ffi::Buffer<ffi::U32>>()  // sizes
                                  .Ret<ffi::Buffer<ffi::U8>>()   // workspace
                                  .Attr<int64_t>("item_elems"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclDecompressCuda, Decompress,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::AnyBuffer>()         // decoded
                                  .Ret<ffi::Buffer<ffi::U32>>()  // status words
                                  .Ret<ffi::Buffer<ffi::U8>>()   // workspace
                                  .Attr<int64_t>("item_elems"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclDecompressAccumulateCuda, DecompressAccumulate,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::AnyBuffer>()         // sums
                                  .Ret<ffi::Buffer<ffi::U32>>()  // status words
                                  .Ret<ffi::Buffer<ffi::U8>>()   // workspace
                                  .Attr<int64_t>("item_elems")
                                  .Attr<int32_t>("dtype"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclStreamSizesCuda, StreamSizes,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .RemainingArgs()               // the leaves
                                  .Ret<ffi::Buffer<ffi::U32>>()  // sizes
                                  .Ret<ffi::Buffer<ffi::U8>>()   // workspace
                                  .Attr<int64_t>("unit"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclEncodeRowsCuda, EncodeRows,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .RemainingArgs()  // the leaves
                                  .RemainingRets()  // the row buffers, the workspace
                                  .Attr<int64_t>("rows")
                                  .Attr<int64_t>("unit")
                                  .Attr<bool>("raw"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclDecodeRowsCuda, DecodeRows,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .RemainingArgs()  // the received parts
                                  .RemainingRets()  // the leaves, status words, the workspace
                                  .Attr<int64_t>("unit"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclDecodeAccumulateRowsCuda, DecodeAccumulateRows,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .RemainingArgs()  // the received parts
                                  .RemainingRets()  // the sums' leaves, status words, the workspace
                                  .Attr<int32_t>("dtype"),
                              {ffi::Traits::kCmdBufferCompatible});

// ---- for the host: workspace sizes, timing ----

namespace zipccl_cuda {

int64_t CompressWorkspaceBytes(int dtype, int64_t batch, int64_t n) {
  Workspace ws;
  TakeCompressArrays(ws, dtype, batch, n);
  return ws.needed();
}

int64_t DecompressWorkspaceBytes(int dtype, int64_t streams, int64_t n) {
  Workspace ws;
  TakeStreamInfo(ws, dtype, streams, n);
  return ws.needed();
}

int64_t AccumulateWorkspaceBytes(int dtype, int64_t batch, int64_t k, int64_t n) {
  Workspace ws;
  TakeAccumulateArrays(ws, dtype, batch, k, n);
  return ws.needed();
}

int64_t RowsWorkspaceBytes(const std::string& op, int dtype, int64_t rows, int64_t size, int64_t unit, int64_t leaves,
                           int64_t part_rows) {
  const RowOp kind = op == "zipccl_stream_sizes" ? RowOp::kSizes
                     : op == "zipccl_encode_rows" ? RowOp::kEncode
                     : op == "zipccl_encode_rows_raw" ? RowOp::kEncodeRaw
                     : op == "zipccl_decode_rows" ? RowOp::kDecode
                                                  : RowOp::kAccumulate;
  Workspace ws;
  TakeRowArrays(ws, kind, dtype, zc::RowLayout::of(size, rows, unit), leaves, part_rows);
  return ws.needed();
}

namespace {

// Device memory, events and a stream for the timers, released on every path.
struct TimingResources {
  std::vector<void*> buffers;
  cudaEvent_t events[2] = {};
  cudaStream_t stream = nullptr;
  ffi::Error Start(int device) {  // on CUDA device `device`: the stream and the events
    ZC_CUDA(cudaSetDevice(device));
    ZC_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (cudaEvent_t& e : events) ZC_CUDA(cudaEventCreate(&e));
    return ffi::Error::Success();
  }
  ~TimingResources() {
    for (void* p : buffers) cudaFree(p);
    for (cudaEvent_t e : events)
      if (e) cudaEventDestroy(e);
    if (stream) cudaStreamDestroy(stream);
  }
  template <typename T>
  cudaError_t Alloc(int64_t bytes, T** p) {
    void* v = nullptr;
    const cudaError_t e = cudaMalloc(&v, size_t(std::max<int64_t>(bytes, 1)));
    if (e == cudaSuccess) buffers.push_back(v);
    *p = static_cast<T*>(v);
    return e;
  }
};

// An XLA FFI buffer over device memory, to call the handlers outside XLA: [d0, d1], or [d0, d1, d2].
struct DeviceView {
  int64_t dims[3];
  XLA_FFI_Buffer buffer;
  DeviceView(ffi::DataType type, void* data, int64_t d0, int64_t d1, int64_t d2 = -1) : dims{d0, d1, d2} {
    buffer = {XLA_FFI_Buffer_STRUCT_SIZE, nullptr, static_cast<XLA_FFI_DataType>(type), data, d2 < 0 ? 2 : 3, dims};
  }
};

// Milliseconds per call of fn between two of r's events, `repeat` calls after a warm-up.
template <typename Fn>
ffi::Error TimeCalls(TimingResources& r, int repeat, Fn fn, double* ms) {
  if (const ffi::Error e = fn(); e.failure()) return e;  // warm-up
  ZC_CUDA(cudaEventRecord(r.events[0], r.stream));
  for (int i = 0; i < repeat; ++i)
    if (const ffi::Error e = fn(); e.failure()) return e;
  ZC_CUDA(cudaEventRecord(r.events[1], r.stream));
  ZC_CUDA(cudaEventSynchronize(r.events[1]));
  float elapsed;
  ZC_CUDA(cudaEventElapsedTime(&elapsed, r.events[0], r.events[1]));
  *ms = elapsed / repeat;
  return ffi::Error::Success();
}

ffi::DataType XlaType(int dtype) {
  return dtype == zc::kBF16 ? ffi::DataType::BF16 : dtype == zc::kF16 ? ffi::DataType::F16 : ffi::DataType::F32;
}

ffi::Error TimeCodecOn(int device, int dtype, const void* host_input, int64_t n, int repeat,
                       zipccl_cuda::CodecTiming* timing) {
  if (dtype < zc::kBF16 || dtype > zc::kF32 || n < 0 || repeat < 1) return Invalid("time_codec: bad arguments");
  const int64_t bytes = n * zc::layout_of(dtype).elem_bytes, cap = zc::max_stream_bytes(n, dtype);
  const int64_t c_ws = zipccl_cuda::CompressWorkspaceBytes(dtype, 1, n);
  const int64_t d_ws = zipccl_cuda::DecompressWorkspaceBytes(dtype, 1, n);
  TimingResources r;
  uint8_t *x, *payload, *y, *copy, *c_work, *d_work;
  uint32_t *sizes, *status;
  if (const ffi::Error e = r.Start(device); e.failure()) return e;
  ZC_CUDA(r.Alloc(bytes, &x));
  ZC_CUDA(r.Alloc(cap, &payload));
  ZC_CUDA(r.Alloc(bytes, &y));
  ZC_CUDA(r.Alloc(bytes, &copy));
  ZC_CUDA(r.Alloc(c_ws, &c_work));
  ZC_CUDA(r.Alloc(d_ws, &d_work));
  ZC_CUDA(r.Alloc(sizeof(uint32_t), &sizes));
  ZC_CUDA(r.Alloc(sizeof(uint32_t), &status));
  ZC_CUDA(cudaMemcpyAsync(x, host_input, size_t(bytes), cudaMemcpyHostToDevice, r.stream));
  DeviceView vx(XlaType(dtype), x, 1, n), vpayload(ffi::DataType::U8, payload, 1, cap), vy(XlaType(dtype), y, 1, n),
      vsizes(ffi::DataType::U32, sizes, 1, 1), vstatus(ffi::DataType::U32, status, 1, 1),
      vc_work(ffi::DataType::U8, c_work, 1, c_ws), vd_work(ffi::DataType::U8, d_work, 1, d_ws);
  const auto compress = [&] {
    return Compress(r.stream, ffi::AnyBuffer(&vx.buffer), ffi::Buffer<ffi::U8>(&vpayload.buffer),
                    ffi::Buffer<ffi::U32>(&vsizes.buffer), ffi::Buffer<ffi::U8>(&vc_work.buffer), n);
  };
  const auto decompress = [&] {
    return Decompress(r.stream, ffi::Buffer<ffi::U8>(&vpayload.buffer), ffi::AnyBuffer(&vy.buffer),
                      ffi::Buffer<ffi::U32>(&vstatus.buffer), ffi::Buffer<ffi::U8>(&vd_work.buffer), n);
  };
  const auto copy_input = [&]() -> ffi::Error {
    ZC_CUDA(cudaMemcpyAsync(copy, x, size_t(bytes), cudaMemcpyDeviceToDevice, r.stream));
    return ffi::Error::Success();
  };
  if (const ffi::Error e = TimeCalls(r, repeat, compress, &timing->compress_ms); e.failure()) return e;
  if (const ffi::Error e = TimeCalls(r, repeat, decompress, &timing->decompress_ms); e.failure()) return e;
  if (const ffi::Error e = TimeCalls(r, repeat, copy_input, &timing->copy_ms); e.failure()) return e;
  std::vector<uint8_t> back(size_t(bytes) + 2 * sizeof(uint32_t));
  ZC_CUDA(cudaMemcpyAsync(back.data(), y, size_t(bytes), cudaMemcpyDeviceToHost, r.stream));
  ZC_CUDA(cudaMemcpyAsync(back.data() + bytes, sizes, sizeof(uint32_t), cudaMemcpyDeviceToHost, r.stream));
  ZC_CUDA(cudaMemcpyAsync(back.data() + bytes + 4, status, sizeof(uint32_t), cudaMemcpyDeviceToHost, r.stream));
  ZC_CUDA(cudaStreamSynchronize(r.stream));
  uint32_t words[2];
  std::memcpy(words, back.data() + bytes, sizeof(words));
  timing->compressed_bytes = words[0];
  timing->round_trip = words[1] == 0 && (bytes == 0 || std::memcmp(back.data(), host_input, size_t(bytes)) == 0);
  return ffi::Error::Success();
}

ffi::Error TimeRowsOn(int device, int dtype, const void* host_input, int64_t n, int64_t rows, int repeat,
                      zipccl_cuda::RowsTiming* timing) {
  if (dtype < zc::kBF16 || dtype > zc::kF32 || rows < 1 || n % rows || repeat < 1)
    return Invalid("time_rows: bad arguments (the elements must cut into the rows)");
  const int64_t m = n / rows, eb = zc::layout_of(dtype).elem_bytes, cap = zc::max_stream_bytes(m, dtype);
  const int64_t c_ws = zipccl_cuda::CompressWorkspaceBytes(dtype, rows, m);
  const int64_t a_ws = zipccl_cuda::AccumulateWorkspaceBytes(dtype, 1, rows, m);
  TimingResources r;
  uint8_t *x, *payload, *sum, *c_work, *a_work;
  uint32_t *sizes, *status;
  if (const ffi::Error e = r.Start(device); e.failure()) return e;
  ZC_CUDA(r.Alloc(n * eb, &x));
  ZC_CUDA(r.Alloc(rows * cap, &payload));
  ZC_CUDA(r.Alloc(m * eb, &sum));
  ZC_CUDA(r.Alloc(c_ws, &c_work));
  ZC_CUDA(r.Alloc(a_ws, &a_work));
  ZC_CUDA(r.Alloc(rows * sizeof(uint32_t), &sizes));
  ZC_CUDA(r.Alloc(rows * sizeof(uint32_t), &status));
  ZC_CUDA(cudaMemcpyAsync(x, host_input, size_t(n * eb), cudaMemcpyHostToDevice, r.stream));
  DeviceView vx(XlaType(dtype), x, rows, m), vrows(ffi::DataType::U8, payload, rows, cap),
      vsizes(ffi::DataType::U32, sizes, 1, rows), vc_work(ffi::DataType::U8, c_work, 1, c_ws),
      vparts(ffi::DataType::U8, payload, 1, rows, cap), vsum(XlaType(dtype), sum, 1, m),
      vstatus(ffi::DataType::U32, status, 1, rows), va_work(ffi::DataType::U8, a_work, 1, a_ws);
  const auto encode = [&] {
    return Compress(r.stream, ffi::AnyBuffer(&vx.buffer), ffi::Buffer<ffi::U8>(&vrows.buffer),
                    ffi::Buffer<ffi::U32>(&vsizes.buffer), ffi::Buffer<ffi::U8>(&vc_work.buffer), m);
  };
  const auto reduce = [&] {
    return DecompressAccumulate(r.stream, ffi::Buffer<ffi::U8>(&vparts.buffer), ffi::AnyBuffer(&vsum.buffer),
                                ffi::Buffer<ffi::U32>(&vstatus.buffer), ffi::Buffer<ffi::U8>(&va_work.buffer), m,
                                int32_t(dtype));
  };
  Workspace size_ws(c_work, c_ws);  // the size pass alone: Compress's kernels up to the layout (StreamSizes)
  const CompressArrays size_arrays = TakeCompressArrays(size_ws, dtype, rows, m);
  const auto size_pass = [&] {
    return LaunchCompress(r.stream, size_arrays, dtype, x, m, rows, payload, cap, sizes, false);
  };
  if (const ffi::Error e = TimeCalls(r, repeat, size_pass, &timing->size_ms); e.failure()) return e;
  if (const ffi::Error e = TimeCalls(r, repeat, encode, &timing->encode_ms); e.failure()) return e;
  if (const ffi::Error e = TimeCalls(r, repeat, reduce, &timing->reduce_ms); e.failure()) return e;
  std::vector<uint32_t> words(size_t(2 * rows));
  ZC_CUDA(cudaMemcpyAsync(words.data(), sizes, size_t(rows) * 4, cudaMemcpyDeviceToHost, r.stream));
  ZC_CUDA(cudaMemcpyAsync(words.data() + rows, status, size_t(rows) * 4, cudaMemcpyDeviceToHost, r.stream));
  ZC_CUDA(cudaStreamSynchronize(r.stream));
  timing->compressed_bytes = 0;
  timing->decoded = true;
  for (int64_t j = 0; j < rows; ++j) {
    timing->compressed_bytes += words[size_t(j)];
    timing->decoded = timing->decoded && words[size_t(rows + j)] == 0;
  }
  return ffi::Error::Success();
}

}  // namespace

std::string TimeRows(int device, int dtype, const void* host_input, int64_t n, int64_t rows, int repeat,
                     RowsTiming* timing) {
  const ffi::Error e = TimeRowsOn(device, dtype, host_input, n, rows, repeat, timing);
  return e.failure() ? e.message() : std::string();
}

std::string TimeCodec(int device, int dtype, const void* host_input, int64_t n, int repeat, CodecTiming* timing) {
  const ffi::Error e = TimeCodecOn(device, dtype, host_input, n, repeat, timing);
  return e.failure() ? e.message() : std::string();
}

}  // namespace zipccl_cuda
