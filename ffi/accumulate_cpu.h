// The reduce step's arithmetic on the CPU (FORMAT.md §7): rows decoded and
// summed in row order in float32, the sums rounded once. Shared by the CPU
// codec (codec6_cpu.cc) and the FFI handlers (zipccl_cpu.cc).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include "zipccl_format.h"  // Status, dtype_bytes, element_to_f32, add_f32

namespace zipccl {

// The elements the reduce step sums at a time: a group of blocks (FORMAT.md
// §2), so that a tile's sums (256 KiB) and one row's decoded tile stay in a
// core's L2 cache while every row is added to them.
constexpr int64_t kReduceTile = int64_t(16) * 4096;

// acc[i] = x[i] (first) or acc[i] + x[i] in float32, for n elements of dtype
// at x: the rank-ordered sum's step (FORMAT.md §7; the caller turns flush-to-
// zero and denormals-are-zero off). Typed loops the compiler vectorises (with
// AVX-512 or AVX2 where the CPU has them).
void accumulate_elements(int dtype, const uint8_t* x, int64_t n, float* acc, bool first);

// out[i] = acc[i] rounded once to dtype (round to nearest even; NaN to the
// canonical quiet NaN of its sign, as numpy's cast does).
void round_elements(int dtype, const float* acc, int64_t n, uint8_t* out);

// Sums k rows of n elements in row order into acc, a tile of kReduceTile
// elements at a time: row(j, begin, count, out) -> Status puts row j's
// elements [begin, begin + count) at out (begin a multiple of kReduceTile; a
// header's checks come with begin 0, so n == 0 still asks each row once).
// Returns the Status summing whole rows in order would: the first failing
// row's (its index in *failed), its first failing tile's verdict.
template <class Row>
int accumulate_tiled(int dtype, int64_t k, int64_t n, float* acc, Row row, int64_t* failed = nullptr) {
  const int es = dtype_bytes(dtype);
  std::unique_ptr<uint8_t[]> tile(new uint8_t[size_t(std::max<int64_t>(std::min(n, kReduceTile) * es, 1))]);
  const auto fail = [&](int64_t j, int status) {
    if (failed) *failed = j;
    return status;
  };
  for (int64_t begin = 0; begin < n || begin == 0; begin += kReduceTile) {
    const int64_t count = std::min(kReduceTile, n - begin);
    for (int64_t j = 0; j < k; ++j) {
      const int status = row(j, begin, count, tile.get());
      if (status == kOk) {
        accumulate_elements(dtype, tile.get(), count, acc + begin, j == 0);
        continue;
      }
      for (int64_t i = 0; i < j; ++i)  // an earlier row may yet fail in a later tile: its verdict comes first
        for (int64_t at = begin + kReduceTile; at < n; at += kReduceTile)
          if (const int s = row(i, at, std::min(kReduceTile, n - at), tile.get()); s != kOk) return fail(i, s);
      return fail(j, status);
    }
    if (n == 0) break;
  }
  return kOk;
}

}  // namespace zipccl
