// The CPU decoder's tables against their specification: Baked::bake (the table
// filled by doubling from code lengths) gives, at every 12-bit window, the entry
// that build_lut's table implies, and canonical_codes gives the codes of the
// lengths-then-symbols order FORMAT.md §4 defines (written out here the slow way),
// for complete, incomplete and one-symbol codes of every length up to 12 and every dtype.
// Prints "ok <codes checked>" or the first difference.
#include <cstdio>
#include <random>

#include "lanes6_cpu.h"

namespace v6 = zipccl::v6;

namespace {

// §4 canonical codes, one length at a time over the symbols in order (bit-reversed).
void slow_codes(const uint8_t* lens, uint16_t* codes) {
  uint32_t code = 0;
  for (int len = 1; len <= zipccl::kMaxCodeLen; ++len, code <<= 1)
    for (int s = 0; s < v6::kNumSyms; ++s)
      if (lens[s] == len) {
        uint32_t rev = 0;
        for (int b = 0; b < len; ++b) rev |= ((code >> b) & 1u) << (len - 1 - b);
        codes[s] = uint16_t(rev), ++code;
      }
}

// The entry of window w from build_lut's table: symbol, length, the value's bits, its kind.
template <int DT>
uint32_t lut_entry(const uint16_t* lut, int w) {
  constexpr v6::Layout lay = v6::Elements<DT>::lay;
  const uint32_t len = lut[w] >> 8, s = lut[w] & 0xFF, cls = s & 127;
  if (!len) return 0;
  const bool esc = cls == uint32_t(v6::kClassEsc), zero = cls == uint32_t(v6::kClassZero);
  const uint32_t kind = esc ? v6::Baked::kEsc | v6::Baked::kLow : zero ? 0 : v6::Baked::kNear | v6::Baked::kLow;
  const uint32_t used = len + (zero ? 0 : lay.low_bits) + (esc ? lay.q_bits : 0);
  return s | len << v6::Baked::kLenShift | used << v6::Baked::kUsedShift | kind;
}

// Code lengths of nsym random symbols with Kraft sum at most 1 (exactly 1 if complete).
void random_lengths(std::mt19937& rng, int nsym, bool complete, uint8_t* lens) {
  for (int s = 0; s < v6::kNumSyms; ++s) lens[s] = 0;
  uint32_t counts[v6::kNumSyms] = {};
  for (int i = 0; i < nsym; ++i) counts[rng() % v6::kNumSyms] = 1 + rng() % (rng() % 2 ? 1000000 : 5);
  zipccl::code_lengths(counts, lens, v6::kNumSyms);  // complete where two or more symbols are used
  if (!complete)
    for (int s = 0; s < v6::kNumSyms; ++s)
      if (lens[s] && lens[s] < zipccl::kMaxCodeLen && rng() % 4 == 0) ++lens[s];  // a longer code: Kraft < 1
}

template <int DT>
bool check(const uint8_t* lens, int trial) {
  uint16_t codes[v6::kNumSyms] = {}, slow[v6::kNumSyms] = {}, lut[zipccl::kLutSize];
  zipccl::canonical_codes(lens, codes, v6::kNumSyms);
  slow_codes(lens, slow);
  for (int s = 0; s < v6::kNumSyms; ++s)
    if (lens[s] && codes[s] != slow[s]) {
      std::printf("trial %d: symbol %d of length %d: canonical_codes %d, the slow way %d\n", trial, s, lens[s], codes[s], slow[s]);
      return false;
    }
  zipccl::build_lut(lens, lut, v6::kNumSyms);
  static v6::Baked baked;
  baked.bake<DT>(lens);
  for (int w = 0; w < zipccl::kLutSize; ++w)
    if (baked.entry[w] != lut_entry<DT>(lut, w)) {
      std::printf("trial %d, dtype %d: window %d: bake 0x%x, build_lut's 0x%x\n", trial, DT, w, baked.entry[w], lut_entry<DT>(lut, w));
      return false;
    }
  return true;
}

}  // namespace

int main() {
  std::mt19937 rng(26);
  uint8_t lens[v6::kNumSyms];
  int checked = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int nsym = trial < 12 ? 1 + trial : 1 + int(rng() % 244);
    random_lengths(rng, nsym, trial % 3 != 0, lens);
    if (trial == 0) lens[7] = 12;  // one symbol, longest code
    if (!check<zipccl::kBF16>(lens, trial) || !check<zipccl::kF16>(lens, trial) || !check<zipccl::kF32>(lens, trial)) return 1;
    ++checked;
  }
  for (int c = 0; c < v6::kMembers; ++c) {  // the family's codes as the decoder uses them
    if (!check<zipccl::kBF16>(v6::kFamily[c], -1 - c)) return 1;
    ++checked;
  }
  std::printf("ok %d\n", checked);
  return 0;
}
