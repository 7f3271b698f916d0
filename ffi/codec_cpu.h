// Stream coder on the CPU: whole streams of FORMAT.md, built on the block
// coder of zipccl_format.h. Plain functions with no XLA types, so the FFI
// handlers, the Python buffer API and the fuzzer share them.
#pragma once

#include <cstdint>
#include <memory>

#include "zipccl_format.h"

namespace zipccl {

// Writes one stream of n elements (bytes at in) to out, which has room for
// max_stream_bytes(n, dtype) bytes, or for cap bytes where cap >= 0: then
// nothing past out[cap) is written and a stream longer than cap returns -1
// (out's contents unspecified). Returns the stream length. generic=true
// runs the shared block coder the CUDA codec uses instead of the fast CPU one
// (same bytes; tests compare them). With a plan from stream_bytes of the same
// elements, it skips the choices (FORMAT.md §7 steps 1-3) that fill it; the
// plan must be that (check_plan guards memory safety, not the match).
int64_t compress_stream(int dtype, const uint8_t* in, int64_t n, uint8_t* out, bool generic = false,
                        const uint8_t* plan = nullptr, int64_t cap = -1);

// The length compress_stream would write for these n elements, from the
// encoder's choices and the sub-streams' sizes, without coding them: for
// sizing a transfer before coding it. The choices are most of the encoder's
// work (the symbol counts of every block); with plan (plan_bytes(n) bytes)
// they are kept, and compress_stream given the plan codes without them.
int64_t stream_bytes(int dtype, const uint8_t* in, int64_t n, uint8_t* plan = nullptr, bool generic = false);
int64_t plan_bytes(int64_t n);
// Whether plan (plan_bytes(n) bytes) is safe to code n elements of dtype
// with: masks, code lengths and refs in range (not that it is their plan).
bool check_plan(int dtype, const uint8_t* plan, int64_t n);

// Decodes the stream in [in, in + size) into n elements at out. Validates
// everything and returns a Status; never reads or writes out of bounds.
int decompress_stream(int dtype, const uint8_t* in, int64_t size, int64_t n, uint8_t* out, bool generic = false);

// Decodes k streams of n elements, each in its own row of cap bytes, and sums
// them in row order in float32 into acc (FORMAT.md §8). Returns a Status.
int decompress_accumulate(int dtype, const uint8_t* in, int64_t cap, int64_t k, int64_t n, float* acc);

// decompress_accumulate with a stream decoder of either version: decode(dtype, in, size, n, out) -> Status.
template <class Decode>
int accumulate_rows(int dtype, const uint8_t* in, int64_t cap, int64_t k, int64_t n, float* acc, Decode decode);

// acc[i] = x[i] (first) or acc[i] + x[i] in float32, for n elements of dtype
// at x: the rank-ordered sum's step (FORMAT.md §8; the caller turns flush-to-
// zero and denormals-are-zero off). Typed loops the compiler vectorises.
void accumulate_elements(int dtype, const uint8_t* x, int64_t n, float* acc, bool first);

// out[i] = acc[i] rounded once to dtype (round to nearest even; NaN to the
// canonical quiet NaN of its sign, as numpy's cast does).
void round_elements(int dtype, const float* acc, int64_t n, uint8_t* out);

template <class Decode>
int accumulate_rows(int dtype, const uint8_t* in, int64_t cap, int64_t k, int64_t n, float* acc, Decode decode) {
  const int es = layout_of(dtype).elem_bytes;
  std::unique_ptr<uint8_t[]> row(new uint8_t[size_t(n > 0 ? n * es : 1)]);
  for (int64_t j = 0; j < k; ++j) {
    const int status = decode(dtype, in + j * cap, cap, n, row.get());
    if (status != kOk) return status;
    accumulate_elements(dtype, row.get(), n, acc, j == 0);
  }
  return kOk;
}

}  // namespace zipccl
