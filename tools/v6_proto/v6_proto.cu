// A GPU prototype of issue 26's coding (codes fixed ahead of time), bf16 only, to measure before the
// format is designed: how fast can a one-pass compress and a one-kernel decode of that coding run?
// Not the format and not the library (tools/v6_proto/README.md says what it is and how to run it).
//
// Stream (prototype): 4,096-value blocks. Per block a u64 descriptor: body offset (u32) | q_ref << 32
// | combo << 42 (5 bits) | raw << 47, where q_ref = the block's largest 4 e + t over its normal values (e the
// exponent, t the top two mantissa bits) and combo = 2 member + flip (the sign read inverted). A coded
// body: 64 u16 lane bit lengths, then the 64 lanes' bits back to back (value i in lane i mod 64),
// MSB first in u32 words; the body padded to 4 bytes. Per value: the member's prefix code of
// sign << 7 | class (class 0 an exact +-0, 1 + (q_ref - q) for a distance 0..119, 121 an escape),
// then for an escape q (10 bits), then the 5 low mantissa bits unless a zero. A block whose body would
// not be smaller than its values is stored raw. With V6_GROUP_TABLES (group_code.cuh), each group of
// 16 blocks also carries its own code (128 bytes of 4-bit lengths, after the descriptors), combo 16.
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
#define __noinline__ __attribute__((noinline))
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
#define V6_COMPRESS_MIN_CTAS 4  // __launch_bounds__'s minimum resident CTAs for CompressKernel
#endif
constexpr int kBlocksPerCta = 4, kThreads = kBlocksPerCta * kLanes;
constexpr int kPeek = V6_PEEK, kMaxLen = 12, kHeadBytes = 2 * kLanes;
constexpr int kMaxD = 119, kEsc = 121;

struct Tables {
  uint64_t packed[256];            // nibble c: the symbol's code length under combo c
  uint32_t enc[kMembers][256];     // the bits a value of the symbol takes << 27 | its code, shifted to
                                   // leave room for an escape's q and the low mantissa bits
  uint32_t dec[kMembers][1 << kPeek];  // DecodeEntry of the code that starts with these bits; 0: longer
  uint16_t first[kMembers][kMaxLen + 1], count[kMembers][kMaxLen + 1], base[kMembers][kMaxLen + 1];
  uint8_t order[kMembers][256];
};

// A value's symbol (sign << 7 | class) against q_ref, and the bits stored beside its code. q in
// [4, 1019] is exactly a normal exponent (1..254). Selects, no branches.
__device__ __forceinline__ uint32_t Symbol(uint32_t x, uint32_t qref, uint32_t* fixed) {
  const uint32_t q = (x >> 5) & 0x3FF, d = qref - q;
  const bool zero = (x & 0x7FFF) == 0, near = q - 4 < 1016 && d <= kMaxD;
  *fixed = zero ? 0 : near ? 5 : 15;
  return (x >> 15) << 7 | (zero ? 0 : near ? d + 1 : kEsc);
}

template <typename T>
__device__ __forceinline__ T Max(T a, T b) { return a > b ? a : b; }
template <typename T>
__device__ __forceinline__ T Min(T a, T b) { return a < b ? a : b; }

// A decode table entry: what a symbol's code decodes to, so that the common path is a lookup and a
// few integer operations. Bits 0-15: the output bits the symbol fixes, to which q_ref << 5 and the 5
// low mantissa bits are added (modulo 2^16): sign << 15 minus d << 5 for a distance d; sign << 15
// for a zero or an escape. Bit 16: a zero (no mantissa bits follow). Bit 17: the slow path (an
// escape, or with nothing else set a code longer than kPeek bits). Bits 22-26: the code's length;
// 27-31: the bits the value takes in all (code, an escape's 10, the 5 low mantissa bits).
constexpr uint32_t kZeroBit = 1u << 16, kSlowBit = 1u << 17;
__host__ __device__ inline uint32_t DecodeEntry(uint32_t sym, uint32_t code_len) {
  const uint32_t cls = sym & 127, sign = (sym >> 7) << 15;
  const uint32_t bits = cls == 0 || cls == kEsc ? sign : (sign - ((cls - 1) << 5)) & 0xFFFF;
  const uint32_t total = code_len + (cls == 0 ? 0 : cls == kEsc ? 15 : 5);
  return bits | (cls == 0 ? kZeroBit : 0) | (cls == kEsc ? kSlowBit : 0) | code_len << 22 | total << 27;
}

// The top 32 bits of hi:lo shifted left by s mod 32.
__device__ __forceinline__ uint32_t Funnel(uint32_t hi, uint32_t lo, uint32_t s) {
#ifdef ZIPCCL_HOST_EMULATION
  s &= 31;
  return s ? hi << s | lo >> (32 - s) : hi;
#else
  return __funnelshift_l(lo, hi, s);
#endif
}

#ifndef V6_GROUP_TABLES
#define V6_GROUP_TABLES 1  // 1: the second block kind (group_code.cuh); 0: the family alone
#endif
#include "group_code.cuh"

// The per-value passes of a lane, compiled twice: kFull (all 64 values present, no tests) and not.
#ifndef V6_COMPRESS_REREAD
#define V6_COMPRESS_REREAD 1  // 1: each pass reads the lane's values again (L1 hits); 0: held in registers
#endif
template <bool kFull>
__device__ __forceinline__ uint32_t LoadLane(const uint16_t* xb, int mine, uint32_t (&v)[kPerLane / 2]) {
  uint32_t qm = 0;  // the largest q of the lane's normal values
#pragma unroll
  for (int k = 0; k < kPerLane / 2; ++k) {
    const uint32_t lo = kFull || 2 * k < mine ? xb[2 * k * kLanes] : 0;
    const uint32_t hi = kFull || 2 * k + 1 < mine ? xb[(2 * k + 1) * kLanes] : 0;
    if (!V6_COMPRESS_REREAD) v[k] = lo | hi << 16;
    const uint32_t ql = (lo >> 5) & 0x3FF, qh = (hi >> 5) & 0x3FF;
    qm = Max(qm, ql - 4 < 1016 ? ql : 0u);
    qm = Max(qm, qh - 4 < 1016 ? qh : 0u);
  }
  return qm;
}

// Exact sizes under all 16 combos: each symbol's 16 nibble lengths summed in bytes, widened to u16
// every 16 values. Keeps the symbols, a byte each, for the coding pass.
template <bool kFull>
__device__ __forceinline__ uint32_t SizeLane(const uint16_t* xb, const uint32_t (&v)[kPerLane / 2], int mine,
                                             uint32_t qref,
                                             const uint64_t* packed, const uint8_t* glen, uint64_t (&wide)[4],
                                             uint32_t (&syms)[kPerLane / 4], uint32_t* gbits) {
  constexpr uint64_t kNib = 0x0F0F0F0F0F0F0F0Full, kByte = 0x00FF00FF00FF00FFull;
  uint32_t fixed_bits = 0;
#pragma unroll
  for (int k0 = 0; k0 < kPerLane / 2; k0 += 8) {
    uint64_t even = 0, odd = 0;
#pragma unroll
    for (int k = k0; k < k0 + 8; ++k) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int j = 2 * k + h;
        uint32_t f;
        const uint32_t x = V6_COMPRESS_REREAD ? (kFull || j < mine ? uint32_t(xb[j * kLanes]) : 0u)
                                              : h ? v[k] >> 16 : v[k] & 0xFFFF;
        const uint32_t sym = Symbol(x, qref, &f);
        syms[j / 4] = j % 4 ? syms[j / 4] | sym << (8 * (j % 4)) : sym;
        const uint64_t e = kFull || j < mine ? packed[sym] : 0;
        even += e & kNib, odd += (e >> 4) & kNib, fixed_bits += kFull || j < mine ? f : 0;
        if (V6_GROUP_TABLES) *gbits += kFull || j < mine ? glen[sym] : 0;
      }
    }
    wide[0] += even & kByte, wide[1] += (even >> 8) & kByte, wide[2] += odd & kByte, wide[3] += (odd >> 8) & kByte;
  }
  return fixed_bits;
}

// A lane's bits into the staged body from bit `bit`, MSB first in u32 words: plain stores but for the
// two words it may share with the lanes beside it (atomicOr; the stage starts zeroed).
struct BitWriter {
  uint32_t* out;
  uint32_t word;
  uint64_t acc = 0;
  int held;  // bits in acc, from its top; the first `held` at the start are the previous lane's
  bool first = true;
  __device__ BitWriter(uint32_t* o, uint32_t bit) : out(o), word(bit / 32), held(int(bit % 32)) {}
  __device__ __forceinline__ void Put(uint32_t code, int len) {
    acc |= uint64_t(code) << (64 - held - len);
    held += len;
    if (held >= 32) {
      const uint32_t w = uint32_t(acc >> 32);
      if (first) atomicOr(&out[word], w), first = false;
      else out[word] = w;
      ++word, acc <<= 32, held -= 32;
    }
  }
  __device__ __forceinline__ void Finish() {
    if (held > 0) atomicOr(&out[word], uint32_t(acc >> 32));
  }
};

// One put a value: its code, an escape's q, the low mantissa bits, joined in a register. The values
// are read again (L1 hits): holding all 64 beside the symbols would cost occupancy.
template <bool kFull>
__device__ __forceinline__ void CodeLane(const uint16_t* xb, int mine, const uint32_t (&syms)[kPerLane / 4],
                                         const uint32_t* enc, uint32_t flip, BitWriter& w) {
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    if (kFull || j < mine) {
      const uint32_t xv = xb[j * kLanes], sym = (syms[j / 4] >> (8 * (j % 4))) & 0xFF;
      const uint32_t e = enc[sym ^ flip];
      const uint32_t esc = (sym & 127) == kEsc ? ((xv >> 5) & 0x3FF) << 5 : 0;
      w.Put((e & 0x7FFFFFF) | esc | (xv & 31), int(e >> 27));
    }
  }
}

constexpr int kChoices = kCombos + V6_GROUP_TABLES;  // combo 16: the group's code

struct CompressSmem {
  uint64_t packed[256];
  uint32_t enc[kMembers + 1][256];  // [8]: the group's code
  uint8_t glen[256];
  uint16_t gfirst[kMaxLen + 1], gcount[kMaxLen + 1], gbase[kMaxLen + 1];
  uint8_t gorder[256];
  CanonicalScratch scratch;
  uint32_t stage[kBlocksPerCta][kBlock / 2];  // a coded body is smaller than its values
  uint32_t sums[kBlocksPerCta][2][kChoices + 1];
  uint32_t qmax[kBlocksPerCta][2], warp_bits[kBlocksPerCta];
  uint32_t body[kBlocksPerCta], offset[kBlocksPerCta];
  int combo[kBlocksPerCta];
  unsigned ticket;
  uint64_t base;
};

// One CTA per kBlocksPerCta blocks, a thread per lane; the CTA's place in the payload by decoupled
// look-back over tickets taken in launch order (status: (bytes << 2) | 1 aggregate, | 2 inclusive).
__global__ void __launch_bounds__(kThreads, V6_COMPRESS_MIN_CTAS)
    CompressKernel(const uint16_t* x, int64_t n, const Tables* tables,
                                                           uint8_t* payload, uint64_t* desc,
                                                           unsigned long long* status, unsigned* tickets,
                                                           unsigned long long* total, const uint32_t* qrefs,
                                                           const uint8_t* gtables) {
  ZC_SHARED(CompressSmem, s);
  const int tid = threadIdx.x, blk = tid / kLanes, lane = tid % kLanes, warp = lane / 32;
  if (tid == 0) s.ticket = atomicAdd(tickets, 1u);
  for (int i = tid; i < 256; i += kThreads) s.packed[i] = tables->packed[i];
  for (int i = tid; i < kMembers * 256; i += kThreads) s.enc[i / 256][i % 256] = tables->enc[i / 256][i % 256];
  for (int i = tid; i < kBlocksPerCta * kBlock / 2; i += kThreads) s.stage[i / (kBlock / 2)][i % (kBlock / 2)] = 0;
  __syncthreads();
  const unsigned t = s.ticket;
  if (V6_GROUP_TABLES) {  // member 8: the CTA's group's code (its 4 blocks are in one group)
    const uint32_t packed_len = gtables[(int64_t(t) * kBlocksPerCta / kGroupBlocks) * kGroupTableBytes + tid / 2];
    const uint32_t len = tid & 1 ? packed_len >> 4 : packed_len & 15;
    const uint32_t code = CanonicalCode(len, s.scratch, s.gfirst, s.gcount, s.gbase, s.gorder);
    const uint32_t cls = tid & 127, extra = cls == 0 ? 0 : cls == kEsc ? 15 : 5;
    s.enc[kGroupMember][tid] = len ? (len + extra) << 27 | code << extra : 0;
    s.glen[tid] = uint8_t(len);
    __syncthreads();
  }
  const int64_t nb = (n + kBlock - 1) / kBlock, b = int64_t(t) * kBlocksPerCta + blk;
  const int count = int(Min<int64_t>(kBlock, Max<int64_t>(0, n - b * kBlock)));
  const int mine = count > lane ? (count - lane + kLanes - 1) / kLanes : 0;  // values in this lane
  const uint16_t* xb = x + b * kBlock + lane;
  const bool full = mine == kPerLane;
  uint32_t v[kPerLane / 2], qref;
  if (V6_GROUP_TABLES) {  // GroupKernel has the q_refs
    if (!V6_COMPRESS_REREAD) full ? LoadLane<true>(xb, mine, v) : LoadLane<false>(xb, mine, v);
    qref = count > 0 ? qrefs[b] : 0;
  } else {
    uint32_t qm = full ? LoadLane<true>(xb, mine, v) : LoadLane<false>(xb, mine, v);
    for (int o = 16; o; o >>= 1) qm = Max(qm, __shfl_xor_sync(0xFFFFFFFFu, qm, o));
    if (lane % 32 == 0) s.qmax[blk][warp] = qm;
    __syncthreads();
    qref = Max(s.qmax[blk][0], s.qmax[blk][1]);
  }
  uint64_t wide[4] = {0, 0, 0, 0};
  uint32_t syms[kPerLane / 4];
  uint32_t gbits = 0;  // this lane's code bits under the group's code
  const uint32_t fixed_bits = full ? SizeLane<true>(xb, v, mine, qref, s.packed, s.glen, wide, syms, &gbits)
                                   : SizeLane<false>(xb, v, mine, qref, s.packed, s.glen, wide, syms, &gbits);
  // combo c = 2 m + f: even bytes hold f = 0 (m = byte), odd bytes f = 1; wide[0] m = 0,2,4,6 ...
  auto lane_bits = [&](int c) -> uint32_t {  // selects, not an indexed array: wide[] stays in registers
    if (c == kCombos) return gbits;
    const int f = c & 1, m = c >> 1, w = 2 * f + (m & 1);
    const uint64_t word = w == 0 ? wide[0] : w == 1 ? wide[1] : w == 2 ? wide[2] : wide[3];
    return uint32_t(word >> (16 * (m >> 1))) & 0xFFFF;
  };
  uint64_t red[4] = {wide[0], wide[1], wide[2], wide[3]};
  uint32_t fred = fixed_bits, gred = gbits;
  for (int o = 16; o; o >>= 1) {
#pragma unroll
    for (int w = 0; w < 4; ++w) red[w] += __shfl_xor_sync(0xFFFFFFFFu, red[w], o);
    fred += __shfl_xor_sync(0xFFFFFFFFu, fred, o);
    if (V6_GROUP_TABLES) gred += __shfl_xor_sync(0xFFFFFFFFu, gred, o);
  }
  if (lane % 32 == 0) {
    for (int c = 0; c < kCombos; ++c) {
      const int f = c & 1, m = c >> 1, w = 2 * f + (m & 1);
      s.sums[blk][warp][c] = uint32_t(red[w] >> (16 * (m >> 1))) & 0xFFFF;
    }
    if (V6_GROUP_TABLES) s.sums[blk][warp][kCombos] = gred;
    s.sums[blk][warp][kChoices] = fred;
  }
  __syncthreads();
  if (lane == 0) {
    const uint32_t raw = (2 * count + 3) & ~3u;
    uint32_t best = raw;
    int combo = -1;
    for (int c = 0; c < kChoices && count > 0; ++c) {
      const uint32_t bits = s.sums[blk][0][c] + s.sums[blk][1][c] + s.sums[blk][0][kChoices] + s.sums[blk][1][kChoices];
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
    const uint32_t* enc = s.enc[combo >> 1];
    const uint32_t flip = uint32_t(combo & 1) << 7;
    BitWriter w(s.stage[blk], bit);
    if (full) CodeLane<true>(xb, mine, syms, enc, flip, w);
    else CodeLane<false>(xb, mine, syms, enc, flip, w);
    w.Finish();
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
  uint32_t dec[kMembers + V6_GROUP_TABLES][1 << kPeek];  // [8]: the group's code, built per group
  uint16_t first[kMembers + 1][kMaxLen + 1], count[kMembers + 1][kMaxLen + 1], base[kMembers + 1][kMaxLen + 1];
  uint8_t order[kMembers + 1][256];
  uint32_t warp_bits[kBlocksPerCta];
  CanonicalScratch scratch;
};

// The rare values: a code longer than kPeek bits (canonical decode), an escape (q, then the low bits).
// Returns the value | the bits it took << 16.
__device__ __noinline__ uint32_t DecodeSlow(const DecodeSmem& s, uint32_t m, uint32_t peek, uint32_t e,
                                            uint32_t qadd, uint32_t flip) {
  if (e == kSlowBit) {
    uint32_t len = kPeek + 1, sym = 0;
    for (; len <= kMaxLen; ++len) {
      const uint32_t c = (peek >> (32 - len)) - s.first[m][len];
      if (c < s.count[m][len]) {
        sym = s.order[m][s.base[m][len] + c];
        break;
      }
    }
    e = DecodeEntry(sym, len);
  }
  const uint32_t taken = (e >> 27) << 16, rest = Funnel(peek, 0, e >> 22);
  if (e & kZeroBit) return ((e ^ flip) & 0xFFFF) | taken;
  if (!(e & kSlowBit)) return ((e + qadd + (rest >> 27)) & 0xFFFF) | taken;
  return ((e ^ flip) & 0x8000) | (rest >> 22) << 5 | (rest << 10) >> 27 | taken;  // an escape
}

// One value from the 32 bits at the reader's position: the value (its low 16 bits) and the bits taken.
__device__ __forceinline__ uint32_t DecodeValue(const DecodeSmem& s, uint32_t m, uint32_t peek, uint32_t qadd,
                                                uint32_t flip, uint32_t* taken) {
  const uint32_t e = s.dec[m][peek >> (32 - kPeek)];
  if (e & kSlowBit) {
    const uint32_t v = DecodeSlow(s, m, peek, e, qadd, flip);
    *taken = v >> 16;
    return v;
  }
  *taken = e >> 27;
  const uint32_t low = Funnel(peek, 0, e >> 22) >> 27;
  return e & kZeroBit ? e ^ flip : e + qadd + low;  // the store keeps the low 16 bits
}

#ifndef V6_DECODE_WINDOW
#define V6_DECODE_WINDOW 1  // 1: three words held in registers, a load per word consumed; 0: two loads per value
#endif

// A lane's `mine` values from bit `start` of the body's words into yb[j * kLanes] (kFull: all 64).
template <bool kFull>
__device__ __forceinline__ void DecodeLane(const DecodeSmem& s, uint32_t m, const uint32_t* words, uint32_t start,
                                           uint32_t qadd, uint32_t flip, uint16_t* yb, int mine) {
  words += start / 32;
#if V6_DECODE_WINDOW
  uint32_t cur = words[0], next = words[1], after = words[2], pos = start % 32;
  words += 3;
  auto one = [&](int j) {
    uint32_t taken;
    yb[j * kLanes] = uint16_t(DecodeValue(s, m, Funnel(cur, next, pos), qadd, flip, &taken));
    pos += taken;
    if (pos >= 32) pos -= 32, cur = next, next = after, after = *words++;
  };
#else
  uint32_t p = start % 32;
  auto one = [&](int j) {
    uint32_t taken;
    const uint32_t* at = words + (p >> 5);
    yb[j * kLanes] = uint16_t(DecodeValue(s, m, Funnel(at[0], at[1], p), qadd, flip, &taken));
    p += taken;
  };
#endif
  if (kFull) {
#pragma unroll 16
    for (int j = 0; j < kPerLane; ++j) one(j);
  } else {
    for (int j = 0; j < mine; ++j) one(j);
  }
}

// A thread per lane; persistent CTAs, each a run of consecutive groups of kBlocksPerCta blocks.
__global__ void __launch_bounds__(kThreads) DecodeKernel(const uint8_t* payload, const uint64_t* desc, int64_t n,
                                                         const Tables* tables, const uint8_t* gtables, uint16_t* y) {
  ZC_SHARED(DecodeSmem, s);
  const int tid = threadIdx.x, blk = tid / kLanes, lane = tid % kLanes, warp = lane / 32;
  for (int i = tid; i < kMembers * (1 << kPeek); i += kThreads)
    s.dec[i >> kPeek][i & ((1 << kPeek) - 1)] = tables->dec[i >> kPeek][i & ((1 << kPeek) - 1)];
  for (int i = tid; i < kMembers * (kMaxLen + 1); i += kThreads) {
    const int m = i / (kMaxLen + 1), l = i % (kMaxLen + 1);
    s.first[m][l] = tables->first[m][l], s.count[m][l] = tables->count[m][l], s.base[m][l] = tables->base[m][l];
  }
  for (int i = tid; i < kMembers * 256; i += kThreads) s.order[i / 256][i % 256] = tables->order[i / 256][i % 256];
  __syncthreads();
  const int64_t nb = (n + kBlock - 1) / kBlock, groups = (nb + kBlocksPerCta - 1) / kBlocksPerCta;
  int64_t built = -1;  // the group whose code member 8 holds
  // each CTA a run of consecutive groups of blocks, so that a group table is built once per CTA that
  // decodes its blocks (kGroupBlocks / kBlocksPerCta of them in a row)
  const int64_t per = (groups + gridDim.x - 1) / gridDim.x, end = Min<int64_t>(groups, (blockIdx.x + 1) * per);
  for (int64_t g = blockIdx.x * per; g < end; ++g) {
    const int64_t table_group = g * kBlocksPerCta / kGroupBlocks;
    if (V6_GROUP_TABLES && table_group != built) {  // uniform in the CTA
      const uint32_t packed_len = gtables[table_group * kGroupTableBytes + tid / 2];
      const uint32_t m = kGroupMember;
      CanonicalCode(tid & 1 ? packed_len >> 4 : packed_len & 15, s.scratch, s.first[m], s.count[m], s.base[m],
                    s.order[m]);
      FillDecodeTable(s.dec[m], s.first[m], s.count[m], s.base[m], s.order[m]);
      __syncthreads();
      built = table_group;
    }
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
      const uint32_t combo = uint32_t(d >> 42) & 31, m = combo >> 1, flip = (combo & 1) << 15;
      const uint32_t qadd = ((uint32_t(d >> 32) & 0x3FF) << 5) + flip;
      const uint32_t* words = reinterpret_cast<const uint32_t*>(body);
      if (mine == kPerLane) DecodeLane<true>(s, m, words, start, qadd, flip, yb, mine);
      else DecodeLane<false>(s, m, words, start, qadd, flip, yb, mine);
    }
  }
}

Tables BuildTables() {
  Tables t{};
  for (int sym = 0; sym < 256; ++sym)
    for (int c = 0; c < kCombos; ++c) t.packed[sym] |= uint64_t(kFamily[c >> 1][(c & 1) ? sym ^ 128 : sym]) << (4 * c);
  for (int m = 0; m < kMembers; ++m) {
    for (auto& e : t.dec[m]) e = kSlowBit;  // prefixes of longer codes
    uint32_t code = 0;
    int idx = 0;
    for (int len = 1; len <= kMaxLen; ++len) {
      t.first[m][len] = uint16_t(code), t.base[m][len] = uint16_t(idx);
      for (int sym = 0; sym < 256; ++sym) {
        if (kFamily[m][sym] != len) continue;
        const uint32_t cls = sym & 127, extra = cls == 0 ? 0 : cls == kEsc ? 15 : 5;
        t.order[m][idx++] = uint8_t(sym), t.enc[m][sym] = (len + extra) << 27 | code << extra;
        if (len <= kPeek)
          for (uint32_t r = 0; r < 1u << (kPeek - len); ++r)
            t.dec[m][code << (kPeek - len) | r] = DecodeEntry(sym, len);
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
  uint32_t* qrefs;
  uint8_t* gtables;
  const int64_t ngroups = (nb + kGroupBlocks - 1) / kGroupBlocks;
  CHECK(cudaMalloc((void**)&x, 2 * n + 64));
  CHECK(cudaMalloc((void**)&y, 2 * n + 64));
  CHECK(cudaMalloc((void**)&z, 2 * n + 64));
  CHECK(cudaMalloc((void**)&payload, 2 * n + 64));
  CHECK(cudaMalloc((void**)&desc, 8 * nb + 8));
  CHECK(cudaMalloc((void**)&status, 8 * ctas + 8));
  CHECK(cudaMalloc((void**)&total, 8));
  CHECK(cudaMalloc((void**)&tickets, 4));
  CHECK(cudaMalloc((void**)&tables, sizeof(Tables)));
  CHECK(cudaMalloc((void**)&qrefs, 4 * nb + 4));
  CHECK(cudaMalloc((void**)&gtables, kGroupTableBytes * ngroups + 4));
  const Tables t = BuildTables();
  CHECK(cudaMemcpyAsync(tables, &t, sizeof(Tables), cudaMemcpyHostToDevice, nullptr));
  CHECK(cudaMemcpyAsync(x, host.data(), 2 * n, cudaMemcpyHostToDevice, nullptr));
  auto compress = [&] {
    CHECK(cudaMemsetAsync(status, 0, 8 * ctas + 8, nullptr));
    CHECK(cudaMemsetAsync(tickets, 0, 4, nullptr));
    if (V6_GROUP_TABLES) ZC_LAUNCH_KERNEL(GroupKernel, unsigned(ngroups), 256, nullptr, x, n, qrefs, gtables);
    ZC_LAUNCH_KERNEL(CompressKernel, unsigned(ctas), kThreads, nullptr, x, n, tables, payload, desc, status, tickets,
                     total, qrefs, gtables);
  };
  auto decompress = [&] {
    ZC_LAUNCH_KERNEL(DecodeKernel, unsigned(grid_decode), kThreads, nullptr, payload, desc, n, tables, gtables, y);
  };
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
  if (!r.exact && std::getenv("V6_DEBUG")) {
    std::vector<uint64_t> d(nb);
    CHECK(cudaMemcpyAsync(d.data(), desc, 8 * nb, cudaMemcpyDeviceToHost, nullptr));
    for (int64_t i = 0; i < n; ++i)
      if (back[i] != host[i]) {
        const uint64_t e = d[i / kBlock];
        std::fprintf(stderr, "first mismatch at %lld (block %lld lane %lld, combo %d raw %d): %04x, expected %04x\n",
                     (long long)i, (long long)(i / kBlock), (long long)(i % kLanes), int(e >> 42 & 31),
                     int(e >> 47 & 1),
                     back[i], host[i]);
        break;
      }
  }
  r.ratio = double(2 * n) / double(16 + 8 * nb + (V6_GROUP_TABLES ? kGroupTableBytes * ngroups : 0) + bytes);
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
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  for (void* p : {(void*)qrefs, (void*)gtables, (void*)x, (void*)y, (void*)z, (void*)payload, (void*)desc,
                  (void*)status, (void*)total,
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
  } else if (!std::strcmp(kind, "mixed")) {  // Gaussians with 1 in 64 specials: escapes and zeros in coded blocks
    std::normal_distribution<float> g(0.f, 0.02f);
    for (auto& e : v) {  // specials that leave q_ref alone: NaN payloads, +-Inf, subnormals, +-0, tiny normals
      const uint64_t r = rng();
      const uint16_t sign = uint16_t(r >> 63) << 15;
      switch (r % 320) {
        case 0: e = sign | 0x7F80 | uint16_t(1 + (r >> 8) % 127); break;  // NaN, its payload
        case 1: e = sign | 0x7F80; break;
        case 2: e = sign | uint16_t(1 + (r >> 8) % 127); break;  // subnormal
        case 3: e = sign; break;
        case 4: e = sign | uint16_t((1 + (r >> 8) % 20) << 7) | uint16_t((r >> 16) & 127); break;  // tiny normal
        default: e = ToBf16(g(rng));
      }
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

#ifndef V6_NO_MAIN
// v6_proto KIND N [REPS] [FILE]: KIND gaussian | relu | mixed | bits | file
int main(int argc, char** argv) {
  if (argc < 3) return std::fprintf(stderr, "usage: %s gaussian|relu|mixed|bits|file N [REPS] [FILE]\n", argv[0]), 2;
  const int64_t n = std::atoll(argv[2]);
  const int reps = argc > 3 ? std::atoi(argv[3]) : 20;
  if (n < 1 || reps < 1) return std::fprintf(stderr, "N and REPS must be at least 1\n"), 2;
#ifdef ZIPCCL_HOST_EMULATION
  if (const char* r = std::getenv("V6_EMU_RESIDENT")) zc_emu::resident = unsigned(std::atoi(r));  // CTAs at once
#endif
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
#endif  // V6_NO_MAIN
