// The CPU codec's SIMD dispatch and the AVX-512 helpers its lane coder uses
// (lanes6_cpu.h). Full blocks take AVX-512 paths where the CPU has them
// (simd_enabled()); the plain paths give the same bytes on any x86-64.
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

#if ZC_HAVE_SIMD
// Appends to 16 lanes at once: each lane's pending bits (nb < 32 of them) sit in
// its word of acc; an append of n <= 32 bits v completes the word when
// nb + n >= 32 (put returns every lane's word and which completed), and what
// did not fit (v >> (32 - nb)) is pending next.
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
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
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
  for (int i = 0; i < 16; ++i) r[i] = t[i];
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

}  // namespace zipccl
