// Differential fuzzer of format version 6's CPU codec (ffi/codec6_cpu.cc),
// built with AddressSanitizer and UndefinedBehaviorSanitizer by
// test_codec_cpu.py:
//   fuzz_codec_cpu SEED ITERATIONS
// For random inputs of every dtype and kind (fuzz_inputs.h) it checks that the
// fast and the generic (format6.h's, the CUDA codec's) coders write the same
// stream, that the size pass gives its length, and that it round-trips; then
// the plan of the size pass codes the same stream, a capacity bounds what
// is written; then it corrupts each stream many ways (bytes, descriptor fields, group tables,
// width fields, truncation) and checks that both decoders give the same
// Status and, when they accept, the same elements. Every output buffer is
// exactly as large as the API promises, so the sanitizers see any access past it.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "codec6_cpu.h"
#include "fuzz_inputs.h"

using namespace zipccl;

namespace {

// One random corruption of a version-6 stream of n elements.
std::vector<uint8_t> corrupt(std::mt19937_64& rng, const std::vector<uint8_t>& s, int64_t n) {
  std::vector<uint8_t> c(s);
  const size_t len = c.size(), nb = size_t(num_blocks(n));
  const size_t data_at = size_t(v6::data_offset(int64_t(nb)));
  const size_t b = nb ? rng() % nb : 0, desc = 16 + 8 * b;
  switch (rng() % 8) {
    case 0: c[16 + rng() % (len - 16)] ^= uint8_t(1 << (rng() % 8)); break;
    case 1: c[rng() % len] = uint8_t(rng()); break;
    case 2: c.resize(rng() % len); break;
    case 3:  // a descriptor bit: end, ref, code, flip, raw, table, reserved
      if (desc + 8 <= len) c[desc + rng() % 8] ^= uint8_t(1 << (rng() % 8));
      break;
    case 4:  // a descriptor's end moved a little
      if (desc + 8 <= len) c[desc] = uint8_t(c[desc] + int(rng() % 5) - 2);
      break;
    case 5:  // a group table's nibble (the group's first record)
      if (desc + 8 <= len && nb) {
        const size_t first = b - b % kGroupBlocks, at = first ? v6::read_desc(c.data(), int64_t(first) - 1).end : 0;
        if (data_at + at + v6::kTableBytes <= len) c[data_at + at + rng() % v6::kTableBytes] ^= uint8_t(1 + rng() % 255);
      }
      break;
    case 6:  // a block's body: its width field and deviations
      if (desc + 8 <= len) {
        const size_t at = data_at + (b ? v6::read_desc(c.data(), int64_t(b) - 1).end : 0) + rng() % 16;
        if (at < len) c[at] ^= uint8_t(1 << (rng() % 8));
      }
      break;
    default:
      for (int r = 0; r < 3; ++r) c[16 + rng() % (len - 16)] ^= uint8_t(rng());
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  std::mt19937_64 rng(argc > 1 ? std::atoi(argv[1]) : 1);
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 200;
  int fails = 0, mutations = 0, accepted = 0;
  for (int dtype = 1; dtype <= 3; ++dtype)  // a stream's length is a uint32: more elements are refused, untouched
    if (v6::compress_stream(dtype, nullptr, v6::max_elements(dtype) + 1, nullptr) != -1 ||
        v6::stream_bytes(dtype, nullptr, v6::max_elements(dtype) + 1) != -1 || v6::max_elements(dtype) * (dtype == 3 ? 4 : 2) + 16 > 0xFFFFFFFFll) {
      std::printf("over-long stream not refused: dtype=%d\n", dtype);
      ++fails;
    }
  for (int it = 0; it < iterations; ++it) {
    const int dtype = 1 + it % 3, es = v6::layout_of(dtype).elem_bytes, kind = int(rng() % 10);
    const int64_t n = it % 7 == 0 ? int64_t(rng() % 5) : it % 3 == 0 ? 2 * 65536 + int64_t(rng() % 9000)
                                                                   : int64_t(rng() % 70000);
    const std::vector<uint8_t> x = make_input(rng, dtype, n, kind);
    std::vector<uint8_t> fast(size_t(max_stream_bytes(n, dtype))), generic(fast.size());
    const int64_t len = v6::compress_stream(dtype, x.data(), n, fast.data());
    if (len != v6::compress_stream(dtype, x.data(), n, generic.data(), true) || !same(fast.data(), generic.data(), len) ||
        v6::stream_bytes(dtype, x.data(), n) != len || v6::stream_bytes(dtype, x.data(), n, nullptr, true) != len) {
      std::printf("streams or sizes differ: it=%d dtype=%d n=%ld kind=%d\n", it, dtype, long(n), kind);
      ++fails;
      continue;
    }
    // The size pass's plan codes the same stream, on both coders; a capacity of exactly the stream's
    // length gives the same bytes, one byte less is refused, and nothing is written past it.
    std::vector<uint8_t> plan(size_t(v6::plan_bytes(n)) + 1), planned(fast.size());
    for (bool gen : {false, true}) {
      if (v6::stream_bytes(dtype, x.data(), n, plan.data(), gen) != len || !v6::check_plan(dtype, plan.data(), n) ||
          v6::compress_stream(dtype, x.data(), n, planned.data(), gen, plan.data()) != len ||
          !same(fast.data(), planned.data(), len)) {
        std::printf("planned stream differs: it=%d dtype=%d n=%ld kind=%d generic=%d\n", it, dtype, long(n), kind, int(gen));
        ++fails;
      }
    }
    for (const uint8_t* p : {static_cast<const uint8_t*>(nullptr), static_cast<const uint8_t*>(plan.data())}) {
      std::vector<uint8_t> exact(static_cast<size_t>(len)), short_by_one(static_cast<size_t>(len - 1));
      if (v6::compress_stream(dtype, x.data(), n, exact.data(), false, p, len) != len || !same(fast.data(), exact.data(), len) ||
          v6::compress_stream(dtype, x.data(), n, short_by_one.data(), false, p, len - 1) != -1) {
        std::printf("bounded stream wrong: it=%d dtype=%d n=%ld kind=%d\n", it, dtype, long(n), kind);
        ++fails;
      }
    }
    if (plan.size() > 1) {  // a damaged plan: refused by check_plan, or coded within bounds (not promised to decode)
      std::vector<uint8_t> bad = plan, out(size_t(max_stream_bytes(n, dtype)));
      for (int r = 0; r < 4; ++r) bad[rng() % (bad.size() - 1)] ^= uint8_t(1 << (rng() % 8));
      if (v6::check_plan(dtype, bad.data(), n)) v6::compress_stream(dtype, x.data(), n, out.data(), false, bad.data(), int64_t(out.size()));
    }
    fast.resize(size_t(len));
    std::vector<uint8_t> a(size_t(n * es)), b(a.size());
    if (v6::decompress_stream(dtype, fast.data(), len, n, a.data()) != kOk || !same(a.data(), x.data(), n * es)) {
      std::printf("round trip failed: it=%d\n", it);
      ++fails;
    }
    for (int m = 0; m < 60 && len > 16; ++m, ++mutations) {
      const std::vector<uint8_t> c = corrupt(rng, fast, n);
      const int sa = v6::decompress_stream(dtype, c.data(), int64_t(c.size()), n, a.data());
      const int sb = v6::decompress_stream(dtype, c.data(), int64_t(c.size()), n, b.data(), true);
      if (sa != sb || sa < kOk || sa > kErrLast || (sa == kOk && !same(a.data(), b.data(), n * es))) {
        std::printf("decoders disagree: it=%d fast=%d generic=%d\n", it, sa, sb);
        if (const char* dump = std::getenv("FUZZ6_DUMP")) {  // the stream, for a closer look
          if (FILE* f = std::fopen(dump, "wb")) std::fwrite(c.data(), 1, c.size(), f), std::fclose(f);
          std::printf("dumped: dtype=%d n=%ld\n", dtype, long(n));
          return 1;
        }
        ++fails;
      }
      accepted += sa == kOk;
    }
  }
  std::printf("%d inputs, %d corrupted streams (%d still valid), %d failures\n", iterations, mutations, accepted, fails);
  return fails != 0;
}
