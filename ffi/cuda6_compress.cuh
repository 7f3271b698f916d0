// Format version 6 on CUDA: compress (docs/FORMAT.md §6), three kernels and no
// host synchronisation.
//
//   GroupKernel<DT>  a CTA per group, a warp per block: each block's own ref
//                    and symbol histogram, its exact size under the 8 family
//                    choices; the group code at the blocks' own refs and at the
//                    group ref (its histogram shifted from the own-ref ones),
//                    both by version 5's code_lengths; the sizes under each and
//                    the group's decisions: per block its descriptor's fields
//                    and its record's bytes, per group its bytes and code (the
//                    values' symbols kept between its passes: GroupShared).
//   ScanKernel       one CTA: the groups' offsets, the stream's length, the
//                    STORED_RAW decision and the header.
//   CodeKernel<DT>   a warp per block, a thread per lane: the descriptor and
//                    the record (table, raw bytes or coded body), staged in
//                    shared memory at the record's alignment and stored as
//                    whole words; or, for a STORED_RAW stream, the block's bytes.
#pragma once

#include "cuda6_device.cuh"

namespace zipccl {
namespace cuda6 {

constexpr int kGroupThreads = kWarp * kGroupBlocks;  // 512
constexpr uint32_t kRawStream = 1;                    // Workspace::flags: the stream is STORED_RAW

// The compress workspace (device memory), carved by CompressWorkspaceBytes's layout.
struct Workspace {
  uint64_t* plan;    // [nb] the descriptor's fields but `end`
  uint32_t* rsize;   // [nb] the record's bytes (a table included)
  uint16_t* lanes;   // [nb][32] a coded block's lane bits under its code (GroupKernel's, for CodeKernel)
  uint32_t* gbytes;  // [ng] the group's records' bytes
  uint64_t* goff;    // [ng] where the group's records start in the data area
  uint8_t* glens;    // [ng][256] the group's code (lengths) if it stores a table
  uint32_t* gput;    // [ng][256] its canonical codes as CodeKernel's entries (PutEntry)
  uint32_t* flags;   // kRawStream

  // Item `item`'s arrays, in a workspace carved for a batch of items of nb blocks in ng groups each.
  __host__ __device__ Workspace Item(int64_t item, int64_t nb, int64_t ng) const {
    return {plan + item * nb, rsize + item * nb, lanes + item * nb * kWarp, gbytes + item * ng, goff + item * ng,
            glens + item * ng * v6::kNumSyms, gput + item * ng * v6::kNumSyms, flags + item};
  }
};

// §6 step 1's images: a value's bits but the sign, plus 4 << low, wrapped at the sign bit, so
// that normal q (4 <= q < q_max = 2^q_bits - 4) land at kNormal = 8 << low and over (at (q + 4)
// << low | low), q < 4 (+-0, subnormals) below it and q >= q_max (Inf, NaN) below 4 << low: the
// largest image gives the largest normal q. bf16 and fp16 two values a word (a u16x2 maximum).
template <int DT>
struct RefImage {
  using E = Elem<DT>;
  static_assert(E::kLay.q_max == (1u << E::kLay.q_bits) - 4, "q_max is the all-ones exponent's");
  static constexpr int kPerLoad = 16 / E::kBytes;
  static constexpr uint32_t kMask = E::kBytes == 2 ? 0x7FFF7FFFu : 0x7FFFFFFFu;
  static constexpr uint32_t kAdd = (4u << E::kLay.low_bits) * (E::kBytes == 2 ? 0x10001u : 1u);
  static constexpr uint32_t kNormal = 8u << E::kLay.low_bits;
  __device__ static __forceinline__ uint32_t Of(uint32_t w) { return ((w & kMask) + kAdd) & kMask; }
  __device__ static __forceinline__ uint32_t Max(uint32_t a, uint32_t b) {
    return E::kBytes == 2 ? MaxU16x2(a, b) : cuda6::Max(a, b);
  }
};

struct HuffScratch {
  uint32_t weight[2 * v6::kNumSyms];
  uint16_t parent[2 * v6::kNumSyms];
  uint8_t depth[2 * v6::kNumSyms], leaf[v6::kNumSyms];
};

struct GroupSmem {
  union {
    uint32_t hist[kGroupBlocks][v6::kNumSyms];  // each block's symbols at its own ref, by exact index
    uint32_t cand[kGroupBlocks][v6::kNumSyms];  // then per block, by own-ref symbol: its bits under the candidates
  } u;
  uint64_t sizes[v6::kNumSyms][2];            // Tables::sizes by exact index, each length plus the fixed bits
  uint32_t counts[2][v6::kNumSyms];           // the candidates' symbol counts (flattened in place)
  uint32_t keys[2][v6::kNumSyms];             // the sort's: the used symbols' count << 8 | symbol, ~0 after
  uint16_t warp_used[2][v6::kNumSyms / kWarp];  // the used symbols a warp of each candidate's holds
  uint8_t lens[2][v6::kNumSyms];
  HuffScratch huff[2];
  CanonScratch canon;
  uint16_t fam_lanes[kGroupBlocks][kWarp];  // the lanes' bits under the block's family choice (0 if raw)
  uint32_t own[kGroupBlocks], fam_size[kGroupBlocks], fam_choice[kGroupBlocks], cand_size[2][kGroupBlocks];
  uint32_t used[2], longest[2], gref;
  int best;
};

// A block's symbols between GroupKernel's passes (each value's exact index at the block's own ref),
// four a word: value i = 128 t + 32 u + lane at byte u of word 32 t + lane (a lane's four values a
// word, a warp's 32 words in a row). (Not kept for CodeKernel: a byte an element of workspace would
// break the collectives' memory bound, docs/GPU.md "Ninth version".)
// GroupKernel's shared memory (dynamic: past a static array's 48 KB) is GroupSmem and its blocks'
// symbols, within the 99 KB a CUDA block of sm_86, sm_89 or sm_120 may have.
struct GroupShared {
  GroupSmem s;
  uint32_t syms[kGroupBlocks][kBlock / 4];
};
static_assert(sizeof(GroupShared) <= 101376, "GroupKernel's shared memory fits 99 KB");

// f(t, full) for word t of a lane's symbols in a block of `count` values: full (a
// std::true_type) when every value is there (count == kBlock), else a std::false_type, and f
// tests each value (128 t + 32 u + lane < count).
template <typename F>
__device__ __forceinline__ void ForSymbolWords(int count, F f) {
  if (count == kBlock) {
#pragma unroll 2
    for (int t = 0; t < kBlock / 128; ++t) f(t, std::true_type{});
  } else {
    for (int t = 0; 128 * t < count; ++t) f(t, std::false_type{});
  }
}

// zipccl_format.h huffman_tree_lengths's two-queue merge for one thread: t.weight[0..n) holds
// the n >= 2 used symbols' counts in (count, symbol) order; fills t.parent of the 2n - 2 nodes
// below the root (node 2n - 2) and t.weight of the merged nodes. Each queue's first two weights
// are held in registers, a queue's next loaded as it advances, a take before it can be needed,
// so that no shared-memory load's latency lies between one pick and the next.
__device__ inline void HuffmanMerge(HuffScratch& t, int n) {
  int li = 0, ni = n, total = n;  // the leaves [li, n), the merged nodes [ni, total)
  // weight[li], weight[li + 1] and weight[ni], weight[ni + 1], each where it lies in its queue
  uint32_t l0 = t.weight[0], l1 = t.weight[1], n0 = 0, n1 = 0;
#pragma unroll 1
  while (total < 2 * n - 1) {
    int pick[2];
    uint32_t w[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {  // a leaf on a tie, as huffman_tree_lengths; no branches
      const bool leaf = li < n && (ni >= total || l0 <= n0);
      pick[k] = leaf ? li : ni, w[k] = leaf ? l0 : n0;
      li += leaf, ni += !leaf;
      // the advanced queue's second (past its queue's end, or a node not merged yet: unused)
      const uint32_t next = t.weight[leaf ? li + 1 : ni + 1];
      l0 = leaf ? l1 : l0, l1 = leaf ? next : l1;
      n0 = leaf ? n0 : n1, n1 = leaf ? n1 : next;
    }
    t.parent[pick[0]] = t.parent[pick[1]] = uint16_t(total);
    const uint32_t sum = w[0] + w[1];
    t.weight[total] = sum;
    if (ni == total) n0 = sum;
    else if (ni + 1 == total) n1 = sum;
    ++total;
  }
}

// §6 step 4: the lengths of candidate h's counts (threads 256 h .. 256 h + 255),
// as code_lengths: Huffman over the used symbols by (count, symbol), the counts
// flattened until no code exceeds 12 bits. The sort is a rank a thread among
// the used symbols' keys (a candidate that needs no more flattening skips it); the
// merge one thread's (HuffmanMerge); the depths (huffman_tree_lengths's) by
// pointer jumping, a thread per two nodes. Every thread of the CTA calls it.
__device__ inline void GroupCodeLengths(GroupSmem& s) {
  // jumps: a depth below 2^6. A Huffman tree of depth D has counts summing to at least
  // Fibonacci(D + 2) (F1 = F2 = 1), and a group's at most 65,536: D <= 22
  constexpr int kRounds = 6;
  static_assert(kGroupBlocks * kBlock < 75025, "Fibonacci(25): a group's depths below 23");
  const int h = int(threadIdx.x) / v6::kNumSyms, sym = int(threadIdx.x) % v6::kNumSyms;
  uint32_t* counts = s.counts[h];
  HuffScratch& t = s.huff[h];
  const int n = int(s.used[h]), total = 2 * n - 1;
  // the used symbols' keys side by side (the flattening keeps a count nonzero): a used symbol's
  // place among them, in symbol order; ~0 past them, to a multiple of 8
  const bool used = counts[sym] != 0;
  const unsigned mask = __ballot_sync(kAll, used);
  const int lane = LaneId(), wh = sym / kWarp;
  if (lane == 0) s.warp_used[h][wh] = uint16_t(__popc(mask));
  __syncthreads();
  int at = __popc(mask & ((1u << lane) - 1));
  for (int i = 0; i < wh; ++i) at += s.warp_used[h][i];
  const int padded = (n + 7) & ~7;
  if (sym >= n && sym < padded) s.keys[h][sym] = 0xFFFFFFFFu;  // (at < n: never a used key's place)
  bool done = false;
  for (;;) {
    // the rank of (count, symbol) among the used symbols: one compare of packed keys (counts < 2^17)
    const uint32_t c = counts[sym], key = c << 8 | uint32_t(sym);
    if (used) s.keys[h][at] = key;
    __syncthreads();
    uint32_t rank = 0;
    if (used && !done)  // (a warp of unused symbols, most of a Gaussian's, skips the ranks)
      for (int u = 0; u < padded; u += 8)
#pragma unroll
        for (int v = 0; v < 8; ++v) rank += s.keys[h][u + v] < key;
    if (!done) {
      if (c) t.leaf[rank] = uint8_t(sym), t.weight[rank] = c;
      if (sym == 0) s.longest[h] = 0;
    }
    __syncthreads();
    const bool tree = !done && n >= 2;
    if (tree && sym == 0) HuffmanMerge(t, n);
    __syncthreads();
    // depth by pointer jumping: d += d[p], p = p[p]; the root (node total - 1) is its own parent, at 0
    uint32_t d[2] = {0, 0}, p[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
      const int j = sym + k * v6::kNumSyms;
      if (tree && j < total) d[k] = j == total - 1 ? 0u : 1u, p[k] = j == total - 1 ? uint32_t(j) : t.parent[j];
    }
#pragma unroll 1
    for (int r = 0; r <= kRounds; ++r) {
      for (int k = 0; k < 2; ++k) {
        const int j = sym + k * v6::kNumSyms;
        if (tree && j < total) t.depth[j] = uint8_t(d[k]), t.parent[j] = uint16_t(p[k]);
      }
      __syncthreads();
      if (r == kRounds) break;
      for (int k = 0; k < 2; ++k) {
        const int j = sym + k * v6::kNumSyms;
        if (tree && j < total) d[k] += t.depth[p[k]], p[k] = t.parent[p[k]];
      }
      __syncthreads();
    }
    if (!done) {  // symbol sym is leaf `rank`, at its depth (a lone symbol: length 1)
      const uint32_t len = !c ? 0u : n == 1 ? 1u : uint32_t(t.depth[rank]);
      s.lens[h][sym] = uint8_t(len);
      if (len) atomicMax(&s.longest[h], len);
    }
    __syncthreads();
    done = s.longest[h] <= uint32_t(kMaxCodeLen);
    if (s.longest[0] <= uint32_t(kMaxCodeLen) && s.longest[1] <= uint32_t(kMaxCodeLen)) return;
    __syncthreads();  // all have read longest
    if (!done) {
      const int k = flattening_shift(int(s.longest[h]));
      counts[sym] = c ? (c + (1u << k) - 1) >> k : 0;
    }
    __syncthreads();
  }
}

template <int DT>
__global__ void __launch_bounds__(kGroupThreads, 2) GroupKernel(const typename Elem<DT>::Word* x, int64_t n,
                                                             const Tables* tables, Workspace ws) {
  // a batch: CTA item * ng + g, the items' x end to end
  const int64_t nb = (n + kBlock - 1) / kBlock, ng = (nb + kGroupBlocks - 1) / kGroupBlocks, item = blockIdx.x / ng;
  x += item * n, ws = ws.Item(item, nb, ng), tables = TablesOr(tables);
  using E = Elem<DT>;
  constexpr v6::Layout lay = E::kLay;
  ZC_DYNAMIC_SHARED(smem);
  GroupShared& shared = *reinterpret_cast<GroupShared*>(smem);
  GroupSmem& s = shared.s;
  const int tid = int(threadIdx.x), w = WarpIdx(), lane = LaneId();
  const int64_t g = blockIdx.x % ng, b = g * kGroupBlocks + w;
  const int count = b < nb ? int(Min<int64_t>(kBlock, n - b * kBlock)) : 0;
  const int blocks = int(Min<int64_t>(kGroupBlocks, nb - g * kGroupBlocks));
  const typename E::Word* xb = x + b * kBlock;
  for (int i = tid; i < kGroupBlocks * v6::kNumSyms; i += kGroupThreads) s.u.hist[i / v6::kNumSyms][i % v6::kNumSyms] = 0;
  if (tid < v6::kNumSyms) {  // a value's bits under each combo: its code's and the fixed ones
    const int sym = PseudoSource(tid, v6::kClassEsc - 1);
    const uint64_t fixed = uint64_t(v6::fixed_bits(sym, lay)) * 0x0001000100010001ull;
    s.sizes[tid][0] = tables->sizes[sym][0] + fixed, s.sizes[tid][1] = tables->sizes[sym][1] + fixed;
  }
  if (tid < 2 * v6::kNumSyms) s.counts[tid / v6::kNumSyms][tid % v6::kNumSyms] = 0;
  if (tid < 2) s.used[tid] = 0;
  // §6 step 1: the block's own ref, the largest normal q (0 if none), from the values' images
  // (RefImage): 16 bytes a load where x is 16-byte aligned (then every block is), the rest one by one
  using Img = RefImage<DT>;
  const int vec = reinterpret_cast<uintptr_t>(x) % 16 == 0 ? count / Img::kPerLoad : 0;
  const Words4* xv = reinterpret_cast<const Words4*>(xb);
  uint32_t top = 0;
#pragma unroll 4
  for (int i = lane; i < vec; i += kWarp) {
    const Words4 v = xv[i];
    top = Img::Max(top, Img::Max(Img::Max(Img::Of(v.x), Img::Of(v.y)), Img::Max(Img::Of(v.z), Img::Of(v.w))));
  }
  for (int i = vec * Img::kPerLoad + lane; i < count; i += kWarp) top = Img::Max(top, Img::Of(xb[i]));
  if (ZC_INJECTED(2) && lane == 5) return;  // a lane that skips its warp's reduction (the emulation's test)
  top = RedMax(E::kBytes == 2 ? Max(top & 0xFFFFu, top >> 16) : top);
  const uint32_t own = top >= Img::kNormal ? (top >> lay.low_bits) - 4 : 0u, own_lim = SymbolLimit(own);
  __syncthreads();
  // §6 step 2: the symbols' histogram and the lanes' bits under the 8 family choices (16 bits each:
  // a lane's 128 values take at most 128 x 43 bits); the symbols kept (GroupShared)
  // (each value's exact index; at lim 120 by SymbolIndexHigh: warp-uniform)
  uint64_t fam0 = 0, fam1 = 0;
  uint32_t* syms = shared.syms[w];
  const auto histogram = [&](auto high) {
    ForSymbolWords(count, [&](int t, auto full) {
      uint32_t word = 0;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int i = 128 * t + 32 * u + lane;
        if (decltype(full)::value || i < count) {
          const uint32_t j = decltype(high)::value ? SymbolIndexHigh<DT>(xb[i], own)
                                                   : SymbolIndex<DT, true>(xb[i], own, own_lim);
          atomicAdd(&s.u.hist[w][j], 1u);
          fam0 += s.sizes[j][0], fam1 += s.sizes[j][1];
          word += j << (8 * u);
        }
      }
      syms[32 * t + lane] = word;
    });
  };
  if (own_lim == uint32_t(v6::kClassEsc - 1)) histogram(std::true_type{});
  else histogram(std::false_type{});
  uint32_t best_size = 0xFFFFFFFFu, best_c = 0;
  for (int c = 0; c < kCombos; ++c) {
    const uint32_t bits = uint32_t((c < 4 ? fam0 : fam1) >> (16 * (c % 4))) & 0xFFFF;
    // a body holds its lanes' bits and a head of at least head_bits(1): a combo whose bits alone
    // cannot beat the best so far skips the width search (warp-uniform)
    if ((RedAdd(bits) + uint32_t(v6::head_bits(1)) + 7) / 8 >= best_size) continue;
    const uint32_t size = WarpBodyShape(bits).size;
    if (size < best_size) best_size = size, best_c = uint32_t(c);
  }
  const uint32_t raw_bytes = uint32_t(count) * E::kBytes;
  // (kept in shared memory, not in registers across GroupCodeLengths)
  s.fam_lanes[w][lane] = uint16_t(best_size >= raw_bytes ? 0u : uint32_t((best_c < 4 ? fam0 : fam1) >> (16 * (best_c % 4))));
  if (lane == 0) {
    s.own[w] = own;
    s.fam_size[w] = best_size >= raw_bytes ? raw_bytes : best_size;
    s.fam_choice[w] = best_size >= raw_bytes ? ~0u : best_c;
  }
  __syncthreads();
  // §6 step 4: the candidates' counts: at the own refs, and at the group ref by shifting each block's
  if (tid == 0) {
    uint32_t gref = 0;
    for (int i = 0; i < kGroupBlocks; ++i) gref = Max(gref, s.own[i]);
    s.gref = gref;
  }
  __syncthreads();
  {
    const int h = tid / v6::kNumSyms, sym = tid % v6::kNumSyms;
    uint32_t own_total = 0;
    for (int i = 0; i < blocks; ++i) {
      const uint32_t c = s.u.hist[i][ExactIndex(sym)];
      own_total += c;
      if (h == 1 && c) atomicAdd(&s.counts[1][v6::shifted_symbol(sym, s.gref - s.own[i])], c);
    }
    if (h == 0) s.counts[0][sym] = own_total;
  }
  __syncthreads();
  if (s.counts[tid / v6::kNumSyms][tid % v6::kNumSyms]) atomicAdd(&s.used[tid / v6::kNumSyms], 1u);
  __syncthreads();
  GroupCodeLengths(s);  // its barriers order the histograms' last reads before the tables below
  // the blocks' sizes under both candidates: per own-ref symbol (its exact index, as kept) the
  // bits under candidate 0 and, shifted to the group ref, under candidate 1 (the block's normal q
  // are at most its ref), so that a value is one lookup and one add for both (16 bits each)
  uint32_t* cand = s.u.cand[w];
  // (the ref read again: fewer registers live across GroupCodeLengths)
  const uint32_t ref = s.own[w], shift = s.gref - ref;
  for (int k = lane; k < v6::kNumSyms; k += kWarp) {
    const int k0 = PseudoSource(k, v6::kClassEsc - 1), k1 = v6::shifted_symbol(k0, shift);
    cand[k] = (s.lens[0][k0] + uint32_t(v6::fixed_bits(k0, lay))) | (s.lens[1][k1] + uint32_t(v6::fixed_bits(k1, lay))) << 16;
  }
  __syncwarp();
  uint32_t both = 0;
  ForSymbolWords(count, [&](int t, auto full) {
    const uint32_t word = syms[32 * t + lane];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (decltype(full)::value || 128 * t + 32 * u + lane < count) both += cand[ByteOf(word, u)];
  });
  const uint32_t bits0 = both & 0xFFFF, bits1 = both >> 16;
  const uint32_t size0 = WarpBodyShape(bits0).size, size1 = WarpBodyShape(bits1).size;
  if (lane == 0) s.cand_size[0][w] = size0, s.cand_size[1][w] = size1;
  __syncthreads();
  if (tid == 0) {  // the first of least cost, if it beats the family
    uint32_t family = 0, cost[2] = {v6::kTableBytes, v6::kTableBytes};
    for (int i = 0; i < blocks; ++i) {
      family += s.fam_size[i];
      for (int h = 0; h < 2; ++h) cost[h] += Min(s.fam_size[i], s.cand_size[h][i]);
    }
    const int h = cost[1] < cost[0] ? 1 : 0;
    s.best = cost[h] < family ? h : -1;
  }
  __syncthreads();
  const int best = s.best;
  uint32_t index;
  const uint32_t code = CanonicalCode(tid < v6::kNumSyms && best >= 0 ? s.lens[best][tid] : 0u, s.canon, &index);
  if (best >= 0 && tid < v6::kNumSyms) {
    const uint32_t len = s.lens[best][tid];
    ws.glens[g * v6::kNumSyms + tid] = uint8_t(len);
    ws.gput[g * v6::kNumSyms + tid] = PutEntry<DT>(Reverse(code, int(len)) | len << 16, tid);
  }
  if (w < blocks) {  // the lane's bits under the block's code, for CodeKernel
    const bool group = best >= 0 && s.cand_size[best][w] < s.fam_size[w];
    ws.lanes[b * kWarp + lane] = group ? uint16_t(best ? bits1 : bits0) : s.fam_lanes[w][lane];
  }
  if (lane == 0 && w < blocks) {
    const bool group = best >= 0 && s.cand_size[best][w] < s.fam_size[w];
    const uint32_t choice = s.fam_choice[w], raw = !group && choice == ~0u;
    const uint32_t bref = group ? (best ? s.gref : ref) : raw ? 0 : ref;
    const uint32_t bcode = group ? v6::kGroupCode : raw ? 0 : choice >> 1, flip = !group && !raw ? choice & 1 : 0;
    const bool table = best >= 0 && w == 0;
    ws.plan[b] = uint64_t(bref) << 32 | uint64_t(bcode) << 42 | uint64_t(flip) << 46 | uint64_t(raw) << 47 |
                 uint64_t(table) << 48;
    ws.rsize[b] = (group ? s.cand_size[best][w] : s.fam_size[w]) + (table ? v6::kTableBytes : 0);
  }
  __syncthreads();
  if (tid == 0) {
    uint32_t total = 0;
    for (int i = 0; i < blocks; ++i) total += ws.rsize[g * kGroupBlocks + i];
    ws.gbytes[g] = total;
  }
}

// §2, §6 step 5: the groups' offsets (a thread a run of groups, then a block
// scan), the stream's length and header. One CTA of 1024 threads a stream:
// item blockIdx.x's, written at out + item * pitch; its length to out_len[item]
// and (if not null) out_len32[item].
constexpr int kScanThreads = 1024;
struct ScanSmem {
  uint64_t sums[kScanThreads / kWarp];
};
__global__ void __launch_bounds__(kScanThreads) ScanKernel(int dtype, int64_t n, Workspace ws, uint8_t* out,
                                                           int64_t pitch, unsigned long long* out_len,
                                                           uint32_t* out_len32) {
  ZC_SHARED(ScanSmem, smem);
  uint64_t* sums = smem.sums;
  const int64_t nb = (n + kBlock - 1) / kBlock, ng = (nb + kGroupBlocks - 1) / kGroupBlocks, item = blockIdx.x;
  ws = ws.Item(item, nb, ng), out += item * pitch;
  const int64_t per = (ng + kScanThreads - 1) / kScanThreads, lo = Min<int64_t>(ng, threadIdx.x * per),
                hi = Min<int64_t>(ng, lo + per);
  uint64_t mine = 0;
  for (int64_t g = lo; g < hi; ++g) mine += ws.gbytes[g];
  const uint64_t inclusive = WarpInclusiveScan(mine);
  if (LaneId() == kWarp - 1) sums[WarpIdx()] = inclusive;
  __syncthreads();
  uint64_t before = 0, all = 0;
  for (int i = 0; i < kScanThreads / kWarp; ++i) before += i < WarpIdx() ? sums[i] : 0, all += sums[i];
  uint64_t at = inclusive - mine + before;
  for (int64_t g = lo; g < hi; ++g) ws.goff[g] = at, at += ws.gbytes[g];
  const int64_t raw_bytes = n * v6::layout_of(dtype).elem_bytes;
  const bool raw = int64_t(v6::kDescBytes * nb + all) >= raw_bytes;
  if (threadIdx.x == 0) {
    *ws.flags = raw ? kRawStream : 0;
    v6::write_header(out, dtype, raw ? kFlagStoredRaw : 0, n);
    const int64_t len = raw ? kHeaderBytes + raw_bytes : v6::data_offset(nb) + int64_t(all);
    if (out_len) out_len[item] = (unsigned long long)len;
    if (out_len32) out_len32[item] = uint32_t(len);
  }
}

// Ors the len (<= 32) bits of v into the stage at bit `bit` (the stage starts zeroed).
__device__ __forceinline__ void OrBits(uint32_t* stage, uint32_t bit, uint32_t v, int len) {
  const uint64_t t = uint64_t(v) << (bit % 32);
  atomicOr(&stage[bit / 32], uint32_t(t));
  if (bit % 32 + uint32_t(len) > 32) atomicOr(&stage[bit / 32 + 1], uint32_t(t >> 32));
}

// A lane's bits into the stage from bit `bit`, LSB first: a word of held bits,
// a put one funnel-shifted append. A word is stored whole by the lane whose
// bits reach its end (zeros below its first bit); the lane's last, partial
// word is ored in by Finish, after a __syncwarp orders it after those stores
// (the stage starts zeroed; the head and the table are ored in after that).
struct LaneWriter {
  uint32_t* at;              // the word being filled
  uint32_t cur, held;        // its bits so far (the first `bit % 32` are other lanes', zero here)
  __device__ LaneWriter(uint32_t* stage, uint32_t bit) : at(stage + bit / 32), cur(0), held(bit % 32) {}
  // v < 2^len, len <= 32 (0: nothing)
  __device__ __forceinline__ void Put(uint32_t v, uint32_t len) {
    const uint32_t lo = cur | v << held, hi = FunnelL(v, 0u, held);
    held += len;
    const bool full = held >= 32;
    if (full) *at = lo;
    at += full, cur = full ? hi : lo, held &= 31;
  }
  __device__ __forceinline__ void Finish() {  // after a __syncwarp
    if (held > 0) atomicOr(at, cur);
  }
};

template <int DT>
struct CodeShape {
  static constexpr int kWarps = 8 / Elem<DT>::kBytes;  // blocks a CTA: the stages fill 33 KB
  // a record's bytes at most (a table and a raw body) after up to 3 bytes of alignment
  static constexpr int kStageWords = (3 + v6::kTableBytes + kBlock * Elem<DT>::kBytes + 3) / 4 + 1;
};
template <int DT>
struct CodeSmem {
  uint32_t enc[CodeShape<DT>::kWarps][v6::kNumSyms];
  uint32_t stage[CodeShape<DT>::kWarps][CodeShape<DT>::kStageWords];
};

// §3: one element's code, an escape's q and its low bits to the lane's writer: bf16 and fp16
// in one put (at most 12 + 10 + 5 or 12 + 7 + 8 bits), fp32 in two.
template <int DT>
__device__ __forceinline__ void PutElement(uint32_t xv, uint32_t e, LaneWriter& out) {
  using E = Elem<DT>;
  const uint32_t code = e & 0xFFFF, low = xv & E::kLowMask, q = (xv >> E::kLay.low_bits) & E::kQMask;
  const bool esc = e & kPutEsc;
  if (E::kBytes == 2) {  // FunnelL(0, t, e >> 16): t << the code's length (the shift's low 5 bits)
    out.Put(code | FunnelL(0u, esc ? q | low << E::kLay.q_bits : low, e >> 16), e >> 25);
  } else {
    out.Put(code | (esc ? FunnelL(0u, q, e >> 16) : 0u), e >> 25);
    out.Put(low, e & kPutMore ? uint32_t(E::kLay.low_bits) : 0u);
  }
}

template <int DT>
__global__ void __launch_bounds__(kWarp * CodeShape<DT>::kWarps) CodeKernel(const typename Elem<DT>::Word* x,
                                                                            int64_t n, const Tables* tables,
                                                                            Workspace ws, uint8_t* out, int64_t pitch) {
  using E = Elem<DT>;
  constexpr v6::Layout lay = E::kLay;
  ZC_SHARED(CodeSmem<DT>, s);
  const int w = WarpIdx(), lane = LaneId();
  // a batch: CTAs item * per .. item * per + per - 1 for item's blocks, its stream at out + item * pitch
  // (any alignment: the stores below are aligned to the absolute address)
  const int64_t nb = (n + kBlock - 1) / kBlock, per = (nb + CodeShape<DT>::kWarps - 1) / CodeShape<DT>::kWarps;
  const int64_t item = blockIdx.x / per, b = int64_t(blockIdx.x % per) * CodeShape<DT>::kWarps + w;
  if (b >= nb) return;  // the warp's block; no CTA barrier follows
  x += item * n, out += item * pitch, ws = ws.Item(item, nb, (nb + kGroupBlocks - 1) / kGroupBlocks);
  tables = TablesOr(tables);
  const int count = int(Min<int64_t>(kBlock, n - b * kBlock));
  const typename E::Word* xb = x + b * kBlock;
  if (*ws.flags & kRawStream) {
    uint8_t* dst = out + kHeaderBytes + b * kBlock * E::kBytes;  // one store an element where aligned
    for (int i = lane; i < count; i += kWarp) store_element(dst + i * E::kBytes, xb[i], E::kBytes);
    return;
  }
  const int64_t g = b / kGroupBlocks, first = g * kGroupBlocks;
  const uint32_t start = uint32_t(ws.goff[g]) + WarpSum(lane < b - first ? ws.rsize[first + lane] : 0u);
  const uint32_t size = ws.rsize[b];
  const uint64_t plan = ws.plan[b];
  const uint32_t ref = uint32_t(plan >> 32) & 0x3FF, code = uint32_t(plan >> 42) & 15, flip = uint32_t(plan >> 46) & 1;
  const bool raw = (plan >> 47) & 1, table = (plan >> 48) & 1;
  uint8_t* desc = out + kHeaderBytes + v6::kDescBytes * b;
  if (reinterpret_cast<uintptr_t>(desc) % 8 == 0) {
    if (lane == 0) *reinterpret_cast<uint64_t*>(desc) = plan | (start + size);
  } else if (lane < v6::kDescBytes) {  // a stream at an unaligned pitch: a byte a lane
    desc[lane] = uint8_t((plan | (start + size)) >> (8 * lane));
  }
  uint32_t* enc = s.enc[w];
  uint32_t* stage = s.stage[w];
  const uint32_t lim = SymbolLimit(ref);
  const uint32_t* src = code == uint32_t(v6::kGroupCode) ? ws.gput + g * v6::kNumSyms : tables->put[DT - 1][2 * code + flip];
  for (int i = lane; i < v6::kNumSyms; i += kWarp) enc[i] = src[PseudoSource(i, lim)];  // indexed by SymbolIndex
  const int64_t at = v6::data_offset(nb) + start;  // the record in the stream
  const uint32_t pad = uint32_t((reinterpret_cast<uintptr_t>(out) + at) % 4), words = (pad + size + 3) / 4, tbl = table ? v6::kTableBytes : 0;
  for (uint32_t i = lane; i < words; i += kWarp) stage[i] = 0;
  __syncwarp();
  if (raw) {
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(xb);
    for (uint32_t i = lane; i < words; i += kWarp) {
      uint32_t v = 0;
      for (uint32_t k = 0; k < 4; ++k) {
        const int64_t r = int64_t(4 * i + k) - pad - tbl;
        if (r >= 0 && r < int64_t(count) * E::kBytes) v |= uint32_t(bytes[r]) << (8 * k);
      }
      if (v) atomicOr(&stage[i], v);
    }
  } else {  // §3: the lanes' lengths, each lane's elements, then the head
    const uint32_t bits = ws.lanes[b * kWarp + lane];  // GroupKernel's
    const BodyShape shape = WarpBodyShape(bits);
    const uint32_t before = WarpInclusiveScan(bits) - bits, body = 8 * (pad + tbl);
    LaneWriter lw(stage, body + uint32_t(v6::head_bits(shape.width)) + before);
#pragma unroll 8
    for (int i = lane; i < count; i += kWarp) {
      const uint32_t xv = xb[i];
      PutElement<DT>(xv, enc[SymbolIndex<DT, false>(xv, ref, lim)], lw);
    }
    if (!ZC_INJECTED(1)) __syncwarp();  // the lanes' whole words stored before the words they share are ored
                                        // (the emulation's injected race leaves it out)
    lw.Finish();
    if (lane == 0)
      OrBits(stage, body, shape.field_bits == 3 ? uint32_t(shape.width - kWidthShort) : 7u | uint32_t(shape.width) << 3,
             shape.field_bits);
    if (lane < kWarp - 1)
      OrBits(stage, body + shape.field_bits + lane * shape.width,
             (bits - shape.base) & ((1u << shape.width) - 1), shape.width);
  }
  if (table) {  // §4: the group's code, two lengths a byte
    const uint8_t* lens = ws.glens + g * v6::kNumSyms;
    for (int j = lane; j < v6::kTableBytes; j += kWarp) {
      const int a = 2 * j, c = 2 * j + 1;  // valid symbol indices: 122 a sign
      const uint32_t lo = lens[(a / 122) * 128 + a % 122], hi = lens[(c / 122) * 128 + c % 122];
      OrBits(stage, 8 * (pad + j), lo | hi << 4, 8);
    }
  }
  __syncwarp();
  // the record's whole words [whole, last) stored; the two it may share with its neighbours byte
  // by byte, the first (if pad) by lane 0, the last (if the record ends inside it and it is not
  // the first) by lane 1
  uint32_t* dst = reinterpret_cast<uint32_t*>(out + (at - pad));
  const uint32_t end = pad + size, whole = pad ? 1 : 0, last = end / 4;
#pragma unroll 4
  for (uint32_t i = whole + lane; i < last; i += kWarp) dst[i] = stage[i];
  if (lane == 0 ? pad != 0 : lane == 1 && end % 4 != 0 && (last > 0 || pad == 0)) {
    const uint32_t i = lane ? last : 0;
    for (uint32_t k = 4 * i; k < 4 * i + 4; ++k)
      if (k >= pad && k < end) reinterpret_cast<uint8_t*>(dst)[k] = uint8_t(stage[i] >> (8 * (k - 4 * i)));
  }
}

}  // namespace cuda6
}  // namespace zipccl
