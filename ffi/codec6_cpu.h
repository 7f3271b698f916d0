// Stream coder of format version 6 (docs/FORMAT.md) on the CPU: whole
// streams, built on format6.h. Plain functions with no XLA types, so FFI
// handlers, the Python buffer API and the fuzzer share them. generic=true runs
// format6.h's block coder (the specification the CUDA codec shares) instead
// of the fast one: the same bytes and verdicts (tests compare them).
#pragma once

#include <cstdint>

#include "format6.h"

namespace zipccl {
namespace v6 {

// The most elements a stream holds: its whole length must fit a uint32, as
// the library's stream lengths do (and a descriptor's 32-bit end then always
// fits). Longer arrays are split into streams (ops.compress_chunks).
inline int64_t max_elements(int dtype) { return (int64_t(0xFFFFFFFF) - kHeaderBytes) / layout_of(dtype).elem_bytes; }

// Writes one stream of n elements (bytes at in) to out, which has room for
// max_stream_bytes(n, dtype) bytes (version 5's: the header and the raw
// elements), or for cap bytes where cap >= 0: then nothing past out[cap) is
// written and a stream longer than cap returns -1 (out's contents
// unspecified). Returns the stream's length, or -1 if n > max_elements(dtype).
// With a plan from stream_bytes of the same elements it codes without sizing
// anything (FORMAT.md §6 is the plan's); the plan must be that (check_plan
// guards memory safety, not the match).
int64_t compress_stream(int dtype, const uint8_t* in, int64_t n, uint8_t* out, bool generic = false,
                        const uint8_t* plan = nullptr, int64_t cap = -1);

// The length compress_stream would write, from the encoder's choices,
// without writing the bodies (-1 as compress_stream); with plan (plan_bytes(n)
// bytes) the choices and the lanes' bits, for compress_stream.
int64_t stream_bytes(int dtype, const uint8_t* in, int64_t n, uint8_t* plan = nullptr, bool generic = false);
int64_t plan_bytes(int64_t n);
// Whether plan (plan_bytes(n) bytes) is safe to code n elements of dtype with.
bool check_plan(int dtype, const uint8_t* plan, int64_t n);

// Decodes the stream in [in, in + size) into n elements at out. Validates
// everything, never reads or writes out of bounds, and returns a Status: the
// reference's verdict (its first failing block's).
int decompress_stream(int dtype, const uint8_t* in, int64_t size, int64_t n, uint8_t* out, bool generic = false);

// How many blocks the fast decoders (vector and scalar) have handed to the
// generic one on this thread: a block they find anything wrong in, or may (a
// valid stream gives none; tests check that the fast paths decode it all).
int64_t generic_fallbacks();

// decompress_stream of elements [begin, begin + count) only, into count
// elements at out: whole blocks (begin a multiple of 4,096, and begin + count
// too or n; else kErrCount). Those blocks are checked and decoded, and the
// stream's header and length: where they pass, the same elements; where one
// fails, the stream's verdict if no block before begin fails.
int decompress_range(int dtype, const uint8_t* in, int64_t size, int64_t n, int64_t begin, int64_t count, uint8_t* out);

// Decodes k streams of n elements, each in its own row of cap bytes, and sums
// them in row order in float32 into acc (FORMAT.md §7). Returns a Status:
// the first failing row's verdict.
int decompress_accumulate(int dtype, const uint8_t* in, int64_t cap, int64_t k, int64_t n, float* acc);

}  // namespace v6
}  // namespace zipccl
