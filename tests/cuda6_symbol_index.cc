// Checks the compress kernels' symbol indices (ffi/cuda6_device.cuh
// SymbolIndex, SymbolIndexHigh, PseudoSource, ExactIndex) against format6.h symbol_of, for
// tests/test_cuda6_emulation.py: every bf16 and fp16 value and, for fp32, every
// sign and q with low bits 0, 1 and all ones, at ref 0 and every normal q.
// Prints "ok N" (the checks made) or the first mismatch, exit status 1.
#include "cuda_host_shim.h"
//
#include "cuda6_device.cuh"

#include <cstdio>

namespace {

namespace c6 = zipccl::cuda6;
namespace v6 = zipccl::v6;

template <int DT>
bool Check(uint32_t x, uint32_t ref, long* checks) {
  const v6::Layout lay = v6::layout_of(DT);
  const int sym = v6::symbol_of(x, lay, ref);
  const uint32_t lim = c6::SymbolLimit(ref);
  const uint32_t exact = c6::SymbolIndex<DT, true>(x, ref, lim), pseudo = c6::SymbolIndex<DT, false>(x, ref, lim);
  // at lim 120 (ref >= 123), SymbolIndexHigh's (else not called: the exact index stands in)
  const uint32_t high = lim == 120 ? c6::SymbolIndexHigh<DT>(x, ref) : exact;
  ++*checks;
  // the exact index is the symbol's, inverted by PseudoSource at 120; the cheaper one's table
  // entry (PseudoSource at lim) is the symbol's; SymbolIndexHigh's is the exact one
  if (exact < 256 && int(exact) == c6::ExactIndex(sym) && c6::PseudoSource(int(exact), 120) == sym && pseudo < 256 &&
      c6::PseudoSource(int(pseudo), lim) == sym && high == exact)
    return true;
  std::printf("dtype %d x %#x ref %u: symbol %d, exact index %u, index %u (lim %u), high %u\n", DT, x, ref, sym, exact,
              pseudo, lim, high);
  return false;
}

template <int DT>
bool CheckAll(long* checks) {
  const v6::Layout lay = v6::layout_of(DT);
  for (uint32_t ref = 0; ref < lay.q_max; ref = ref ? ref + 1 : 4) {
    if (lay.elem_bytes == 2) {
      for (uint32_t x = 0; x < 65536; ++x)
        if (!Check<DT>(x, ref, checks)) return false;
    } else {
      const uint32_t lows[3] = {0, 1, (1u << lay.low_bits) - 1};
      for (uint32_t sign = 0; sign < 2; ++sign)
        for (uint32_t q = 0; q < (1u << lay.q_bits); ++q)
          for (uint32_t low : lows)
            if (!Check<DT>(sign << 31 | q << lay.low_bits | low, ref, checks)) return false;
    }
  }
  return true;
}

}  // namespace

int main() {
  long checks = 0;
  if (!CheckAll<zipccl::kBF16>(&checks) || !CheckAll<zipccl::kF16>(&checks) || !CheckAll<zipccl::kF32>(&checks))
    return 1;
  std::printf("ok %ld\n", checks);
  return 0;
}
