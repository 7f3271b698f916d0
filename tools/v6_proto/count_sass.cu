// The per-value passes alone, to count their SASS instructions (tools/v6_proto/README.md):
//   nvcc -O3 -std=c++17 -arch=sm_90 -cubin -o count.cubin tools/v6_proto/count_sass.cu && cuobjdump -sass count.cubin
#define V6_NO_MAIN
#include "v6_proto.cu"

__global__ void LoadOnly(const uint16_t* x, uint32_t* out) {
  uint32_t v[kPerLane / 2];
  const uint32_t qm = LoadLane<true>(x + threadIdx.x, kPerLane, v);
  uint32_t acc = qm;
#pragma unroll
  for (int k = 0; k < kPerLane / 2; ++k) acc ^= v[k];
  out[threadIdx.x] = acc;
}
__global__ void SizeOnly(const uint32_t* x, const uint64_t* packed, uint32_t* out) {
  uint32_t v[kPerLane / 2], syms[kPerLane / 4];
#pragma unroll
  for (int k = 0; k < kPerLane / 2; ++k) v[k] = x[threadIdx.x + 256 * k];
  uint64_t wide[4] = {0, 0, 0, 0};
  uint32_t gbits = 0;
  uint32_t acc = SizeLane<true>(reinterpret_cast<const uint16_t*>(x) + threadIdx.x, v, kPerLane, out[0], packed,
                                reinterpret_cast<const uint8_t*>(packed), wide, syms, &gbits) ^ gbits;
#pragma unroll
  for (int k = 0; k < kPerLane / 4; ++k) acc ^= syms[k];
  out[threadIdx.x] = acc ^ uint32_t(wide[0] ^ wide[1] ^ wide[2] ^ wide[3]);
}
__global__ void CodeOnly(const uint16_t* x, const uint32_t* syms_in, const uint32_t* enc, uint32_t* stage) {
  uint32_t syms[kPerLane / 4];
#pragma unroll
  for (int k = 0; k < kPerLane / 4; ++k) syms[k] = syms_in[threadIdx.x + 256 * k];
  BitWriter w(stage, threadIdx.x * 300);
  CodeLane<true>(x + threadIdx.x, kPerLane, syms, enc, threadIdx.x & 128, w);
  w.Finish();
}
__global__ void DecodeOnly(const uint32_t* words, const Tables* t, uint16_t* y) {
  ZC_SHARED(DecodeSmem, s);
  for (int i = threadIdx.x; i < kMembers * (1 << kPeek); i += blockDim.x)
    s.dec[i >> kPeek][i & ((1 << kPeek) - 1)] = t->dec[i >> kPeek][i & ((1 << kPeek) - 1)];
  __syncthreads();
  const uint32_t m = threadIdx.x & 7, flip = threadIdx.x & 0x8000, qadd = threadIdx.x << 5;
  DecodeLane<true>(s, m, words + threadIdx.x * 64, threadIdx.x & 31, qadd, flip, y + threadIdx.x, kPerLane);
}
