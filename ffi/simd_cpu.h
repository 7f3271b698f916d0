// Fast CPU block coder, shared part: dispatch, the element layout of one
// dtype and SIMD helpers. encode_cpu.h and decode_cpu.h give the same bytes
// as encode_block/decode_block of zipccl_format.h (tests assert it),
// restructured for one core. Full blocks take AVX-512 paths where the CPU
// has them (simd_enabled()); the plain paths give the same bytes on any x86-64.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "zipccl_format.h"

#if defined(__x86_64__)
// GCC 12's AVX-512 headers trip -Wuninitialized on their own placeholder
// operands once inlined (GCC PR 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#define ZC_HAVE_SIMD 1
#define ZC_SIMD __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2,bmi,bmi2")))
#else
#define ZC_HAVE_SIMD 0
#endif

namespace zipccl {

// ZIPCCL_NO_SIMD=1 in the environment forces the plain paths (tests compare them).
inline bool simd_enabled() {
#if ZC_HAVE_SIMD
  static const bool ok = !std::getenv("ZIPCCL_NO_SIMD") && __builtin_cpu_supports("avx512f") &&
                         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                         __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512vbmi2") &&
                         __builtin_cpu_supports("bmi2");
  return ok;
#else
  return false;
#endif
}

// §3 for one dtype. Everything coded lives in the element's top 16 bits h
// (the whole element for 16-bit dtypes): sign, exponent, top mantissa bits and,
// for bf16 and fp32, the five bits under them.
template <int DT>
struct Elem {
  static constexpr Layout lay = layout_of(DT);
  static constexpr uint32_t all_ones = (1u << lay.exp_bits) - 1;
  static constexpr int e_shift = 15 - lay.exp_bits;  // exponent position in h
  static constexpr int t_shift = e_shift - kTopBits;  // top bits position in h
  static constexpr int keys = (all_ones + 1) << kTopBits;  // (exponent, top bits) pairs
  using U = std::conditional_t<lay.elem_bytes == 2, uint16_t, uint32_t>;

  static uint32_t top(const uint8_t* in, int i) {
    U x;
    std::memcpy(&x, in + i * sizeof(U), sizeof(U));
    return lay.elem_bytes == 4 ? uint32_t(x) >> 16 : x;
  }
  static uint32_t bits(const uint8_t* in, int i) {  // the whole element
    U x;
    std::memcpy(&x, in + i * sizeof(U), sizeof(U));
    return x;
  }
  static uint32_t key(uint32_t h) { return (h >> t_shift) & (keys - 1); }
  static uint32_t signed_key(uint32_t h) { return h >> t_shift; }  // the sign bit above key(h)
  static uint32_t exponent(uint32_t h) { return (h >> e_shift) & all_ones; }
  static uint32_t top_bits(uint32_t h) { return (h >> t_shift) & 3u; }
  static uint32_t extra(uint32_t h) {
    if constexpr (DT == kF16) return h >> 15;
    return ((h & 0x1Fu) << 1) | (h >> 15);
  }
  // h from its parts; the low byte of fp16 comes from the raw area.
  static uint32_t join_top(uint32_t e, uint32_t t, uint32_t extra) {
    if constexpr (DT == kF16) return (extra << 15) | (e << 10) | (t << 8);
    return ((extra & 1u) << 15) | (e << 7) | (t << 5) | (extra >> 1);
  }
};

// §4: the symbol (without the sign) of exponent e and top bits t under ref.
// Encoder refs are below ALL_ONES, so e == ALL_ONES is an e > ref and escapes.
inline uint32_t symbol_of(uint32_t e, uint32_t t, uint32_t ref) {
  const uint32_t d = ref - e;  // wraps when e > ref
  const uint32_t c = e == 0 ? uint32_t(kClassZero) : d <= uint32_t(kMaxDelta) ? d + 1 : uint32_t(kClassEsc);
  return (c << kTopBits) | t;
}

// Orders non-temporal stores before the stores that follow.
inline void store_fence() {
#if ZC_HAVE_SIMD
  _mm_sfence();
#endif
}

inline uint64_t load_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// ---------------------------------------------------------------- encoder

#if ZC_HAVE_SIMD
// Index vectors of the permutes below, built at compile time.
struct alignas(64) Lanes {
  uint8_t b[64];
};
template <class F>
constexpr Lanes bytes_of(F f) {
  Lanes l{};
  for (int i = 0; i < 64; ++i) l.b[i] = uint8_t(f(i));
  return l;
}
template <class F>
constexpr Lanes words_of(F f) {
  Lanes l{};
  for (int i = 0; i < 32; ++i) l.b[2 * i] = uint8_t(f(i)), l.b[2 * i + 1] = uint8_t(f(i) >> 8);
  return l;
}
constexpr Lanes kOddWords = words_of([](int i) { return 2 * i + 1; });
constexpr Lanes kEvenWords = words_of([](int i) { return 2 * i; });
// bytes 0-2 of each 64-bit lane, packed (24 bytes)
constexpr Lanes kPack24 = bytes_of([](int i) { return i < 24 ? 8 * (i / 3) + i % 3 : 0; });
// bytes 0-4 of each even 64-bit lane, packed (20 bytes)
constexpr Lanes kPack40 = bytes_of([](int i) { return i < 20 ? 16 * (i / 5) + i % 5 : 0; });
// 6-bit field j of 24 bytes: word lane j takes bytes 6j/8, 6j/8 + 1, to shift right by 6j % 8
constexpr Lanes kSixBitBytes = bytes_of([](int i) { return 6 * (i / 2) / 8 + i % 2; });
constexpr Lanes kSixBitShifts = words_of([](int i) { return 6 * i % 8; });
// the same for 5-bit fields of 20 bytes
constexpr Lanes kFiveBitBytes = bytes_of([](int i) { return 5 * (i / 2) / 8 + i % 2; });
constexpr Lanes kFiveBitShifts = words_of([](int i) { return 5 * i % 8; });
// 32 low halves a and 32 top halves b interleaved into 32-bit elements: first 16, last 16
constexpr Lanes kJoinLow = words_of([](int i) { return i % 2 ? 32 + i / 2 : i / 2; });
constexpr Lanes kJoinHigh = words_of([](int i) { return i % 2 ? 48 + i / 2 : 16 + i / 2; });
// 32 bytes, in reverse order, to words; 32 words in reverse order
constexpr Lanes kReverseToWords = words_of([](int i) { return 31 - i; });
constexpr Lanes kReverseWords = kReverseToWords;
// lane i's first bit in 32 fields of w bits
template <int w>
constexpr Lanes kFieldBits = words_of([](int i) { return w * i; });
// i, 5 bits, reversed into bits 11..7
constexpr Lanes kReverse5Words = words_of([](int i) {
  return (i & 1) << 11 | (i & 2) << 9 | (i & 4) << 7 | (i & 8) << 5 | (i & 16) << 3;
});

ZC_SIMD inline __m512i lanes(const Lanes& l) { return _mm512_load_si512(l.b); }

// Appends to 16 lanes at once: each lane's pending bits (nb < 32 of them) sit in
// its word of acc; an append of n <= 32 bits v completes the word when
// nb + n >= 32 (put returns every lane's word and which completed), and what
// did not fit (v >> (32 - nb)) is pending next. Both versions' lane coders use it.
struct LaneAppender {
  struct Appended {
    __m512i low;
    __mmask16 full;
  };
  __m512i acc, nb;
  ZC_SIMD LaneAppender() : acc(_mm512_setzero_si512()), nb(_mm512_setzero_si512()) {}
  ZC_SIMD Appended put(__m512i v, __m512i n) {
    const __m512i thirty_two = _mm512_set1_epi32(32);
    const __m512i low = _mm512_or_si512(acc, _mm512_sllv_epi32(v, nb));  // shifts of 32 give 0
    const __m512i spill = _mm512_srlv_epi32(v, _mm512_sub_epi32(thirty_two, nb));
    nb = _mm512_add_epi32(nb, n);
    const __mmask16 full = _mm512_cmpge_epu32_mask(nb, thirty_two);
    acc = _mm512_mask_mov_epi32(low, full, spill);
    nb = _mm512_mask_sub_epi32(nb, full, nb, thirty_two);
    return Appended{low, full};
  }
};

// Transposes the 16 x 16 32-bit matrix of rows r.
ZC_SIMD inline void transpose16(__m512i* r) {
  __m512i t[kLanes];
  for (int i = 0; i < kLanes; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < kLanes; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // r[4q + c] holds columns c, c + 4, c + 8, c + 12 of rows 4q .. 4q + 3 (a 128-bit chunk per row group)
  for (int c = 0; c < 4; ++c) {
    const __m512i a = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88), b = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xDD);
    const __m512i d = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88), e = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xDD);
    t[c] = _mm512_shuffle_i32x4(a, d, 0x88);       // column c
    t[8 + c] = _mm512_shuffle_i32x4(a, d, 0xDD);   // column c + 8
    t[4 + c] = _mm512_shuffle_i32x4(b, e, 0x88);   // column c + 4
    t[12 + c] = _mm512_shuffle_i32x4(b, e, 0xDD);  // column c + 12
  }
  for (int i = 0; i < kLanes; ++i) r[i] = t[i];
}

// Writes n words of a lane's bits (src; src[-1] readable, words past its bits
// zero) to dst shifted up by s bits, the first word's bits below s from
// `first`: up to 16 words past n are written too (zeros or garbage).
ZC_SIMD inline void splice_words(const uint32_t* src, uint8_t* dst, uint32_t s, uint32_t n, uint32_t first) {
  const __m128i left = _mm_cvtsi32_si128(int(s)), right = _mm_cvtsi32_si128(int(32 - s));
  for (uint32_t i = 0; i < n; i += 16) {
    const __m512i cur = _mm512_loadu_si512(src + i), prev = _mm512_loadu_si512(src + int(i) - 1);
    __m512i v = _mm512_or_si512(_mm512_sll_epi32(cur, left), _mm512_srl_epi32(prev, right));
    if (i == 0) v = _mm512_mask_or_epi32(v, 1, v, _mm512_set1_epi32(int(first)));
    _mm512_storeu_si512(dst + 4 * i, v);
  }
}
#endif  // ZC_HAVE_SIMD

// canonical_codes of zipccl_format.h (§5.2), same codes, from the count of
// codes of each length rather than a scan of all symbols for each length.
inline void fast_canonical_codes(const uint8_t* lens, uint16_t* codes, int nsym = kNumSyms) {
  int count[kMaxCodeLen + 1] = {};
  uint32_t next[kMaxCodeLen + 1];
  for (int s = 0; s < nsym; ++s) ++count[lens[s]];
  for (int l = 1, code = 0; l <= kMaxCodeLen; ++l) {
    next[l] = uint32_t(code);
    code = (code + count[l]) << 1;
  }
  for (int s = 0; s < nsym; ++s) {
    const int len = lens[s];
    if (!len) continue;
    const uint32_t code = next[len]++;
    uint32_t rev = 0;  // written first bit (the most significant) first
    for (int b = 0; b < len; ++b) rev |= ((code >> b) & 1u) << (len - 1 - b);
    codes[s] = uint16_t(rev);
  }
}

}  // namespace zipccl
