// CUDA codec for the zipccl byte format, version 6 (docs/FORMAT.md), as XLA
// FFI handlers: they write version 6 streams and read version 6 only.
//
// Every format decision is a shared function of format6.h (the same ones the
// CPU codec runs) or a kernel tested byte for byte against the reference
// (tests/test_cuda6_emulation.py); this file (the host side) only checks the
// operands, carves the working arrays out of the workspace result and
// launches. ffi/zipccl_cpu.cc says what each row op computes. docs/GPU.md
// has the kernels' performance model.
//
// compress:    GroupKernel (CTA per group of 16 blocks: refs, histograms, the
//              family's and the group code's sizes, the choices) -> ScanKernel
//              (CTA per stream: offsets, length, header) -> CodeKernel (warp
//              per block: descriptor and record); cuda6_compress.cuh.
// decompress:  DecodeKernel (persistent CTAs, a run per stream; warp per
//              block; cuda6_decompress.cuh) -> FinishKernel (status words,
//              poison).
// accumulate:  AccumulateKernel (past 8 rows, each row's group codes worked
//              out once by WarpCodesKernel): per block, rows 0, 1, ..., k - 1
//              decoded 8 at once (a warp a row; 4 rows or fewer: the rows of
//              several blocks at once) into shared memory and added in row
//              order to float32 sums in registers (no decoded row in memory);
//              rounded once -> FinishKernel (a failing row poisons its item's
//              sums).
// row ops:     the same kernels on the rows (zipccl_rows.h: gathered from the
//              leaves by RowsKernel unless one leaf holds them as they are);
//              the size pass is GroupKernel and ScanKernel alone.
//
// Batches: a batch of streams (the items of compress, a part's rows) is one
// set of launches, the kernels taking their stream from blockIdx.x, not a set
// per stream: a psum bucket's k rows or a batch of a thousand small items
// would otherwise cost 3 k launches (a few microseconds each, more than the
// work of a small stream) and leave the GPU idle between them. Streams may
// start at any byte (a capacity that is not a multiple of 4): the kernels
// align their word accesses to the address.
//
// Tables: the family's (108 KB) are kDeviceTables, a __device__ global
// initialised at compile time (cuda6_device.cuh, MakeTables): no call copies
// or builds them.
//
// Decoders' verdicts: a u64 per stream in the workspace (~0, or (the first
// failing block + 1) << 8 | Status, or a header's Status alone: the lowest
// wins, as the reference's first error); FinishKernel turns each into the
// handler's uint32 status word, 0 or the Status alone (what
// zipccl_jax.ops.corrupt_payload_error reads as the CPU codec's error code).
//
// Grids are sized from the device's SM count. Byte offsets are 64-bit. The
// handlers never wait for the device, copy nothing between host and device,
// allocate nothing (their working arrays are a result XLA allocates) and
// launch the same kernels for the same shapes, so XLA may capture them into
// command buffers (docs/GPU.md).
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
#include "cuda6_codec.cuh"
#include "cuda6_rows.cuh"
#include "format6.h"
#include "zipccl_cuda_host.h"
#include "zipccl_rows.h"

namespace ffi = xla::ffi;
namespace zc = zipccl;
namespace c6 = zipccl::cuda6;

namespace {

using c6::kThreads;
using c6::Max;
using c6::Min;

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

constexpr int kThreadsPerSm = 2048;

// The device's SMs (the codec kernels' grids).
ffi::ErrorOr<int> Sms() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return ffi::Unexpected(ffi::Error(ffi::ErrorCode::kInternal, "zipccl: cannot read the device's SM count"));
  return sms;
}

// Launches one of cuda6_rows.cuh's kernels on kThreads-thread CUDA blocks, as
// many as the device's SMs hold at once or one per unit of work if fewer;
// none if work == 0. The kernels loop over their work.
#define ZC_LAUNCH(kernel, work, stream, ...)                                                 \
  do {                                                                                       \
    if ((work) > 0) {                                                                        \
      const auto sms_ = Sms();                                                               \
      if (sms_.has_error()) return sms_.error();                                             \
      const int64_t g_ = Min<int64_t>(work, int64_t(*sms_) * (kThreadsPerSm / kThreads));     \
      ZC_LAUNCH_KERNEL(kernel, unsigned(g_), kThreads, stream, __VA_ARGS__);                 \
      ZC_CUDA(cudaGetLastError());                                                           \
    }                                                                                        \
  } while (0)

// Format dtype code of an XLA element type, 0 if unsupported.
int DTypeCode(ffi::DataType t) {
  if (t == ffi::DataType::BF16) return zc::kBF16;
  if (t == ffi::DataType::F16) return zc::kF16;
  if (t == ffi::DataType::F32) return zc::kF32;
  return 0;
}

int ElemBytes(int dtype) { return zc::v6::layout_of(dtype).elem_bytes; }

// A stream's most bytes (STORED_RAW), and whether a stream of n elements fits the u32 offsets.
int64_t MaxStreamBytes(int64_t n, int dtype) { return zc::kHeaderBytes + n * ElemBytes(dtype); }
bool StreamFits(int64_t n, int dtype) { return MaxStreamBytes(n, dtype) <= int64_t(UINT32_MAX); }

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

// The compress kernels' arrays (cuda6_compress.cuh, Workspace) for `items` streams of n elements.
c6::Workspace TakeCompress(Workspace& ws, int64_t n, int64_t items) {
  const int64_t nb = items * c6::NumBlocks(n), ng = items * c6::NumGroups(n);
  c6::Workspace a;
  a.plan = ws.Take<uint64_t>(nb);
  a.rsize = ws.Take<uint32_t>(nb);
  a.lanes = ws.Take<uint16_t>(nb * c6::kWarp);
  a.gbytes = ws.Take<uint32_t>(ng);
  a.goff = ws.Take<uint64_t>(ng);
  a.glens = ws.Take<uint8_t>(ng * zc::v6::kNumSyms);
  a.gput = ws.Take<uint32_t>(ng * zc::v6::kNumSyms);
  a.flags = ws.Take<uint32_t>(items);
  return a;
}

// The reduce step's arrays for `items` items of k rows of n elements: the rows' pointers, the
// rows' group codes where they are more than AccumulateKernel's row warps (c6::CodeCacheBytes),
// the rows' verdicts (the sums are in registers).
struct SumArrays {
  const uint8_t** rows;
  void* codes;
  unsigned long long* verdicts;
};

SumArrays TakeSums(Workspace& ws, int dtype, int64_t items, int64_t k, int64_t n) {
  SumArrays a;
  a.rows = ws.Take<const uint8_t*>(items * k);
  const int64_t code_bytes = c6::CodeCacheBytes(dtype, items, k, n);
  a.codes = code_bytes ? ws.Take<uint8_t>(code_bytes) : nullptr;
  a.verdicts = ws.Take<unsigned long long>(items * k);
  return a;
}

// ---- handlers ----

// The pointers of `rows` rows of `pitch` bytes in parts (buffers end to end) into ptrs.
ffi::Error RowPointers(cudaStream_t stream, const std::vector<uint8_t*>& data, const std::vector<int64_t>& rows,
                       int64_t pitch, const uint8_t** ptrs) {
  int64_t begin = 0;
  for (size_t first = 0; first < data.size(); first += c6::kSpanLeaves) {
    c6::Span span{};
    span.begin = begin;
    for (size_t i = first; i < data.size() && span.count < c6::kSpanLeaves; ++i, ++span.count) {
      span.data[span.count] = data[i];
      span.end[span.count] = (span.count ? span.end[span.count - 1] : 0) + rows[i];
    }
    const int64_t n = span.end[span.count - 1];
    ZC_LAUNCH(c6::RowPointersKernel, (n + kThreads - 1) / kThreads, stream, span, pitch, ptrs);
    begin += n;
  }
  return ffi::Error::Success();
}

// The reduce step of `items` items of k rows (a.rows, size bytes each) of n elements of dtype
// into out (out_dtype) and the status words, a failing row's item poisoned.
ffi::Error LaunchSums(cudaStream_t stream, const SumArrays& a, int dtype, int64_t size, int64_t k, int64_t n,
                      int64_t items, int out_dtype, uint8_t* out, uint32_t* words) {
  const auto sms = Sms();
  if (sms.has_error()) return sms.error();
  int device = 0, smem_block = 0, smem_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) != cudaSuccess)
    return ffi::Error(ffi::ErrorCode::kInternal, "zipccl: cannot read the device's shared memory sizes");
  ZC_CUDA(cudaMemsetAsync(a.verdicts, 0xFF, size_t(items * k) * sizeof(unsigned long long), stream));
  ZC_CUDA(c6::Accumulate(dtype, a.rows, size, k, n, items, a.codes, out_dtype, out, a.verdicts, nullptr, *sms,
                         smem_block, smem_sm, stream));
  ZC_CUDA(cudaGetLastError());
  ZC_LAUNCH(c6::FinishKernel, items, stream, a.verdicts, k, items, words, out, n * ElemBytes(out_dtype));
  return ffi::Error::Success();
}

// Decodes `items` streams (in + i pitch, size bytes each) of n elements into out; verdicts
// (workspace) into the status words, a failing stream's elements poisoned.
ffi::Error LaunchDecode(cudaStream_t stream, int dtype, const uint8_t* in, int64_t pitch, int64_t size, int64_t n,
                        int64_t items, uint8_t* out, unsigned long long* verdicts) {
  const auto sms = Sms();
  if (sms.has_error()) return sms.error();
  c6::DecompressBatch(dtype, in, pitch, size, n, items, out, verdicts, nullptr, *sms, stream);
  ZC_CUDA(cudaGetLastError());
  return ffi::Error::Success();
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
  const int64_t max_bytes = MaxStreamBytes(n, dtype);
  if (cap < max_bytes || !StreamFits(n, dtype))
    return Invalid("compress: payload capacity " + std::to_string(cap) + " is below " + std::to_string(max_bytes) +
                   " or a stream exceeds 4 GiB");
  Workspace ws = WorkspaceOf(workspace);
  const c6::Workspace a = TakeCompress(ws, n, batch);
  if (!ws.ok()) return TooSmall("compress", workspace, ws);
  c6::CompressBatch(dtype, x.untyped_data(), n, batch, payload->typed_data(), cap, nullptr, sizes->typed_data(), a,
                    nullptr, true, stream);
  ZC_CUDA(cudaGetLastError());
  return ffi::Error::Success();
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
  auto* verdicts = ws.Take<unsigned long long>(nstreams);
  if (!ws.ok()) return TooSmall("decompress", workspace, ws);
  if (nstreams == 0) return ffi::Error::Success();
  auto* decoded = static_cast<uint8_t*>(out->untyped_data());
  ZC_CUDA(cudaMemsetAsync(verdicts, 0xFF, size_t(nstreams) * sizeof(unsigned long long), stream));
  if (const ffi::Error e = LaunchDecode(stream, dtype, payload.typed_data(), cap, cap, n, nstreams, decoded, verdicts);
      e.failure())
    return e;
  ZC_LAUNCH(c6::FinishKernel, nstreams, stream, verdicts, 1, nstreams, status->typed_data(), decoded,
            n * ElemBytes(dtype));
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
  const SumArrays a = TakeSums(ws, dtype, batch, k, n);
  if (!ws.ok()) return TooSmall("accumulate", workspace, ws);
  if (k == 0 || batch == 0) return ffi::Error::Success();  // no rows; out may be null when empty
  // every row's pointer, then each item's rows summed in order (n == 0 too: the headers are still
  // checked, as the CPU codec does)
  if (const ffi::Error e = RowPointers(stream, {payload.typed_data()}, {batch * k}, cap, a.rows); e.failure()) return e;
  return LaunchSums(stream, a, dtype, cap, k, n, batch, out_dtype, static_cast<uint8_t*>(out->untyped_data()),
                    status->typed_data());
}

// ---- the collectives' row ops: ffi/zipccl_cpu.cc says what each computes ----
//
// A row op's workspace holds what it cannot take from its operands and
// results: the rows gathered from the leaves (unless one leaf holds them as
// they are), the compressor's arrays, the worst-case streams an encode
// assembles before copying c bytes of each, the decoders' verdicts, the
// reduce step's row pointers and float32 sums. The decoders return a status
// word per row and poison a corrupt row's elements (decode_rows) or the
// whole sum (decode_accumulate_rows), as Decompress does.

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
  if (!StreamFits(l.m, dtype)) return Invalid("a row's stream could exceed 4 GiB");
  return ffi::Error::Success();
}

// The row ops' workspace arrays; null where an op needs none.
struct RowArrays {
  uint8_t* rows = nullptr;            // the rows' elements [k, m], unless in place
  c6::Workspace compress{};           // size pass and encode
  uint8_t* streams = nullptr;         // size pass: k headers; encode: k worst-case streams
  uint32_t* lengths = nullptr;        // encode
  unsigned long long* verdicts = nullptr;  // decode
  SumArrays sums{};                   // accumulate
  uint8_t* out = nullptr;             // accumulate: the rounded sums, when the leaves are several
};

enum class RowOp { kSizes, kEncode, kEncodeRaw, kDecode, kAccumulate };

// part_rows: accumulate: the rows summed (decode: l.rows, its parts' rows).
RowArrays TakeRowArrays(Workspace& ws, RowOp op, int dtype, const zc::RowLayout& l, int64_t leaves,
                        int64_t part_rows) {
  RowArrays a;
  const int64_t eb = ElemBytes(dtype);
  if (op != RowOp::kAccumulate && !InPlace(l, leaves)) a.rows = ws.Take<uint8_t>(l.rows * l.m * eb);
  if (op == RowOp::kSizes || op == RowOp::kEncode) a.compress = TakeCompress(ws, l.m, l.rows);
  if (op == RowOp::kSizes) a.streams = ws.Take<uint8_t>(l.rows * zc::kHeaderBytes);
  if (op == RowOp::kEncode) {
    a.streams = ws.Take<uint8_t>(l.rows * MaxStreamBytes(l.m, dtype));
    a.lengths = ws.Take<uint32_t>(l.rows);
  }
  if (op == RowOp::kDecode) a.verdicts = ws.Take<unsigned long long>(l.rows);
  if (op == RowOp::kAccumulate) {  // l: the summed elements as one row; part_rows: all the rows
    a.sums = TakeSums(ws, dtype, 1, part_rows, l.m);
    if (leaves > 1) a.out = ws.Take<uint8_t>(l.m * 4);  // float32 sums at most
  }
  return a;
}

// Moves elements between the leaves and rows ([k, m], contiguous): RowsKernel per span of leaves.
ffi::Error MoveRows(cudaStream_t stream, const zc::RowLayout& l, const LeafList& leaves, uint8_t* rows, bool to_rows) {
  const int eb = ElemBytes(leaves.dtype);
  int64_t begin = 0;
  for (size_t first = 0; first < leaves.data.size(); first += c6::kSpanLeaves) {
    c6::Span span{};
    span.begin = begin;
    for (size_t i = first; i < leaves.data.size() && span.count < c6::kSpanLeaves; ++i, ++span.count) {
      span.data[span.count] = leaves.data[i];
      span.end[span.count] = (span.count ? span.end[span.count - 1] : 0) + leaves.size[i];
    }
    const int64_t n = span.end[span.count - 1];
    ZC_LAUNCH(c6::RowsKernel, (n + kThreads - 1) / kThreads, stream, l, span, eb, rows, to_rows);
    begin += n;
  }
  return ffi::Error::Success();
}

// The rows' elements, [k, m] contiguous: the leaf itself, or gathered into
// a.rows with the padding zeroed.
ffi::ErrorOr<const uint8_t*> RowsIn(cudaStream_t stream, const zc::RowLayout& l, const LeafList& leaves,
                                    const RowArrays& a) {
  if (!a.rows) return static_cast<const uint8_t*>(leaves.data[0]);
  const int64_t bytes = l.rows * l.m * ElemBytes(leaves.dtype);
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
  // GroupKernel and ScanKernel alone: the lengths (and headers, into the workspace), no record coded
  c6::CompressBatch(leaves->dtype, *in, l.m, l.rows, a.streams, zc::kHeaderBytes, nullptr, sizes->typed_data(),
                    a.compress, nullptr, false, stream);
  ZC_CUDA(cudaGetLastError());
  return ffi::Error::Success();
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
  const int64_t max_bytes = MaxStreamBytes(l.m, dtype), eb = ElemBytes(dtype);
  if (raw && out.cap < max_bytes) return Invalid("encode_rows: raw streams need their full capacity");
  auto workspace = RetAt<ffi::DataType::U8>(outs, outs.size() - 1);
  if (workspace.has_error()) return workspace.error();
  Workspace ws = WorkspaceOf(*workspace);
  const RowArrays a = TakeRowArrays(ws, raw ? RowOp::kEncodeRaw : RowOp::kEncode, dtype, l,
                                    int64_t(leaves->data.size()), 0);
  if (!ws.ok()) return TooSmall("encode_rows", *workspace, ws);
  auto in = RowsIn(stream, l, *leaves, a);
  if (in.has_error()) return in.error();
  if (!raw) {  // the worst-case streams in the workspace, then c bytes of each
    c6::CompressBatch(dtype, *in, l.m, rows, a.streams, max_bytes, nullptr, a.lengths, a.compress, nullptr, true,
                      stream);
    ZC_CUDA(cudaGetLastError());
  }
  if (lengths) ZC_CUDA(cudaMemcpyAsync(lengths, a.lengths, size_t(rows) * sizeof(uint32_t), cudaMemcpyDeviceToDevice,
                                       stream));
  for (size_t o = 0; o < out.data.size(); ++o) {
    const int64_t first = out.first[o], n = out.rows[o];
    if (raw)
      ZC_LAUNCH(c6::RawRowsKernel, (n * out.cap + kThreads - 1) / kThreads, stream, dtype, *in + first * l.m * eb, l.m,
                n, out.data[o], out.cap);
    else
      ZC_LAUNCH(c6::CopyRowsKernel, (n * out.cap + kThreads - 1) / kThreads, stream, a.streams + first * max_bytes,
                max_bytes, a.lengths + first, n, out.data[o], out.cap);
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
  const RowArrays a = TakeRowArrays(ws, RowOp::kDecode, dtype, l, int64_t(leaves->data.size()), l.rows);
  if (!ws.ok()) return TooSmall("decode_rows", *workspace, ws);
  const int64_t row_bytes = l.m * ElemBytes(dtype);
  uint8_t* rows = a.rows ? a.rows : leaves->data[0];
  ZC_CUDA(cudaMemsetAsync(a.verdicts, 0xFF, size_t(l.rows) * sizeof(unsigned long long), stream));
  for (size_t p = 0; p < parts->data.size(); ++p)  // a launch per part, its rows as one batch
    if (const ffi::Error e = LaunchDecode(stream, dtype, parts->data[p], parts->cap, parts->cap, l.m, parts->rows[p],
                                          rows + parts->first[p] * row_bytes, a.verdicts + parts->first[p]);
        e.failure())
      return e;
  ZC_LAUNCH(c6::FinishKernel, l.rows, stream, a.verdicts, 1, l.rows, (*status)->typed_data(), rows, row_bytes);
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
  const int64_t m = leaves->total, rows = parts->total;
  const auto l = zc::RowLayout::of(m, 1, 0);
  Workspace ws = WorkspaceOf(*workspace);
  const RowArrays a = TakeRowArrays(ws, RowOp::kAccumulate, dtype, l, int64_t(leaves->data.size()), rows);
  if (!ws.ok()) return TooSmall("accumulate", *workspace, ws);
  // one leaf: the sums straight into it; several: into the workspace, then moved to the leaves
  uint8_t* sums = a.out ? a.out : leaves->data[0];
  if (const ffi::Error e = RowPointers(stream, parts->data, parts->rows, parts->cap, a.sums.rows); e.failure())
    return e;
  if (const ffi::Error e = LaunchSums(stream, a.sums, dtype, parts->cap, rows, m, 1, leaves->dtype, sums,
                                      (*status)->typed_data());
      e.failure())
    return e;
  if (a.out) return MoveRows(stream, l, *leaves, a.out, false);
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

int64_t CompressWorkspaceBytes(int, int64_t batch, int64_t n) {
  Workspace ws;
  TakeCompress(ws, n, batch);
  return ws.needed();
}

int64_t DecompressWorkspaceBytes(int, int64_t streams, int64_t) {
  Workspace ws;
  ws.Take<unsigned long long>(streams);
  return ws.needed();
}

int64_t AccumulateWorkspaceBytes(int dtype, int64_t batch, int64_t k, int64_t n) {
  Workspace ws;
  TakeSums(ws, dtype, batch, k, n);
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
  const int64_t bytes = n * ElemBytes(dtype), cap = MaxStreamBytes(n, dtype);
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
  const int64_t m = n / rows, eb = ElemBytes(dtype), cap = MaxStreamBytes(m, dtype);
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
  Workspace size_ws(c_work, c_ws);  // the size pass alone: GroupKernel and ScanKernel (StreamSizes)
  const c6::Workspace size_arrays = TakeCompress(size_ws, m, rows);
  const auto size_pass = [&]() -> ffi::Error {
    c6::CompressBatch(dtype, x, m, rows, payload, cap, nullptr, sizes, size_arrays, nullptr, false, r.stream);
    ZC_CUDA(cudaGetLastError());
    return ffi::Error::Success();
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
