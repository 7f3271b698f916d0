// The CPU codec's SIMD dispatch and the AVX-512 and AVX2 helpers its lane
// coder uses (lanes6_cpu.h, lanes6_avx2.h). Full blocks take AVX-512 paths
// where the CPU has them (simd_enabled()), else AVX2 paths where it has those
// (avx2_enabled()); the plain paths give the same bytes on any x86-64.
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
#define ZC_AVX2 __attribute__((target("avx2,bmi,bmi2,popcnt")))
#else
#define ZC_HAVE_SIMD 0
#endif

namespace zipccl {

// The widest SIMD the codec uses here: the CPU's, capped by the environment
// (tests compare the paths): ZIPCCL_NO_SIMD=1 forces the plain paths,
// ZIPCCL_SIMD=avx2 the AVX2 ones on a CPU with AVX-512.
enum SimdLevel { kPlain, kAvx2, kAvx512 };

inline SimdLevel simd_level() {
#if ZC_HAVE_SIMD
  static const SimdLevel level = [] {
    if (std::getenv("ZIPCCL_NO_SIMD")) return kPlain;
    const char* cap = std::getenv("ZIPCCL_SIMD");
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("popcnt");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi") &&
                        __builtin_cpu_supports("avx512vbmi2");
    if (avx512 && !(cap && std::strcmp(cap, "avx2") == 0)) return kAvx512;
    return avx2 ? kAvx2 : kPlain;
  }();
  return level;
#else
  return kPlain;
#endif
}

inline bool simd_enabled() { return simd_level() == kAvx512; }  // the AVX-512 paths
inline bool avx2_enabled() { return simd_level() == kAvx2; }    // the AVX2 paths (no AVX-512 here)

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

ZC_AVX2 inline __m256i avx2_load(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
ZC_AVX2 inline void avx2_store(void* p, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
ZC_AVX2 inline __m256i avx2_set(uint32_t v) { return _mm256_set1_epi32(int(v)); }

// Appends to 8 lanes at once: LaneAppender's scheme in 256-bit vectors.
struct LaneAppender8 {
  __m256i acc, nb;
  ZC_AVX2 LaneAppender8() : acc(_mm256_setzero_si256()), nb(_mm256_setzero_si256()) {}
  // Appends n <= 32 bits v to each lane; returns every lane's word (its bits so far and v's that
  // fit), *full: all ones in the lanes whose word this append completed.
  ZC_AVX2 __m256i put(__m256i v, __m256i n, __m256i* full) {
    const __m256i thirty_two = _mm256_set1_epi32(32);
    const __m256i low = _mm256_or_si256(acc, _mm256_sllv_epi32(v, nb));  // shifts of 32 give 0
    const __m256i spill = _mm256_srlv_epi32(v, _mm256_sub_epi32(thirty_two, nb));
    nb = _mm256_add_epi32(nb, n);
    *full = _mm256_cmpgt_epi32(nb, _mm256_set1_epi32(31));
    acc = _mm256_blendv_epi8(low, spill, *full);
    nb = _mm256_sub_epi32(nb, _mm256_and_si256(*full, thirty_two));
    return low;
  }
};

// Transposes the 8 x 8 32-bit matrix of rows r.
ZC_AVX2 inline void transpose8(__m256i* r) {
  __m256i t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
  }
  __m256i u[8];
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // u[c] (c < 4) holds columns c and c + 4 of rows 0..3 (a 128-bit half each); u[4 + c] of rows 4..7
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x20);
    r[4 + c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x31);
  }
}

// Left-packing permutations: for an 8-bit mask, the indices of its set bits first, in order.
struct LeftPack {
  alignas(32) uint32_t idx[256][8];
  LeftPack() {
    for (int m = 0; m < 256; ++m) {
      int j = 0;
      for (int b = 0; b < 8; ++b)
        if (m >> b & 1) idx[m][j++] = uint32_t(b);
      for (; j < 8; ++j) idx[m][j] = 0;
    }
  }
};

inline const LeftPack& left_pack() {
  static const LeftPack* p = new LeftPack();
  return *p;
}

// splice_words in 256-bit vectors: up to 8 words past n are written too (zeros or garbage).
ZC_AVX2 inline void avx2_splice_words(const uint32_t* src, uint8_t* dst, uint32_t s, uint32_t n, uint32_t first) {
  const __m128i left = _mm_cvtsi32_si128(int(s)), right = _mm_cvtsi32_si128(int(32 - s));
  for (uint32_t i = 0; i < n; i += 8) {
    const __m256i cur = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i prev = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + int(i) - 1));
    __m256i v = _mm256_or_si256(_mm256_sll_epi32(cur, left), _mm256_srl_epi32(prev, right));
    if (i == 0) v = _mm256_or_si256(v, _mm256_setr_epi32(int(first), 0, 0, 0, 0, 0, 0, 0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 4 * i), v);
  }
}
#endif  // ZC_HAVE_SIMD

}  // namespace zipccl
