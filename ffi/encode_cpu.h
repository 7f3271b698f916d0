// Fast CPU encoder (FORMAT.md §7): a block's symbols are counted once, per
// sign, under its own emax; the group's eight candidate codes follow from
// those counts. The four sub-streams of a block are coded in lockstep (four
// writers in flight), the codes of up to eight elements merged into one
// 64-bit write, then joined at bit granularity behind their lengths.
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

// A block's symbol counts per sub-stream (FORMAT.md §2: its quarters),
// under its own emax, with the sign in bit 7, and its exact zeros per sign:
// what stream_bytes needs to size the sub-streams without coding them.
struct QuarterCounts {
  uint16_t counts[kSubstreams][2 * kNumSyms];
  uint32_t zeros[kSubstreams][2];
};

// block_counts for a full block: its symbols with the sign in bit 7 as
// bytes, then counted in four sub-histograms, one per quarter, so that
// repeats of a frequent symbol do not wait on each other's increments
// (eight cost more to add up than they save on Gaussian data).
template <int DT>
ZC_SIMD uint32_t block_counts_simd(const uint8_t* in, uint32_t (*counts)[kNumSyms], uint32_t* zeros,
                                   QuarterCounts* quarters) {
  constexpr int q = kBlock / kSubstreams;
  const uint32_t emax = block_emax_simd<DT>(in);
  const __m512i ref = _mm512_set1_epi16(short(emax));
  alignas(64) uint8_t syms[kBlock];
  uint32_t plus[kSubstreams] = {}, minus[kSubstreams] = {};
  for (int i = 0; i < kBlock; i += 32) {
    __mmask32 esc;
    uint32_t p, m;
    const __m512i h = load_tops<DT>(in, i);
    zero_masks<DT>(in, i, h, &p, &m);
    plus[i / q] += __builtin_popcount(p), minus[i / q] += __builtin_popcount(m);
    _mm256_store_si256(reinterpret_cast<__m256i*>(syms + i), _mm512_cvtepi16_epi8(symbols_of<DT, true>(h, ref, &esc)));
  }
  uint16_t h[kSubstreams][2 * kNumSyms] = {};
  for (int i = 0; i < q; ++i)
    for (int j = 0; j < kSubstreams; ++j) ++h[j][syms[j * q + i]];
  for (int s = 0; s < 2 * kNumSyms; ++s) counts[s >> 7][s & 127] = h[0][s] + h[1][s] + h[2][s] + h[3][s];
  zeros[0] = plus[0] + plus[1] + plus[2] + plus[3], zeros[1] = minus[0] + minus[1] + minus[2] + minus[3];
  if (quarters) {
    std::memcpy(quarters->counts, h, sizeof h);
    for (int j = 0; j < kSubstreams; ++j) quarters->zeros[j][0] = plus[j], quarters->zeros[j][1] = minus[j];
  }
  return emax;
}
#endif

// §7 steps 1-2 for one block: returns its emax, sets counts[sign][kNumSyms]
// to its symbol counts under ref = emax, per sign, zeros[sign] to its exact
// zeros of each sign and, if asked, *quarters.
template <int DT>
uint32_t block_counts(const uint8_t* in, int count, uint32_t (*counts)[kNumSyms], uint32_t* zeros,
                      QuarterCounts* quarters = nullptr) {
#if ZC_HAVE_SIMD
  if (count == kBlock && simd_enabled()) return block_counts_simd<DT>(in, counts, zeros, quarters);
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
  if (quarters) {  // a second pass, only for the size pass
    std::memset(quarters, 0, sizeof *quarters);
    const int q = substream_len(count);
    for (int i = 0; i < count; ++i) {
      const uint32_t x = E::bits(in, i), top = E::top(in, i);
      ++quarters->counts[i / q][(top >> 15) << kSignBit | symbol_of(E::exponent(top), E::top_bits(top), emax)];
      quarters->zeros[i / q][0] += x == 0, quarters->zeros[i / q][1] += x == sign;
    }
  }
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
                       int* mask, QuarterCounts* quarters = nullptr, uint32_t* block_emax = nullptr) {
  constexpr Layout lay = Elem<DT>::lay;
  uint32_t emax[kGroupBlocks], own[kGroupBlocks][2][kNumSyms], zeros[kGroupBlocks][2], gmax = 0, all_zeros[2] = {};
  int64_t count = 0;
  for (int64_t b = b0; b < b1; ++b) {
    const int i = int(b - b0);
    emax[i] = block_counts<DT>(in + b * kBlock * lay.elem_bytes, block_count(n, b), own[i], zeros[i],
                               quarters ? quarters + i : nullptr);
    if (block_emax) block_emax[i] = emax[i];
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

// The encoder's code table: code | length << 12 per symbol (lengths <= 12).
inline void encoder_table(const uint8_t* lens, int nsym, uint16_t* table) {
  uint16_t codes[2 * kNumSyms] = {};
  fast_canonical_codes(lens, codes, nsym);
  for (int s = 0; s < nsym; ++s) table[s] = uint16_t(codes[s] | (lens[s] << 12));
}

// Bit writer that stores 8 bytes at a time and advances by whole bytes (its
// buffer has 8 bytes of slack); values are at most 56 bits.
struct Writer {
  uint8_t* out;
  uint64_t acc;
  uint64_t nbits;
  void put(uint64_t value, uint64_t len) {
    acc |= value << nbits;
    nbits += len;
    std::memcpy(out, &acc, 8);
    out += nbits >> 3;
    acc >>= nbits & 56;
    nbits &= 7;
  }
  uint64_t bits(const uint8_t* start) const { return uint64_t(out - start) * 8 + nbits; }
  // Appends the first `bits` bits of src (which has 8 bytes of slack; out
  // too): whole words shifted into place, then the rest.
  void append(const uint8_t* src, uint64_t bits) {
    const uint64_t sh = nbits, low = acc & ((uint64_t(1) << sh) - 1);
    uint64_t carry = low, i = 0;
    for (; i + 64 <= bits; i += 64) {
      const uint64_t v = load_u64(src + i / 8);
      const uint64_t word = carry | (v << sh);
      std::memcpy(out + i / 8, &word, 8);
      carry = sh ? v >> (64 - sh) : 0;
    }
    out += i / 8;
    acc = carry;
    nbits = sh;
    for (; i < bits; i += 32) {  // the rest, at most 32 bits a time
      const uint64_t len = bits - i < 32 ? bits - i : 32;
      put((load_u64(src + i / 8) >> (i & 7)) & ((uint64_t(1) << len) - 1), len);
    }
    std::memcpy(out, &acc, 8);
  }
  void flush() {
    if (nbits) *out++ = uint8_t(acc);
  }
};

// Keys of the plain encoder: (sign, exponent, top bits).
template <int DT>
constexpr uint32_t kKeys = 2 * Elem<DT>::keys;

// The plain encoder's table under ref: per key, the bits written (§6: the
// symbol's code, then an escape's exponent) | their count << 24. With ZEROS
// a key of exponent 0 and t = 0 is coded as an escape (§4.2); implied zeros
// take `zero`, the code of symbol (ZERO, 0) of their sign.
template <int DT, bool SC, bool ZEROS>
void key_codes(uint32_t ref, const uint16_t* table, uint32_t* codes) {
  using E = Elem<DT>;
  for (uint32_t k = 0; k < kKeys<DT>; ++k) {
    const uint32_t e = (k >> kTopBits) & E::all_ones, t = k & 3, sign = k / E::keys;
    uint32_t s = symbol_of(e, t, ref);
    if (ZEROS && e == 0 && t == 0) s = kClassEsc << kTopBits;
    s |= SC ? sign << kSignBit : 0;
    const uint32_t len = table[s] >> 12;
    codes[k] = escapes(int(s)) ? ((table[s] & 0xFFFu) | e << len) | (len + E::lay.exp_bits) << 24
                               : (table[s] & 0xFFFu) | len << 24;
  }
}

// The code of an element with key-code table codes, or of an implied zero.
template <int DT, bool SC, bool ZEROS>
uint32_t element_code(const uint8_t* in, int i, const uint32_t* codes, const uint16_t* table) {
  using E = Elem<DT>;
  const uint32_t h = E::top(in, i);
  if (ZEROS && implied_zero(E::bits(in, i), E::lay, SC)) {
    const uint32_t s = SC ? (h >> 15) << kSignBit : 0;
    return (table[s] & 0xFFFu) | uint32_t(table[s] >> 12) << 24;
  }
  return codes[h >> E::t_shift];
}

// Codes elements [begin, end), two per write. (Writers are passed by value:
// kept in registers, as the bytes they store could alias anything in memory.)
template <int DT, bool SC, bool ZEROS>
Writer encode_keys(const uint8_t* in, int begin, int end, const uint32_t* codes, const uint16_t* table, Writer w) {
  int i = begin;
  for (; i + 2 <= end; i += 2) {
    const uint32_t a = element_code<DT, SC, ZEROS>(in, i, codes, table);
    const uint32_t b = element_code<DT, SC, ZEROS>(in, i + 1, codes, table);
    w.put((a & 0xFFFFFFu) | uint64_t(b & 0xFFFFFFu) << (a >> 24), (a >> 24) + (b >> 24));
  }
  if (i < end) {
    const uint32_t a = element_code<DT, SC, ZEROS>(in, i, codes, table);
    w.put(a & 0xFFFFFFu, a >> 24);
  }
  return w;
}

// Writes the stored area (§2) of a block: the raw bytes of its stored
// elements, then their stored extra bits (with SC, extra >> 1).
template <int DT, bool SC, bool ZEROS>
void write_stored(const uint8_t* in, int count, int m, uint8_t* area) {
  using E = Elem<DT>;
  constexpr Layout lay = E::lay;
  constexpr int w = lay.extra_bits - SC;
  uint8_t* extras = area + m * lay.raw_bytes;
  uint64_t acc = 0;
  int bits = 0, j = 0;
  for (int i = 0; i < count; ++i) {
    if (ZEROS && implied_zero(E::bits(in, i), lay, SC)) continue;
    if constexpr (lay.raw_bytes > 0) std::memcpy(area + j * lay.raw_bytes, in + i * lay.elem_bytes, lay.raw_bytes);
    ++j;
    if constexpr (w > 0) {
      acc |= uint64_t(E::extra(E::top(in, i)) >> SC) << bits;
      bits += w;
      if (bits >= 32) {
        for (int k = 0; k < 4; ++k) *extras++ = uint8_t(acc >> (8 * k));
        acc >>= 32, bits -= 32;
      }
    }
  }
  for (; bits > 0; bits -= 8, acc >>= 8) *extras++ = uint8_t(acc);
}

#if ZC_HAVE_SIMD
// The encoder's tables: the code table in registers (4 for 128 symbols, 8
// for 256), and the key table for elements with escapes, built when first needed.
template <int DT, bool SC, bool ZEROS>
struct SimdTables {
  __m512i t[SC ? 8 : 4];
  uint32_t ref;
  const uint16_t* table;
  bool built;
  uint32_t codes[kKeys<DT>];

  const uint32_t* key_table() {
    if (!built) key_codes<DT, SC, ZEROS>(ref, table, codes), built = true;
    return codes;
  }
};

// The table entries of 32 symbols s.
template <int DT, bool SC, bool ZEROS>
ZC_SIMD inline __m512i table_entries(const SimdTables<DT, SC, ZEROS>& tab, __m512i s) {
  const __mmask32 hi = _mm512_test_epi16_mask(s, _mm512_set1_epi16(64));
  const __m512i low = _mm512_mask_blend_epi16(hi, _mm512_permutex2var_epi16(tab.t[0], s, tab.t[1]),
                                              _mm512_permutex2var_epi16(tab.t[2], s, tab.t[3]));
  if constexpr (!SC) return low;
  const __m512i high = _mm512_mask_blend_epi16(hi, _mm512_permutex2var_epi16(tab.t[4], s, tab.t[5]),
                                               _mm512_permutex2var_epi16(tab.t[6], s, tab.t[7]));
  return _mm512_mask_blend_epi16(_mm512_test_epi16_mask(s, _mm512_set1_epi16(128)), low, high);
}

// Codes 32 elements from i: codes merged pairwise into 32-bit, then 64-bit
// lanes (at most 48 bits without escapes), then eight per write when they fit
// in 56 bits.
template <int DT, bool SC, bool ZEROS>
ZC_SIMD inline Writer encode_chunk_simd(const uint8_t* in, int i, __m512i vref, SimdTables<DT, SC, ZEROS>& tab,
                                        Writer w) {
  const __m512i lo16 = _mm512_set1_epi32(0xFFFF), lo32 = _mm512_set1_epi64(0xFFFFFFFF);
  __mmask32 esc;
  const __m512i h = load_tops<DT>(in, i);
  const __m512i s = symbols_of<DT, SC>(h, vref, &esc);
  if constexpr (ZEROS) {  // (ZERO, 0) that is no implied zero: an escape (§4.2)
    uint32_t plus, minus;
    zero_masks<DT>(in, i, h, &plus, &minus);
    const uint32_t zero_t0 = _mm512_testn_epi16_mask(s, _mm512_set1_epi16(0x7F));
    esc |= zero_t0 & ~(plus | (SC ? minus : 0));
  }
  if (esc) return encode_keys<DT, SC, ZEROS>(in, i, i + 32, tab.key_table(), tab.table, w);  // exponents follow
  const __m512i ent = table_entries(tab, s);
  const __m512i c1 = _mm512_and_si512(ent, _mm512_set1_epi16(0xFFF)), l1 = _mm512_srli_epi16(ent, 12);
  const __m512i c2 = _mm512_or_si512(_mm512_and_si512(c1, lo16),
                                     _mm512_sllv_epi32(_mm512_srli_epi32(c1, 16), _mm512_and_si512(l1, lo16)));
  const __m512i l2 = _mm512_madd_epi16(l1, _mm512_set1_epi16(1));
  const __m512i c4 = _mm512_or_si512(_mm512_and_si512(c2, lo32),
                                     _mm512_sllv_epi64(_mm512_srli_epi64(c2, 32), _mm512_and_si512(l2, lo32)));
  const __m512i l4 = _mm512_add_epi64(_mm512_and_si512(l2, lo32), _mm512_srli_epi64(l2, 32));
  // eights in the even 64-bit lanes: low four | high four << low length
  const __m512i c8 = _mm512_or_si512(
      c4, _mm512_shuffle_epi32(_mm512_sllv_epi64(c4, _mm512_shuffle_epi32(l4, _MM_PERM_BABA)), _MM_PERM_DCDC));
  const __m512i l8 = _mm512_add_epi64(l4, _mm512_shuffle_epi32(l4, _MM_PERM_DCDC));
  alignas(64) uint64_t code[8], len[8];
  if ((_mm512_cmple_epu64_mask(l8, _mm512_set1_epi64(56)) & 0x55) == 0x55) {
    _mm512_store_si512(code, c8);
    _mm512_store_si512(len, l8);
    for (int k = 0; k < 8; k += 2) w.put(code[k], len[k]);
  } else {
    _mm512_store_si512(code, c4);
    _mm512_store_si512(len, l4);
    for (int k = 0; k < 8; ++k) w.put(code[k], len[k]);
  }
  return w;
}

// Codes the four sub-streams of a full block, a chunk of each in turn: four
// independent writers in flight.
template <int DT, bool SC, bool ZEROS>
ZC_SIMD void encode_substreams_simd(const uint8_t* in, uint32_t ref, const uint16_t* table, Writer* w) {
  SimdTables<DT, SC, ZEROS> tab;
  for (int j = 0; j < (SC ? 8 : 4); ++j) tab.t[j] = _mm512_loadu_si512(table + 32 * j);
  tab.ref = ref, tab.table = table, tab.built = false;
  const __m512i vref = _mm512_set1_epi16(short(ref));
  constexpr int q = kBlock / kSubstreams;
  Writer w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];
  for (int i = 0; i < q; i += 32) {
    w0 = encode_chunk_simd<DT, SC, ZEROS>(in, i, vref, tab, w0);
    w1 = encode_chunk_simd<DT, SC, ZEROS>(in, q + i, vref, tab, w1);
    w2 = encode_chunk_simd<DT, SC, ZEROS>(in, 2 * q + i, vref, tab, w2);
    w3 = encode_chunk_simd<DT, SC, ZEROS>(in, 3 * q + i, vref, tab, w3);
  }
  w[0] = w0, w[1] = w1, w[2] = w2, w[3] = w3;
}

ZC_SIMD inline void stream_copy_simd(uint8_t* dst, const uint8_t* src, uint32_t bytes) {
  const uint32_t head = uint32_t(-reinterpret_cast<uintptr_t>(dst) & 63);
  std::memcpy(dst, src, head);
  uint32_t i = head;
  for (; i + 64 <= bytes; i += 64) _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_loadu_si512(src + i));
  std::memcpy(dst + i, src + i, bytes - i);
}

// write_stored for a full block without ZEROS: the raw bytes, then the
// packed extra bits.
template <int DT, bool SC>
ZC_SIMD void write_stored_simd(const uint8_t* in, uint8_t* area) {
  constexpr Layout lay = Elem<DT>::lay;
  uint8_t* extras = area + kBlock * lay.raw_bytes;
  for (int i = 0; i < kBlock; i += 32) {
    const __m512i h = load_tops<DT>(in, i);
    if constexpr (DT == kF16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(area + i), _mm512_cvtepi16_epi8(h));
      const uint32_t signs = _mm512_movepi16_mask(h);
      if constexpr (!SC) std::memcpy(extras + i / 8, &signs, 4);
      continue;
    }
    if constexpr (DT == kF32)
      _mm512_storeu_si512(area + 2 * i, _mm512_permutex2var_epi16(_mm512_loadu_si512(in + 4 * i), lanes(kEvenWords),
                                                                   _mm512_loadu_si512(in + 4 * i + 64)));
    if constexpr (SC) {
      // extra >> 1 = h & 0x1F, 5 bits; two, four in 20 bits, then eight per 40 bits in the even 64-bit lanes
      const __m512i two = _mm512_madd_epi16(_mm512_and_si512(h, _mm512_set1_epi16(0x1F)), _mm512_set1_epi32(0x00200001));
      const __m512i four = _mm512_and_si512(_mm512_or_si512(two, _mm512_srli_epi64(two, 22)), _mm512_set1_epi64(0xFFFFF));
      const __m512i eight = _mm512_or_si512(four, _mm512_slli_epi64(_mm512_shuffle_epi32(four, _MM_PERM_BADC), 20));
      const __m512i packed = _mm512_permutexvar_epi8(lanes(kPack40), eight);
      _mm256_mask_storeu_epi8(extras + i / 8 * 5, 0xFFFFF, _mm512_castsi512_si256(packed));
      continue;
    }
    // extra = (h & 0x1F) << 1 | h >> 15, 6 bits; two, four, then eight per 48 bits
    const __m512i extra = _mm512_ternarylogic_epi32(_mm512_slli_epi16(h, 1), _mm512_set1_epi16(0x3E),
                                                    _mm512_srli_epi16(h, 15), 0xEA);  // (a & b) | c
    const __m512i two = _mm512_madd_epi16(extra, _mm512_set1_epi32(0x00400001));
    const __m512i four = _mm512_or_si512(two, _mm512_srli_epi64(two, 20));
    const __m512i packed = _mm512_permutexvar_epi8(lanes(kPack24), four);
    _mm256_mask_storeu_epi8(extras + i / 8 * 6, 0xFFFFFF, _mm512_castsi512_si256(packed));
  }
}


// write_stored for a full block with ZEROS: 32 elements at a time, the kept
// (stored) ones' raw bytes and extra values compressed together (VBMI2).
template <int DT, bool SC>
ZC_SIMD void write_stored_zeros_simd(const uint8_t* in, int m, uint8_t* area) {
  constexpr Layout lay = Elem<DT>::lay;
  constexpr int w = lay.extra_bits - SC;
  Writer extras{area + m * lay.raw_bytes, 0, 0};  // 8 bytes stored at a time: the area has slack
  int j = 0;
  for (int i = 0; i < kBlock; i += 32) {
    const __m512i h = load_tops<DT>(in, i);
    uint32_t plus, minus;
    zero_masks<DT>(in, i, h, &plus, &minus);
    const __mmask32 keep = ~(plus | (SC ? minus : 0u));
    const int k = __builtin_popcount(keep);
    // Compressed in a register, then stored as k contiguous lanes: clang 14 folds a compressing
    // store of a truncated vector into a masked truncating store, which does not compress.
    const __mmask32 first_k = __mmask32(_bzhi_u32(~0u, unsigned(k)));
    if constexpr (DT == kF16) {
      _mm256_mask_storeu_epi8(area + j, first_k, _mm256_maskz_compress_epi8(keep, _mm512_cvtepi16_epi8(h)));
      if constexpr (!SC) extras.put(_pext_u32(_mm512_movepi16_mask(h), keep), k);  // the signs
      j += k;
      continue;
    }
    if constexpr (DT == kF32)
      _mm512_mask_storeu_epi16(area + 2 * j, first_k, _mm512_maskz_compress_epi16(keep, _mm512_permutex2var_epi16(
          _mm512_loadu_si512(in + 4 * i), lanes(kEvenWords), _mm512_loadu_si512(in + 4 * i + 64))));
    // extra (>> 1 with SC): w bits per kept element, in order
    const __m512i extra = SC ? _mm512_and_si512(h, _mm512_set1_epi16(0x1F))
                             : _mm512_ternarylogic_epi32(_mm512_slli_epi16(h, 1), _mm512_set1_epi16(0x3E),
                                                         _mm512_srli_epi16(h, 15), 0xEA);  // (a & b) | c
    alignas(64) uint16_t kept[32];
    _mm512_store_si512(kept, _mm512_maskz_compress_epi16(keep, extra));
    int l = 0;
    for (; l + 8 <= k; l += 8) {  // eight values per write: 40 or 48 bits
      uint64_t v = 0;
      for (int t = 0; t < 8; ++t) v |= uint64_t(kept[l + t]) << (t * w);
      extras.put(v, 8 * w);
    }
    for (; l < k; ++l) extras.put(kept[l], w);
    j += k;
  }
  if (extras.nbits) extras.out[0] = uint8_t(extras.acc);  // the last byte (put stored it; its padding is 0)
}
#endif

// Copies a body out of the encoder's buffer. The output of a large tensor is
// not read back soon: non-temporal stores spare reading its lines first (a
// stream is a few tens of MB), the partial lines at the ends stored as usual.
inline void stream_copy(uint8_t* dst, const uint8_t* src, uint32_t bytes) {
#if ZC_HAVE_SIMD
  if (bytes >= 256 && simd_enabled()) return stream_copy_simd(dst, src, bytes);
#endif
  std::memcpy(dst, src, bytes);
}

// Stream buffer of one sub-stream: every element at most 20 bits, plus slack.
constexpr int kStreamBytes = kBlock / kSubstreams * kMaxElementBits / 8 + 16;

// Encodes one block (see encode_block) under ref with its group's encoder
// table into body, which has room for count * elem_bytes bytes; SC, ZEROS:
// the group's mask (§4.1, §4.2; no byte planes). Returns the block's descriptor.
template <int DT, bool SC, bool ZEROS>
uint32_t encode_block_fast(const uint8_t* in, int count, uint32_t ref, const uint16_t* table, uint8_t* body) {
  using E = Elem<DT>;
  constexpr Layout lay = E::lay;
  alignas(64) uint8_t streams[kSubstreams][kStreamBytes];
  const int q = substream_len(count);
#if ZC_HAVE_SIMD
  const bool simd = count == kBlock && simd_enabled();
#else
  const bool simd = false;
#endif
  Writer w[kSubstreams];
  for (int k = 0; k < kSubstreams; ++k) w[k] = {streams[k], 0, 0};
#if ZC_HAVE_SIMD
  if (simd) encode_substreams_simd<DT, SC, ZEROS>(in, ref, table, w);
#endif
  if (!simd) {
    uint32_t codes[kKeys<DT>];
    key_codes<DT, SC, ZEROS>(ref, table, codes);
    for (int k = 0; k < kSubstreams; ++k)
      w[k] = encode_keys<DT, SC, ZEROS>(in, k * q < count ? k * q : count, (k + 1) * q < count ? (k + 1) * q : count,
                                        codes, table, w[k]);
  }
  int m = count;
  if constexpr (ZEROS)
    for (int i = 0; i < count; ++i) m -= implied_zero(E::bits(in, i), lay, SC);
  const GroupLayout gl = group_layout(DT, (SC ? kMaskSign : 0) | (ZEROS ? kMaskZeros : 0));
  uint32_t bits[kSubstreams], coded;
  int32_t devs[kSubstreams - 1];
  for (int k = 0; k < kSubstreams; ++k) bits[k] = uint32_t(w[k].bits(streams[k]));
  const uint32_t stored = gl.stored_bytes(m);
  const int width = choose_width(bits, stored, count, gl, devs, &coded);
  const uint32_t raw_block = uint32_t(count) * lay.elem_bytes;
  if (coded >= raw_block) {
    std::memcpy(body, in, raw_block);
    return make_descriptor(raw_block, 0);
  }
  // The sub-stream area: the width, the deviations, the four sub-streams at bit granularity.
  for (int k = 0; k < kSubstreams; ++k) std::memcpy(w[k].out, &w[k].acc, 8);  // the last partial byte, and slack
  alignas(64) uint8_t joined[kBlock * 4 + 64];  // the body, then copied out (stream_copy)
  Writer a{joined, 0, 0};
  put_width(width, a);
  a.put((uint64_t(uint32_t(devs[0])) & ((1u << width) - 1)) | (uint64_t(uint32_t(devs[1])) & ((1u << width) - 1)) << width,
        2 * width);
  a.put(uint32_t(devs[2]) & ((1u << width) - 1), width);
  for (int k = 0; k < kSubstreams; ++k) a.append(streams[k], bits[k]);
  a.flush();
  const uint32_t area_bytes = uint32_t(a.out - joined);
#if ZC_HAVE_SIMD
  if (simd && !ZEROS) write_stored_simd<DT, SC>(in, joined + area_bytes);
  else if (simd) write_stored_zeros_simd<DT, SC>(in, m, joined + area_bytes);
  else
#endif
    write_stored<DT, SC, ZEROS>(in, count, m, joined + area_bytes);
  stream_copy(body, joined, coded);
  return make_descriptor(coded, uint32_t(width));
}

template <int DT>
uint32_t encode_block_fast(const uint8_t* in, int count, uint32_t ref, int mask, const uint16_t* table,
                           uint8_t* body) {
  switch (symbol_mask(mask)) {
    case 0: return encode_block_fast<DT, false, false>(in, count, ref, table, body);
    case kMaskSign: return encode_block_fast<DT, true, false>(in, count, ref, table, body);
    case kMaskZeros: return encode_block_fast<DT, false, true>(in, count, ref, table, body);
    default: return encode_block_fast<DT, true, true>(in, count, ref, table, body);
  }
}

}  // namespace zipccl
