// Fast CPU sizing of version-6 blocks (docs/FORMAT.md §6): each block's
// symbols at its own ref counted by lane once, from which its exact body size
// under any code (a family combo, a group code at either ref) is a few vector
// multiply-adds per symbol present. codec6_cpu.cc's fast coder; AVX-512 or
// AVX2 paths where the CPU has them (simd_level()), plain loops otherwise, the
// same results (tests compare the streams with the reference's).
#pragma once

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "format6.h"
#include "simd_cpu.h"  // ZC_SIMD, ZC_AVX2, simd_level

namespace zipccl {
namespace v6 {

constexpr int kCombos = 2 * kMembers;  // §6 step 2: (member, flip) in the order 2 member + flip
constexpr uint32_t kNoSize = 0xFFFFFFFFu;

// One dtype's layout at compile time, so that shifts and masks are constants.
template <int DT>
struct Elements {
  using T = std::conditional_t<DT == kF32, uint32_t, uint16_t>;
  static constexpr Layout lay = layout_of(DT);
  static constexpr uint32_t q_mask = (1u << lay.q_bits) - 1, low_mask = (1u << lay.low_bits) - 1;
  static constexpr uint32_t mag_mask = DT == kF32 ? 0x7FFFFFFFu : 0x7FFFu;
  static constexpr int sign_shift = 8 * sizeof(T) - 1;
  static uint32_t q(uint32_t x) { return (x >> lay.low_bits) & q_mask; }
};

// A block's symbols at its own ref, counted by lane.
struct BlockStats {
  uint32_t ref;
  int count, nused;
  uint8_t used[kNumSyms];            // the symbols present, increasing
  uint16_t rows[kNumSyms][kLanes];   // rows[j][k]: how many of lane k's values have symbol used[j]
  uint32_t counts[kNumSyms];         // the block's symbol counts
};

struct GroupScratch {
  uint16_t hist[kNumSyms][kLanes];  // all zero between blocks
  uint8_t syms[kGroupBlocks][kBlock];
  BlockStats st[kGroupBlocks];
};

// Bits of a value of each symbol beside its code, by dtype,
// and a value's bits (code and fixed) under each family combo (2 member + flip).
struct FixedTable {
  uint8_t bits[kNumSyms];
  uint8_t family[kNumSyms][kCombos];
  explicit FixedTable(Layout lay) {
    for (int s = 0; s < kNumSyms; ++s) {
      bits[s] = uint8_t(class_of_symbol(s) > kClassEsc ? 0 : fixed_bits(s, lay));
      for (int c = 0; c < kCombos; ++c) family[s][c] = uint8_t(kFamily[c >> 1][s ^ (c & 1 ? kSignSym : 0)] + bits[s]);
    }
  }
};

// §6 step 3 for lanes of bits[0..31] as choose_width, from the extremes of
// lanes 0..30: the deviations of a width fit when theirs do.
inline int narrowest_width(const uint32_t* bits, int32_t* devs, uint32_t* size) {
  uint32_t all = 0, lo = bits[0], hi = bits[0];
  for (int k = 0; k < kLanes; ++k) all += bits[k];
  for (int k = 1; k < kLanes - 1; ++k) lo = std::min(lo, bits[k]), hi = std::max(hi, bits[k]);
  int w = 1;
  for (;; ++w) {
    *size = uint32_t((head_bits(w) + all + 7) / 8);
    const int32_t base = int32_t(length_base(*size, uint32_t(head_bits(w)))), lim = 1 << (w - 1);
    if ((int32_t(lo) - base >= -lim && int32_t(hi) - base < lim) || w == kMaxWidth) break;
  }
  const int32_t base = int32_t(length_base(*size, uint32_t(head_bits(w))));
  for (int k = 0; k < kLanes - 1; ++k) devs[k] = int32_t(bits[k]) - base;
  return w;
}

#if ZC_HAVE_SIMD
// The largest class a block's values can have: none below its least normal q.
inline int top_class(uint32_t ref, uint32_t least) { return ref < least ? 0 : int(std::min<uint32_t>(ref - least + 1, kMaxD + 1)); }

// block_stats's first two passes over a full block with AVX-512: the own ref
// (§6 step 1) and the largest class present (*top), then every value's symbol at it into syms. Returns the ref.
template <int DT>
ZC_SIMD uint32_t simd_symbols(const typename Elements<DT>::T* x, uint8_t* syms, int* top_cls) {
  using El = Elements<DT>;
  constexpr Layout lay = El::lay;
  if constexpr (sizeof(typename El::T) == 2) {
    const __m512i qmask = _mm512_set1_epi16(short(El::q_mask)), four = _mm512_set1_epi16(4);
    const __m512i span = _mm512_set1_epi16(short(lay.q_max - 4));
    __m512i top = _mm512_setzero_si512(), bot = _mm512_set1_epi16(-1);
    for (int i = 0; i < kBlock; i += 32) {
      const __m512i q = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512(x + i), lay.low_bits), qmask);
      const __mmask32 normal = _mm512_cmplt_epu16_mask(_mm512_sub_epi16(q, four), span);
      top = _mm512_mask_max_epu16(top, normal, top, q);
      bot = _mm512_mask_min_epu16(bot, normal, bot, q);
    }
    const uint32_t ref = std::max(_mm512_reduce_max_epu32(_mm512_and_si512(top, _mm512_set1_epi32(0xFFFF))),
                                  _mm512_reduce_max_epu32(_mm512_srli_epi32(top, 16)));
    *top_cls = top_class(ref, std::min(_mm512_reduce_min_epu32(_mm512_and_si512(bot, _mm512_set1_epi32(0xFFFF))),
                                       _mm512_reduce_min_epu32(_mm512_srli_epi32(bot, 16))));
    const __m512i vref = _mm512_set1_epi16(short(ref)), esc = _mm512_set1_epi16(kClassEsc);
    for (int i = 0; i < kBlock; i += 32) {
      const __m512i v = _mm512_loadu_si512(x + i), q = _mm512_and_si512(_mm512_srli_epi16(v, lay.low_bits), qmask);
      const __m512i d = _mm512_sub_epi16(vref, q);
      const __mmask32 near = _mm512_cmplt_epu16_mask(_mm512_sub_epi16(q, four), span) &
                             _mm512_cmple_epu16_mask(d, _mm512_set1_epi16(kMaxD));
      __m512i cls = _mm512_mask_add_epi16(esc, near, d, _mm512_set1_epi16(1));
      cls = _mm512_maskz_mov_epi16(_mm512_test_epi16_mask(v, _mm512_set1_epi16(short(El::mag_mask))), cls);
      const __m512i sym = _mm512_or_si512(_mm512_slli_epi16(_mm512_srli_epi16(v, 15), 7), cls);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(syms + i), _mm512_cvtepi16_epi8(sym));
    }
    return ref;
  } else {
    const __m512i qmask = _mm512_set1_epi32(int(El::q_mask)), four = _mm512_set1_epi32(4);
    const __m512i span = _mm512_set1_epi32(int(lay.q_max - 4));
    __m512i top = _mm512_setzero_si512(), bot = _mm512_set1_epi32(-1);
    for (int i = 0; i < kBlock; i += 16) {
      const __m512i q = _mm512_and_si512(_mm512_srli_epi32(_mm512_loadu_si512(x + i), lay.low_bits), qmask);
      const __mmask16 normal = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(q, four), span);
      top = _mm512_mask_max_epu32(top, normal, top, q);
      bot = _mm512_mask_min_epu32(bot, normal, bot, q);
    }
    const uint32_t ref = _mm512_reduce_max_epu32(top);
    *top_cls = top_class(ref, _mm512_reduce_min_epu32(bot));
    const __m512i vref = _mm512_set1_epi32(int(ref)), esc = _mm512_set1_epi32(kClassEsc);
    for (int i = 0; i < kBlock; i += 16) {
      const __m512i v = _mm512_loadu_si512(x + i), q = _mm512_and_si512(_mm512_srli_epi32(v, lay.low_bits), qmask);
      const __m512i d = _mm512_sub_epi32(vref, q);
      const __mmask16 near = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(q, four), span) &
                             _mm512_cmple_epu32_mask(d, _mm512_set1_epi32(kMaxD));
      __m512i cls = _mm512_mask_add_epi32(esc, near, d, _mm512_set1_epi32(1));
      cls = _mm512_maskz_mov_epi32(_mm512_test_epi32_mask(v, _mm512_set1_epi32(int(El::mag_mask))), cls);
      const __m512i sym = _mm512_or_si512(_mm512_slli_epi32(_mm512_srli_epi32(v, 31), 7), cls);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(syms + i), _mm512_cvtepi32_epi8(sym));
    }
    return ref;
  }
}

// block_stats's last pass with AVX-512: the rows of the symbols present moved out of the histogram
// (those of classes 0 .. top and the escape's, each sign: the others are empty).
ZC_SIMD inline void simd_rows(GroupScratch& gs, BlockStats& st, int top) {
  const __m512i ones = _mm512_set1_epi16(1);
  std::memset(st.counts, 0, sizeof st.counts);
  for (int sign = 0; sign < 2; ++sign)
    for (int cls = 0; cls <= kClassEsc; cls = cls == top ? kClassEsc : cls + 1) {
      const int s = sign << 7 | cls;
      const __m512i row = _mm512_loadu_si512(gs.hist[s]);
      if (!_mm512_test_epi16_mask(row, row)) continue;
      st.counts[s] = uint32_t(_mm512_reduce_add_epi32(_mm512_madd_epi16(row, ones)));
      _mm512_storeu_si512(st.rows[st.nused], row);
      _mm512_storeu_si512(gs.hist[s], _mm512_setzero_si512());
      st.used[st.nused++] = uint8_t(s);
    }
}

// stats_size's lane sums with AVX-512: a lane count per 16-bit element, a row per vector.
ZC_SIMD inline bool simd_lane_bits(const BlockStats& s, const uint8_t* lens, const uint8_t* fixed, const uint8_t* map,
                                   uint32_t* bits) {
  __m512i acc = _mm512_setzero_si512();
  for (int j = 0; j < s.nused; ++j) {
    const int sym = map ? map[s.used[j]] : s.used[j];
    if (!lens[sym]) return false;
    const __m512i row = _mm512_loadu_si512(s.rows[j]);
    acc = _mm512_add_epi16(acc, _mm512_mullo_epi16(row, _mm512_set1_epi16(short(lens[sym] + fixed[sym]))));
  }
  _mm512_storeu_si512(bits, _mm512_cvtepu16_epi32(_mm512_castsi512_si256(acc)));
  _mm512_storeu_si512(bits + 16, _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(acc, 1)));
  return true;
}

// simd_symbols, simd_rows and simd_lane_bits with AVX2, for CPUs without AVX-512.
ZC_AVX2 inline uint32_t avx2_max_epu16(__m256i v) {  // the largest of 16 u16
  const __m128i m = _mm_max_epu16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  return 0xFFFFu - uint32_t(_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(m, _mm_set1_epi16(-1)))) & 0xFFFF);
}

ZC_AVX2 inline uint32_t avx2_max_epu32(__m256i v) {  // the largest of 8 u32
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4E));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xB1));
  return uint32_t(_mm_cvtsi128_si32(m));
}

// One vector of a full block's values: their q, whether it is normal, and their symbols at ref
// (16-bit elements: unsigned a < b as min(a, b - 1) == a; 32-bit ones: signed compares of q < 2^10).
template <int DT>
struct Avx2Symbols {
  using El = Elements<DT>;
  static constexpr Layout lay = El::lay;
  static constexpr bool kWide = sizeof(typename El::T) == 4;

  ZC_AVX2 static __m256i q_of(__m256i v) {
    return kWide ? _mm256_and_si256(_mm256_srli_epi32(v, lay.low_bits), _mm256_set1_epi32(int(El::q_mask)))
                 : _mm256_and_si256(_mm256_srli_epi16(v, lay.low_bits), _mm256_set1_epi16(short(El::q_mask)));
  }
  ZC_AVX2 static __m256i normal(__m256i q) {
    if (kWide)
      return _mm256_and_si256(_mm256_cmpgt_epi32(q, _mm256_set1_epi32(3)), _mm256_cmpgt_epi32(_mm256_set1_epi32(int(lay.q_max)), q));
    const __m256i t = _mm256_sub_epi16(q, _mm256_set1_epi16(4));
    return _mm256_cmpeq_epi16(_mm256_min_epu16(t, _mm256_set1_epi16(short(lay.q_max - 5))), t);
  }
  ZC_AVX2 static __m256i symbols(__m256i v, __m256i vref) {
    const __m256i q = q_of(v);
    if (kWide) {
      const __m256i d = _mm256_sub_epi32(vref, q);
      const __m256i in = _mm256_and_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(kMaxD + 1), d), _mm256_cmpgt_epi32(d, _mm256_set1_epi32(-1)));
      __m256i cls = _mm256_blendv_epi8(_mm256_set1_epi32(kClassEsc), _mm256_add_epi32(d, _mm256_set1_epi32(1)),
                                       _mm256_and_si256(normal(q), in));
      cls = _mm256_andnot_si256(_mm256_cmpeq_epi32(_mm256_and_si256(v, _mm256_set1_epi32(int(El::mag_mask))), _mm256_setzero_si256()), cls);
      return _mm256_or_si256(_mm256_slli_epi32(_mm256_srli_epi32(v, 31), 7), cls);
    }
    const __m256i d = _mm256_sub_epi16(vref, q);
    const __m256i near = _mm256_and_si256(normal(q), _mm256_cmpeq_epi16(_mm256_min_epu16(d, _mm256_set1_epi16(kMaxD)), d));
    __m256i cls = _mm256_blendv_epi8(_mm256_set1_epi16(kClassEsc), _mm256_add_epi16(d, _mm256_set1_epi16(1)), near);
    cls = _mm256_andnot_si256(_mm256_cmpeq_epi16(_mm256_and_si256(v, _mm256_set1_epi16(short(El::mag_mask))), _mm256_setzero_si256()), cls);
    return _mm256_or_si256(_mm256_slli_epi16(_mm256_srli_epi16(v, 15), 7), cls);
  }
};

template <int DT>
ZC_AVX2 uint32_t avx2_symbols(const typename Elements<DT>::T* x, uint8_t* syms) {
  using S = Avx2Symbols<DT>;
  constexpr int kStep = 32 / sizeof(typename Elements<DT>::T);  // values a vector
  __m256i top = _mm256_setzero_si256();
  for (int i = 0; i < kBlock; i += kStep) {
    const __m256i q = S::q_of(avx2_load(x + i));
    top = S::kWide ? _mm256_max_epu32(top, _mm256_and_si256(q, S::normal(q))) : _mm256_max_epu16(top, _mm256_and_si256(q, S::normal(q)));
  }
  const uint32_t ref = S::kWide ? avx2_max_epu32(top) : avx2_max_epu16(top);
  const __m256i vref = S::kWide ? _mm256_set1_epi32(int(ref)) : _mm256_set1_epi16(short(ref));
  for (int i = 0; i < kBlock; i += 32) {  // 32 symbols a store
    __m256i bytes;
    if constexpr (S::kWide) {
      __m256i s[4];
      for (int j = 0; j < 4; ++j) s[j] = S::symbols(avx2_load(x + i + 8 * j), vref);
      bytes = _mm256_packus_epi16(_mm256_packus_epi32(s[0], s[1]), _mm256_packus_epi32(s[2], s[3]));
      bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    } else {
      bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(S::symbols(avx2_load(x + i), vref), S::symbols(avx2_load(x + i + 16), vref)), 0xD8);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(syms + i), bytes);
  }
  return ref;
}

ZC_AVX2 inline void avx2_rows(GroupScratch& gs, BlockStats& st) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int s = 0; s < kNumSyms; ++s) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gs.hist[s]));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gs.hist[s] + 16));
    st.counts[s] = 0;
    if (_mm256_testz_si256(_mm256_or_si256(a, b), _mm256_or_si256(a, b))) continue;
    const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(a, ones), _mm256_madd_epi16(b, ones));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
    st.counts[s] = uint32_t(_mm_cvtsi128_si32(t));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(st.rows[st.nused]), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(st.rows[st.nused] + 16), b);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(gs.hist[s]), _mm256_setzero_si256());
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(gs.hist[s] + 16), _mm256_setzero_si256());
    st.used[st.nused++] = uint8_t(s);
  }
}

ZC_AVX2 inline bool avx2_lane_bits(const BlockStats& s, const uint8_t* lens, const uint8_t* fixed, const uint8_t* map,
                                   uint32_t* bits) {
  __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
  for (int j = 0; j < s.nused; ++j) {
    const int sym = map ? map[s.used[j]] : s.used[j];
    if (!lens[sym]) return false;
    const __m256i c = _mm256_set1_epi16(short(lens[sym] + fixed[sym]));
    lo = _mm256_add_epi16(lo, _mm256_mullo_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.rows[j])), c));
    hi = _mm256_add_epi16(hi, _mm256_mullo_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.rows[j] + 16)), c));
  }
  const __m256i halves[2] = {lo, hi};
  for (int h = 0; h < 2; ++h) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(bits + 16 * h), _mm256_cvtepu16_epi32(_mm256_castsi256_si128(halves[h])));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(bits + 16 * h + 8), _mm256_cvtepu16_epi32(_mm256_extracti128_si256(halves[h], 1)));
  }
  return true;
}
#endif

// The lane bits of a block under code lens (after map, if given), and its
// body's size; kNoSize if a symbol present has no code.
inline uint32_t stats_size(const BlockStats& s, const uint8_t* lens, const uint8_t* fixed, const uint8_t* map, uint32_t* bits,
                    int32_t* devs, int* width) {
#if ZC_HAVE_SIMD
  if (simd_level() != kPlain) {
    if (!(simd_enabled() ? simd_lane_bits(s, lens, fixed, map, bits) : avx2_lane_bits(s, lens, fixed, map, bits))) return kNoSize;
    uint32_t size;
    *width = narrowest_width(bits, devs, &size);
    return size;
  }
#endif
  uint16_t acc[kLanes] = {};
  for (int j = 0; j < s.nused; ++j) {
    const int sym = map ? map[s.used[j]] : s.used[j];
    if (!lens[sym]) return kNoSize;
    const uint16_t c = uint16_t(lens[sym] + fixed[sym]);
    for (int k = 0; k < kLanes; ++k) acc[k] = uint16_t(acc[k] + s.rows[j][k] * c);  // <= 128 * 43
  }
  for (int k = 0; k < kLanes; ++k) bits[k] = acc[k];
  uint32_t size;
  *width = narrowest_width(bits, devs, &size);
  return size;
}

// stats_size, the lanes' bits kept as a block's Choice holds them (for the coder, if it is chosen).
inline uint32_t stats_size(const BlockStats& s, const uint8_t* lens, const uint8_t* fixed, const uint8_t* map, uint16_t* keep) {
  uint32_t bits[kLanes] = {};  // left as is where a symbol has no code (kNoSize: never chosen)
  int32_t devs[kLanes - 1];
  int width;
  const uint32_t size = stats_size(s, lens, fixed, map, bits, devs, &width);
  for (int k = 0; k < kLanes; ++k) keep[k] = uint16_t(bits[k]);
  return size;
}

// The total bits of a block's lanes under code lens (after map, if given),
// and the least and most bytes a body of that many bits can take (its width
// field and deviations take head_bits(1) to head_bits(20) bits): enough to
// rule a code out without its lanes' bits. ~0 if a symbol present has no code.
inline uint64_t total_bits(const BlockStats& s, const uint8_t* lens, const uint8_t* fixed, const uint8_t* map = nullptr) {
  uint64_t total = 0;
  for (int j = 0; j < s.nused; ++j) {
    const int sym = map ? map[s.used[j]] : s.used[j];
    if (!lens[sym]) return ~uint64_t(0);
    total += uint64_t(s.counts[s.used[j]]) * (lens[sym] + fixed[sym]);
  }
  return total;
}
#if ZC_HAVE_SIMD
// family_totals's sums with AVX2 (either SIMD path): a combo a 32-bit element.
ZC_AVX2 inline void avx2_family_totals(const BlockStats& s, const uint8_t (*costs)[kCombos], uint32_t* t) {
  __m256i acc = _mm256_setzero_si256();
  for (int j = 0; j < s.nused; ++j) {
    const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(costs[s.used[j]])));
    acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(c, _mm256_set1_epi32(int(s.counts[s.used[j]]))));
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(t), acc);
}
#endif

// total_bits under the 8 family combos at once: costs[s][c] is combo c's
// length of symbol s plus its fixed bits (all present: the family codes every symbol).
inline void family_totals(const BlockStats& s, const uint8_t (*costs)[kCombos], uint64_t* totals) {
  uint32_t t[kCombos] = {};  // < 2^13 values of < 2^6 bits
#if ZC_HAVE_SIMD
  if (simd_level() != kPlain) {
    avx2_family_totals(s, costs, t);
    for (int k = 0; k < kCombos; ++k) totals[k] = t[k];
    return;
  }
#endif
  for (int j = 0; j < s.nused; ++j) {
    const uint32_t n = s.counts[s.used[j]];
    const uint8_t* c = costs[s.used[j]];
    for (int k = 0; k < kCombos; ++k) t[k] += n * c[k];
  }
  for (int k = 0; k < kCombos; ++k) totals[k] = t[k];
}

inline uint64_t least_size(uint64_t total) { return total == ~uint64_t(0) ? total : (total + head_bits(1) + 7) / 8; }
inline uint64_t most_size(uint64_t total) { return total == ~uint64_t(0) ? total : (total + head_bits(kMaxWidth) + 7) / 8; }

// §6 step 4: the symbol map of a block whose ref is raised by shift.
inline void shift_map(uint32_t shift, uint8_t* map) {
  for (int s = 0; s < kNumSyms; ++s) map[s] = uint8_t(class_of_symbol(s) > kClassEsc ? s : shifted_symbol(s, shift));
}

// Counts one block's symbols at its own ref (§6 step 1) into st, its symbols into syms.
template <int DT>
void block_stats(const typename Elements<DT>::T* x, int count, GroupScratch& gs, uint8_t* syms, BlockStats& st) {
  using El = Elements<DT>;
  uint32_t ref = 0;
  [[maybe_unused]] int top = kMaxD + 1;  // the largest class present, at most (rows past it are empty)
#if ZC_HAVE_SIMD
  if (count == kBlock && simd_level() != kPlain) {
    ref = simd_enabled() ? simd_symbols<DT>(x, syms, &top) : avx2_symbols<DT>(x, syms);
  } else
#endif
  {
    for (int i = 0; i < count; ++i) {
      const uint32_t q = El::q(x[i]);
      ref = std::max(ref, normal_q(q, El::lay) ? q : 0u);
    }
    for (int i = 0; i < count; ++i) {
      const uint32_t v = x[i], q = El::q(v), d = ref - q;
      const uint32_t cls = (v & El::mag_mask) == 0 ? 0u : (normal_q(q, El::lay) && d <= uint32_t(kMaxD)) ? d + 1 : uint32_t(kClassEsc);
      syms[i] = uint8_t((v >> El::sign_shift) << 7 | cls);
    }
  }
  int i = 0;
  for (; i + kLanes <= count; i += kLanes) {  // a row at a time: each lane's counter at a constant offset
#pragma GCC unroll 32
    for (int k = 0; k < kLanes; ++k) ++gs.hist[syms[i + k]][k];
  }
  for (; i < count; ++i) ++gs.hist[syms[i]][i & (kLanes - 1)];
  st.ref = ref;
  st.count = count;
  st.nused = 0;
#if ZC_HAVE_SIMD
  if (simd_enabled()) return simd_rows(gs, st, top);
  if (avx2_enabled()) return avx2_rows(gs, st);
#endif
  for (int s = 0; s < kNumSyms; ++s) {
    uint32_t total = 0;
    for (int k = 0; k < kLanes; ++k) total += gs.hist[s][k];
    st.counts[s] = total;
    if (!total) continue;
    std::memcpy(st.rows[st.nused], gs.hist[s], sizeof gs.hist[s]);
    std::memset(gs.hist[s], 0, sizeof gs.hist[s]);
    st.used[st.nused++] = uint8_t(s);
  }
}

}  // namespace v6
}  // namespace zipccl
