// Stream coder on the CPU: whole streams of FORMAT.md, built on the block
// coder of zipccl_format.h. Plain functions with no XLA types, so the FFI
// handlers, the Python buffer API and the fuzzer share them.
#pragma once

#include <cstdint>

#include "zipccl_format.h"

namespace zipccl {

// Writes one stream of n elements (bytes at in) to out, which has room for
// max_stream_bytes(n, dtype) bytes. Returns the stream length. generic=true
// runs the shared block coder the CUDA codec uses instead of the fast CPU one
// (same bytes; tests compare them).
int64_t compress_stream(int dtype, const uint8_t* in, int64_t n, uint8_t* out, bool generic = false);

// Decodes the stream in [in, in + size) into n elements at out. Validates
// everything and returns a Status; never reads or writes out of bounds.
int decompress_stream(int dtype, const uint8_t* in, int64_t size, int64_t n, uint8_t* out, bool generic = false);

// Decodes k streams of n elements, each in its own row of cap bytes, and sums
// them in row order in float32 into acc (FORMAT.md §8). Returns a Status.
int decompress_accumulate(int dtype, const uint8_t* in, int64_t cap, int64_t k, int64_t n, float* acc);

}  // namespace zipccl
