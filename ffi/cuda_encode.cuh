// The CUDA codec's compress kernels (docs/FORMAT.md §7; zipccl_cuda.cu's header
// says what runs where).
//
// Included by zipccl_cuda.cu alone (one translation unit for nvcc and for the host
// emulation), after the CUDA runtime or tests/cuda_host_shim.h and its ZC_* macros.
#pragma once

#include "cuda_device.cuh"

namespace {

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
// candidates C and D in shared histograms (one pass over the group's
// elements; A and B are theirs summed over the sign, E-H follow from A-D and
// the counts of exact zeros), a warp per two
// candidates' code lengths, the choice; then the stored elements' plane
// bytes (a second pass: each thread a contiguous run, a block scan numbers
// the stored elements for the sample) and the planes' codes (warp p: plane
// p). Refs, lengths, canonical codes, the mask and the table area's size go
// to global scratch. Same choices as choose_group_generic and choose_planes
// of the CPU codec.
template <int DT>
__global__ void ChooseKernel(const uint8_t* x, int64_t n, int64_t nb, int64_t ng, int64_t total_groups,
                             uint32_t* refs, uint8_t* lens, uint16_t* codes, PlaneScratch ps) {
  constexpr int dtype = DT;
  ZC_SHARED(ChooseSmem, sm);
  constexpr zc::Layout lay = zc::layout_of(dtype);
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
      for (int c = 2; c < 4; ++c)  // the sign-coded C and D; A and B are their counts summed over the sign
        atomicAdd(&sm.counts[c][zc::symbol_of_element(v, lay, (c & 1) ? own : sm.gmax, zc::candidate_mask(c))], 1u);
      if (zc::implied_zero(v, lay, true)) atomicAdd(&sm.implied[zc::implied_zero(v, lay, false) ? 0 : 1], 1u);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 2 * zc::kNumSyms; i += blockDim.x) {  // A = C's and B = D's, sign dropped
      const int c = i / zc::kNumSyms, s = i % zc::kNumSyms;
      sm.counts[c][s] = sm.counts[2 + c][s] + sm.counts[2 + c][s | (1 << zc::kSignBit)];
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

// What a CUDA block of the lane kernels keeps of its group's codes (§5).
struct GroupCodesSmem {
  uint8_t lens[zc::kMaxSyms];
  uint16_t codes[zc::kMaxSyms];
  uint8_t plens[zc::kMaxPlanes][zc::kPlaneSyms];
  uint16_t pcodes[zc::kMaxPlanes][zc::kPlaneSyms];
  uint32_t bits[kDecodeBlocks][zc::kLanes];  // each lane's bits (§2)
  int32_t devs[kDecodeBlocks][zc::kLanes - 1];
  int width[kDecodeBlocks];
  uint32_t coded[kDecodeBlocks];
};

// Copies group gi's codes to shared memory (all threads); returns its mask.
__device__ int LoadGroupCodes(GroupCodesSmem& sm, int64_t gi, const uint8_t* lens, const uint16_t* codes,
                              const PlaneScratch& ps) {
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
  return mask;
}

// The lane kernels' units: half groups (kDecodeBlocks blocks, thread 16 j + k
// on lane k of block j) of every item; false for the second half of a group
// that has none.
__device__ bool HalfGroup(int64_t unit, int64_t nb, int64_t ng, int64_t* item, int64_t* g, int64_t* b) {
  const int64_t halves = 2 * ng;
  *item = unit / halves, *g = (unit % halves) / 2;
  *b = *g * zc::kGroupBlocks + (unit % 2) * kDecodeBlocks + threadIdx.x / zc::kLanes;
  return !(unit % 2) || *g * zc::kGroupBlocks + kDecodeBlocks < nb;
}

// §7 step 4, thread per lane of every block of every item: each lane's bits
// (element_bits, summed over its elements) into lane_bits, then the block's
// width and body bytes (choose_width; a raw block's count * elem_bytes) into
// descs.
template <int DT>
__global__ void SizeKernel(const uint8_t* x, int64_t n, int64_t nb, int64_t ng, int64_t batch,
                           const uint32_t* refs, const uint8_t* lens, const uint16_t* codes, PlaneScratch ps,
                           uint32_t* lane_bits, uint32_t* descs) {
  constexpr int dtype = DT;
  ZC_SHARED(GroupCodesSmem, sm);
  constexpr zc::Layout lay = zc::layout_of(dtype);
  const int j = threadIdx.x / zc::kLanes, k = threadIdx.x % zc::kLanes;
  ZC_FOR_BLOCKS(unit, batch * 2 * ng) {
    int64_t item, g, b;
    if (!HalfGroup(unit, nb, ng, &item, &g, &b)) continue;  // block-uniform
    const int mask = LoadGroupCodes(sm, item * ng + g, lens, codes, ps);
    __syncthreads();
    const zc::PlaneCodes pc{mask, {sm.plens[0], sm.plens[1]}, {sm.pcodes[0], sm.pcodes[1]}, {}};
    const int64_t t = item * nb + b;
    if (b < nb) {
      const uint8_t* in = x + (item * n + b * zc::kBlock) * lay.elem_bytes;
      uint32_t bits = 0;
      for (int i = k; i < zc::block_count(n, b); i += zc::kLanes)
        bits += zc::element_bits(dtype, zc::load_element(in + i * lay.elem_bytes, lay.elem_bytes), refs[t], sm.lens, pc);
      lane_bits[t * zc::kLanes + k] = sm.bits[j][k] = bits;
    }
    __syncthreads();
    if (b < nb && k == 0) {
      uint32_t coded;
      zc::choose_width(sm.bits[j], sm.devs[j], &coded);
      const uint32_t raw = uint32_t(zc::block_count(n, b)) * lay.elem_bytes;
      descs[t] = coded < raw ? coded : raw;
    }
    __syncthreads();  // the shared memory is reused by the next unit
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
      const int64_t at = BlockExclusiveScan(b < nb ? descs[item * nb + b] : 0, sm.sums, &total);
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

// The bytes of a block's body (at byte `at` of the payload, `size` bytes,
// lanes of bits[16], the width field's width) that share a 32-bit word with
// another writer -- the words that hold a boundary between two writers (the
// body's start, each lane's, the body's end) off a word's start -- zeroed:
// BodyKernel ORs its bits into them. Their other bytes, another block's or a
// record's, are left alone.
__device__ void ZeroEdges(uint8_t* payload, uint64_t at, uint32_t size, int width, const uint32_t* bits) {
  const auto zero = [&](uint64_t edge) {
    if (!(edge & 31)) return;
    for (uint64_t byte = 4 * (edge >> 5); byte < 4 * (edge >> 5) + 4; ++byte)
      if (byte >= at && byte < at + size) payload[byte] = 0;
  };
  uint64_t edge = 8 * at;  // the body's start, where lane 0 (after the head) begins
  zero(edge);
  edge += zc::head_bits(width);
  for (int k = 0; k < zc::kLanes; ++k) {
    edge += bits[k];
    zero(edge);  // where lane k ends and lane k + 1 starts; the last lane's end
  }
}

// Thread per lane of every coded block (half groups, as SizeKernel): the
// edges of the block's body zeroed (ZeroEdges), before BodyKernel.
__global__ void PrepKernel(int64_t nb, int64_t ng, int64_t batch, const uint32_t* lane_bits, const uint32_t* descs,
                           const int64_t* body_at, const uint8_t* stored_raw, uint8_t* payload, int64_t cap,
                           int elem_bytes, int64_t n) {
  ZC_FOR_THREADS(t, batch * nb) {
    const int64_t item = t / nb, b = t % nb;
    if (stored_raw[item] || descs[t] == uint32_t(zc::block_count(n, b)) * elem_bytes) continue;
    int32_t devs[zc::kLanes - 1];
    uint32_t coded;
    const int width = zc::choose_width(lane_bits + t * zc::kLanes, devs, &coded);
    ZeroEdges(payload, uint64_t(item * cap + body_at[t]), descs[t], width, lane_bits + t * zc::kLanes);
  }
}

// §6: appends bits LSB first from bit `start` of 32-bit words up to bit
// `end`: whole words by plain stores, the two it may share with another
// writer (where start or end is off a word's start) by atomicOr into their
// zeroed bits (ZeroEdges).
struct EdgeWriter {
  uint32_t* words;
  uint64_t word, first, last;  // the next word; the shared ones (~0: none)
  uint64_t acc;
  int nbits;
  __device__ EdgeWriter(uint32_t* w, uint64_t start, uint64_t end)
      : words(w), word(start >> 5), first(start & 31 ? start >> 5 : ~0ull), last(end & 31 ? end >> 5 : ~0ull),
        acc(0), nbits(int(start & 31)) {}
  __device__ void emit(uint32_t v) {
    if ((word == first || word == last) && !ZC_INJECTED(1)) atomicOr(&words[word], v);  // injected: a race
    else words[word] = v;
    ++word;
  }
  __device__ void put(uint32_t value, int len) {
    acc |= uint64_t(value) << nbits;
    nbits += len;
    if (nbits >= 32) {
      emit(uint32_t(acc));
      acc >>= 32;
      nbits -= 32;
    }
  }
  __device__ void finish() {
    if (nbits > 0) emit(uint32_t(acc));
  }
};

// §7 step 4, thread per lane of every coded block of every item (half
// groups, as SizeKernel): lane k writes its elements (put_element) at its
// bit of the block's body in the payload -- lane 0 first the width field and
// the length deviations --, straight to their place.
template <int DT>
__global__ void BodyKernel(const uint8_t* x, int64_t n, int64_t nb, int64_t ng, int64_t batch,
                           const uint32_t* refs, const uint8_t* lens, const uint16_t* codes, PlaneScratch ps,
                           const uint32_t* lane_bits, const uint32_t* descs, const int64_t* body_at,
                           const uint8_t* stored_raw, uint8_t* payload, int64_t cap) {
  constexpr int dtype = DT;
  ZC_SHARED(GroupCodesSmem, sm);
  constexpr zc::Layout lay = zc::layout_of(dtype);
  const int j = threadIdx.x / zc::kLanes, k = threadIdx.x % zc::kLanes;
  ZC_FOR_BLOCKS(unit, batch * 2 * ng) {
    int64_t item, g, b;
    if (!HalfGroup(unit, nb, ng, &item, &g, &b) || stored_raw[item]) continue;  // block-uniform
    const int mask = LoadGroupCodes(sm, item * ng + g, lens, codes, ps);
    const int64_t t = item * nb + b;
    const int count = b < nb ? zc::block_count(n, b) : 0;
    const bool coded = b < nb && descs[t] < uint32_t(count) * lay.elem_bytes;
    if (coded && k == 0) sm.width[j] = zc::choose_width(lane_bits + t * zc::kLanes, sm.devs[j], &sm.coded[j]);
    __syncthreads();
    if (coded) {
      const zc::PlaneCodes pc{mask, {sm.plens[0], sm.plens[1]}, {sm.pcodes[0], sm.pcodes[1]}, {}};
      const uint32_t* bits = lane_bits + t * zc::kLanes;
      const int width = sm.width[j];
      uint64_t start = 8 * uint64_t(item * cap + body_at[t]) + (k ? zc::head_bits(width) : 0);
      for (int i = 0; i < k; ++i) start += bits[i];
      const uint64_t end = start + bits[k] + (k ? 0 : zc::head_bits(width));
      EdgeWriter w(reinterpret_cast<uint32_t*>(payload), start, end);
      if (k == 0) {  // §2: the width field, the length deviations
        zc::put_width(width, w);
        for (int d = 0; d + 1 < zc::kLanes; ++d) w.put(uint32_t(sm.devs[j][d]) & ((1u << width) - 1), width);
      }
      const uint8_t* in = x + (item * n + b * zc::kBlock) * lay.elem_bytes;
      for (int i = k; i < count; i += zc::kLanes)
        zc::put_element(dtype, zc::load_element(in + i * lay.elem_bytes, lay.elem_bytes), refs[t], sm.lens, sm.codes,
                        pc, w);
      w.finish();
    }
    __syncthreads();  // the shared memory is reused by the next unit
  }
}

// CUDA block per block of every item: its descriptor, its group's record
// and table area (first block of a group, one thread), a raw body (its
// elements); or, in a stored-raw item, its elements. Lanes store consecutive
// bytes. Coded bodies are BodyKernel's.
__global__ void MetaKernel(int dtype, const uint8_t* x, int64_t n, int64_t nb, int64_t ng, int64_t total,
                           const uint32_t* refs, const uint8_t* lens, PlaneScratch ps, const uint32_t* descs,
                           const int64_t* table_at, const int64_t* body_at, const uint8_t* stored_raw,
                           uint8_t* payload, int64_t cap) {
  const int64_t eb = zc::layout_of(dtype).elem_bytes;
  ZC_FOR_BLOCKS(t, total) {
    const int64_t item = t / nb, b = t % nb;
    uint8_t* out = payload + item * cap;
    const int64_t first = b * zc::kBlock * eb, bytes = zc::block_count(n, b) * eb;
    const uint8_t* in = x + item * n * eb + first;
    if (stored_raw[item]) {
      for (int64_t i = threadIdx.x; i < bytes; i += blockDim.x) out[zc::kHeaderBytes + first + i] = in[i];
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
      for (int i = 0; i < nblocks; ++i) group_refs[i] = uint8_t(refs[item * nb + b + i]);
      const uint8_t(*plens)[zc::kPlaneSyms] =
          reinterpret_cast<const uint8_t(*)[zc::kPlaneSyms]>(ps.lens + gi * zc::kMaxPlanes * zc::kPlaneSyms);
      zc::write_table_area(group_refs, zc::num_refs(mask, nblocks), lens + gi * zc::kMaxSyms, mask, plens,
                           out + table_at[gi]);
    }
    if (descs[t] == uint32_t(bytes))  // §2: a raw block
      for (int64_t i = threadIdx.x; i < bytes; i += blockDim.x) out[body_at[t] + i] = in[i];
  }
}

}  // namespace
