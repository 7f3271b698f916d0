// The reduce step's arithmetic on the CPU (FORMAT.md §7): rows decoded and
// summed in row order in float32, the sums rounded once. Shared by the CPU
// codec (codec6_cpu.cc) and the FFI handlers (zipccl_cpu.cc).
#pragma once

#include <cstdint>
#include <memory>

#include "zipccl_format.h"  // Status, dtype_bytes, element_to_f32, add_f32

namespace zipccl {

// Decodes k streams of n elements, each in its own row of cap bytes, with
// decode(dtype, in, size, n, out) -> Status, and sums them in row order into
// acc. Returns a Status: the first failing row's.
template <class Decode>
int accumulate_rows(int dtype, const uint8_t* in, int64_t cap, int64_t k, int64_t n, float* acc, Decode decode);

// acc[i] = x[i] (first) or acc[i] + x[i] in float32, for n elements of dtype
// at x: the rank-ordered sum's step (FORMAT.md §7; the caller turns flush-to-
// zero and denormals-are-zero off). Typed loops the compiler vectorises.
void accumulate_elements(int dtype, const uint8_t* x, int64_t n, float* acc, bool first);

// out[i] = acc[i] rounded once to dtype (round to nearest even; NaN to the
// canonical quiet NaN of its sign, as numpy's cast does).
void round_elements(int dtype, const float* acc, int64_t n, uint8_t* out);

template <class Decode>
int accumulate_rows(int dtype, const uint8_t* in, int64_t cap, int64_t k, int64_t n, float* acc, Decode decode) {
  const int es = dtype_bytes(dtype);
  std::unique_ptr<uint8_t[]> row(new uint8_t[size_t(n > 0 ? n * es : 1)]);
  for (int64_t j = 0; j < k; ++j) {
    const int status = decode(dtype, in + j * cap, cap, n, row.get());
    if (status != kOk) return status;
    accumulate_elements(dtype, row.get(), n, acc, j == 0);
  }
  return kOk;
}

}  // namespace zipccl
