// The rank-ordered float32 sum of the reduce step (FORMAT.md §7) on the CPU.
#include "accumulate_cpu.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "simd_cpu.h"  // ZC_SIMD, ZC_AVX2, simd_level

namespace zipccl {

namespace {

// The loops, compiled once for each instruction set below: the same scalar
// code, vectorised as wide as the caller's target allows.
template <int D>
__attribute__((always_inline)) inline void accumulate_loop(const uint8_t* x, int64_t n, float* acc, bool first) {
  using T = std::conditional_t<D == kF32, uint32_t, uint16_t>;
  constexpr int64_t kTile = 1024;
  T bits[kTile];
  for (int64_t base = 0; base < n; base += kTile) {  // a tile at a time: x need not be aligned
    const int64_t len = std::min(kTile, n - base);
    std::memcpy(bits, x + base * int64_t(sizeof(T)), size_t(len) * sizeof(T));
    float* a = acc + base;
    if (first) {
      for (int64_t i = 0; i < len; ++i) a[i] = element_to_f32(D, bits[i]);
    } else {
      for (int64_t i = 0; i < len; ++i) a[i] = add_f32(a[i], element_to_f32(D, bits[i]));
    }
  }
}

template <int D>
void accumulate_plain(const uint8_t* x, int64_t n, float* acc, bool first) { accumulate_loop<D>(x, n, acc, first); }

#if ZC_HAVE_SIMD
template <int D>
ZC_SIMD void accumulate_avx512(const uint8_t* x, int64_t n, float* acc, bool first) { accumulate_loop<D>(x, n, acc, first); }

template <int D>
ZC_AVX2 void accumulate_avx2(const uint8_t* x, int64_t n, float* acc, bool first) { accumulate_loop<D>(x, n, acc, first); }
#endif

template <int D>
void accumulate_typed(const uint8_t* x, int64_t n, float* acc, bool first) {
#if ZC_HAVE_SIMD
  if (simd_enabled()) return accumulate_avx512<D>(x, n, acc, first);
  if (avx2_enabled()) return accumulate_avx2<D>(x, n, acc, first);
#endif
  accumulate_plain<D>(x, n, acc, first);
}

template <int D>
void round_typed(const float* acc, int64_t n, uint8_t* out) {
  using T = std::conditional_t<D == kF32, uint32_t, uint16_t>;
  constexpr int64_t kTile = 1024;
  T bits[kTile];
  for (int64_t base = 0; base < n; base += kTile) {
    const int64_t len = std::min(kTile, n - base);
    for (int64_t i = 0; i < len; ++i) bits[i] = T(f32_to_element(D, acc[base + i]));
    std::memcpy(out + base * int64_t(sizeof(T)), bits, size_t(len) * sizeof(T));
  }
}

}  // namespace

void accumulate_elements(int dtype, const uint8_t* x, int64_t n, float* acc, bool first) {
  if (dtype == kBF16) return accumulate_typed<kBF16>(x, n, acc, first);
  if (dtype == kF16) return accumulate_typed<kF16>(x, n, acc, first);
  return accumulate_typed<kF32>(x, n, acc, first);
}

void round_elements(int dtype, const float* acc, int64_t n, uint8_t* out) {
  if (dtype == kBF16) return round_typed<kBF16>(acc, n, out);
  if (dtype == kF16) return round_typed<kF16>(acc, n, out);
  return round_typed<kF32>(acc, n, out);
}

}  // namespace zipccl
