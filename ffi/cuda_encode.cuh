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

}  // namespace
