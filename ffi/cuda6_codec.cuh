// Format version 6 on CUDA (docs/FORMAT.md): the compress, decompress and
// reduce-step kernels (cuda6_compress.cuh, cuda6_decompress.cuh) and their
// host calls, each over a batch of streams in one set of launches (the
// kernels take their item from blockIdx.x). No call synchronises with the
// host or copies to or from it: lengths and verdicts are written to device
// memory, and the family's tables are kDeviceTables, in the module image
// (tables null; the emulation tests and tools/v6_cuda pass their own).
// The XLA FFI handlers (zipccl_cuda.cu) call these.
#pragma once

#include "cuda6_compress.cuh"
#include "cuda6_decompress.cuh"

namespace zipccl {
namespace cuda6 {

constexpr int kDecodeCtasPerSm = kDecodeMinCtas;  // DecodeKernel: 64 registers, 34 KB of shared memory
constexpr int kSumCtasPerSm = 2;  // AccumulateKernel: at most 128 registers (its shared memory may allow fewer)

inline int64_t NumBlocks(int64_t n) { return (n + kBlock - 1) / kBlock; }
inline int64_t NumGroups(int64_t n) { return (NumBlocks(n) + kGroupBlocks - 1) / kGroupBlocks; }

// The compress workspace's arrays for `items` streams of n elements, carved in order from
// base (each 256-byte aligned; base null: only measured). Returns the bytes they take.
inline size_t CarveWorkspace(void* base, int64_t n, int64_t items, Workspace* ws) {
  const int64_t nb = items * NumBlocks(n), ng = items * NumGroups(n);
  auto up = [](int64_t v) { return size_t((Max<int64_t>(v, 1) + 255) / 256 * 256); };
  uint8_t* p = static_cast<uint8_t*>(base);
  size_t at = 0;
  auto take = [&](auto** field, int64_t bytes) {
    *field = p ? reinterpret_cast<std::remove_pointer_t<decltype(field)>>(p + at) : nullptr;
    at += up(bytes);
  };
  take(&ws->plan, 8 * nb);
  take(&ws->rsize, 4 * nb);
  take(&ws->lanes, 2 * kWarp * nb);
  take(&ws->gbytes, 4 * ng);
  take(&ws->goff, 8 * ng);
  take(&ws->glens, v6::kNumSyms * ng);
  take(&ws->gput, 4 * v6::kNumSyms * ng);
  take(&ws->flags, 4 * items);
  return at;
}

// The compress workspace's bytes for `items` streams of n elements (base 256-byte aligned).
inline size_t CompressWorkspaceBytes(int64_t n, int64_t items = 1) {
  Workspace ws;
  return CarveWorkspace(nullptr, n, items, &ws);
}

template <int DT>
void CompressAs(const void* x, int64_t n, int64_t items, uint8_t* out, int64_t pitch, unsigned long long* out_len,
                uint32_t* out_len32, const Workspace& ws, const Tables* tables, bool code, cudaStream_t stream) {
  using Word = typename Elem<DT>::Word;
  const int64_t nb = NumBlocks(n), ng = NumGroups(n);
  const Word* xw = static_cast<const Word*>(x);
  if (items == 0) return;
  if (ng) {  // past 48 KB of shared memory (where they cannot be allowed, the launch fails: cudaGetLastError)
    constexpr int smem = int(sizeof(GroupShared));
    (void)cudaFuncSetAttribute(GroupKernel<DT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    ZC_LAUNCH_KERNEL_SMEM(GroupKernel<DT>, unsigned(items * ng), kGroupThreads, smem, stream, xw, n, tables, ws);
  }
  ZC_LAUNCH_KERNEL(ScanKernel, unsigned(items), kScanThreads, stream, DT, n, ws, out, pitch, out_len, out_len32);
  constexpr int warps = CodeShape<DT>::kWarps;
  const int64_t per = (nb + warps - 1) / warps;
  if (code && nb)
    ZC_LAUNCH_KERNEL(CodeKernel<DT>, unsigned(items * per), kWarp * warps, stream, xw, n, tables, ws, out, pitch);
}

// Compresses `items` streams of n elements of dtype (1 bf16, 2 fp16, 3 fp32), item i's at x + i
// n (device), into out + i pitch (device, at least 16 + n * elem_bytes bytes each, any alignment);
// each stream's length to out_len[i] and/or out_len32[i] (device; either may be null). ws:
// CarveWorkspace's arrays for the batch. code false: the size pass alone (GroupKernel and
// ScanKernel: the lengths and headers, out needs only 16 bytes a stream). Requires n * elem_bytes
// < 2^32 (a descriptor's end is a u32).
inline void CompressBatch(int dtype, const void* x, int64_t n, int64_t items, uint8_t* out, int64_t pitch,
                          unsigned long long* out_len, uint32_t* out_len32, const Workspace& ws, const Tables* tables,
                          bool code, cudaStream_t stream) {
  if (dtype == kBF16) CompressAs<kBF16>(x, n, items, out, pitch, out_len, out_len32, ws, tables, code, stream);
  else if (dtype == kF16) CompressAs<kF16>(x, n, items, out, pitch, out_len, out_len32, ws, tables, code, stream);
  else CompressAs<kF32>(x, n, items, out, pitch, out_len, out_len32, ws, tables, code, stream);
}

// One stream: *out_len receives its length; workspace: CompressWorkspaceBytes(n) bytes, 256-byte aligned.
inline void Compress(int dtype, const void* x, int64_t n, uint8_t* out, unsigned long long* out_len, void* workspace,
                     const Tables* tables, cudaStream_t stream) {
  Workspace ws;
  CarveWorkspace(workspace, n, 1, &ws);
  CompressBatch(dtype, x, n, 1, out, 0, out_len, nullptr, ws, tables, true, stream);
}

// CTAs per item of a decoding grid: the CTAs the device's SMs hold at once (per_sm each) shared
// by the items, at most one per batch of 8 blocks, at least one.
inline int64_t DecodeCtas(int64_t n, int64_t items, int sms, int per_sm) {
  const int64_t batches = (NumBlocks(n) + kDecodeWarps - 1) / kDecodeWarps;
  return Max<int64_t>(1, Min<int64_t>(batches, int64_t(sms) * per_sm / Max<int64_t>(items, 1)));
}

// Decodes `items` streams of n elements of dtype, item i's at in + i pitch (device, size bytes,
// any alignment), into y + i n (device). status[i] (device, ~0 before: the caller sets it)
// receives ~0 if the stream decoded, else its verdict: (the first failing block + 1) << 8 | its
// Status, or a header's (or the stream's length's) Status alone. sms: the device's SMs.
inline void DecompressBatch(int dtype, const uint8_t* in, int64_t pitch, int64_t size, int64_t n, int64_t items,
                            void* y, unsigned long long* status, const Tables* tables, int sms, cudaStream_t stream) {
  if (items == 0) return;
  const int64_t ctas = DecodeCtas(n, items, sms, kDecodeCtasPerSm);
  const unsigned grid = unsigned(items * ctas);
  if (dtype == kBF16)
    ZC_LAUNCH_KERNEL(DecodeKernel<kBF16>, grid, kDecodeThreads, stream, in, pitch, size, n, items, tables,
                     static_cast<uint16_t*>(y), status);
  else if (dtype == kF16)
    ZC_LAUNCH_KERNEL(DecodeKernel<kF16>, grid, kDecodeThreads, stream, in, pitch, size, n, items, tables,
                     static_cast<uint16_t*>(y), status);
  else
    ZC_LAUNCH_KERNEL(DecodeKernel<kF32>, grid, kDecodeThreads, stream, in, pitch, size, n, items, tables,
                     static_cast<uint32_t*>(y), status);
}

// One stream in[0, size): *status receives its verdict (set to ~0 first, on the stream).
inline void Decompress(int dtype, const uint8_t* in, int64_t size, int64_t n, void* y, unsigned long long* status,
                       const Tables* tables, int sms, cudaStream_t stream) {
  cudaMemsetAsync(status, 0xFF, sizeof(*status), stream);
  DecompressBatch(dtype, in, 0, size, n, 1, y, status, tables, sms, stream);
}

// How AccumulateKernel runs for dtype on a device whose CUDA blocks may take smem_block bytes of
// shared memory (cudaDevAttrMaxSharedMemoryPerBlockOptin) and whose SMs hold smem_sm
// (cudaDevAttrMaxSharedMemoryPerMultiprocessor): its row warps (up to 8, as many as the shared
// memory allows: an H100's 227 KB takes 8 for every dtype; however few the rows, SumSpan giving
// few rows the blocks of several at once), its bytes of dynamic shared memory and the CUDA
// blocks an SM holds (1 KB of each block's shared memory is the system's; at most kSumCtasPerSm
// by registers).
struct SumShape {
  int row_warps;
  size_t smem;
  int per_sm;
};
inline SumShape SumShapeOf(int dtype, int64_t smem_block, int64_t smem_sm) {
  const int eb = v6::layout_of(dtype).elem_bytes;
  const int64_t fit = (smem_block - int64_t(SumSmemBytes(0, eb))) / int64_t(SumSmemBytes(1, eb) - SumSmemBytes(0, eb));
  const int rows = int(Max<int64_t>(1, Min<int64_t>(kRowWarps, fit)));
  const size_t smem = SumSmemBytes(rows, eb);
  const int per_sm = int(Max<int64_t>(1, Min<int64_t>(kSumCtasPerSm, smem_sm / int64_t(smem + 1024))));
  return {rows, smem, per_sm};
}

// AccumulateKernel<DT, kBlocks> on `grid` CUDA blocks, allowed its shared memory first where it
// takes more than 48 KB (the error of allowing it, if any).
template <int DT, bool kBlocks>
cudaError_t LaunchSumKernel(unsigned grid, const SumShape& shape, cudaStream_t stream, const uint8_t* const* rows,
                            int64_t size, int64_t k, int64_t n, int64_t items, const Tables* tables,
                            const CachedCode<DT>* cache, int out_dtype, uint8_t* out, unsigned long long* verdicts) {
  cudaError_t e = cudaSuccess;
  if (shape.smem > (48u << 10))
    e = cudaFuncSetAttribute((AccumulateKernel<DT, kBlocks>), cudaFuncAttributeMaxDynamicSharedMemorySize,
                             int(shape.smem));
  if (e == cudaSuccess)
    ZC_LAUNCH_KERNEL_SMEM((AccumulateKernel<DT, kBlocks>), grid, kSumThreads, shape.smem, stream, rows, size, k, n,
                          items, shape.row_warps, tables, cache, out_dtype, out, verdicts);
  return e;
}

// AccumulateKernel<DT, SumSpan > 1> for `items` items of k rows (Accumulate's arguments), after
// WarpCodesKernel<DT> where more rows than row warps share a block (codes: CodeCacheBytes).
template <int DT>
cudaError_t LaunchAccumulate(const uint8_t* const* rows, int64_t size, int64_t k, int64_t n, int64_t items,
                             void* codes, int out_dtype, uint8_t* out, unsigned long long* verdicts,
                             const Tables* tables, int sms, const SumShape& shape, cudaStream_t stream) {
  CachedCode<DT>* cache = k > kRowWarps ? static_cast<CachedCode<DT>*>(codes) : nullptr;
  if (cache) {
    const int64_t jobs = items * k * NumGroups(n);
    if (jobs)
      ZC_LAUNCH_KERNEL(WarpCodesKernel<DT>, unsigned((jobs + kRowWarps - 1) / kRowWarps), kSumThreads, stream, rows,
                       size, k, n, items, cache);
  }
  const int64_t span = SumSpan(k, shape.row_warps);
  const int64_t rounds = (NumBlocks(n) + span - 1) / span;  // of a CTA's span blocks
  const int64_t ctas = Max<int64_t>(1, Min<int64_t>(rounds, int64_t(sms) * shape.per_sm / items));
  const unsigned grid = unsigned(items * ctas);
  return span > 1 ? LaunchSumKernel<DT, true>(grid, shape, stream, rows, size, k, n, items, tables, cache, out_dtype,
                                              out, verdicts)
                  : LaunchSumKernel<DT, false>(grid, shape, stream, rows, size, k, n, items, tables, cache, out_dtype,
                                               out, verdicts);
}

// The reduce step: `items` items of k rows of dtype, row r of item i at rows[i k + r] (a device
// array of device pointers; size bytes each), summed in row order in float32 and rounded once
// into out + i n (device, out_dtype: dtype or kF32). verdicts[i k + r] (device, ~0 before)
// receives each row's verdict, as DecompressBatch's. The sums of an item with a failing row
// are garbage: the caller poisons them. codes: CodeCacheBytes(dtype, items, k, n) bytes (device,
// 16-byte aligned; none, and unused, unless k > kRowWarps). sms, smem_block, smem_sm: the
// device's (SumShapeOf). Returns
// the error of allowing the kernel its shared memory, if any (the launch's is the caller's
// cudaGetLastError).
inline cudaError_t Accumulate(int dtype, const uint8_t* const* rows, int64_t size, int64_t k, int64_t n,
                              int64_t items, void* codes, int out_dtype, void* out,
                              unsigned long long* verdicts, const Tables* tables, int sms, int64_t smem_block,
                              int64_t smem_sm, cudaStream_t stream) {
  if (items == 0 || k == 0) return cudaSuccess;
  uint8_t* o = static_cast<uint8_t*>(out);
  const SumShape shape = SumShapeOf(dtype, smem_block, smem_sm);
  if (dtype == kBF16)
    return LaunchAccumulate<kBF16>(rows, size, k, n, items, codes, out_dtype, o, verdicts, tables, sms, shape, stream);
  if (dtype == kF16)
    return LaunchAccumulate<kF16>(rows, size, k, n, items, codes, out_dtype, o, verdicts, tables, sms, shape, stream);
  return LaunchAccumulate<kF32>(rows, size, k, n, items, codes, out_dtype, o, verdicts, tables, sms, shape, stream);
}

// The Status of a decoder's verdict word.
inline int VerdictStatus(unsigned long long verdict) { return verdict == kNoError ? kOk : int(verdict & 0xFF); }

}  // namespace cuda6
}  // namespace zipccl
