// Test inputs for the differential fuzzers (fuzz_codec_cpu.cc):
// n elements of dtype, of one of 10 kinds: Gaussian, wide exponents with
// escapes, zeros, Inf/NaN, block-varying scale, random bits, skewed signs over
// many binades, ReLU outputs with -0 and subnormals among them; and same().
#pragma once

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "zipccl_format.h"

namespace zipccl {

inline std::vector<uint8_t> make_input(std::mt19937_64& rng, int dtype, int64_t n, int kind) {
  const int es = dtype_bytes(dtype);
  std::vector<uint8_t> x(size_t(n * es));
  std::normal_distribution<float> normal(0, 1);
  for (int64_t i = 0; i < n; ++i) {
    float f = normal(rng);
    if (kind == 1) f *= std::exp2(float(int(rng() % 200) - 100));  // wide exponents: escapes
    if (kind == 2 && rng() % 10 == 0) f = 0;
    if (kind == 3 && rng() % 50 == 0) f = (rng() % 2) ? INFINITY : NAN;
    if (kind == 4 && i > n / 2) f *= 1e-30f;  // the emax changes between blocks
    if (kind >= 6) f = rng() % 10 ? std::fabs(f) : -std::fabs(f);  // skewed signs: coded (§4.1)
    if (kind == 7) f *= std::exp2(float(int(rng() % 40) - 20));    // ... over many binades
    if (kind >= 8) f = std::fmax(f, 0.0f);                         // ReLU: implied zeros (§4.2)
    uint32_t u = f32_to_bits(f);
    if (dtype != kF32) u = dtype == kBF16 ? u >> 16 : f32_to_f16(f);
    if (kind == 5) u = uint32_t(rng());  // incompressible
    if (kind == 9 && rng() % 20 == 0) u = rng() % 2 ? 1u : 1u << (8 * es - 1);  // a subnormal, -0: escapes
    store_element(x.data() + i * es, u, es);
  }
  return x;
}

// Whether bytes bytes at a and b agree (none: they do).
inline bool same(const uint8_t* a, const uint8_t* b, int64_t bytes) { return bytes == 0 || !std::memcmp(a, b, size_t(bytes)); }

}  // namespace zipccl
