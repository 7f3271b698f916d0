// Fast CPU encoder choices (FORMAT.md §7 steps 1-3): a block's symbols are
// counted once, per sign, under its own emax; the group's eight candidate
// codes follow from those counts.
#pragma once

#include "simd_cpu.h"

namespace zipccl {

#if ZC_HAVE_SIMD
// The top 16 bits of 32 elements from element i.
template <int DT>
ZC_SIMD __m512i load_tops(const uint8_t* in, int i) {
  if constexpr (Elem<DT>::lay.elem_bytes == 2) return _mm512_loadu_si512(in + 2 * i);
  return _mm512_permutex2var_epi16(_mm512_loadu_si512(in + 4 * i), lanes(kOddWords),
                                   _mm512_loadu_si512(in + 4 * i + 64));
}

// Which of the 32 elements from element i are exact zeros of sign 0 and 1.
template <int DT>
ZC_SIMD void zero_masks(const uint8_t* in, int i, __m512i h, uint32_t* plus, uint32_t* minus) {
  if constexpr (Elem<DT>::lay.elem_bytes == 2) {
    *plus = _mm512_testn_epi16_mask(h, h);
    *minus = _mm512_cmpeq_epi16_mask(h, _mm512_set1_epi16(short(0x8000)));
  } else {
    const __m512i a = _mm512_loadu_si512(in + 4 * i), b = _mm512_loadu_si512(in + 4 * i + 64);
    const __m512i sign = _mm512_set1_epi32(int(0x80000000u));
    *plus = _mm512_testn_epi32_mask(a, a) | uint32_t(_mm512_testn_epi32_mask(b, b)) << 16;
    *minus = _mm512_cmpeq_epi32_mask(a, sign) | uint32_t(_mm512_cmpeq_epi32_mask(b, sign)) << 16;
  }
}

// The symbols (§4, without the sign) of the 32 tops h under ref; *esc flags
// the escapes. With SC the sign goes to bit 7 (§4.1).
template <int DT, bool SC = false>
ZC_SIMD __m512i symbols_of(__m512i h, __m512i ref, __mmask32* esc) {
  using E = Elem<DT>;
  const __m512i e = _mm512_and_si512(_mm512_srli_epi16(h, E::e_shift), _mm512_set1_epi16(E::all_ones));
  const __m512i t = _mm512_and_si512(_mm512_srli_epi16(h, E::t_shift), _mm512_set1_epi16(3));
  // d = ref - e wraps when e > ref: min(d, max_delta + 1) + 1 is then the escape class
  __m512i c = _mm512_min_epu16(_mm512_sub_epi16(ref, e), _mm512_set1_epi16(kMaxDelta + 1));
  c = _mm512_maskz_add_epi16(_mm512_test_epi16_mask(e, e), c, _mm512_set1_epi16(1));
  *esc = _mm512_cmpeq_epi16_mask(c, _mm512_set1_epi16(kClassEsc));
  const __m512i s = _mm512_or_si512(_mm512_slli_epi16(c, kTopBits), t);
  if constexpr (SC) return _mm512_or_si512(s, _mm512_and_si512(_mm512_srli_epi16(h, 8), _mm512_set1_epi16(0x80)));
  return s;
}

// §7 step 1 for a full block.
template <int DT>
ZC_SIMD uint32_t block_emax_simd(const uint8_t* in) {
  using E = Elem<DT>;
  const __m512i all_ones = _mm512_set1_epi16(E::all_ones);
  __m512i emax = _mm512_setzero_si512();
  for (int i = 0; i < kBlock; i += 32) {
    const __m512i e = _mm512_and_si512(_mm512_srli_epi16(load_tops<DT>(in, i), E::e_shift), all_ones);
    emax = _mm512_mask_max_epu16(emax, _mm512_cmpneq_epi16_mask(e, all_ones), emax, e);
  }
  emax = _mm512_max_epu16(emax, _mm512_srli_epi32(emax, 16));
  return _mm512_reduce_max_epu32(_mm512_and_si512(emax, _mm512_set1_epi32(0xFFFF)));
}

// block_counts for a full block: its symbols with the sign in bit 7 as
// bytes, then counted in four sub-histograms, one per quarter of the block,
// so that repeats of a frequent symbol do not wait on each other's
// increments (eight cost more to add up than they save on Gaussian data).
template <int DT>
ZC_SIMD uint32_t block_counts_simd(const uint8_t* in, uint32_t (*counts)[kNumSyms], uint32_t* zeros) {
  constexpr int kQuarters = 4, q = kBlock / kQuarters;
  const uint32_t emax = block_emax_simd<DT>(in);
  const __m512i ref = _mm512_set1_epi16(short(emax));
  alignas(64) uint8_t syms[kBlock];
  uint32_t plus[kQuarters] = {}, minus[kQuarters] = {};
  for (int i = 0; i < kBlock; i += 32) {
    __mmask32 esc;
    uint32_t p, m;
    const __m512i h = load_tops<DT>(in, i);
    zero_masks<DT>(in, i, h, &p, &m);
    plus[i / q] += __builtin_popcount(p), minus[i / q] += __builtin_popcount(m);
    _mm256_store_si256(reinterpret_cast<__m256i*>(syms + i), _mm512_cvtepi16_epi8(symbols_of<DT, true>(h, ref, &esc)));
  }
  uint16_t h[kQuarters][2 * kNumSyms] = {};
  for (int i = 0; i < q; ++i)
    for (int j = 0; j < kQuarters; ++j) ++h[j][syms[j * q + i]];
  for (int s = 0; s < 2 * kNumSyms; ++s) counts[s >> 7][s & 127] = h[0][s] + h[1][s] + h[2][s] + h[3][s];
  zeros[0] = plus[0] + plus[1] + plus[2] + plus[3], zeros[1] = minus[0] + minus[1] + minus[2] + minus[3];
  return emax;
}
#endif

// §7 steps 1-2 for one block: returns its emax, sets counts[sign][kNumSyms]
// to its symbol counts under ref = emax, per sign, and zeros[sign] to its
// exact zeros of each sign.
template <int DT>
uint32_t block_counts(const uint8_t* in, int count, uint32_t (*counts)[kNumSyms], uint32_t* zeros) {
#if ZC_HAVE_SIMD
  if (count == kBlock && simd_enabled()) return block_counts_simd<DT>(in, counts, zeros);
#endif
  using E = Elem<DT>;
  constexpr uint32_t keys = 2 * E::keys;  // the sign above the key
  constexpr uint32_t sign = E::lay.elem_bytes == 2 ? 0x8000u : 0x80000000u;
  uint16_t h[2][keys] = {};  // two sub-histograms: see block_counts_simd
  zeros[0] = zeros[1] = 0;
  for (int i = 0; i < count; ++i) {
    const uint32_t x = E::bits(in, i);
    ++h[i & 1][E::signed_key(E::top(in, i))];
    zeros[0] += x == 0, zeros[1] += x == sign;
  }
  uint32_t emax = 0;
  for (uint32_t k = 0; k < keys; ++k) {
    const uint32_t e = (k >> kTopBits) & E::all_ones;
    if ((h[0][k] || h[1][k]) && e < E::all_ones && e > emax) emax = e;
  }
  std::memset(counts, 0, 2 * kNumSyms * sizeof(uint32_t));
  for (uint32_t k = 0; k < keys; ++k)
    counts[k / E::keys][symbol_of((k >> kTopBits) & E::all_ones, k & 3, emax)] += h[0][k] + h[1][k];
  return emax;
}

// The n used symbols of counts (1 << kShift of them) as leaves count <<
// kShift | symbol, sorted by (count, symbol): in symbol order, then sorted by
// count, stably, a byte per pass (with two used symbols or more, the counts
// of a group, at most 2^16 elements, fit 16 bits).
template <int kShift>
inline void sort_leaves(const uint32_t* counts, uint32_t* leaf, int n) {
  uint32_t any = 0, m = 0, sorted[(1 << kShift) + 2];
  for (int s = 0; s < (1 << kShift); ++s) {  // branch-free: used and unused symbols interleave
    leaf[m] = counts[s] << kShift | uint32_t(s);
    m += counts[s] != 0;
    any |= counts[s];
  }
  for (int pass = 0; pass < 2 && (any >> (8 * pass)); ++pass) {
    const int shift = kShift + 8 * pass;
    uint16_t start[256] = {};
    for (int i = 0; i < n; ++i) ++start[(leaf[i] >> shift) & 0xFF];
    for (int v = 0, at = 0; v < 256; ++v) {
      const int c = start[v];
      start[v] = uint16_t(at), at += c;
    }
    for (int i = 0; i < n; ++i) sorted[start[(leaf[i] >> shift) & 0xFF]++] = leaf[i];
    std::memcpy(leaf, sorted, sizeof(uint32_t) * n);
  }
}

// code_lengths of zipccl_format.h (§5.1) over NSYM symbols (128 or 256),
// same result, with a radix sort of the leaves and a branch-free merge.
template <int NSYM = kNumSyms>
inline void fast_code_lengths(const uint32_t* counts, uint8_t* lens) {
  constexpr int kShift = NSYM == 256 ? 8 : 7;
  constexpr uint32_t kSym = NSYM - 1;
  static_assert(NSYM == 1 << kShift, "128 or 256 symbols");
  uint32_t leaf[NSYM + 2];  // count << kShift | symbol, ascending; then two past the end
  int n = 0;
  for (int s = 0; s < NSYM; ++s) n += counts[s] != 0;
  std::memset(lens, 0, NSYM);
  if (n == 1)
    for (int s = 0; s < NSYM; ++s) lens[s] = counts[s] != 0;
  if (n < 2) return;
  sort_leaves<kShift>(counts, leaf, n);
  // Past the end of either queue, weights read as more than any true weight.
  leaf[n] = leaf[n + 1] = ~0u;
  uint32_t node[NSYM + 1];        // weights of internal nodes in creation order
  uint8_t height[NSYM + 1] = {};  // of internal nodes: their deepest leaf's depth below them
  uint16_t parent[2 * NSYM + 1];  // of leaves 0..n-1, then of nodes n..; last: a dummy
  const int dummy = 2 * NSYM;
  for (;;) {
    int li = 0, ni = 0;
    for (int made = 0; made < n - 1; ++made) {  // two-queue Huffman, leaves first on ties
      node[made] = node[made + 1] = ~0u;
      // The two lightest fronts, branch-free (which queue wins is data).
      const uint32_t l0 = leaf[li] >> kShift, l1 = leaf[li + 1] >> kShift, n0 = node[ni], n1 = node[ni + 1];
      const bool a_leaf = l0 <= n0, b_leaf = a_leaf ? l1 <= n0 : l0 <= n1;
      const int leaves = a_leaf + b_leaf, nodes = 2 - leaves;
      const uint16_t p = uint16_t(n + made);
      parent[leaves > 0 ? li : dummy] = p;
      parent[leaves > 1 ? li + 1 : dummy] = p;
      parent[nodes > 0 ? n + ni : dummy] = p;
      parent[nodes > 1 ? n + ni + 1 : dummy] = p;
      const uint32_t b = b_leaf ? (a_leaf ? l1 : l0) : (a_leaf ? n0 : n1);
      node[made] = (a_leaf ? l0 : n0) + b;
      const uint32_t h0 = nodes > 0 ? height[ni] : 0, h1 = nodes > 1 ? height[ni + 1] : 0;
      height[made] = uint8_t((h0 > h1 ? h0 : h1) + 1);
      li += leaves, ni += nodes;
    }
    if (height[n - 2] <= kMaxCodeLen) break;  // the root's height: the longest code
    // Flatten, rounding up; many counts now tie, and ties order by symbol: the
    // leaves are rebuilt in symbol order and sorted by count, stably.
    const int k = flattening_shift(height[n - 2]);
    uint32_t flat[NSYM] = {};
    for (int i = 0; i < n; ++i) flat[leaf[i] & kSym] = ((leaf[i] >> kShift) + (1u << k) - 1) >> k;
    sort_leaves<kShift>(flat, leaf, n);
    leaf[n] = leaf[n + 1] = ~0u;
  }
  uint8_t depth[2 * NSYM];
  depth[2 * n - 2] = 0;
  for (int i = 2 * n - 3; i >= 0; --i) depth[i] = uint8_t(depth[parent[i]] + 1);
  for (int i = 0; i < n; ++i) lens[leaf[i] & kSym] = depth[i];
}

inline void fast_code_lengths(const uint32_t* counts, uint8_t* lens, int nsym) {
  if (nsym == kNumSyms) fast_code_lengths<kNumSyms>(counts, lens);
  else fast_code_lengths<2 * kNumSyms>(counts, lens);
}

// Adds a block's counts of one sign s, taken under ref r (own, 128 symbols),
// as they are under ref r + delta to counts: with SC at s << 7; with ZEROS,
// `implied` of its (ZERO, 0) symbols stay and the rest escape (§4.2).
// (Classes 0 and ESC stay: the block has no exponent in (r, ALL_ONES).)
inline void add_shifted_counts(const uint32_t* own, uint32_t delta, bool sc, uint32_t s, bool zeros,
                               uint32_t implied, uint32_t* counts) {
  uint32_t* to = counts + (sc ? s << kSignBit : 0);
  if (!delta) {
    for (int k = 0; k < kNumSyms; ++k) to[k] += own[k];
  } else {
    for (int k = 0; k < 4; ++k) to[k] += own[k];
    for (uint32_t c = 1; c < uint32_t(kNumClasses); ++c) {
      const uint32_t d = c - 1 + delta, c2 = c == uint32_t(kClassEsc) || d > uint32_t(kMaxDelta) ? kClassEsc : d + 1;
      for (int t = 0; t < 4; ++t) to[(c2 << kTopBits) + t] += own[(c << kTopBits) + t];
    }
  }
  if (zeros) to[kClassEsc << kTopBits] += own[0] - implied, to[0] -= own[0] - implied;
}

// §7 step 2 from each block's counts under its own emax, per sign: candidates
// with own refs add them as they are, those with the group's ref shifted to
// gmax. refs, lens and *mask receive the choice.
template <int DT>
void choose_group_fast(const uint8_t* in, int64_t n, int64_t b0, int64_t b1, uint8_t* refs, uint8_t* lens,
                       int* mask) {
  constexpr Layout lay = Elem<DT>::lay;
  uint32_t emax[kGroupBlocks], own[kGroupBlocks][2][kNumSyms], zeros[kGroupBlocks][2], gmax = 0, all_zeros[2] = {};
  int64_t count = 0;
  for (int64_t b = b0; b < b1; ++b) {
    const int i = int(b - b0);
    emax[i] = block_counts<DT>(in + b * kBlock * lay.elem_bytes, block_count(n, b), own[i], zeros[i]);
    gmax = emax[i] > gmax ? emax[i] : gmax;
    count += block_count(n, b);
    all_zeros[0] += zeros[i][0], all_zeros[1] += zeros[i][1];
  }
  bool same = true;  // every block's emax is gmax: both refs give the same counts
  for (int64_t b = b0; b < b1; ++b) same &= emax[b - b0] == gmax;
  uint32_t counts[kCandidates][2 * kNumSyms];
  static thread_local uint8_t cand_lens[kCandidates][2 * kNumSyms];
  uint64_t cost[kCandidates];
  for (int c = 0; c < kCandidates; ++c) {
    const bool sc = c & 2, zero_mode = c & 4;
    const int64_t implied = zero_mode ? all_zeros[0] + (sc ? all_zeros[1] : 0) : 0;
    cost[c] = ~uint64_t(0);
    if (zero_mode && zero_candidate_skipped(c, lay, count, count - implied)) continue;
    const int nsym = sc ? 2 * kNumSyms : kNumSyms;
    if (same && (c & 1)) {  // the same counts, code and cost as c - 1
      cost[c] = cost[c - 1];
      std::memcpy(cand_lens[c], cand_lens[c - 1], size_t(nsym));
      std::memcpy(counts[c], counts[c - 1], sizeof(uint32_t) * nsym);
      continue;
    }
    std::memset(counts[c], 0, sizeof(uint32_t) * nsym);
    for (int64_t b = b0; b < b1; ++b)
      for (uint32_t s = 0; s < 2; ++s)
        add_shifted_counts(own[b - b0][s], (c & 1) ? 0 : gmax - emax[b - b0], sc, s, zero_mode,
                           (sc || s == 0) ? zeros[b - b0][s] : 0, counts[c]);
    fast_code_lengths(counts[c], cand_lens[c], nsym);
    cost[c] = code_cost(counts[c], cand_lens[c], candidate_mask(c), lay, count - implied);
  }
  const int best = best_candidate(cost, count);
  *mask = candidate_mask(best);
  for (int64_t b = b0; b < b1; ++b) refs[b - b0] = uint8_t((best & 1) ? emax[b - b0] : gmax);
  std::memcpy(lens, cand_lens[best], (best & 2) ? 2 * kNumSyms : kNumSyms);
}

// plane_code_bits of zipccl_format.h, same result: four histograms (a run of
// equal bytes would otherwise wait on its own increments) and the fast
// Huffman lengths. Without ZEROS every element is stored.
template <int DT>
uint64_t plane_code_bits_fast(const uint8_t* in, int64_t count, int64_t stride, int p, uint8_t* lens,
                              int64_t* used) {
  constexpr int es = Elem<DT>::lay.elem_bytes;
  uint32_t h[4][kPlaneSyms] = {};
  int64_t i = 0;
  for (; i + 3 * stride < count; i += 4 * stride)
    for (int k = 0; k < 4; ++k) ++h[k][in[(i + k * stride) * es + p]];
  for (; i < count; i += stride) ++h[0][in[i * es + p]];
  uint32_t counts[kPlaneSyms];
  uint64_t bits = 0;
  *used = 0;
  for (int v = 0; v < kPlaneSyms; ++v) counts[v] = h[0][v] + h[1][v] + h[2][v] + h[3][v], *used += counts[v];
  fast_code_lengths<kPlaneSyms>(counts, lens);
  for (int v = 0; v < kPlaneSyms; ++v) bits += uint64_t(counts[v]) * lens[v];
  return bits;
}

// choose_planes of zipccl_format.h, same result, with the fast counts
// (ZEROS groups, where the stored elements must be picked out, take the
// shared one).
template <int DT>
int choose_planes_fast(const uint8_t* in, int64_t count, int mask, uint8_t (*lens)[kPlaneSyms]) {
  if (mask & kMaskZeros) return choose_planes(DT, in, count, mask, lens);
  int planes = 0;
  for (int p = 0; p < Elem<DT>::lay.raw_bytes; ++p) {
    int64_t ns, m;
    const uint64_t sample = plane_code_bits_fast<DT>(in, count, kPlaneSampleStride, p, lens[p], &ns);  // sets ns
    if (!plane_sample_pays(sample, ns)) continue;
    const uint64_t bits = plane_code_bits_fast<DT>(in, count, 1, p, lens[p], &m);  // sets m
    if (plane_pays(bits, lens[p], m)) planes |= 1 << p;
  }
  return planes;
}

}  // namespace zipccl
