// Format version 6 on CUDA (docs/FORMAT6.md): the compress and decompress
// kernels (cuda6_compress.cuh, cuda6_decompress.cuh) and their host calls.
// Neither call synchronises with the host: the stream's length and the
// decoder's verdict are written to device memory.
//
// Not yet wired into the library (which writes version 5); tested by host
// emulation (tests/test_cuda6_emulation.py) and timed by tools/v6_cuda/measure.sh.
#pragma once

#include "cuda6_compress.cuh"
#include "cuda6_decompress.cuh"

namespace zipccl {
namespace cuda6 {

constexpr int kDecodeCtasPerSm = kDecodeMinCtas;  // DecodeKernel: 64 registers, 37 KB of shared memory

inline int64_t NumBlocks(int64_t n) { return (n + kBlock - 1) / kBlock; }
inline int64_t NumGroups(int64_t n) { return (NumBlocks(n) + kGroupBlocks - 1) / kGroupBlocks; }

// The compress workspace's bytes for n elements (each array 256-byte aligned).
inline size_t CompressWorkspaceBytes(int64_t n) {
  const int64_t nb = NumBlocks(n), ng = NumGroups(n);
  auto up = [](int64_t v) { return size_t((v + 255) / 256 * 256); };
  return up(8 * nb) + up(4 * nb) + up(64 * nb) + up(4 * ng) + up(8 * ng) + up(v6::kNumSyms * ng) + up(4 * v6::kNumSyms * ng) + 256;
}

inline Workspace CarveWorkspace(void* base, int64_t n) {
  const int64_t nb = NumBlocks(n), ng = NumGroups(n);
  auto up = [](int64_t v) { return size_t((v + 255) / 256 * 256); };
  uint8_t* p = static_cast<uint8_t*>(base);
  Workspace ws;
  ws.plan = reinterpret_cast<uint64_t*>(p), p += up(8 * nb);
  ws.rsize = reinterpret_cast<uint32_t*>(p), p += up(4 * nb);
  ws.lanes = reinterpret_cast<uint16_t*>(p), p += up(64 * nb);
  ws.gbytes = reinterpret_cast<uint32_t*>(p), p += up(4 * ng);
  ws.goff = reinterpret_cast<uint64_t*>(p), p += up(8 * ng);
  ws.glens = p, p += up(v6::kNumSyms * ng);
  ws.gput = reinterpret_cast<uint32_t*>(p), p += up(4 * v6::kNumSyms * ng);
  ws.flags = reinterpret_cast<uint32_t*>(p);
  return ws;
}

template <int DT>
void CompressAs(const void* x, int64_t n, uint8_t* out, unsigned long long* out_len, void* workspace,
                const Tables* tables, cudaStream_t stream) {
  using Word = typename Elem<DT>::Word;
  const Workspace ws = CarveWorkspace(workspace, n);
  const int64_t nb = NumBlocks(n), ng = NumGroups(n);
  const Word* xw = static_cast<const Word*>(x);
  if (ng) ZC_LAUNCH_KERNEL(GroupKernel<DT>, unsigned(ng), kGroupThreads, stream, xw, n, tables, ws);
  ZC_LAUNCH_KERNEL(ScanKernel, 1u, kScanThreads, stream, DT, n, ws, out, out_len);
  constexpr int warps = CodeShape<DT>::kWarps;
  if (nb) ZC_LAUNCH_KERNEL(CodeKernel<DT>, unsigned((nb + warps - 1) / warps), kWarp * warps, stream, xw, n, tables, ws, out);
}

// Compresses n elements of dtype (1 bf16, 2 fp16, 3 fp32) at x (device) into
// out (device, at least 16 + n * elem_bytes bytes, 4-byte aligned); *out_len
// (device) receives the stream's length. tables: BuildTables's, on the device.
// Requires n * elem_bytes < 2^32 (a descriptor's end is a u32).
inline void Compress(int dtype, const void* x, int64_t n, uint8_t* out, unsigned long long* out_len, void* workspace,
                     const Tables* tables, cudaStream_t stream) {
  if (dtype == kBF16) CompressAs<kBF16>(x, n, out, out_len, workspace, tables, stream);
  else if (dtype == kF16) CompressAs<kF16>(x, n, out, out_len, workspace, tables, stream);
  else CompressAs<kF32>(x, n, out, out_len, workspace, tables, stream);
}

// Decodes the stream in[0, size) (device, 4-byte aligned) of n elements of
// dtype into y (device). *status (device) receives ~0 if the stream decoded,
// else its verdict: (the first failing block + 1) << 8 | its Status, or a
// header's (or the stream's length's) Status alone. sms: the device's SMs.
inline void Decompress(int dtype, const uint8_t* in, int64_t size, int64_t n, void* y, unsigned long long* status,
                       const Tables* tables, int sms, cudaStream_t stream) {
  cudaMemsetAsync(status, 0xFF, sizeof(*status), stream);
  const int64_t batches = (NumBlocks(n) + kDecodeWarps - 1) / kDecodeWarps;
  const unsigned grid = unsigned(Max<int64_t>(1, Min<int64_t>(batches, int64_t(sms) * kDecodeCtasPerSm)));
  if (dtype == kBF16)
    ZC_LAUNCH_KERNEL(DecodeKernel<kBF16>, grid, kDecodeThreads, stream, in, size, n, tables, static_cast<uint16_t*>(y), status);
  else if (dtype == kF16)
    ZC_LAUNCH_KERNEL(DecodeKernel<kF16>, grid, kDecodeThreads, stream, in, size, n, tables, static_cast<uint16_t*>(y), status);
  else
    ZC_LAUNCH_KERNEL(DecodeKernel<kF32>, grid, kDecodeThreads, stream, in, size, n, tables, static_cast<uint32_t*>(y), status);
}

// The Status of a decoder's verdict word.
inline int VerdictStatus(unsigned long long verdict) { return verdict == kNoError ? kOk : int(verdict & 0xFF); }

}  // namespace cuda6
}  // namespace zipccl
