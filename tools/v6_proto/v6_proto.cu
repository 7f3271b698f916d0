// A GPU prototype of issue 26's coding (codes fixed ahead of time), bf16 only, to measure before the
// format is designed: how fast can a one-pass compress and a one-kernel decode of that coding run?
// Not the format and not the library (tools/v6_proto/README.md says what it is and how to run it).
//
// Stream (prototype): 4,096-value blocks. Per block a u64 descriptor: body offset (u32) | q_ref << 32
// | combo << 42 | raw << 47, where q_ref = the block's largest 4 e + t over its normal values (e the
// exponent, t the top two mantissa bits) and combo = 2 member + flip (the sign read inverted). A coded
// body: 64 u16 lane bit lengths, then the 64 lanes' bits back to back (value i in lane i mod 64),
// MSB first in u32 words; the body padded to 4 bytes. Per value: the member's prefix code of
// sign << 7 | class (class 0 an exact +-0, 1 + (q_ref - q) for a distance 0..119, 121 an escape),
// then the 5 low mantissa bits unless a zero, then for an escape q (10 bits). A block whose body would
// not be smaller than its values is stored raw.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#ifdef ZIPCCL_HOST_EMULATION
#include "../../tests/cuda_host_shim.h"
#define ZC_FENCE() std::atomic_thread_fence(std::memory_order_seq_cst)
#else
#include <cuda_runtime.h>
#define ZC_SHARED(Type, name) __shared__ Type name
#define ZC_LAUNCH_KERNEL(kernel, grid, threads, stream, ...) kernel<<<grid, threads, 0, stream>>>(__VA_ARGS__)
#define ZC_FENCE() __threadfence()
#endif
#include "family8.h"

namespace {

constexpr int kBlock = 4096, kLanes = 64, kPerLane = kBlock / kLanes, kMembers = 8, kCombos = 16;
#ifndef V6_PEEK
#define V6_PEEK 10  // bits of the decoder's first lookup
#endif
#ifndef V6_COMPRESS_MIN_CTAS
#define V6_COMPRESS_MIN_CTAS 1  // __launch_bounds__'s minimum resident CTAs for CompressKernel
#endif
constexpr int kBlocksPerCta = 4, kThreads = kBlocksPerCta * kLanes;
constexpr int kPeek = V6_PEEK, kMaxLen = 12, kHeadBytes = 2 * kLanes;
constexpr int kMaxD = 119, kEsc = 121;

struct Tables {
  uint64_t packed[256];            // nibble c: the symbol's code length under combo c
  uint32_t enc[kMembers][256];     // code << 4 | length
  uint16_t dec[kMembers][1 << kPeek];  // length << 8 | symbol; 0: a code longer than kPeek
  uint16_t first[kMembers][kMaxLen + 1], count[kMembers][kMaxLen + 1], base[kMembers][kMaxLen + 1];
  uint8_t order[kMembers][256];
};

__device__ __forceinline__ uint32_t Symbol(uint32_t x, uint32_t qref, uint32_t* fixed, uint32_t* q) {
  const uint32_t e = (x >> 7) & 0xFF, mag = x & 0x7FFF;
  *q = (x >> 5) & 0x3FF;
  uint32_t cls;
  if (mag == 0) {
    cls = 0, *fixed = 0;
  } else if (e - 1 < 254 && qref - *q <= kMaxD) {
    cls = qref - *q + 1, *fixed = 5;
  } else {
    cls = kEsc, *fixed = 15;
  }
  return (x >> 15) << 7 | cls;
}

template <typename T>
__device__ __forceinline__ T Max(T a, T b) { return a > b ? a : b; }
template <typename T>
__device__ __forceinline__ T Min(T a, T b) { return a < b ? a : b; }

__device__ __forceinline__ bool Normal(uint32_t x) { return ((x >> 7) & 0xFF) - 1 < 254; }

struct CompressSmem {
  uint64_t packed[256];
  uint32_t enc[kMembers][256];
  uint32_t stage[kBlocksPerCta][kBlock / 2];  // a coded body is smaller than its values
  uint32_t sums[kBlocksPerCta][2][kCombos + 1];
  uint32_t qmax[kBlocksPerCta][2], warp_bits[kBlocksPerCta];
  uint32_t body[kBlocksPerCta], offset[kBlocksPerCta];
  int combo[kBlocksPerCta];
  unsigned ticket;
  uint64_t base;
};

// One CTA per kBlocksPerCta blocks, a thread per lane; the CTA's place in the payload by decoupled
// look-back over tickets taken in launch order (status: (bytes << 2) | 1 aggregate, | 2 inclusive).
__global__ void __launch_bounds__(kThreads, V6_COMPRESS_MIN_CTAS) CompressKernel(const uint16_t* x, int64_t n, const Tables* tables,
                                                           uint8_t* payload, uint64_t* desc,
                                                           unsigned long long* status, unsigned* tickets,
                                                           unsigned long long* total) {
  ZC_SHARED(CompressSmem, s);
  const int tid = threadIdx.x, blk = tid / kLanes, lane = tid % kLanes, warp = lane / 32;
  if (tid == 0) s.ticket = atomicAdd(tickets, 1u);
  for (int i = tid; i < 256; i += kThreads) s.packed[i] = tables->packed[i];
  for (int i = tid; i < kMembers * 256; i += kThreads) s.enc[i / 256][i % 256] = tables->enc[i / 256][i % 256];
  for (int i = tid; i < kBlocksPerCta * kBlock / 2; i += kThreads) s.stage[i / (kBlock / 2)][i % (kBlock / 2)] = 0;
  __syncthreads();
  const unsigned t = s.ticket;
  const int64_t nb = (n + kBlock - 1) / kBlock, b = int64_t(t) * kBlocksPerCta + blk;
  const int count = int(Min<int64_t>(kBlock, Max<int64_t>(0, n - b * kBlock)));
  const int mine = count > lane ? (count - lane + kLanes - 1) / kLanes : 0;  // values in this lane
  const uint16_t* xb = x + b * kBlock + lane;
  uint32_t v[kPerLane / 2];
#pragma unroll
  for (int k = 0; k < kPerLane / 2; ++k) {
    const uint32_t lo = 2 * k < mine ? xb[2 * k * kLanes] : 0, hi = 2 * k + 1 < mine ? xb[(2 * k + 1) * kLanes] : 0;
    v[k] = lo | hi << 16;
  }
  // q_ref
  uint32_t qm = 0;
#pragma unroll
  for (int k = 0; k < kPerLane / 2; ++k) {
    const uint32_t lo = v[k] & 0xFFFF, hi = v[k] >> 16;
    if (2 * k < mine && Normal(lo)) qm = Max(qm, (lo >> 5) & 0x3FF);
    if (2 * k + 1 < mine && Normal(hi)) qm = Max(qm, (hi >> 5) & 0x3FF);
  }
  for (int o = 16; o; o >>= 1) qm = Max(qm, __shfl_xor_sync(0xFFFFFFFFu, qm, o));
  if (lane % 32 == 0) s.qmax[blk][warp] = qm;
  __syncthreads();
  const uint32_t qref = Max(s.qmax[blk][0], s.qmax[blk][1]);
  // exact sizes under all 16 combos: nibble lengths summed in bytes, widened every 16 values
  uint64_t wide[4] = {0, 0, 0, 0};
  uint32_t fixed_bits = 0;
  constexpr uint64_t kNib = 0x0F0F0F0F0F0F0F0Full, kByte = 0x00FF00FF00FF00FFull;
#pragma unroll
  for (int k0 = 0; k0 < kPerLane / 2; k0 += 8) {
    uint64_t even = 0, odd = 0;
#pragma unroll
    for (int k = k0; k < k0 + 8; ++k) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (2 * k + h < mine) {
          uint32_t f, q;
          const uint64_t e = s.packed[Symbol(h ? v[k] >> 16 : v[k] & 0xFFFF, qref, &f, &q)];
          even += e & kNib, odd += (e >> 4) & kNib, fixed_bits += f;
        }
      }
    }
    wide[0] += even & kByte, wide[1] += (even >> 8) & kByte, wide[2] += odd & kByte, wide[3] += (odd >> 8) & kByte;
  }
  // combo c = 2 m + f: even bytes hold f = 0 (m = byte), odd bytes f = 1; wide[0] m = 0,2,4,6 ...
  auto lane_bits = [&](int c) -> uint32_t {  // selects, not an indexed array: wide[] stays in registers
    const int f = c & 1, m = c >> 1, w = 2 * f + (m & 1);
    const uint64_t word = w == 0 ? wide[0] : w == 1 ? wide[1] : w == 2 ? wide[2] : wide[3];
    return uint32_t(word >> (16 * (m >> 1))) & 0xFFFF;
  };
  uint64_t red[4] = {wide[0], wide[1], wide[2], wide[3]};
  uint32_t fred = fixed_bits;
  for (int o = 16; o; o >>= 1) {
#pragma unroll
    for (int w = 0; w < 4; ++w) red[w] += __shfl_xor_sync(0xFFFFFFFFu, red[w], o);
    fred += __shfl_xor_sync(0xFFFFFFFFu, fred, o);
  }
  if (lane % 32 == 0) {
    for (int c = 0; c < kCombos; ++c) {
      const int f = c & 1, m = c >> 1, w = 2 * f + (m & 1);
      s.sums[blk][warp][c] = uint32_t(red[w] >> (16 * (m >> 1))) & 0xFFFF;
    }
    s.sums[blk][warp][kCombos] = fred;
  }
  __syncthreads();
  if (lane == 0) {
    const uint32_t raw = (2 * count + 3) & ~3u;
    uint32_t best = raw;
    int combo = -1;
    for (int c = 0; c < kCombos && count > 0; ++c) {
      const uint32_t bits = s.sums[blk][0][c] + s.sums[blk][1][c] + s.sums[blk][0][kCombos] + s.sums[blk][1][kCombos];
      const uint32_t bytes = (kHeadBytes + (bits + 7) / 8 + 3) & ~3u;
      if (bytes < best) best = bytes, combo = c;
    }
    s.body[blk] = best, s.combo[blk] = int(combo);
  }
  __syncthreads();
  // The CTA's place: warp 0 looks back over 32 predecessors at a time (each lane one status word),
  // summing aggregates up to the nearest inclusive prefix.
  if (tid < 32) {
    uint64_t agg = 0;
    for (int i = 0; i < kBlocksPerCta; ++i) agg += s.body[i];
    uint64_t excl = 0;
    if (t == 0) {
      if (tid == 0) atomicAdd(&status[0], (unsigned long long)(agg << 2 | 2));
    } else {
      if (tid == 0) atomicAdd(&status[t], (unsigned long long)(agg << 2 | 1));
      for (int64_t p = int64_t(t) - 1;;) {
        const int64_t q = p - tid;
        const uint64_t st = q >= 0 ? atomicOr(&status[q], 0ull) : 2ull;  // before the first: inclusive 0
        if (__ballot_sync(0xFFFFFFFFu, (st & 3) == 0)) continue;  // a predecessor not yet sized
        const unsigned incl = __ballot_sync(0xFFFFFFFFu, (st & 3) == 2);
        const int stop = incl ? __popc((incl & (0u - incl)) - 1) : 32;  // the nearest inclusive lane
        uint64_t sum = tid <= stop ? st >> 2 : 0;
        for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
        excl += sum;
        if (incl) break;
        p -= 32;
      }
      ZC_FENCE();
      if (tid == 0) atomicAdd(&status[t], (unsigned long long)(excl << 2 | 1));
    }
    if (tid == 0) {
      uint64_t at = 0;
      for (int i = 0; i < kBlocksPerCta; ++i) s.offset[i] = uint32_t(at), at += s.body[i];
      s.base = excl;
      if (int64_t(t) == (nb + kBlocksPerCta - 1) / kBlocksPerCta - 1) *total = excl + agg;
    }
  }
  __syncthreads();
  const int combo = s.combo[blk];
  const uint64_t at = s.base + s.offset[blk];
  if (lane == 0 && count > 0)
    desc[b] = at | uint64_t(qref) << 32 | uint64_t(combo < 0 ? 0 : combo) << 42 | uint64_t(combo < 0) << 47;
  // this lane's bit offset in the body: an exclusive scan of the lane lengths (every thread takes part)
  const uint32_t mybits = combo >= 0 ? lane_bits(combo) + fixed_bits : 0;
  uint32_t inc = mybits;
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t u = __shfl_up_sync(0xFFFFFFFFu, inc, o);
    if (lane % 32 >= o) inc += u;
  }
  if (lane == 31) s.warp_bits[blk] = inc;
  __syncthreads();
  if (combo >= 0) {
    reinterpret_cast<uint16_t*>(s.stage[blk])[lane] = uint16_t(mybits);
    const uint32_t bit = 8 * kHeadBytes + inc - mybits + (warp ? s.warp_bits[blk] : 0);
    const int m = combo >> 1;
    const uint32_t flip = uint32_t(combo & 1) << 7;
    uint32_t* out = s.stage[blk];
    uint32_t word = bit / 32;
    uint64_t acc = 0;
    int held = int(bit % 32);  // bits in acc, from its top; the first `held` are the previous lane's
    bool first = true;
    auto put = [&](uint32_t code, int len) {
      acc |= uint64_t(code) << (64 - held - len);
      held += len;
      if (held >= 32) {
        const uint32_t w = uint32_t(acc >> 32);
        if (first) atomicOr(&out[word], w), first = false;
        else out[word] = w;
        ++word, acc <<= 32, held -= 32;
      }
    };
#pragma unroll
    for (int k = 0; k < kPerLane / 2; ++k) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (2 * k + h < mine) {
          const uint32_t xv = h ? v[k] >> 16 : v[k] & 0xFFFF;
          uint32_t f, q;
          const uint32_t sym = Symbol(xv, qref, &f, &q);
          const uint32_t e = s.enc[m][sym ^ flip];
          put(e >> 4, int(e & 15));
          if (f) put(xv & 31, 5);
          if (f == 15) put(q, 10);
        }
      }
    }
    if (held > 0) atomicOr(&out[word], uint32_t(acc >> 32));
  }
  __syncthreads();
  if (count > 0) {
    uint32_t* dst = reinterpret_cast<uint32_t*>(payload + at);
    if (combo >= 0) {
      for (uint32_t i = lane; i < s.body[blk] / 4; i += kLanes) dst[i] = s.stage[blk][i];
    } else {
      uint16_t* d16 = reinterpret_cast<uint16_t*>(dst);
      for (int i = lane; i < count; i += kLanes) d16[i] = x[b * kBlock + i];
    }
  }
}

struct DecodeSmem {
  uint16_t dec[kMembers][1 << kPeek];
  uint16_t first[kMembers][kMaxLen + 1], count[kMembers][kMaxLen + 1], base[kMembers][kMaxLen + 1];
  uint8_t order[kMembers][256];
  uint32_t warp_bits[kBlocksPerCta];
};

// A thread per lane; persistent CTAs walk the groups of kBlocksPerCta blocks.
__global__ void __launch_bounds__(kThreads) DecodeKernel(const uint8_t* payload, const uint64_t* desc, int64_t n,
                                                         const Tables* tables, uint16_t* y) {
  ZC_SHARED(DecodeSmem, s);
  const int tid = threadIdx.x, blk = tid / kLanes, lane = tid % kLanes, warp = lane / 32;
  {
    const uint32_t* src = reinterpret_cast<const uint32_t*>(tables->dec);
    uint32_t* dst = reinterpret_cast<uint32_t*>(s.dec);
    for (int i = tid; i < kMembers * (1 << kPeek) / 2; i += kThreads) dst[i] = src[i];
    for (int i = tid; i < kMembers * (kMaxLen + 1); i += kThreads) {
      const int m = i / (kMaxLen + 1), l = i % (kMaxLen + 1);
      s.first[m][l] = tables->first[m][l], s.count[m][l] = tables->count[m][l], s.base[m][l] = tables->base[m][l];
    }
    for (int i = tid; i < kMembers * 256; i += kThreads) s.order[i / 256][i % 256] = tables->order[i / 256][i % 256];
  }
  __syncthreads();
  const int64_t nb = (n + kBlock - 1) / kBlock, groups = (nb + kBlocksPerCta - 1) / kBlocksPerCta;
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    const int64_t b = g * kBlocksPerCta + blk;
    const int count = int(Min<int64_t>(kBlock, Max<int64_t>(0, n - b * kBlock)));
    const int mine = count > lane ? (count - lane + kLanes - 1) / kLanes : 0;
    const uint64_t d = count > 0 ? desc[b] : 0;
    const uint8_t* body = payload + uint32_t(d);
    uint16_t* yb = y + b * kBlock + lane;
    const bool raw = count > 0 && (d >> 47 & 1);
    const uint16_t* head = reinterpret_cast<const uint16_t*>(body);
    // lane start: scan the lane lengths (both warps of the block take part, raw or not)
    uint32_t mybits = count > 0 && !raw ? head[lane] : 0, inc = mybits;
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t u = __shfl_up_sync(0xFFFFFFFFu, inc, o);
      if (lane % 32 >= o) inc += u;
    }
    if (lane == 31) s.warp_bits[blk] = inc;
    __syncthreads();
    const uint32_t start = 8 * kHeadBytes + inc - mybits + (warp ? s.warp_bits[blk] : 0);
    __syncthreads();
    if (raw) {
      const uint16_t* r = head + lane;
      for (int j = 0; j < mine; ++j) yb[j * kLanes] = r[j * kLanes];
    } else if (mine > 0) {
      const uint32_t qref = uint32_t(d >> 32) & 0x3FF, combo = uint32_t(d >> 42) & 15, m = combo >> 1;
      const uint32_t flip = (combo & 1) << 7;
      const uint32_t* w = reinterpret_cast<const uint32_t*>(body) + start / 32;
      uint64_t buf = (uint64_t(w[0]) << 32 | w[1]) << (start % 32);
      int held = 64 - int(start % 32);
      uint32_t next = w[2];
      w += 3;
      for (int j = 0; j < mine; ++j) {
        if (held < 32) buf |= uint64_t(next) << (32 - held), held += 32, next = *w++;
        uint32_t e = s.dec[m][buf >> (64 - kPeek)], len = e >> 8, sym = e & 0xFF;
        if (len == 0) {  // a code longer than kPeek bits
          for (len = kPeek + 1; len <= kMaxLen; ++len) {
            const uint32_t c = uint32_t(buf >> (64 - len)) - s.first[m][len];
            if (c < s.count[m][len]) {
              sym = s.order[m][s.base[m][len] + c];
              break;
            }
          }
        }
        buf <<= len, held -= int(len);
        const uint32_t cls = sym & 127, sign = ((sym ^ flip) >> 7) << 15;
        uint32_t out = sign;
        if (cls != 0) {
          uint32_t q = qref + 1 - cls;
          if (cls == kEsc) q = uint32_t(buf >> 54), buf <<= 10, held -= 10;
          out |= q << 5 | uint32_t(buf >> 59);
          buf <<= 5, held -= 5;
        }
        yb[j * kLanes] = uint16_t(out);
      }
    }
  }
}

Tables BuildTables() {
  Tables t{};
  for (int sym = 0; sym < 256; ++sym)
    for (int c = 0; c < kCombos; ++c) t.packed[sym] |= uint64_t(kFamily[c >> 1][(c & 1) ? sym ^ 128 : sym]) << (4 * c);
  for (int m = 0; m < kMembers; ++m) {
    uint32_t code = 0;
    int idx = 0;
    for (int len = 1; len <= kMaxLen; ++len) {
      t.first[m][len] = uint16_t(code), t.base[m][len] = uint16_t(idx);
      for (int sym = 0; sym < 256; ++sym) {
        if (kFamily[m][sym] != len) continue;
        t.order[m][idx++] = uint8_t(sym), t.enc[m][sym] = code << 4 | len;
        if (len <= kPeek)
          for (uint32_t r = 0; r < 1u << (kPeek - len); ++r) t.dec[m][code << (kPeek - len) | r] = uint16_t(len << 8 | sym);
        ++code;
      }
      t.count[m][len] = uint16_t(idx - t.base[m][len]);
      code <<= 1;
    }
  }
  return t;
}

#define CHECK(call)                                                                        \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

struct Run {
  double ratio, compress_ms, decompress_ms, copy_ms;
  bool exact;
};

Run Measure(const std::vector<uint16_t>& host, int reps, int grid_decode) {
  const int64_t n = int64_t(host.size()), nb = (n + kBlock - 1) / kBlock;
  const int64_t ctas = (nb + kBlocksPerCta - 1) / kBlocksPerCta;
  uint16_t *x, *y, *z;
  uint8_t* payload;
  uint64_t* desc;
  unsigned long long *status, *total;
  unsigned* tickets;
  Tables* tables;
  CHECK(cudaMalloc((void**)&x, 2 * n + 64));
  CHECK(cudaMalloc((void**)&y, 2 * n + 64));
  CHECK(cudaMalloc((void**)&z, 2 * n + 64));
  CHECK(cudaMalloc((void**)&payload, 2 * n + 64));
  CHECK(cudaMalloc((void**)&desc, 8 * nb + 8));
  CHECK(cudaMalloc((void**)&status, 8 * ctas + 8));
  CHECK(cudaMalloc((void**)&total, 8));
  CHECK(cudaMalloc((void**)&tickets, 4));
  CHECK(cudaMalloc((void**)&tables, sizeof(Tables)));
  const Tables t = BuildTables();
  CHECK(cudaMemcpyAsync(tables, &t, sizeof(Tables), cudaMemcpyHostToDevice, nullptr));
  CHECK(cudaMemcpyAsync(x, host.data(), 2 * n, cudaMemcpyHostToDevice, nullptr));
  auto compress = [&] {
    CHECK(cudaMemsetAsync(status, 0, 8 * ctas + 8, nullptr));
    CHECK(cudaMemsetAsync(tickets, 0, 4, nullptr));
    ZC_LAUNCH_KERNEL(CompressKernel, unsigned(ctas), kThreads, nullptr, x, n, tables, payload, desc, status, tickets,
                     total);
  };
  auto decompress = [&] { ZC_LAUNCH_KERNEL(DecodeKernel, unsigned(grid_decode), kThreads, nullptr, payload, desc, n, tables, y); };
  auto copy = [&] { CHECK(cudaMemcpyAsync(z, x, 2 * n, cudaMemcpyDeviceToDevice, nullptr)); };
  CHECK(cudaMemsetAsync(y, 0xA5, 2 * n, nullptr));
  compress();
  decompress();
  CHECK(cudaGetLastError());
  std::vector<uint16_t> back(n);
  unsigned long long bytes = 0;
  CHECK(cudaMemcpyAsync(back.data(), y, 2 * n, cudaMemcpyDeviceToHost, nullptr));
  CHECK(cudaMemcpyAsync(&bytes, total, 8, cudaMemcpyDeviceToHost, nullptr));
  CHECK(cudaStreamSynchronize(nullptr));
  Run r{};
  r.exact = std::memcmp(back.data(), host.data(), 2 * n) == 0;
  r.ratio = double(2 * n) / double(16 + 8 * nb + bytes);
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  auto median_ms = [&](auto fn) {
    std::vector<float> ms;
    for (int i = 0; i < reps; ++i) {
      CHECK(cudaEventRecord(a, nullptr));
      fn();
      CHECK(cudaEventRecord(b, nullptr));
      CHECK(cudaEventSynchronize(b));
      float v;
      CHECK(cudaEventElapsedTime(&v, a, b));
      ms.push_back(v);
    }
    std::sort(ms.begin(), ms.end());
    return double(ms[ms.size() / 2]);
  };
  r.compress_ms = median_ms(compress);
  r.decompress_ms = median_ms(decompress);
  r.copy_ms = median_ms(copy);
  CHECK(cudaGetLastError());
  // the timed calls must have written the same stream and values
  std::vector<uint16_t> again(n);
  CHECK(cudaMemcpyAsync(again.data(), y, 2 * n, cudaMemcpyDeviceToHost, nullptr));
  CHECK(cudaStreamSynchronize(nullptr));
  r.exact = r.exact && std::memcmp(again.data(), host.data(), 2 * n) == 0;
  for (void* p : {(void*)x, (void*)y, (void*)z, (void*)payload, (void*)desc, (void*)status, (void*)total,
                  (void*)tickets, (void*)tables})
    CHECK(cudaFree(p));
  return r;
}

uint16_t ToBf16(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

std::vector<uint16_t> Data(const char* kind, int64_t n, const char* file) {
  std::vector<uint16_t> v(n);
  std::mt19937_64 rng(26);
  if (!std::strcmp(kind, "gaussian") || !std::strcmp(kind, "relu")) {
    std::normal_distribution<float> g(0.f, 0.02f);
    for (auto& e : v) {
      const float f = g(rng);
      e = ToBf16(!std::strcmp(kind, "relu") && f < 0 ? 0.f : f);
    }
  } else if (!std::strcmp(kind, "bits")) {  // every bit pattern: NaN payloads, Inf, subnormals, -0
    for (auto& e : v) e = uint16_t(rng());
  } else if (!std::strcmp(kind, "file")) {  // raw bf16 values, repeated to n
    FILE* f = std::fopen(file, "rb");
    if (!f) std::exit((std::fprintf(stderr, "cannot read %s\n", file), 2));
    std::vector<uint16_t> d;
    uint16_t buf[4096];
    size_t got;
    while ((got = std::fread(buf, 2, 4096, f)) > 0) d.insert(d.end(), buf, buf + got);
    std::fclose(f);
    for (int64_t i = 0; i < n; ++i) v[i] = d[i % d.size()];
  } else {
    std::exit((std::fprintf(stderr, "unknown data %s\n", kind), 2));
  }
  return v;
}

}  // namespace

// v6_proto KIND N [REPS] [FILE]: KIND gaussian | relu | bits | file
int main(int argc, char** argv) {
  if (argc < 3) return std::fprintf(stderr, "usage: %s gaussian|relu|bits|file N [REPS] [FILE]\n", argv[0]), 2;
  const int64_t n = std::atoll(argv[2]);
  const int reps = argc > 3 ? std::atoi(argv[3]) : 20;
  int sms = 132;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const auto host = Data(argv[1], n, argc > 4 ? argv[4] : nullptr);
  const Run r = Measure(host, reps, sms * 4);
  const double gb = 2.0 * n / 1e9;
  std::printf("%s n=%lld ratio %.4f compress %.3f ms %.1f GB/s decompress %.3f ms %.1f GB/s copy %.1f GB/s %s\n",
              argv[1], (long long)n, r.ratio, r.compress_ms, gb / r.compress_ms * 1e3, r.decompress_ms,
              gb / r.decompress_ms * 1e3, gb / r.copy_ms * 1e3, r.exact ? "bit-exact" : "MISMATCH");
  return r.exact ? 0 : 1;
}
