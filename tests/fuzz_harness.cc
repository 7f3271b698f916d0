// Coverage-guided fuzz target of the CPU decoder (format version 6), in
// libFuzzer's interface.
// One file, two builds (docs/RELIABILITY.md):
//   - with g++ and tests/fuzz_driver.cc (our small coverage-guided driver on
//     -fsanitize-coverage=trace-pc), by test_fuzz.py: the short CI campaign;
//   - with clang -fsanitize=fuzzer (the real libFuzzer): the long campaign.
// Both under AddressSanitizer and UndefinedBehaviorSanitizer.
//
// The input is a payload, taken as the caller of decompress would: dtype and
// element count come from its own header when they look sane (so valid seeds
// decode), otherwise from its size, which exercises the mismatch checks. It
// goes only through the stable entry points of codec6_cpu.h and checks:
//   - the output buffer holds exactly n elements (ASan catches a write past);
//   - a decode either fails or writes every one of the n elements (two
//     decodes into buffers pre-filled differently give the same bytes);
//   - the fast (SIMD where present) and the generic (CUDA's) block decoders
//     give the same verdict and, when they accept, the same bytes;
//   - decompress_accumulate of the one stream agrees with decompress_stream,
//     and so does decompress_range of its blocks after the first;
//   - the input's bytes, read as elements, round-trip through both encoders,
//     which write the same stream, whose length the size pass gives.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "codec6_cpu.h"

using namespace zipccl;

namespace {

constexpr uint64_t kMaxElements = 1 << 18;  // bounds the harness's own allocations

void check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_harness: property violated: %s\n", what);
  std::abort();
}

bool same_bits(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  return a.size() == b.size() && (a.empty() || !std::memcmp(a.data(), b.data(), a.size()));
}

// A decode into a buffer of exactly n elements, pre-filled with `fill`
// (heap-allocated at that size, so ASan sees any write past it).
int decode(int dtype, const uint8_t* data, size_t size, uint64_t n, uint8_t fill, bool generic,
           std::vector<uint8_t>* out) {
  out->assign(size_t(n) * dtype_bytes(dtype), fill);
  return v6::decompress_stream(dtype, data, int64_t(size), int64_t(n), out->data(), generic);
}

void check_decoders(const uint8_t* data, size_t size) {
  int dtype = size > 5 ? data[5] : 0;
  if (dtype < kBF16 || dtype > kF32) dtype = kBF16 + int(size % 3);
  uint64_t n = 0;
  for (int i = 0; i < 8 && size >= 16; ++i) n |= uint64_t(data[8 + i]) << (8 * i);
  if (n > kMaxElements) n = size % 5000;  // then the count check must reject it
  std::vector<uint8_t> a, b, c;
  const int status = decode(dtype, data, size, n, 0x00, false, &a);
  check(status == decode(dtype, data, size, n, 0xFF, false, &b), "same verdict on every call");
  // Both must accept or both reject; which check fires first may differ
  // (the fast decoder runs two blocks' lanes side by side).
  check((status == kOk) == (decode(dtype, data, size, n, 0x5A, true, &c) == kOk),
        "fast and generic decoders agree on the verdict");
  check(status >= kOk && status <= kErrLast && error_message(status)[0], "a known status with a message");
  if (status != kOk) return;
  check(same_bits(a, b), "an accepted payload writes every one of the n elements");
  check(same_bits(a, c), "fast and generic decoders write the same elements");
  std::vector<float> acc(size_t(n), -1.0f);
  check(v6::decompress_accumulate(dtype, data, int64_t(size), 1, int64_t(n), acc.data()) == kOk,
        "decompress_accumulate accepts what decompress_stream accepts");
  const int es = dtype_bytes(dtype);
  if (n > 4096) {  // whole blocks (heap-allocated at their size, so ASan sees any write past them)
    std::vector<uint8_t> part(size_t(n - 4096) * es);
    check(v6::decompress_range(dtype, data, int64_t(size), int64_t(n), 4096, int64_t(n) - 4096, part.data()) == kOk &&
              !std::memcmp(part.data(), a.data() + 4096 * es, part.size()),
          "decompress_range of the blocks after the first gives their elements");
    check(v6::decompress_range(dtype, data, int64_t(size), int64_t(n), 1, 4095, part.data()) == kErrCount,
          "decompress_range refuses a range that is not whole blocks");
  }
  for (uint64_t i = 0; i < n; ++i) {
    const float v = element_to_f32(dtype, load_element(a.data() + i * es, es));
    check(f32_to_bits(acc[i]) == f32_to_bits(v) || (v != v && acc[i] != acc[i]), "accumulate of one stream");
  }
}

void check_round_trip(const uint8_t* data, size_t size) {
  const int dtype = kBF16 + int(size % 3), es = dtype_bytes(dtype);
  const int64_t n = int64_t(size) / es;
  std::vector<uint8_t> fast(size_t(max_stream_bytes(n, dtype))), generic(fast.size()), back;
  const int64_t len = v6::compress_stream(dtype, data, n, fast.data());
  check(len >= kHeaderBytes && len <= max_stream_bytes(n, dtype), "stream within max_stream_bytes");
  check(v6::compress_stream(dtype, data, n, generic.data(), true) == len && !std::memcmp(fast.data(), generic.data(), size_t(len)),
        "fast and generic encoders write the same stream");
  check(v6::stream_bytes(dtype, data, n) == len, "the size pass gives the stream's length");
  check(decode(dtype, fast.data(), size_t(len), uint64_t(n), 0xA5, false, &back) == kOk, "own stream decodes");
  check(back.empty() || !std::memcmp(back.data(), data, back.size()), "round trip is bit-exact");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // libFuzzer's buffer is exactly `size` bytes: an over-read past it is caught too.
  check_decoders(data, size);
  check_round_trip(data, size);
  return 0;
}
