// Checks GroupKernel's group-code lengths (ffi/cuda6_compress.cuh
// GroupCodeLengths: the rank sort, the one-thread two-queue merge, the depths
// by pointer jumping, the flattening rounds) against zipccl_format.h
// code_lengths, for tests/test_cuda6_emulation.py, on hard counts: Fibonacci
// counts (the deepest trees a group's 65,536 values allow, flattened in
// several rounds), every valid symbol used, ties, one or two used symbols,
// random counts. Each CUDA block takes two cases, one a candidate. Prints
// "ok N" (the cases) or the first mismatch, exit status 1.
#include "cuda_host_shim.h"
//
#include "cuda6_codec.cuh"

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

namespace {

namespace c6 = zipccl::cuda6;
namespace v6 = zipccl::v6;
constexpr int kSyms = v6::kNumSyms;

__global__ void LengthsKernel(const uint32_t* counts, uint8_t* lens) {
  ZC_SHARED(c6::GroupSmem, s);
  const int tid = int(threadIdx.x), h = tid / kSyms, sym = tid % kSyms;
  s.counts[h][sym] = counts[blockIdx.x * 2 * kSyms + tid];
  if (tid < 2) s.used[tid] = 0;
  __syncthreads();
  if (s.counts[h][sym]) atomicAdd(&s.used[h], 1u);
  __syncthreads();
  c6::GroupCodeLengths(s);
  lens[blockIdx.x * 2 * kSyms + tid] = s.lens[h][sym];
}

// The valid symbols (classes 0..121 of each sign), in a shuffled order.
std::vector<int> Symbols(std::mt19937& rng) {
  std::vector<int> syms;
  for (int s = 0; s < kSyms; ++s)
    if (v6::class_of_symbol(s) <= v6::kClassEsc) syms.push_back(s);
  std::shuffle(syms.begin(), syms.end(), rng);
  return syms;
}

}  // namespace

int main() {
  zc_emu::sms = 1;
  zc_emu::resident = 1;
  std::mt19937 rng(6);
  std::vector<std::vector<uint32_t>> cases;
  auto add = [&](std::vector<uint32_t> c) { cases.push_back(std::move(c)); };
  for (int k = 2; k <= 23; ++k) {  // Fibonacci counts: depth k - 1, flattened once k > 13
    std::vector<uint32_t> c(kSyms, 0);
    const std::vector<int> syms = Symbols(rng);
    uint32_t a = 1, b = 1;
    for (int i = 0; i < k; ++i) c[syms[i]] = a, b = a + b, a = b - a;
    add(c);
  }
  for (int used : {0, 1, 2, 3, 200, 244}) {  // equal counts (ties everywhere)
    std::vector<uint32_t> c(kSyms, 0);
    const std::vector<int> syms = Symbols(rng);
    for (int i = 0; i < used; ++i) c[syms[i]] = 65536 / 244;
    add(c);
  }
  for (int r = 0; r < 24; ++r) {  // random: geometric spreads (deep) and uniform ones, 65,536 values
    std::vector<uint32_t> c(kSyms, 0);
    const std::vector<int> syms = Symbols(rng);
    const int used = 2 + int(rng() % 243);
    std::geometric_distribution<int> deep(0.05 + 0.4 * (r % 4) / 3);
    for (int v = 0; v < 65536; ++v) ++c[syms[unsigned(r % 2 ? deep(rng) : int(rng() >> 1)) % unsigned(used)]];
    add(c);
  }
  if (cases.size() % 2) cases.push_back(cases.front());
  const int blocks = int(cases.size() / 2);
  std::vector<uint32_t> counts;
  for (const auto& c : cases) counts.insert(counts.end(), c.begin(), c.end());
  void *dc, *dl;
  if (cudaMalloc(&dc, counts.size() * 4) != cudaSuccess || cudaMalloc(&dl, counts.size()) != cudaSuccess) return 2;
  std::copy(counts.begin(), counts.end(), static_cast<uint32_t*>(dc));
  ZC_LAUNCH_KERNEL(LengthsKernel, unsigned(blocks), 2 * kSyms, nullptr, static_cast<const uint32_t*>(dc),
                   static_cast<uint8_t*>(dl));
  cudaStreamSynchronize(nullptr);
  for (size_t i = 0; i < cases.size(); ++i) {
    uint8_t want[kSyms];
    zipccl::code_lengths(cases[i].data(), want, kSyms);
    const uint8_t* got = static_cast<const uint8_t*>(dl) + i * kSyms;
    for (int s = 0; s < kSyms; ++s)
      if (got[s] != want[s]) {
        std::printf("case %zu symbol %d: length %d, code_lengths %d\n", i, s, got[s], want[s]);
        cudaFree(dc), cudaFree(dl);
        return 1;
      }
  }
  cudaFree(dc), cudaFree(dl);
  std::printf("ok %zu\n", cases.size());
  return 0;
}
