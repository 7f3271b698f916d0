// CUDA codec for the zipccl byte format (docs/FORMAT.md), as XLA FFI handlers.
//
// Every format decision is a shared function of zipccl_format.h (the same ones
// the CPU codec's generic path runs), so the bytes match the CPU codec and the
// numpy reference; this file only decides which threads run what and where
// the bytes go. docs/GPU.md has the performance model of each kernel.
//
// compress:   EmaxKernel (warp per 4096-element block) -> ChooseKernel (CUDA
//             block per 16-block group: shared histograms, a warp per code) ->
//             EncodeKernel (CUDA block per block, a warp per sub-stream, the
//             body staged in shared memory) -> LayoutKernel (CUDA block per
//             item: scans of table and body offsets) -> WriteKernel (CUDA block
//             per block: descriptors, tables, bodies).
// decompress: ValidateKernel (CUDA block per stream) -> DecodeKernel (CUDA
//             block per group: decode tables in shared memory, a thread per
//             sub-stream) -> PoisonKernel; each stream's first error (lowest
//             block, sub-stream) lands in its status word, a result of the
//             handler, and PoisonKernel fills a corrupt stream's output with
//             all-one bytes (a NaN in every float format).
// accumulate: per row j, the two decode kernels and AccumulateKernel; then
//             RoundKernel and PoisonKernel (a corrupt row poisons its sum).
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

namespace {

constexpr int kWarp = 32;
constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr int kThreads = 128;                                   // most kernels: 4 warps
constexpr int kDecodeThreads = zc::kGroupBlocks * zc::kSubstreams;  // a thread per sub-stream of a group
constexpr int kThreadsPerSm = 2048;
constexpr int kRun = 32;    // EncodeKernel: consecutive elements per lane (a warp scan per 1024)
constexpr int kStage = 32;  // DecodeKernel: elements each thread decodes between coalesced stores
constexpr unsigned long long kNoError = ~0ull;

template <typename T>
__host__ __device__ T Min(T a, T b) {
  return a < b ? a : b;
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

// ---- compress ----

// §7 step 1, warp per block of every item: refs[t] = the block's emax
// (ChooseKernel then overwrites it with the chosen ref). Lanes read
// consecutive elements.
__global__ void EmaxKernel(int dtype, const uint8_t* x, int64_t n, int64_t nb, int64_t total, uint32_t* refs) {
  const zc::Layout lay = zc::layout_of(dtype);
  const uint32_t all_ones = (1u << lay.exp_bits) - 1;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / kWarp;
  for (int64_t t = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / kWarp; t < total; t += warps) {
    const int64_t item = t / nb, b = t % nb;
    const uint8_t* in = x + (item * n + b * zc::kBlock) * lay.elem_bytes;
    uint32_t emax = 0;
    for (int i = Lane(); i < zc::block_count(n, b); i += kWarp) {
      const uint32_t e = zc::exponent_of(zc::load_element(in + i * lay.elem_bytes, lay.elem_bytes), lay);
      if (e < all_ones && e > emax) emax = e;
    }
    if (ZC_INJECTED(2) && Lane() == 5) return;  // a lane that skips the warp's shuffles: the emulation must catch it
    emax = WarpMax(emax);
    if (Lane() == 0) refs[t] = emax;
  }
}

// A warp's working space for one Huffman code (§5.1).
struct HuffmanScratch {
  uint32_t counts[zc::kMaxSyms];  // flattened as code_lengths does
  uint32_t weight[2 * zc::kMaxSyms];
  uint16_t parent[2 * zc::kMaxSyms];
  uint8_t leaf[zc::kMaxSyms];
  uint8_t depth[2 * zc::kMaxSyms];
};

// code_lengths of zipccl_format.h by one warp: the lanes sort the used
// symbols by (count, symbol) -- each finds its symbols' ranks --, lane 0 runs
// the two-queue merge (huffman_tree_lengths) in shared memory, and the lanes
// flatten the counts while a code is over 12 bits. lens: shared.
__device__ void WarpCodeLengths(const uint32_t* counts, uint8_t* lens, int nsym, HuffmanScratch& ws) {
  for (int s = Lane(); s < nsym; s += kWarp) ws.counts[s] = counts[s];
  __syncwarp();
  for (;;) {
    int used = 0;
    for (int s = Lane(); s < nsym; s += kWarp) {
      const uint32_t c = ws.counts[s];
      lens[s] = 0;
      if (!c) continue;
      int rank = 0;
      for (int o = 0; o < nsym; ++o) {
        const uint32_t co = ws.counts[o];
        rank += co && (co < c || (co == c && o < s));
      }
      ws.leaf[rank] = uint8_t(s);
      ++used;
    }
    used = WarpSum(used);
    __syncwarp();  // the lanes' leaf and lens stores before lane 0 reads them
    if (Lane() == 0) zc::huffman_tree_lengths(ws.counts, ws.leaf, used, lens, ws.weight, ws.parent, ws.depth);
    __syncwarp();
    int longest = 0;
    for (int s = Lane(); s < nsym; s += kWarp) longest = lens[s] > longest ? lens[s] : longest;
    longest = WarpMax(longest);
    if (longest <= zc::kMaxCodeLen) return;
    const int k = zc::flattening_shift(longest);
    for (int s = Lane(); s < nsym; s += kWarp) ws.counts[s] = ws.counts[s] ? (ws.counts[s] + (1u << k) - 1) >> k : 0;
    __syncwarp();
  }
}

// A group's choices for the encoder (§7 steps 2-3), per group of every item:
// its mask, plane code lengths and codes (kMaxPlanes * kPlaneSyms each), and
// the bytes of its table area (§5.5).
struct PlaneScratch {
  int* masks;
  uint8_t* lens;
  uint16_t* codes;
  uint32_t* table_bytes;
};

struct ChooseSmem {
  uint32_t counts[zc::kCandidates][zc::kMaxSyms];
  uint32_t planes[2][zc::kMaxPlanes][zc::kPlaneSyms];  // [0]: every 8th stored element, [1]: all
  uint8_t lens[zc::kCandidates][zc::kMaxSyms];
  uint8_t plens[zc::kMaxPlanes][zc::kPlaneSyms];
  HuffmanScratch ws[kThreads / kWarp];
  unsigned long long cost[zc::kCandidates];
  int64_t sums[kThreads / kWarp];
  uint32_t gmax, implied[2];  // implied zeros without and with a coded sign
  int best, mask;
};
static_assert(zc::kMaxPlanes < kThreads / kWarp, "ChooseKernel: a warp per plane");

// §7 steps 2-3, CUDA block per group of every item: the symbol counts of
// candidates A-D in shared histograms (one pass over the group's elements;
// E-H follow from them and the counts of exact zeros), a warp per two
// candidates' code lengths, the choice; then the stored elements' plane
// bytes (a second pass: each thread a contiguous run, a block scan numbers
// the stored elements for the sample) and the planes' codes (warp p: plane
// p). Refs, lengths, canonical codes, the mask and the table area's size go
// to global scratch. Same choices as choose_group_generic and choose_planes
// of the CPU codec.
__global__ void ChooseKernel(int dtype, const uint8_t* x, int64_t n, int64_t nb, int64_t ng, int64_t total_groups,
                             uint32_t* refs, uint8_t* lens, uint16_t* codes, PlaneScratch ps) {
  ZC_SHARED(ChooseSmem, sm);
  const zc::Layout lay = zc::layout_of(dtype);
  ZC_FOR_BLOCKS(gi, total_groups) {
    const int64_t item = gi / ng, b0 = (gi % ng) * zc::kGroupBlocks;
    const int64_t first = b0 * zc::kBlock, count = Min<int64_t>(n - first, zc::kGroupBlocks * zc::kBlock);
    const uint8_t* in = x + (item * n + first) * lay.elem_bytes;
    uint32_t* ref = refs + item * nb + b0;
    const int nblocks = int(zc::num_blocks(count));
    for (int i = threadIdx.x; i < zc::kCandidates * zc::kMaxSyms; i += blockDim.x) (&sm.counts[0][0])[i] = 0;
    for (int i = threadIdx.x; i < 2 * zc::kMaxPlanes * zc::kPlaneSyms; i += blockDim.x) (&sm.planes[0][0][0])[i] = 0;
    if (threadIdx.x == 0) {
      sm.gmax = 0;
      for (int b = 0; b < nblocks; ++b) sm.gmax = ref[b] > sm.gmax ? ref[b] : sm.gmax;
      sm.implied[0] = sm.implied[1] = 0;
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
      const uint32_t v = zc::load_element(in + i * lay.elem_bytes, lay.elem_bytes), own = ref[i / zc::kBlock];
      for (int c = 0; c < 4; ++c)
        atomicAdd(&sm.counts[c][zc::symbol_of_element(v, lay, (c & 1) ? own : sm.gmax, zc::candidate_mask(c))], 1u);
      if (zc::implied_zero(v, lay, true)) atomicAdd(&sm.implied[zc::implied_zero(v, lay, false) ? 0 : 1], 1u);
    }
    __syncthreads();
    // E-H (§4.2): as A-D, but of each sign's (ZERO, 0) symbols only the exact zeros stay (in E and F only +0)
    for (int i = threadIdx.x; i < 4 * zc::kMaxSyms; i += blockDim.x) sm.counts[4 + i / zc::kMaxSyms][i % zc::kMaxSyms] =
        sm.counts[i / zc::kMaxSyms][i % zc::kMaxSyms];
    __syncthreads();
    if (threadIdx.x < 4) {
      const int c = 4 + threadIdx.x;
      for (int s = 0; s < ((c & 2) ? 2 : 1); ++s) {
        const int zero = s << zc::kSignBit, esc = zero | (zc::kClassEsc << zc::kTopBits);
        const uint32_t keep = (c & 2) ? sm.implied[s] : sm.implied[0];
        sm.counts[c][esc] += sm.counts[c][zero] - keep;
        sm.counts[c][zero] = keep;
      }
    }
    __syncthreads();
    for (int c = WarpId(); c < zc::kCandidates; c += kThreads / kWarp) {
      const int64_t m = count - ((c & 4) ? sm.implied[0] + ((c & 2) ? sm.implied[1] : 0) : 0);
      const bool skipped = (c & 4) && zc::zero_candidate_skipped(c, lay, count, m);
      if (!skipped) WarpCodeLengths(sm.counts[c], sm.lens[c], zc::num_symbols(zc::candidate_mask(c)), sm.ws[WarpId()]);
      if (Lane() == 0)
        sm.cost[c] = skipped ? ~0ull : zc::code_cost(sm.counts[c], sm.lens[c], zc::candidate_mask(c), lay, m);
      __syncwarp();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint64_t cost[zc::kCandidates];
      for (int c = 0; c < zc::kCandidates; ++c) cost[c] = sm.cost[c];
      sm.best = zc::best_candidate(cost, count);
      sm.mask = zc::candidate_mask(sm.best);
    }
    __syncthreads();
    const int best = sm.best, mask = sm.mask;
    if (lay.raw_bytes > 0) {  // §7 step 3 over the stored elements, numbered in element order
      const int64_t run = (count + blockDim.x - 1) / blockDim.x, begin = Min<int64_t>(count, threadIdx.x * run);
      const int64_t end = Min<int64_t>(count, begin + run);
      int64_t stored = 0, total;
      for (int64_t i = begin; i < end; ++i)
        stored += zc::stores_bits(zc::load_element(in + i * lay.elem_bytes, lay.elem_bytes), lay, mask);
      int64_t j = BlockExclusiveScan(stored, sm.sums, &total);
      for (int64_t i = begin; i < end; ++i) {
        const uint32_t v = zc::load_element(in + i * lay.elem_bytes, lay.elem_bytes);
        if (!zc::stores_bits(v, lay, mask)) continue;
        for (int p = 0; p < lay.raw_bytes; ++p) {
          const uint32_t byte = (v >> (8 * p)) & 0xFFu;
          atomicAdd(&sm.planes[1][p][byte], 1u);
          if (j % zc::kPlaneSampleStride == 0) atomicAdd(&sm.planes[0][p][byte], 1u);
        }
        ++j;
      }
      __syncthreads();
      const int p = WarpId();
      if (p < lay.raw_bytes) {
        bool coded = false;
        for (int pass = 0; pass < 2; ++pass) {
          WarpCodeLengths(sm.planes[pass][p], sm.plens[p], zc::kPlaneSyms, sm.ws[p]);
          uint64_t bits = 0, used = 0;
          for (int v = Lane(); v < zc::kPlaneSyms; v += kWarp) {
            bits += uint64_t(sm.planes[pass][p][v]) * sm.plens[p][v];
            used += sm.planes[pass][p][v];
          }
          bits = WarpSum(bits), used = WarpSum(used);
          coded = pass ? zc::plane_pays(bits, sm.plens[p], int64_t(used)) : zc::plane_sample_pays(bits, int64_t(used));
          if (!coded) break;
        }
        if (coded && Lane() == 0) atomicOr(&sm.mask, 1 << p);
      }
      __syncthreads();
    }
    const int full = sm.mask;
    if (threadIdx.x < zc::kGroupBlocks && threadIdx.x < nblocks && !(best & 1)) ref[threadIdx.x] = sm.gmax;
    for (int s = threadIdx.x; s < zc::kMaxSyms; s += blockDim.x) lens[gi * zc::kMaxSyms + s] = sm.lens[best][s];
    uint8_t* plens = ps.lens + gi * zc::kMaxPlanes * zc::kPlaneSyms;
    for (int i = threadIdx.x; i < zc::kMaxPlanes * zc::kPlaneSyms; i += blockDim.x) plens[i] = (&sm.plens[0][0])[i];
    // canonical codes: warp 0 the symbols' (and the mask, the table area's size), warp 1 + q plane q's
    if (Lane() == 0 && WarpId() == 0) {
      zc::canonical_codes(sm.lens[best], codes + gi * zc::kMaxSyms, zc::num_symbols(full));
      ps.masks[gi] = full;
      uint32_t bits = zc::table_bits(sm.lens[best], zc::num_symbols(full), true);
      for (int q = 0; q < zc::kMaxPlanes; ++q)
        bits += ((full >> q) & 1) ? zc::table_bits(sm.plens[q], zc::kPlaneSyms, false) : 0;
      ps.table_bytes[gi] = uint32_t(zc::num_refs(full, nblocks)) + (bits + 7) / 8;
    } else if (Lane() == 0 && WarpId() <= zc::kMaxPlanes && ((full >> (WarpId() - 1)) & 1)) {
      const int q = WarpId() - 1;
      zc::canonical_codes(sm.plens[q], ps.codes + (gi * zc::kMaxPlanes + q) * zc::kPlaneSyms, zc::kPlaneSyms);
    }
    __syncthreads();  // the shared memory is reused by the next group
  }
}

// Appends bits at bit position pos of a body staged as 32-bit words in
// shared memory (zeroed first); lanes write their elements' bits at once.
struct SharedBitWriter {
  uint32_t* words;
  uint32_t pos;
  __device__ void put(uint32_t value, int len) {
    if (!len) return;
    const uint32_t w = pos >> 5, sh = pos & 31;
    atomicOr(&words[w], value << sh);
    if (sh + len > 32) atomicOr(&words[w + 1], value >> (32 - sh));
    pos += len;
  }
};

__device__ void PutByte(uint32_t* words, uint32_t at, uint32_t byte) { atomicOr(&words[at >> 2], byte << (8 * (at & 3))); }

struct EncodeSmem {
  uint32_t words[zc::kBlock];  // a coded body is shorter than 4096 float32s
  uint8_t lens[zc::kMaxSyms];
  uint16_t codes[zc::kMaxSyms];
  uint8_t plens[zc::kMaxPlanes][zc::kPlaneSyms];
  uint16_t pcodes[zc::kMaxPlanes][zc::kPlaneSyms];
  uint32_t stream_bits[zc::kSubstreams];
  int stored[zc::kSubstreams];  // stored elements per sub-stream
  int32_t devs[zc::kSubstreams - 1];
  uint32_t coded;
  int width;
};
static_assert(zc::kSubstreams == kThreads / kWarp, "EncodeKernel: a warp per sub-stream");

// §7 step 4, CUDA block per block of every item, warp k on sub-stream k:
// the lanes size their elements (element_bits) and count those that store
// bits; warp sums give the sub-streams' sizes, thread 0 the length fields
// and so the body's layout; a raw body is copied, a coded one built in
// shared memory -- each lane puts the codes of kRun consecutive elements at
// the bit a warp scan gives (put_element), their stored bytes and extra bits
// at the stored index another scan gives (put_stored's layout) -- and stored
// to bodies with 32-bit stores.
__global__ void EncodeKernel(int dtype, const uint8_t* x, int64_t n, int64_t nb, int64_t ng, int64_t total,
                             const uint32_t* refs, const uint8_t* lens, const uint16_t* codes, PlaneScratch ps,
                             uint8_t* bodies, uint32_t* descs) {
  ZC_SHARED(EncodeSmem, sm);
  const zc::Layout lay = zc::layout_of(dtype);
  ZC_FOR_BLOCKS(t, total) {
    const int64_t item = t / nb, b = t % nb, gi = item * ng + b / zc::kGroupBlocks;
    const uint8_t* in = x + (item * n + b * zc::kBlock) * lay.elem_bytes;
    uint8_t* body = bodies + t * zc::kBlock * lay.elem_bytes;
    const int count = zc::block_count(n, b), q = zc::substream_len(count), k = WarpId();
    const uint32_t ref = refs[t];
    const int mask = ps.masks[gi];
    for (int s = threadIdx.x; s < zc::kMaxSyms; s += blockDim.x) {
      sm.lens[s] = lens[gi * zc::kMaxSyms + s];
      sm.codes[s] = codes[gi * zc::kMaxSyms + s];
    }
    for (int i = threadIdx.x; i < zc::kMaxPlanes * zc::kPlaneSyms; i += blockDim.x)
      if ((mask >> (i / zc::kPlaneSyms)) & 1) {
        (&sm.plens[0][0])[i] = ps.lens[gi * zc::kMaxPlanes * zc::kPlaneSyms + i];
        (&sm.pcodes[0][0])[i] = ps.codes[gi * zc::kMaxPlanes * zc::kPlaneSyms + i];
      }
    __syncthreads();
    const zc::PlaneCodes pc{mask, {sm.plens[0], sm.plens[1]}, {sm.pcodes[0], sm.pcodes[1]}, {}};
    const zc::GroupLayout gl = zc::group_layout(dtype, mask);
    const int begin = k * q, end = Min(count, begin + q);
    uint32_t bits = 0;
    int stored = 0;
    for (int i = begin + Lane(); i < end; i += kWarp) {
      const uint32_t v = zc::load_element(in + i * lay.elem_bytes, lay.elem_bytes);
      bits += zc::element_bits(dtype, v, ref, sm.lens, pc);
      stored += zc::stores_bits(v, lay, mask);
    }
    bits = WarpSum(bits), stored = WarpSum(stored);
    if (Lane() == 0) sm.stream_bits[k] = bits, sm.stored[k] = stored;
    __syncthreads();
    if (threadIdx.x == 0) {
      const int m = sm.stored[0] + sm.stored[1] + sm.stored[2] + sm.stored[3];
      sm.width = zc::choose_width(sm.stream_bits, gl.stored_bytes(m), count, gl, sm.devs, &sm.coded);
    }
    __syncthreads();
    const uint32_t coded = sm.coded, raw_block = uint32_t(count) * lay.elem_bytes;
    const int width = sm.width, m = sm.stored[0] + sm.stored[1] + sm.stored[2] + sm.stored[3];
    if (coded >= raw_block) {
      for (uint32_t i = threadIdx.x; i < raw_block; i += blockDim.x) body[i] = in[i];
      if (threadIdx.x == 0) descs[t] = zc::make_descriptor(raw_block, 0);
    } else {
      for (uint32_t w = threadIdx.x; w < (coded + 3) / 4; w += blockDim.x) sm.words[w] = 0;
      if (!ZC_INJECTED(1)) __syncthreads();  // without it, a race the emulation must catch
      const uint32_t head = zc::head_bits(width);  // §2: the width field and the deviations
      uint32_t start = head, all = head;  // sub-stream k's first bit; the area's bits
      int first = 0;  // sub-stream k's first stored element
      for (int j = 0; j < zc::kSubstreams; ++j) {
        start += j < k ? sm.stream_bits[j] : 0;
        first += j < k ? sm.stored[j] : 0;
        all += sm.stream_bits[j];
      }
      const uint32_t area = (all + 7) / 8;  // the stored area's first byte
      if (threadIdx.x == 0) {  // §2: the width field, the length deviations
        SharedBitWriter d{sm.words, 0};
        zc::put_width(width, d);
        for (int j = 0; j + 1 < zc::kSubstreams; ++j) d.put(uint32_t(sm.devs[j]) & ((1u << width) - 1), width);
      }
      uint32_t done = 0;  // bits of sub-stream k put so far
      int kept = 0;       // its stored elements so far
      for (int base = begin; base < end; base += kWarp * kRun) {  // lane l: elements base + kRun l ...
        const int lo = base + kRun * Lane(), hi = Min(lo + kRun, end);
        uint32_t len = 0;
        int mine = 0;
        for (int i = lo; i < hi; ++i) {
          const uint32_t v = zc::load_element(in + i * lay.elem_bytes, lay.elem_bytes);
          len += zc::element_bits(dtype, v, ref, sm.lens, pc);
          mine += zc::stores_bits(v, lay, mask);
        }
        const uint32_t after = WarpInclusiveScan(len);
        const int kept_after = WarpInclusiveScan(mine);
        SharedBitWriter w{sm.words, start + done + after - len};
        int j = first + kept + kept_after - mine;
        for (int i = lo; i < hi; ++i) {
          const uint32_t v = zc::load_element(in + i * lay.elem_bytes, lay.elem_bytes);
          zc::put_element(dtype, v, ref, sm.lens, sm.codes, pc, w);
          if (!zc::stores_bits(v, lay, mask)) continue;
          uint32_t top, extra;
          uint8_t raw[zc::kMaxPlanes];
          zc::split_element(dtype, v, &top, raw, &extra);
          for (int p = 0, o = 0; p < lay.raw_bytes; ++p)
            if (!((mask >> p) & 1)) PutByte(sm.words, area + j * gl.stored_planes + o++, raw[p]);
          SharedBitWriter e{sm.words, 8 * (area + uint32_t(m) * gl.stored_planes) + uint32_t(j) * gl.extra_bits};
          e.put(extra >> ((mask & zc::kMaskSign) ? 1 : 0), gl.extra_bits);
          ++j;
        }
        done += __shfl_sync(kFull, after, kWarp - 1);
        kept += __shfl_sync(kFull, kept_after, kWarp - 1);
      }
      __syncthreads();
      uint32_t* out = reinterpret_cast<uint32_t*>(body);  // 4-aligned: slots are kBlock elements
      for (uint32_t w = threadIdx.x; w < (coded + 3) / 4; w += blockDim.x) out[w] = sm.words[w];
      if (threadIdx.x == 0) descs[t] = zc::make_descriptor(coded, uint32_t(width));
    }
    __syncthreads();  // the shared memory is reused by the next block
  }
}

struct ScanSmem {
  int64_t sums[kThreads / kWarp];
};

// §1 and §7 step 5, CUDA block per item: where each block's body and each
// group's table area go (block-wide scans; the table areas after the
// bodies), whether the item is stored raw; writes the header and the item's size.
__global__ void LayoutKernel(int dtype, int64_t n, int64_t nb, int64_t ng, int64_t batch,
                             const uint32_t* table_bytes, const uint32_t* descs, int64_t* table_at, int64_t* body_at,
                             uint8_t* stored_raw, uint8_t* payload, int64_t cap, uint32_t* sizes) {
  ZC_SHARED(ScanSmem, sm);
  ZC_FOR_BLOCKS(item, batch) {
    int64_t pos = zc::bodies_offset(nb), total;
    for (int64_t b0 = 0; b0 < nb; b0 += blockDim.x) {
      const int64_t b = b0 + threadIdx.x;
      const int64_t at = BlockExclusiveScan(b < nb ? descs[item * nb + b] & 0xFFFFu : 0, sm.sums, &total);
      if (b < nb) body_at[item * nb + b] = pos + at;
      pos += total;
    }
    for (int64_t g0 = 0; g0 < ng; g0 += blockDim.x) {
      const int64_t g = g0 + threadIdx.x;
      const int64_t at = BlockExclusiveScan(g < ng ? table_bytes[item * ng + g] : 0, sm.sums, &total);
      if (g < ng) table_at[item * ng + g] = pos + at;
      pos += total;
    }
    if (threadIdx.x == 0) {
      const int64_t raw_bytes = n * zc::layout_of(dtype).elem_bytes;
      stored_raw[item] = pos - zc::kHeaderBytes >= raw_bytes;
      zc::write_header(payload + item * cap, dtype, stored_raw[item] ? zc::kFlagStoredRaw : 0, uint64_t(n));
      sizes[item] = uint32_t(stored_raw[item] ? zc::kHeaderBytes + raw_bytes : pos);
    }
  }
}

// CUDA block per block of every item: its descriptor, its group's record
// and table area (first block of a group, one thread), its body; or, in a
// stored-raw item, its elements. Lanes store consecutive bytes.
__global__ void WriteKernel(int dtype, const uint8_t* x, int64_t n, int64_t nb, int64_t ng, int64_t total,
                            const uint32_t* refs, const uint8_t* lens, PlaneScratch ps, const uint8_t* bodies,
                            const uint32_t* descs, const int64_t* table_at, const int64_t* body_at,
                            const uint8_t* stored_raw, uint8_t* payload, int64_t cap) {
  const int64_t eb = zc::layout_of(dtype).elem_bytes;
  ZC_FOR_BLOCKS(t, total) {
    const int64_t item = t / nb, b = t % nb;
    uint8_t* out = payload + item * cap;
    if (stored_raw[item]) {
      const int64_t first = b * zc::kBlock * eb, bytes = zc::block_count(n, b) * eb;
      for (int64_t i = threadIdx.x; i < bytes; i += blockDim.x) out[zc::kHeaderBytes + first + i] = x[item * n * eb + first + i];
      continue;
    }
    if (threadIdx.x == 0) zc::store_descriptor(out + zc::kHeaderBytes + zc::kDescBytes * b, descs[t]);
    if (b % zc::kGroupBlocks == 0 && threadIdx.x == 0) {
      const int64_t g = b / zc::kGroupBlocks, gi = item * ng + g;
      const int mask = ps.masks[gi], nblocks = zc::group_block_count(nb, g);
      uint8_t* record = out + zc::records_offset(nb) + zc::kRecordBytes * g;
      record[0] = uint8_t(mask);
      record[1] = uint8_t(ps.table_bytes[gi]);
      record[2] = uint8_t(ps.table_bytes[gi] >> 8);
      uint8_t group_refs[zc::kGroupBlocks];
      for (int j = 0; j < nblocks; ++j) group_refs[j] = uint8_t(refs[item * nb + b + j]);
      const uint8_t(*plens)[zc::kPlaneSyms] =
          reinterpret_cast<const uint8_t(*)[zc::kPlaneSyms]>(ps.lens + gi * zc::kMaxPlanes * zc::kPlaneSyms);
      zc::write_table_area(group_refs, zc::num_refs(mask, nblocks), lens + gi * zc::kMaxSyms, mask, plens,
                           out + table_at[gi]);
    }
    const uint8_t* src = bodies + t * zc::kBlock * eb;
    uint8_t* dst = out + body_at[t];
    for (int64_t i = threadIdx.x; i < (descs[t] & 0xFFFFu); i += blockDim.x) dst[i] = src[i];
  }
}

// ---- decompress ----

// What ValidateKernel learns of each stream, for DecodeKernel.
struct StreamInfo {
  int8_t* state;       // [streams] -1 invalid, 0 coded (version 3), 1 stored raw, 2 coded (versions 1-2)
  int64_t* body_at;    // [streams * nb] body offset of each block from the stream start
  int64_t* table_at;   // [streams * ng] offset of each group's tables
  uint8_t* table_ok;   // [streams * ng] versions 1-2: the group's tables are valid (§5.3)
};
constexpr int8_t kCoded = 0, kStoredRaw = 1, kCodedV2 = 2, kCodedV3 = 3;

// Each payload row has a status word on the device (0: no error so far). The
// first error wins: the lowest (block, sub-stream) of the row -- the order a
// serial decoder meets them in --, by atomicMax on (kLastPosition - position)
// above the status in bits 0-7; PoisonKernel then keeps only the status.
constexpr uint32_t kLastPosition = 0xFFFFFF;

__device__ void ReportError(uint32_t* status, int64_t row, int64_t block, int sub, int st) {
  const uint32_t position = uint32_t(Min<int64_t>(block * zc::kSubstreams + sub, kLastPosition));
  atomicMax(&status[row], ((kLastPosition - position) << 8) | uint32_t(st));
}

// Versions 1-2: group g's plane mask in a coded stream with these header flags.
__device__ int StreamMaskV2(const uint8_t* in, int64_t nb, int flags, int64_t g) {
  return (flags & zc::kFlagMasks) ? in[zc::kHeaderBytes + 4 * nb + g] : 0;
}

// Versions 1-2: checks group tables at `at` with mask. Returns a Status.
__device__ int GroupTablesStatusV2(const uint8_t* at, int mask) {
  uint8_t lens[zc::kMaxSyms];
  if (zc::unpack_table_v2(at, lens) != zc::kOk) return zc::kErrTable;
  at += zc::kTableBytes;
  for (int p = 0; p < zc::kMaxPlanes; ++p) {
    if (!((mask >> p) & 1)) continue;
    if (zc::unpack_table_v2(at, lens, zc::kPlaneSyms) != zc::kOk) return zc::kErrTable;
    at += zc::kPlaneTableBytes;
  }
  return zc::kOk;
}

// Versions 3-4, §1: a group's table_bytes from its record.
__device__ uint32_t RecordTableBytes(const uint8_t* in, int64_t nb, int64_t g, int version) {
  const uint8_t* r = in + zc::records_offset(nb, version) + zc::kRecordBytes * g;
  return r[1] | (uint32_t(r[2]) << 8);
}

struct ValidateSmem {
  int64_t sums[kThreads / kWarp];
  unsigned long long first;  // (index << 8) | status of the first failure
  int version, flags, mask_bits, status;
};

// Versions 1-2 of ValidateKernel's stream (see there).
__device__ void ValidateV2(const uint8_t* in, int64_t cap, int64_t s, int64_t nb, int64_t ng,
                                        StreamInfo info, ValidateSmem& sm) {
  int64_t pos = zc::tables_offset_v2(nb, sm.flags), total;
  for (int64_t g0 = 0; g0 < ng; g0 += blockDim.x) {
    const int64_t g = g0 + threadIdx.x;
    const int mask = g < ng ? StreamMaskV2(in, nb, sm.flags, g) : 0;
    if (mask & ~sm.mask_bits) atomicMin(&sm.first, (static_cast<unsigned long long>(g) << 8) | zc::kErrPlanes);
    const int64_t at = BlockExclusiveScan(g < ng ? zc::group_table_bytes_v2(mask) : 0, sm.sums, &total);
    if (g < ng) info.table_at[s * ng + g] = pos + at;
    pos += total;
  }
  if (threadIdx.x == 0 && sm.first == kNoError && pos > cap) sm.first = zc::kErrTruncated;
  for (int64_t g = threadIdx.x; g < ng && pos <= cap; g += blockDim.x)
    info.table_ok[s * ng + g] =
        GroupTablesStatusV2(in + info.table_at[s * ng + g], StreamMaskV2(in, nb, sm.flags, g)) == zc::kOk;
  __syncthreads();
  for (int64_t b0 = 0; b0 < nb && sm.first == kNoError; b0 += blockDim.x) {
    const int64_t b = b0 + threadIdx.x;
    const uint32_t desc = b < nb ? zc::load_u32(in + zc::kHeaderBytes + 4 * b) : 0;
    const int64_t at = pos + BlockExclusiveScan(desc & 0xFFFFu, sm.sums, &total);
    if (b < nb) {
      info.body_at[s * nb + b] = at;
      const int st = (desc >> 24) == 1 && !info.table_ok[s * ng + b / zc::kGroupBlocks] ? zc::kErrTable
                     : int64_t(desc & 0xFFFFu) > cap - at                               ? zc::kErrTruncated
                                                                                       : zc::kOk;
      if (st != zc::kOk) atomicMin(&sm.first, (static_cast<unsigned long long>(b) << 8) | unsigned(st));
    }
    pos += total;
    __syncthreads();  // sm.first, for the loop condition
  }
}

// CUDA block per stream: the header (thread 0), then in version 3 the
// group masks, the body offsets and the table areas' (scans) and the bounds
// of all of them, as the reference does before decoding any block; the
// table areas and block errors are DecodeKernel's.
// Versions 1-2: the masks, the table offsets (a scan), the tables (thread
// per group), the body offsets (a scan) and each block's checks -- its
// group's tables if it is coded, then its bounds; the first failing block in
// stream order is the stream's error, mode, body size and bitstream errors
// are DecodeKernel's. Stream s is payload row s * row_stride + row_offset.
// Reads only [row, row + cap).
__global__ void ValidateKernel(int dtype, const uint8_t* payload, int64_t cap, int64_t row_stride,
                               int64_t row_offset, int64_t nstreams, int64_t n, StreamInfo info,
                               uint32_t* status) {
  ZC_SHARED(ValidateSmem, sm);
  const int64_t nb = zc::num_blocks(n), ng = zc::num_groups(nb);
  ZC_FOR_BLOCKS(s, nstreams) {
    const int64_t row = s * row_stride + row_offset;
    const uint8_t* in = payload + row * cap;
    if (threadIdx.x == 0) {
      int st = zc::check_header(in, uint64_t(cap), dtype, uint64_t(n), &sm.version, &sm.flags, &sm.mask_bits);
      const bool raw = sm.flags & zc::kFlagStoredRaw, v3 = sm.version >= 3;
      if (st == zc::kOk && raw && zc::max_stream_bytes(n, dtype) > cap) st = zc::kErrTruncated;
      if (st == zc::kOk && !raw && (v3 ? zc::bodies_offset(nb, sm.version) : zc::tables_offset_v2(nb, sm.flags)) > cap)
        st = zc::kErrTruncated;
      sm.status = st;
      sm.first = kNoError;
    }
    __syncthreads();
    const bool coded = sm.status == zc::kOk && !(sm.flags & zc::kFlagStoredRaw);
    if (coded && sm.version >= 3) {
      for (int64_t g = threadIdx.x; g < ng; g += blockDim.x)
        if (in[zc::records_offset(nb, sm.version) + zc::kRecordBytes * g] & ~sm.mask_bits)
          atomicMin(&sm.first, (static_cast<unsigned long long>(g) << 8) | zc::kErrPlanes);
      int64_t pos = zc::bodies_offset(nb, sm.version), total;
      for (int64_t b0 = 0; b0 < nb; b0 += blockDim.x) {
        const int64_t b = b0 + threadIdx.x;
        const uint32_t desc = b < nb ? zc::load_descriptor(in, b, sm.version, 0) : 0;
        const int64_t at = pos + BlockExclusiveScan(desc & 0xFFFFu, sm.sums, &total);
        if (b < nb) info.body_at[s * nb + b] = at;
        pos += total;
      }
      for (int64_t g0 = 0; g0 < ng; g0 += blockDim.x) {
        const int64_t g = g0 + threadIdx.x;
        const int64_t at = pos + BlockExclusiveScan(g < ng ? RecordTableBytes(in, nb, g, sm.version) : 0, sm.sums,
                                                    &total);
        if (g < ng) info.table_at[s * ng + g] = at;
        pos += total;
      }
      __syncthreads();
      if (threadIdx.x == 0 && sm.first == kNoError && pos > cap) sm.first = zc::kErrTruncated;
      __syncthreads();  // the table areas are read and checked by DecodeKernel, into its shared memory
      if (threadIdx.x == 0 && sm.first != kNoError) sm.status = int(sm.first & 0xFF);
    } else if (coded) {
      ValidateV2(in, cap, s, nb, ng, info, sm);
      if (threadIdx.x == 0 && sm.first != kNoError) sm.status = int(sm.first & 0xFF);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      if (sm.status != zc::kOk) ReportError(status, row, 0, 0, sm.status);
      info.state[s] = sm.status != zc::kOk                ? -1
                      : (sm.flags & zc::kFlagStoredRaw)    ? kStoredRaw
                      : sm.version == zc::kVersion         ? kCoded
                      : sm.version == 3                    ? kCodedV3
                                                           : kCodedV2;
    }
    __syncthreads();  // the shared memory is reused by the next stream
  }
}

struct DecodeSmem {
  uint16_t luts[1 + zc::kMaxPlanes][zc::kLutSize];  // the symbols', then each plane's
  uint16_t codes[zc::kMaxSyms];
  uint8_t lens[zc::kMaxSyms];
  uint8_t area_lens[1 + zc::kMaxPlanes][zc::kMaxSyms];  // version 3: a group's table area
  uint8_t refs[zc::kGroupBlocks];
  uint8_t stage[kDecodeThreads][kStage * 4];  // each thread's last kStage decoded elements
  int64_t stage_at[kDecodeThreads];            // where in its block they go (bytes)
  int stage_bytes[kDecodeThreads];
  int implied[kDecodeThreads];   // version 3, ZEROS: each sub-stream's implied zeros
  uint32_t end3[zc::kGroupBlocks];  // ... where each block's sub-stream 3 ends
  int8_t ok[kDecodeThreads];     // ... whether each sub-stream decoded
  bool table_ok;                 // version 3: the group's table area is valid
};

// build_lut of zipccl_format.h by a CUDA block, from code lengths in shared
// memory: the threads clear the table, one lane computes the canonical
// codes, a thread per symbol fills its entries.
__device__ void BlockBuildLut(const uint8_t* lens, int nsym, uint16_t* lut, DecodeSmem& sm) {
  for (int w = threadIdx.x; w < zc::kLutSize; w += blockDim.x) lut[w] = 0;
  __syncthreads();
  if (threadIdx.x == 0) zc::canonical_codes(lens, sm.codes, nsym);
  __syncthreads();
  for (int s = threadIdx.x; s < nsym; s += blockDim.x) {
    const int len = lens[s];
    for (uint32_t fill = 0; len && fill < (1u << (zc::kMaxCodeLen - len)); ++fill)
      lut[sm.codes[s] | (fill << len)] = uint16_t(s | (len << 8));
  }
  __syncthreads();
}

// Versions 1-2: the same from a stored table of 4-bit lengths.
__device__ void BlockBuildLutV2(const uint8_t* table, int nsym, uint16_t* lut, DecodeSmem& sm) {
  for (int j = threadIdx.x; j < nsym / 2; j += blockDim.x) {
    sm.lens[2 * j] = table[j] & 15;
    sm.lens[2 * j + 1] = table[j] >> 4;
  }
  __syncthreads();
  BlockBuildLut(sm.lens, nsym, lut, sm);
}

// Stages kStage elements of each thread in shared memory for the CUDA
// block's coalesced store: thread t's elements go to group_out + at.
__device__ void StoreStaged(DecodeSmem& sm, uint8_t* group_out, int elem_bytes) {
  __syncthreads();
  const int row_bytes = kStage * elem_bytes;  // thread t's elements are row t
  for (int idx = threadIdx.x; idx < kDecodeThreads * row_bytes; idx += blockDim.x) {
    const int t = idx / row_bytes, byte = idx % row_bytes;
    if (byte < sm.stage_bytes[t]) group_out[sm.stage_at[t] + byte] = sm.stage[t][byte];
  }
  __syncthreads();
}

// Versions 1-2 of DecodeKernel's group (see there).
__device__ void DecodeGroupV2(int dtype, const uint8_t* in, int64_t s, int64_t g, int64_t row, int64_t n,
                              StreamInfo info, uint8_t* group_out, DecodeSmem& sm, uint32_t* status) {
  const zc::Layout lay = zc::layout_of(dtype);
  const int64_t nb = zc::num_blocks(n), ng = zc::num_groups(nb);
  const int flags = in[6], mask = StreamMaskV2(in, nb, flags, g);
  const bool ok = info.table_ok[s * ng + g];
  if (ok) {
    const uint8_t* table = in + info.table_at[s * ng + g];
    BlockBuildLutV2(table, zc::kNumSyms, sm.luts[0], sm);
    table += zc::kTableBytes;
    for (int p = 0; p < zc::kMaxPlanes; ++p) {
      if (!((mask >> p) & 1)) continue;
      BlockBuildLutV2(table, zc::kPlaneSyms, sm.luts[1 + p], sm);
      table += zc::kPlaneTableBytes;
    }
  }
  const int j = threadIdx.x / zc::kSubstreams, k = threadIdx.x % zc::kSubstreams;
  const int64_t b = g * zc::kGroupBlocks + j;
  const int count = b < nb ? zc::block_count(n, b) : 0, q = zc::substream_len(count);
  const uint32_t desc = b < nb ? zc::load_u32(in + zc::kHeaderBytes + 4 * b) : 0;
  const uint8_t* body = b < nb ? in + info.body_at[s * nb + b] : in;
  uint32_t bounds[zc::kSubstreams + 1] = {};
  int st = zc::kOk;
  bool coded = false;
  if (b < nb && (desc >> 24) == 0) {  // a raw body
    const uint32_t size = desc & 0xFFFFu, part = (size + zc::kSubstreams - 1) / zc::kSubstreams;
    uint8_t* to = group_out + int64_t(j) * zc::kBlock * lay.elem_bytes;
    if (size != uint32_t(count) * lay.elem_bytes) st = zc::kErrBlockSize;
    for (uint32_t i = k * part; st == zc::kOk && i < Min(size, (k + 1) * part); ++i) to[i] = body[i];
  } else if (b < nb && (desc >> 24) != 1) {
    st = zc::kErrBlockMode;
  } else if (b < nb) {
    st = zc::locate_substreams_v2(body, desc & 0xFFFFu, count, zc::group_layout_v2(lay, mask), bounds);
    if (st == zc::kOk && !ok) st = zc::kErrTable;
    coded = st == zc::kOk;
  }
  const zc::PlaneCodes pc{mask, {}, {}, {sm.luts[1], sm.luts[2]}};
  zc::BitReaderV2 r{body + bounds[k], bounds[k + 1] - bounds[k], 0};
  const int begin = k * q, end = Min(count, begin + q);
  for (int i0 = 0; i0 < zc::kBlock / zc::kSubstreams; i0 += kStage) {  // the same rounds for every thread
    int m = 0;
    for (; coded && st == zc::kOk && m < kStage && begin + i0 + m < end; ++m)
      st = zc::decode_element_v2(dtype, body, count, begin + i0 + m, (desc >> 16) & 0xFFu, sm.luts[0], pc, r,
                                 sm.stage[threadIdx.x] + m * lay.elem_bytes);
    sm.stage_bytes[threadIdx.x] = m * lay.elem_bytes;
    sm.stage_at[threadIdx.x] = (int64_t(j) * zc::kBlock + begin + i0) * lay.elem_bytes;
    StoreStaged(sm, group_out, lay.elem_bytes);
  }
  if (coded && st == zc::kOk && !r.finished()) st = zc::kErrTrailing;
  if (st != zc::kOk) ReportError(status, row, b, k, st);
}

// Version 3 of DecodeKernel's group: the group's table area is read into
// shared memory (thread 0) and its decode tables built; thread 4 j + k has
// sub-stream k of block j. A block's descriptor errors and a missing table
// are reported at its sub-stream 0. In a ZEROS group each thread first
// decodes its sub-stream only to count implied zeros (where the stored
// area starts depends on them), then again into the output; otherwise once,
// the stored area's place being known.
__device__ void DecodeGroup(int dtype, const uint8_t* in, int64_t s, int64_t g, int64_t row, int64_t n,
                            StreamInfo info, uint8_t* group_out, DecodeSmem& sm, uint32_t* status) {
  const zc::Layout lay = zc::layout_of(dtype);
  const int version = info.state[s] == kCodedV3 ? 3 : zc::kVersion;
  const int64_t nb = zc::num_blocks(n), ng = zc::num_groups(nb);
  const int mask = in[zc::records_offset(nb, version) + zc::kRecordBytes * g], nblocks = zc::group_block_count(nb, g);
  if (threadIdx.x == 0)
    sm.table_ok = zc::read_table_area(in + info.table_at[s * ng + g], RecordTableBytes(in, nb, g, version), mask,
                                      nblocks, sm.refs, sm.area_lens[0],
                                      reinterpret_cast<uint8_t(*)[zc::kPlaneSyms]>(sm.area_lens[1]),
                                      version) == zc::kOk;
  __syncthreads();
  const bool ok = sm.table_ok;
  if (ok) {
    BlockBuildLut(sm.area_lens[0], zc::num_symbols(mask), sm.luts[0], sm);
    for (int p = 0; p < zc::kMaxPlanes; ++p)
      if ((mask >> p) & 1) BlockBuildLut(sm.area_lens[1 + p], zc::kPlaneSyms, sm.luts[1 + p], sm);
  }
  const int j = threadIdx.x / zc::kSubstreams, k = threadIdx.x % zc::kSubstreams;
  const int64_t b = g * zc::kGroupBlocks + j;
  const int count = b < nb ? zc::block_count(n, b) : 0, q = zc::substream_len(count);
  const uint32_t desc = b < nb ? zc::load_descriptor(in, b, version, uint32_t(count) * lay.elem_bytes) : 0;
  const uint32_t size = desc & 0xFFFFu, width = desc >> 16;
  const uint8_t* body = b < nb ? in + info.body_at[s * nb + b] : in;
  const zc::GroupLayout gl = zc::group_layout(dtype, mask);
  uint32_t starts[zc::kSubstreams + 1] = {};
  int st = zc::kOk;
  bool coded = false;
  if (b < nb && width == 0) {  // a raw body
    const uint32_t part = (size + zc::kSubstreams - 1) / zc::kSubstreams;
    uint8_t* to = group_out + int64_t(j) * zc::kBlock * lay.elem_bytes;
    if (size != uint32_t(count) * lay.elem_bytes) st = k == 0 ? zc::kErrBlockSize : zc::kOk;
    for (uint32_t i = k * part; size == uint32_t(count) * lay.elem_bytes && i < Min(size, (k + 1) * part); ++i)
      to[i] = body[i];
  } else if (b < nb && width > uint32_t(zc::kMaxWidth) && width != zc::kWidthInBody) {
    st = k == 0 ? zc::kErrBlockMode : zc::kOk;
  } else if (b < nb && size >= uint32_t(count) * lay.elem_bytes) {
    st = k == 0 ? zc::kErrBlockSize : zc::kOk;
  } else if (b < nb && !ok) {
    st = k == 0 ? zc::kErrTable : zc::kOk;
  } else if (b < nb) {
    st = zc::locate_substreams(body, size, count, int(width), gl, starts);
    coded = st == zc::kOk;
    if (k != 0) st = zc::kOk;  // a block's error is reported once, at sub-stream 0
  }
  const zc::PlaneCodes pc{mask, {}, {}, {sm.luts[1], sm.luts[2]}};
  const uint32_t ref = sm.refs[(mask & zc::kMaskOwnRefs) ? j : 0];
  const int begin = k * q, end = Min(count, begin + q);
  // Where the stored area starts is known unless the group has ZEROS (or the
  // body is too short for it: then it is corrupt, found after the sub-streams).
  const int64_t at = int64_t(size) - gl.stored_bytes(count);
  const bool two_pass = coded && ((mask & zc::kMaskZeros) || at < 0);
  zc::BitReader r{body, size, starts[k], starts[k + 1]};
  int implied = 0, unused = 0;
  for (int i = begin; two_pass && st == zc::kOk && i < end; ++i)  // the first pass: check and count
    st = zc::decode_element(dtype, gl, ref, sm.luts[0], pc, r, zc::StoredArea{nullptr, 0}, &unused, &implied, nullptr);
  if (two_pass && st == zc::kOk) st = zc::substream_end_status(k, r.pos, starts);
  sm.implied[threadIdx.x] = implied;
  sm.ok[threadIdx.x] = st == zc::kOk;
  if (k == zc::kSubstreams - 1) sm.end3[j] = r.pos;
  __syncthreads();
  bool go = coded && st == zc::kOk;  // whether this thread decodes into the output
  int first = begin;                 // its sub-stream's first stored element
  zc::StoredArea area{body + (at > 0 ? at : 0), count};
  if (two_pass) {
    int m = count;
    for (int i = 0; i < zc::kSubstreams; ++i) {
      m -= sm.implied[zc::kSubstreams * j + i];
      first -= i < k ? sm.implied[zc::kSubstreams * j + i] : 0;
      go = go && sm.ok[zc::kSubstreams * j + i];
    }
    const int area_st = go ? zc::check_stored_area(body, size, sm.end3[j], m, gl, &area) : zc::kOk;
    if (k == zc::kSubstreams - 1 && area_st != zc::kOk) st = area_st;  // after sub-stream 3, once
    go = go && area_st == zc::kOk;
  }
  zc::BitReader w{body, size, starts[k], starts[k + 1]};  // the pass into the output, kStage elements at a time
  int stored = first, zeros = 0;
  for (int i0 = 0; i0 < zc::kBlock / zc::kSubstreams; i0 += kStage) {  // the same rounds for every thread
    int m = 0;
    for (; go && st == zc::kOk && m < kStage && begin + i0 + m < end; ++m)
      st = zc::decode_element(dtype, gl, ref, sm.luts[0], pc, w, area, &stored, &zeros,
                              sm.stage[threadIdx.x] + m * lay.elem_bytes);
    sm.stage_bytes[threadIdx.x] = m * lay.elem_bytes;
    sm.stage_at[threadIdx.x] = (int64_t(j) * zc::kBlock + begin + i0) * lay.elem_bytes;
    StoreStaged(sm, group_out, lay.elem_bytes);
  }
  if (go && !two_pass && st == zc::kOk) {  // the single pass's checks: sub-streams 0-2 end, then the area
    zc::StoredArea checked;
    st = zc::substream_end_status(k, w.pos, starts);
    if (st == zc::kOk && k == zc::kSubstreams - 1) st = zc::check_stored_area(body, size, w.pos, count, gl, &checked);
  }
  if (st != zc::kOk) ReportError(status, row, b, k, st);
}

// CUDA block per group of every valid stream: builds the group's decode
// tables in shared memory, then thread 4 j + k decodes sub-stream k of the
// group's block j, kStage elements at a time into shared memory, from where
// the CUDA block stores them, lanes on consecutive bytes. Raw bodies are
// copied, a quarter per thread; stored-raw streams by all.
__global__ void DecodeKernel(int dtype, const uint8_t* payload, int64_t cap, int64_t row_stride, int64_t row_offset,
                             int64_t nstreams, int64_t n, StreamInfo info, uint8_t* out, uint32_t* status) {
  ZC_SHARED(DecodeSmem, sm);
  const zc::Layout lay = zc::layout_of(dtype);
  const int64_t nb = zc::num_blocks(n), ng = zc::num_groups(nb);
  ZC_FOR_BLOCKS(unit, nstreams * ng) {
    const int64_t s = unit / ng, g = unit % ng, row = s * row_stride + row_offset;
    const uint8_t* in = payload + row * cap;
    const int64_t first = g * zc::kGroupBlocks * zc::kBlock;
    uint8_t* group_out = out + (s * n + first) * lay.elem_bytes;
    if (info.state[s] < 0) continue;
    if (info.state[s] == kStoredRaw) {
      const int64_t bytes = Min<int64_t>(n - first, zc::kGroupBlocks * zc::kBlock) * lay.elem_bytes;
      for (int64_t i = threadIdx.x; i < bytes; i += blockDim.x) group_out[i] = in[zc::kHeaderBytes + first * lay.elem_bytes + i];
      continue;
    }
    if (info.state[s] == kCodedV2) DecodeGroupV2(dtype, in, s, g, row, n, info, group_out, sm, status);
    else DecodeGroup(dtype, in, s, g, row, n, info, group_out, sm, status);
    __syncthreads();  // the shared memory is reused by the next group
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

// The end of every decode, CUDA block per item of k payload rows: if a row's
// status word holds an error, the item's whole output becomes all-one bytes
// -- a NaN in bfloat16, float16 and float32, so a result that nobody checks
// cannot pass for data --; then each word keeps only its status (bits 0-7).
__global__ void PoisonKernel(uint32_t* status, int64_t k, int64_t items, uint8_t* out, int64_t item_bytes) {
  ZC_FOR_BLOCKS(item, items) {
    bool corrupt = false;
    for (int64_t j = 0; j < k; ++j) corrupt |= status[item * k + j] != 0;
    __syncthreads();  // every thread has read the words before they are rewritten
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) status[item * k + j] &= 0xFFu;
    for (int64_t i = threadIdx.x; corrupt && i < item_bytes; i += blockDim.x) out[item * item_bytes + i] = 0xFF;
  }
}

// ---- the collectives' rows (zipccl_rows.h) ----

// Up to kSpanLeaves leaves of a flat array: its elements [begin, begin + end[count - 1]).
constexpr int kSpanLeaves = 16;
struct LeafSpan {
  uint8_t* data[kSpanLeaves];
  int64_t end[kSpanLeaves];  // cumulative element counts from begin
  int64_t begin;
  int count;
};

// Moves the span's elements to their places in rows ([k, m], contiguous;
// to_rows) or back from them: thread per element.
__global__ void RowsKernel(zc::RowLayout l, LeafSpan span, int eb, uint8_t* rows, bool to_rows) {
  ZC_FOR_THREADS(e, span.end[span.count - 1]) {
    int leaf = 0;
    while (e >= span.end[leaf]) ++leaf;
    int64_t j, i;
    l.locate(span.begin + e, &j, &i);
    uint8_t* row = rows + (j * l.m + i) * eb;
    uint8_t* x = span.data[leaf] + (e - (leaf ? span.end[leaf - 1] : 0)) * eb;
    for (int b = 0; b < eb; ++b) {
      if (to_rows) row[b] = x[b];
      else x[b] = row[b];
    }
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
  const int64_t body = m * zc::layout_of(dtype).elem_bytes;
  ZC_FOR_THREADS(e, rows * cap) {
    const int64_t r = e / cap, b = e % cap;
    if (b == 0) zc::write_header(out + r * cap, dtype, zc::kFlagStoredRaw, uint64_t(m));
    else if (b >= zc::kHeaderBytes) out[e] = b - zc::kHeaderBytes < body ? in[r * body + b - zc::kHeaderBytes] : 0;
  }
}

// The float32 sums into out as out_dtype (float32, or rounded to a 16-bit dtype).
__global__ void StoreSumsKernel(const float* acc, int out_dtype, uint8_t* out, int64_t count) {
  const int eb = zc::layout_of(out_dtype).elem_bytes;
  ZC_FOR_THREADS(i, count) zc::store_element(out + i * eb, zc::f32_to_element(out_dtype, acc[i]), eb);
}

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
  uint8_t* bodies;
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
  a.bodies = ws.Take<uint8_t>(total * zc::kBlock * zc::layout_of(dtype).elem_bytes);
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
StreamInfo TakeStreamInfo(Workspace& ws, int64_t streams, int64_t n) {
  const int64_t nb = zc::num_blocks(n), ng = zc::num_groups(nb);
  StreamInfo info;
  info.state = ws.Take<int8_t>(streams);
  info.body_at = ws.Take<int64_t>(streams * nb);
  info.table_at = ws.Take<int64_t>(streams * ng);
  info.table_ok = ws.Take<uint8_t>(streams * ng);
  return info;
}

// DecompressAccumulate's arrays: one row of every item decoded at a time, and
// float32 sums unless the output is float32 (then the sums go straight to it).
struct AccumulateArrays {
  StreamInfo info;
  uint8_t* decoded;
  float* acc;
};

AccumulateArrays TakeAccumulateArrays(Workspace& ws, int dtype, int64_t batch, int64_t n, int out_dtype) {
  AccumulateArrays a;
  a.info = TakeStreamInfo(ws, batch, n);
  a.decoded = ws.Take<uint8_t>(batch * n * zc::layout_of(dtype).elem_bytes);
  a.acc = out_dtype == zc::kF32 ? nullptr : ws.Take<float>(batch * n);
  return a;
}

// ---- handlers ----

// Validates and decodes streams s = 0.. nstreams - 1 (payload rows s * row_stride + row_offset) into out;
// errors go to status[row].
ffi::Error LaunchDecode(cudaStream_t stream, int dtype, const uint8_t* payload, int64_t cap, int64_t row_stride,
                        int64_t row_offset, int64_t nstreams, int64_t n, StreamInfo info, uint8_t* out,
                        uint32_t* status) {
  const int64_t ng = zc::num_groups(zc::num_blocks(n));
  ZC_LAUNCH(ValidateKernel, nstreams, kThreads, stream, dtype, payload, cap, row_stride, row_offset, nstreams, n,
            info, status);
  ZC_LAUNCH(DecodeKernel, nstreams * ng, kDecodeThreads, stream, dtype, payload, cap, row_stride, row_offset,
            nstreams, n, info, out, status);
  return ffi::Error::Success();
}

// Compresses `batch` items of n elements at in into rows of `cap` bytes of
// out (a row holds at least the header), their lengths into sizes, with a's
// arrays. write = false stops after the layout: the headers and the lengths
// only (the size pass; out then needs only 16 bytes per row).
ffi::Error LaunchCompress(cudaStream_t stream, const CompressArrays& a, int dtype, const uint8_t* in, int64_t n,
                          int64_t batch, uint8_t* out, int64_t cap, uint32_t* sizes, bool write) {
  const int64_t nb = zc::num_blocks(n), ng = zc::num_groups(nb), total = batch * nb, total_groups = batch * ng;
  ZC_LAUNCH(EmaxKernel, (total + kThreads / kWarp - 1) / (kThreads / kWarp), kThreads, stream, dtype, in, n, nb, total,
            a.refs);
  ZC_LAUNCH(ChooseKernel, total_groups, kThreads, stream, dtype, in, n, nb, ng, total_groups, a.refs, a.lens, a.codes,
            a.ps);
  ZC_LAUNCH(EncodeKernel, total, kThreads, stream, dtype, in, n, nb, ng, total, a.refs, a.lens, a.codes, a.ps,
            a.bodies, a.descs);
  ZC_LAUNCH(LayoutKernel, batch, kThreads, stream, dtype, n, nb, ng, batch, a.ps.table_bytes, a.descs, a.table_at,
            a.body_at, a.stored_raw, out, cap, sizes);
  if (write)
    ZC_LAUNCH(WriteKernel, total, kThreads, stream, dtype, in, n, nb, ng, total, a.refs, a.lens, a.ps, a.bodies,
              a.descs, a.table_at, a.body_at, a.stored_raw, out, cap);
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
  const StreamInfo info = TakeStreamInfo(ws, nstreams, n);
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
  const AccumulateArrays a = TakeAccumulateArrays(ws, dtype, batch, n, out_dtype);
  if (!ws.ok()) return TooSmall("accumulate", workspace, ws);
  if (k == 0 || batch == 0) return ffi::Error::Success();  // no rows; out may be null when empty
  uint32_t* words = status->typed_data();
  auto* sums = static_cast<uint8_t*>(out->untyped_data());
  float* acc = out_dtype == zc::kF32 ? reinterpret_cast<float*>(sums) : a.acc;
  ZC_CUDA(cudaMemsetAsync(words, 0, batch * k * sizeof(uint32_t), stream));
  for (int64_t j = 0; j < k; ++j) {  // n == 0 too: the headers are still checked, as the CPU codec does
    const ffi::Error launched = LaunchDecode(stream, dtype, payload.typed_data(), cap, k, j, batch, n, a.info, a.decoded,
                                             words);
    if (launched.failure()) return launched;
    ZC_LAUNCH(AccumulateKernel, (count + kThreads - 1) / kThreads, kThreads, stream, dtype, a.decoded, acc, count,
              j == 0);
  }
  if (out_dtype != zc::kF32)
    ZC_LAUNCH(RoundKernel, (count + kThreads - 1) / kThreads, kThreads, stream, acc, out_dtype,
              reinterpret_cast<uint16_t*>(sums), count);
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
  uint8_t* decoded = nullptr;   // accumulate: one row
  float* acc = nullptr;         // accumulate: the float32 sums
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
  if (op == RowOp::kDecode) a.info = TakeStreamInfo(ws, part_rows, l.m);
  if (op == RowOp::kAccumulate) {
    a.info = TakeStreamInfo(ws, 1, l.m);
    a.decoded = ws.Take<uint8_t>(l.m * eb);
    a.acc = ws.Take<float>(l.m);
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

// Results: the row buffers, then the workspace.
ffi::Error EncodeRows(cudaStream_t stream, ffi::RemainingArgs args, ffi::RemainingRets outs, int64_t rows, int64_t unit,
                      bool raw) {
  auto leaves = ArgLeaves(args);
  if (leaves.has_error()) return leaves.error();
  const int dtype = leaves->dtype;
  const auto l = zc::RowLayout::of(leaves->total, rows, unit);
  if (auto e = CheckRows(l, dtype); e.failure()) return e;
  if (outs.size() < 2) return Invalid("encode_rows: row buffers and a workspace expected");
  RowBuffers out;
  for (size_t i = 0; i + 1 < outs.size(); ++i) {
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
  const int64_t m = leaves->total;
  const auto l = zc::RowLayout::of(m, 1, 0);
  Workspace ws = WorkspaceOf(*workspace);
  const RowArrays a = TakeRowArrays(ws, RowOp::kAccumulate, dtype, l, int64_t(leaves->data.size()), 1);
  if (!ws.ok()) return TooSmall("accumulate", *workspace, ws);
  uint32_t* words = (*status)->typed_data();
  ZC_CUDA(cudaMemsetAsync(words, 0, size_t(parts->total) * sizeof(uint32_t), stream));
  for (size_t p = 0; p < parts->data.size(); ++p) {
    for (int64_t r = 0; r < parts->rows[p]; ++r) {  // m == 0 too: the headers are still checked
      const int64_t j = parts->first[p] + r;
      const ffi::Error launched = LaunchDecode(stream, dtype, parts->data[p], parts->cap, 1, r, 1, m, a.info,
                                               a.decoded, words + parts->first[p]);
      if (launched.failure()) return launched;
      ZC_LAUNCH(AccumulateKernel, (m + kThreads - 1) / kThreads, kThreads, stream, dtype, a.decoded, a.acc, m, j == 0);
    }
  }
  int64_t at = 0;
  for (size_t i = 0; i < leaves->data.size(); at += leaves->size[i++]) {
    const int64_t count = leaves->size[i];
    ZC_LAUNCH(StoreSumsKernel, (count + kThreads - 1) / kThreads, kThreads, stream, a.acc + at, leaves->dtype,
              leaves->data[i], count);
    // a corrupt row poisons every sum; the words keep their status once the last leaf is poisoned
    ZC_LAUNCH(PoisonKernel, 1, kThreads, stream, words, parts->total, 1, leaves->data[i],
              count * zc::layout_of(leaves->dtype).elem_bytes);
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

int64_t DecompressWorkspaceBytes(int /*dtype*/, int64_t streams, int64_t n) {
  Workspace ws;
  TakeStreamInfo(ws, streams, n);
  return ws.needed();
}

int64_t AccumulateWorkspaceBytes(int dtype, int64_t batch, int64_t n, int out_dtype) {
  Workspace ws;
  TakeAccumulateArrays(ws, dtype, batch, n, out_dtype);
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

// Device memory, events and a stream for TimeCodec, released on every path.
struct TimingResources {
  std::vector<void*> buffers;
  cudaEvent_t events[4] = {};
  cudaStream_t stream = nullptr;
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

// An XLA FFI buffer over device memory, to call the handlers outside XLA.
struct DeviceView {
  int64_t dims[2];
  XLA_FFI_Buffer buffer;
  DeviceView(ffi::DataType type, void* data, int64_t d0, int64_t d1) : dims{d0, d1} {
    buffer = {XLA_FFI_Buffer_STRUCT_SIZE, nullptr, static_cast<XLA_FFI_DataType>(type), data, 2, dims};
  }
};

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
  ZC_CUDA(cudaSetDevice(device));
  ZC_CUDA(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  for (cudaEvent_t& e : r.events) ZC_CUDA(cudaEventCreate(&e));
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
  if (const ffi::Error e = compress(); e.failure()) return e;  // warm-up
  if (const ffi::Error e = decompress(); e.failure()) return e;
  ZC_CUDA(cudaEventRecord(r.events[0], r.stream));
  for (int i = 0; i < repeat; ++i)
    if (const ffi::Error e = compress(); e.failure()) return e;
  ZC_CUDA(cudaEventRecord(r.events[1], r.stream));
  for (int i = 0; i < repeat; ++i)
    if (const ffi::Error e = decompress(); e.failure()) return e;
  ZC_CUDA(cudaEventRecord(r.events[2], r.stream));
  for (int i = 0; i < repeat; ++i)
    ZC_CUDA(cudaMemcpyAsync(copy, x, size_t(bytes), cudaMemcpyDeviceToDevice, r.stream));
  ZC_CUDA(cudaEventRecord(r.events[3], r.stream));
  ZC_CUDA(cudaEventSynchronize(r.events[3]));
  float ms[3];
  for (int i = 0; i < 3; ++i) ZC_CUDA(cudaEventElapsedTime(&ms[i], r.events[i], r.events[i + 1]));
  std::vector<uint8_t> back(size_t(bytes) + 2 * sizeof(uint32_t));
  ZC_CUDA(cudaMemcpyAsync(back.data(), y, size_t(bytes), cudaMemcpyDeviceToHost, r.stream));
  ZC_CUDA(cudaMemcpyAsync(back.data() + bytes, sizes, sizeof(uint32_t), cudaMemcpyDeviceToHost, r.stream));
  ZC_CUDA(cudaMemcpyAsync(back.data() + bytes + 4, status, sizeof(uint32_t), cudaMemcpyDeviceToHost, r.stream));
  ZC_CUDA(cudaStreamSynchronize(r.stream));
  uint32_t words[2];
  std::memcpy(words, back.data() + bytes, sizeof(words));
  timing->compress_ms = ms[0] / repeat;
  timing->decompress_ms = ms[1] / repeat;
  timing->copy_ms = ms[2] / repeat;
  timing->compressed_bytes = words[0];
  timing->round_trip = words[1] == 0 && (bytes == 0 || std::memcmp(back.data(), host_input, size_t(bytes)) == 0);
  return ffi::Error::Success();
}

}  // namespace

std::string TimeCodec(int device, int dtype, const void* host_input, int64_t n, int repeat, CodecTiming* timing) {
  const ffi::Error e = TimeCodecOn(device, dtype, host_input, n, repeat, timing);
  return e.failure() ? e.message() : std::string();
}

}  // namespace zipccl_cuda
