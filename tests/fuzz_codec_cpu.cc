// Differential fuzzer of the CPU codec, built with AddressSanitizer and
// UndefinedBehaviorSanitizer by test_codec_cpu.py:
//   fuzz_codec_cpu SEED ITERATIONS
// For random inputs of every dtype (Gaussian, wide exponents with escapes,
// zeros, Inf/NaN, block-varying scale, random bits, skewed signs over many
// binades, ReLU outputs with implied zeros, with -0 and subnormals among
// them) it checks that the fast
// and the generic (CUDA's) block coders write the same stream, that the size
// pass (stream_bytes) gives its length and its plan the same stream, and that it
// round-trips; then it corrupts each stream many ways and checks that both
// decoders give the same verdict and, when they accept, the same elements.
// The sanitizers turn any out-of-bounds access into a failure.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "codec_cpu.h"
#include "fuzz_inputs.h"

using namespace zipccl;

namespace {

// One random corruption of a stream of n elements.
std::vector<uint8_t> corrupt(std::mt19937_64& rng, const std::vector<uint8_t>& s, int64_t n) {
  std::vector<uint8_t> c(s);
  const size_t len = c.size(), nb = size_t(num_blocks(n));
  const size_t records = size_t(records_offset(int64_t(nb)));  // §1: the group records follow the descriptors
  switch (rng() % 7) {
    case 0: c[16 + rng() % (len - 16)] ^= uint8_t(1 << (rng() % 8)); break;
    case 1: c[rng() % len] = uint8_t(rng()); break;
    case 2: c.resize(rng() % len); break;
    case 3:
      for (int r = 0; r < 3; ++r) c[16 + rng() % (len - 16)] ^= uint8_t(rng());
      break;
    case 4:  // a group's mask bit
      if (nb && len > records + kRecordBytes * size_t(num_groups(nb)))
        c[records + kRecordBytes * (rng() % size_t(num_groups(nb)))] ^= uint8_t(1 << (rng() % 6));
      break;
    case 5: {  // a block's width field, the first byte of its body (§2)
      const int64_t b = int64_t(rng() % (nb ? nb : 1));
      size_t at = size_t(bodies_offset(int64_t(nb)));
      for (int64_t j = 0; j < b && 16 + kDescBytes * (j + 1) <= int64_t(len); ++j)
        at += c[16 + kDescBytes * j] | (size_t(c[16 + kDescBytes * j + 1]) << 8);
      if (nb && at < len) c[at] = uint8_t(rng());
      break;
    }
    default:  // the table areas, at the end: refs and code lengths
      c[len - 1 - rng() % std::min(len - 16, size_t(64))] ^= uint8_t(1 << (rng() % 8));
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  std::mt19937_64 rng(argc > 1 ? std::atoi(argv[1]) : 1);
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 200;
  int fails = 0, mutations = 0, accepted = 0;
  for (int it = 0; it < iterations; ++it) {
    const int dtype = 1 + it % 3, es = layout_of(dtype).elem_bytes, kind = int(rng() % 10);
    const int64_t n = it % 7 == 0 ? int64_t(rng() % 5) : it % 3 == 0 ? 2 * 65536 + int64_t(rng() % 9000)
                                                                   : int64_t(rng() % 70000);
    const std::vector<uint8_t> x = make_input(rng, dtype, n, kind);
    std::vector<uint8_t> fast(size_t(max_stream_bytes(n, dtype))), generic(fast.size());
    const int64_t len = compress_stream(dtype, x.data(), n, fast.data());
    if (len != compress_stream(dtype, x.data(), n, generic.data(), true) || !same(fast.data(), generic.data(), len)) {
      std::printf("streams differ: it=%d dtype=%d n=%ld kind=%d\n", it, dtype, long(n), kind);
      ++fails;
      continue;
    }
    std::vector<uint8_t> plan(size_t(plan_bytes(n))), planned(generic.size());
    if (stream_bytes(dtype, x.data(), n) != len || stream_bytes(dtype, x.data(), n, plan.data()) != len ||
        compress_stream(dtype, x.data(), n, planned.data(), false, plan.data()) != len ||
        !same(fast.data(), planned.data(), len)) {
      std::printf("size pass or planned stream differs: it=%d dtype=%d n=%ld kind=%d\n", it, dtype, long(n), kind);
      ++fails;
    }
    // A capacity bound: exactly the stream's length fits (the same bytes, with or without the plan);
    // one byte less is refused; nothing is written past it (AddressSanitizer guards the exact-size buffers).
    for (const uint8_t* p : {static_cast<const uint8_t*>(nullptr), static_cast<const uint8_t*>(plan.data())}) {
      std::vector<uint8_t> exact(static_cast<size_t>(len)), short_by_one(static_cast<size_t>(len - 1));
      if (!check_plan(dtype, plan.data(), n) || compress_stream(dtype, x.data(), n, exact.data(), false, p, len) != len ||
          !same(fast.data(), exact.data(), len) ||
          compress_stream(dtype, x.data(), n, short_by_one.data(), false, p, len - 1) != -1) {
        std::printf("bounded stream wrong: it=%d dtype=%d n=%ld kind=%d\n", it, dtype, long(n), kind);
        ++fails;
      }
    }
    // A damaged plan: refused by check_plan, or coded within bounds (its stream is then not promised to decode).
    if (!plan.empty()) {
      std::vector<uint8_t> bad = plan, out(size_t(max_stream_bytes(n, dtype)));
      bad[rng() % bad.size()] ^= uint8_t(1 << (rng() % 8));
      if (check_plan(dtype, bad.data(), n)) compress_stream(dtype, x.data(), n, out.data(), false, bad.data(), int64_t(out.size()));
    }
    fast.resize(size_t(len));
    std::vector<uint8_t> a(size_t(n * es) + 1), b(a.size());
    if (decompress_stream(dtype, fast.data(), len, n, a.data()) != kOk || !same(a.data(), x.data(), n * es)) {
      std::printf("round trip failed: it=%d\n", it);
      ++fails;
    }
    for (int m = 0; m < 60 && len > 16; ++m, ++mutations) {
      const std::vector<uint8_t> c = corrupt(rng, fast, n);
      const int sa = decompress_stream(dtype, c.data(), int64_t(c.size()), n, a.data());
      const int sb = decompress_stream(dtype, c.data(), int64_t(c.size()), n, b.data(), true);
      if ((sa == kOk) != (sb == kOk) || (sa == kOk && !same(a.data(), b.data(), n * es))) {
        std::printf("decoders disagree: it=%d fast=%d generic=%d\n", it, sa, sb);
        ++fails;
      }
      accepted += sa == kOk;
    }
  }
  std::printf("%d inputs, %d corrupted streams (%d still valid), %d failures\n", iterations, mutations, accepted, fails);
  return fails != 0;
}
