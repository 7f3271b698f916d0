// Format version 6 on CUDA (docs/FORMAT.md): what the compress and decompress
// kernels share. The family's tables (built at compile time), warp helpers,
// the body's width choice for a warp's 32 lane lengths, and the canonical code
// of a 256-symbol code by 256 threads.
//
// Included through cuda6_codec.cuh after the CUDA runtime or, for the host
// emulation (-DZIPCCL_HOST_EMULATION), tests/cuda_host_shim.h.
#pragma once

#include <cstdint>
#include <type_traits>

#include "format6.h"

#ifdef ZIPCCL_HOST_EMULATION
#define ZC_NOINLINE __attribute__((noinline))
#else
#define ZC_NOINLINE __noinline__
#endif

#ifndef ZC_INJECTED  // deliberately broken variants exist only in the host emulation's tests
#define ZC_INJECTED(k) false
#endif

#ifndef ZIPCCL_HOST_EMULATION
#ifndef ZC_SHARED
#define ZC_SHARED(Type, name) __shared__ Type name
#endif
#ifndef ZC_LAUNCH_KERNEL
#define ZC_LAUNCH_KERNEL(kernel, grid, threads, stream, ...) kernel<<<grid, threads, 0, stream>>>(__VA_ARGS__)
#endif
// A launch with `smem` bytes of dynamic shared memory (past 48 KB the kernel must be allowed them
// first: cudaFuncSetAttribute), and the kernel's view of them.
#define ZC_LAUNCH_KERNEL_SMEM(kernel, grid, threads, smem, stream, ...) \
  kernel<<<grid, threads, smem, stream>>>(__VA_ARGS__)
#define ZC_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#endif

// An fp16 element's bits as a float32 by the hardware (cvt.f32.f16: exact for every number, a NaN's
// payload not promised; the caller restores it: AddSlots). The host emulation's returns the
// canonical NaN for every NaN (tests/cuda_host_shim.h), the worst a device could do.
#ifdef ZIPCCL_HOST_EMULATION
#define ZC_F16_TO_F32(h) ZC_HOST_F16_TO_F32(h)
#else
__device__ __forceinline__ float HalfBitsToFloat(uint32_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(static_cast<unsigned short>(h)));
  return f;
}
#define ZC_F16_TO_F32(h) HalfBitsToFloat(h)
#endif

namespace zipccl {
namespace cuda6 {

namespace v6 = zipccl::v6;

constexpr int kWarp = 32;
constexpr unsigned kAll = 0xFFFFFFFFu;
constexpr int kCombos = 2 * v6::kMembers;  // a family code: 2 member + flip
constexpr int kPeek = 10;                  // bits of the decoder's first lookup of a family code
constexpr unsigned long long kNoError = ~0ull;

// A dtype's layout and element word, as compile-time constants.
template <int DT>
struct Elem {
  static constexpr v6::Layout kLay = v6::layout_of(DT);
  static constexpr int kBytes = kLay.elem_bytes, kW = 8 * kBytes;
  static constexpr uint32_t kQMask = (1u << kLay.q_bits) - 1, kLowMask = (1u << kLay.low_bits) - 1;
  using Word = typename std::conditional<kBytes == 2, uint16_t, uint32_t>::type;
};

// CodeKernel's table entry of a symbol: its code (bit-reversed) | its length << 16 | 1 << 23 if
// low bits follow (fp32) | 1 << 24 for the escape | the bits of its first put << 25 (bf16, fp16:
// the value's all, at most 27; fp32: the code and an escape's q). base: code | length << 16.
constexpr uint32_t kPutMore = 1u << 23, kPutEsc = 1u << 24;
template <int DT>
__host__ __device__ constexpr uint32_t PutEntry(uint32_t base, int sym) {
  using E = Elem<DT>;
  const int cls = sym & (v6::kSignSym - 1);  // v6::class_of_symbol, here constexpr (MakeTables)
  const uint32_t len = base >> 16, esc = cls == v6::kClassEsc, more = cls != v6::kClassZero;
  const uint32_t fixed = cls == v6::kClassZero ? 0u : cls == v6::kClassEsc ? uint32_t(E::kLay.q_bits + E::kLay.low_bits)
                                                                             : uint32_t(E::kLay.low_bits);
  const uint32_t first = E::kBytes == 2 ? len + fixed : len + esc * E::kLay.q_bits;
  return base | (E::kBytes == 2 ? 0u : more * kPutMore) | esc * kPutEsc | first << 25;
}

// A group table's entry (u32, FastEntry) for the 12 bits at a lane's position, LSB first:
//   fast:  bits 0-15 the element's top 16 bits less ref << kLow16 (sign << 15 - d << kLow16, mod 2^16;
//          a zero's: sign << 15), whose low kLow16 bits (the element's low bits, 0 here) hold in a
//          16-bit dtype the code's length (bits 0-3; a zero's: 0); 16-22 d (a zero's: 0, for
//          FastLane's check); 26 a zero; 27-31 the bits the value takes (its code and, in 16-bit
//          dtypes, its low bits; never 0);
//   slow:  bits 27-31 are 0: sym | code length << 8 for an escape, 0 for a code longer than kPeek
//          bits or none (a 12-bit lookup then says which).
// So a 16-bit value is a lookup, a funnel shift of the window by the entry (taken mod 32: the
// code's length), a bit select of the low bits into the entry and an add of ref << kLow16.
constexpr uint32_t kZeroBit = 1u << 26;
constexpr int kDShift = 16;  // FastEntry's d
// A family table's entry (u16, every combo's in 16 KB): the same top 16 bits, whose low kLow16 bits
// hold the code's length (bits 0-3, 0: slow) and a zero (bit 4; then the length is the value's).
constexpr uint32_t kZero16 = 1u << 4;

template <int DT>
struct Fast {
  // the low bits' place in the element's top 16 bits (fp32: the top 5 of its 21)
  static constexpr int kLow16 = Elem<DT>::kBytes == 2 ? Elem<DT>::kLay.low_bits : 5;
  static constexpr uint32_t kTop = 0xFFFFu << kLow16 & 0xFFFFu;  // an entry's bits that are the element's
};

template <int DT>
__host__ __device__ constexpr uint32_t FastEntry(uint32_t sym, uint32_t clen) {
  constexpr v6::Layout lay = Elem<DT>::kLay;
  constexpr bool k16 = Elem<DT>::kBytes == 2;
  // (selects, not branches: the group tables' builders compute one a symbol)
  const uint32_t cls = sym & (v6::kSignSym - 1), sign = sym >> 7;
  const uint32_t slow = clen ? sym | clen << 8 : 0u, zero = sign << 15 | kZeroBit | clen << 27;
  const uint32_t total = clen + (k16 ? uint32_t(lay.low_bits) : 0u);
  const uint32_t fast = (((sign << 15) - ((cls - 1) << Fast<DT>::kLow16)) & 0xFFFFu) | (k16 ? clen : 0u) |
                        (cls - 1) << kDShift | total << 27;
  return clen == 0 || cls >= uint32_t(v6::kClassEsc) ? slow : cls == uint32_t(v6::kClassZero) ? zero : fast;
}

template <int DT>
__host__ __device__ constexpr uint16_t FamEntry(uint32_t sym, uint32_t clen) {
  const uint32_t e = FastEntry<DT>(sym, clen);
  if (!(e >> 27)) return 0;  // slow: the 12-bit table says which
  return uint16_t((e & Fast<DT>::kTop) | clen | (e & kZeroBit ? kZero16 : 0u));
}

// The family, as the kernels use it (MakeTables).
struct Tables {
  uint64_t sizes[v6::kNumSyms][2];        // a symbol's code length under combo c: bits 16 (c % 4) of [c / 4]
  uint32_t put[3][kCombos][v6::kNumSyms];  // per dtype (kBF16 - 1, ...): CodeKernel's entries (PutEntry)
  // per dtype: the decoder's first lookup (FamEntry) of the kPeek bits at a lane's position, 0 where
  // no code of at most kPeek bits starts (lut12 then says which)
  alignas(16) uint16_t fam[3][kCombos][1 << kPeek];
  uint16_t lut12[kCombos][kLutSize];      // sym | length << 8 (build_lut): the long codes' fallback
};

// The family's tables, computed at compile time (zipccl_format.h's canonical_codes and build_lut,
// restated as constexpr code): the handlers' kernels read them from kDeviceTables, a __device__
// global initialised in the module image, so no call copies them from the host.
__host__ __device__ constexpr Tables MakeTables() {
  Tables t{};
  for (int c = 0; c < kCombos; ++c) {
    uint8_t lens[v6::kNumSyms] = {};
    uint16_t codes[v6::kNumSyms] = {};
    for (int s = 0; s < v6::kNumSyms; ++s) lens[s] = v6::kFamily[c >> 1][s ^ ((c & 1) ? v6::kSignSym : 0)];
    uint32_t code = 0;  // canonical, by (length, symbol), stored bit-reversed (LSB first)
    for (int len = 1; len <= kMaxCodeLen; ++len, code <<= 1)
      for (int s = 0; s < v6::kNumSyms; ++s)
        if (lens[s] == len) {
          uint32_t rev = 0;
          for (int b = 0; b < len; ++b) rev |= ((code >> b) & 1u) << (len - 1 - b);
          codes[s] = uint16_t(rev), ++code;
        }
    for (int s = 0; s < v6::kNumSyms; ++s) {
      const int len = lens[s];
      for (uint32_t fill = 0; len && fill < (1u << (kMaxCodeLen - len)); ++fill)
        t.lut12[c][codes[s] | (fill << len)] = uint16_t(s | (len << 8));
      t.sizes[s][c / 4] |= uint64_t(len) << (16 * (c % 4));
      const uint32_t base = len ? codes[s] | uint32_t(len) << 16 : 0;
      t.put[kBF16 - 1][c][s] = PutEntry<kBF16>(base, s);
      t.put[kF16 - 1][c][s] = PutEntry<kF16>(base, s);
      t.put[kF32 - 1][c][s] = PutEntry<kF32>(base, s);
    }
    for (int w = 0; w < (1 << kPeek); ++w) {
      const uint32_t e = t.lut12[c][w], sym = e & 0xFF, len = (e >> 8) <= kPeek ? e >> 8 : 0;
      t.fam[kBF16 - 1][c][w] = FamEntry<kBF16>(sym, len);
      t.fam[kF16 - 1][c][w] = FamEntry<kF16>(sym, len);
      t.fam[kF32 - 1][c][w] = FamEntry<kF32>(sym, len);
    }
  }
  return t;
}

inline void BuildTables(Tables* t) { *t = MakeTables(); }

#ifdef ZIPCCL_HOST_EMULATION
inline constexpr Tables kDeviceTables = MakeTables();
#else
__device__ const Tables kDeviceTables = MakeTables();
#endif

// A kernel's tables: those passed (the emulation tests', time6.cu's), or null for kDeviceTables.
__device__ __forceinline__ const Tables* TablesOr(const Tables* t) { return t ? t : &kDeviceTables; }

template <typename T>
__host__ __device__ __forceinline__ T Min(T a, T b) {
  return a < b ? a : b;
}
template <typename T>
__host__ __device__ __forceinline__ T Max(T a, T b) {
  return a < b ? b : a;
}

__device__ __forceinline__ int LaneId() { return int(threadIdx.x % kWarp); }
__device__ __forceinline__ int WarpIdx() { return int(threadIdx.x / kWarp); }

template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
  for (int d = kWarp / 2; d > 0; d /= 2) v += __shfl_xor_sync(kAll, v, d);
  return v;
}
template <typename T>
__device__ __forceinline__ T WarpMax(T v) {
  for (int d = kWarp / 2; d > 0; d /= 2) {
    const T o = __shfl_xor_sync(kAll, v, d);
    v = o > v ? o : v;
  }
  return v;
}
template <typename T>
__device__ __forceinline__ T WarpMin(T v) {
  for (int d = kWarp / 2; d > 0; d /= 2) {
    const T o = __shfl_xor_sync(kAll, v, d);
    v = o < v ? o : v;
  }
  return v;
}
template <typename T>
__device__ __forceinline__ T WarpInclusiveScan(T v) {
  for (int d = 1; d < kWarp; d *= 2) {
    const T o = __shfl_up_sync(kAll, v, d);
    if (LaneId() >= d) v += o;
  }
  return v;
}

// Warp reductions of a u32 in one instruction each (REDUX, sm_80 on); the
// emulation's are the shuffle trees above.
__device__ __forceinline__ uint32_t RedAdd(uint32_t v) {
#ifdef ZIPCCL_HOST_EMULATION
  return WarpSum(v);
#else
  return __reduce_add_sync(kAll, v);
#endif
}
__device__ __forceinline__ uint32_t RedMin(uint32_t v) {
#ifdef ZIPCCL_HOST_EMULATION
  return WarpMin(v);
#else
  return __reduce_min_sync(kAll, v);
#endif
}
__device__ __forceinline__ uint32_t RedMax(uint32_t v) {
#ifdef ZIPCCL_HOST_EMULATION
  return WarpMax(v);
#else
  return __reduce_max_sync(kAll, v);
#endif
}

// Each 16-bit half's larger (VIMNMX.U16x2).
__device__ __forceinline__ uint32_t MaxU16x2(uint32_t a, uint32_t b) {
#ifdef ZIPCCL_HOST_EMULATION
  return Max(a & 0xFFFFu, b & 0xFFFFu) | Max(a >> 16, b >> 16) << 16;
#else
  return __vmaxu2(a, b);
#endif
}

// 16 bytes of input, one load.
#ifdef ZIPCCL_HOST_EMULATION
struct Words4 {
  uint32_t x, y, z, w;
};
#else
using Words4 = uint4;
#endif

// Asks L1 for the 128-byte line at p (a hint; nothing in the emulation).
__device__ __forceinline__ void PrefetchL1(const void* p) {
#ifdef ZIPCCL_HOST_EMULATION
  (void)p;
#else
  asm volatile("prefetch.L1 [%0];" ::"l"(p));
#endif
}

// The bits of v (0 for 0).
__device__ __forceinline__ int BitLength(uint32_t v) {
#ifdef ZIPCCL_HOST_EMULATION
  return v ? 32 - __builtin_clz(v) : 0;
#else
  return 32 - __clz(v);
#endif
}

// §3, §6 step 3 for a warp's lanes (lane k holds lane k's bits): the narrowest
// width whose 31 deviations fit, as format6.h choose_width, from the lanes'
// sum, least and largest (lanes 0..30) instead of a pass a width. A width fits
// only if the lanes' spread does (hi - lo < 2^w), so the search starts there:
// the same width as from 1, in one or two steps.
struct BodyShape {
  int width, field_bits;
  uint32_t size, base;  // the body's bytes; the base the lane lengths are relative to
};
__device__ __forceinline__ BodyShape WarpBodyShape(uint32_t bits) {
  const bool dev = LaneId() < kWarp - 1;
  const uint32_t total = RedAdd(bits), lo = RedMin(dev ? bits : 0xFFFFFFFFu), hi = RedMax(dev ? bits : 0u);
  BodyShape s{};
  for (int w = Min(kMaxWidth, Max(1, BitLength(hi - lo))); w <= kMaxWidth; ++w) {
    const uint32_t head = uint32_t(v6::head_bits(w));
    s = {w, width_field_bits(w), (head + total + 7) / 8, 0};
    s.base = v6::length_base(s.size, head);
    const int64_t lim = int64_t(1) << (w - 1);
    if (int64_t(lo) - s.base >= -lim && int64_t(hi) - s.base < lim) break;
  }
  return s;
}

// The `len` low bits of v reversed (a canonical code as the stream holds it, LSB first).
__device__ __forceinline__ uint32_t Reverse(uint32_t v, int len) {
#ifdef ZIPCCL_HOST_EMULATION
  uint32_t r = 0;
  for (int b = 0; b < len; ++b) r |= ((v >> b) & 1u) << (len - 1 - b);
  return r;
#else
  return len ? __brev(v) >> (32 - len) : 0u;
#endif
}

// The low 32 bits of hi:lo shifted right by s mod 32 (SHF.R.W: the 32 stream bits from bit s of lo).
__device__ __forceinline__ uint32_t FunnelR(uint32_t lo, uint32_t hi, uint32_t s) {
#ifdef ZIPCCL_HOST_EMULATION
  s &= 31;
  return s ? lo >> s | hi << (32 - s) : lo;
#else
  return __funnelshift_r(lo, hi, s);
#endif
}

// The bits of b where m is set, of a elsewhere: one LOP3 (ptxas splits the C++ form in two).
__device__ __forceinline__ uint32_t BitSelect(uint32_t a, uint32_t b, uint32_t m) {
#ifdef ZIPCCL_HOST_EMULATION
  return (a & ~m) | (b & m);
#else
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xCA;" : "=r"(r) : "r"(m), "r"(b), "r"(a));  // (m & b) | (~m & a)
  return r;
#endif
}

// Byte u of w (u a constant, 0..3): one PRMT (ptxas made shift, mask and the table's scaling of it
// two and an add).
__device__ __forceinline__ uint32_t ByteOf(uint32_t w, int u) {
#ifdef ZIPCCL_HOST_EMULATION
  return (w >> (8 * u)) & 0xFF;
#else
  return __byte_perm(w, 0u, 0x4440u + uint32_t(u));
#endif
}

// The high 32 bits of hi:lo shifted left by s mod 32 (SHF.L.W); FunnelL(v, 0, s): the bits of v a
// left shift by s pushes out of a word (0 for s = 0).
__device__ __forceinline__ uint32_t FunnelL(uint32_t lo, uint32_t hi, uint32_t s) {
#ifdef ZIPCCL_HOST_EMULATION
  s &= 31;
  return s ? hi << s | lo >> (32 - s) : hi;
#else
  return __funnelshift_l(lo, hi, s);
#endif
}

// §1's symbols, as the compress kernels index their tables by them: index j
// < 127 (with the sign bit) for class j + 1, 127 for class 0 (+-0). For a ref
// the encoder chose (a block's or a group's: 0 or a normal q, so below q_max)
// and lim = SymbolLimit(ref), a value's d = ref - q is a class if d < lim
// (d <= 119 and q >= 4; q <= ref < q_max then makes q normal; a q over ref
// wraps d past lim). kExact: index d or, for an escape, 120 (PseudoSource(j,
// 120) inverts it); else min(d, lim), one instruction less, for a table of the
// block's own that holds the escape's entry at lim too (PseudoSource(j, lim)).
__host__ __device__ __forceinline__ uint32_t SymbolLimit(uint32_t ref) { return ref >= 4 ? Min(120u, ref - 3) : 0u; }
template <int DT, bool kExact>
__device__ __forceinline__ uint32_t SymbolIndex(uint32_t x, uint32_t ref, uint32_t lim) {
  using E = Elem<DT>;
  const uint32_t d = ref - ((x >> E::kLay.low_bits) & E::kQMask), body = x & ((1u << (E::kW - 1)) - 1);
  const uint32_t j = kExact ? (d < lim ? d : uint32_t(v6::kClassEsc - 1)) : Min(d, lim);
  return ((x >> (E::kW - 8)) & uint32_t(v6::kSignSym)) | (body == 0 ? 127u : j);
}
// SymbolIndex at a ref of 123 or over (lim 120: every block of values over 2^-96 in bf16 and
// fp32), where its two indices are the same, from the value's bits but the sign: (ref << low |
// ones) - body is d << low plus the ones less the low bits where q <= ref and wraps past 120's
// image where q > ref, so one VIADDMNMX and a shift give min(d, 120) (seven instructions to
// SymbolIndex<DT, true>'s nine in bf16).
template <int DT>
__device__ __forceinline__ uint32_t SymbolIndexHigh(uint32_t x, uint32_t ref) {
  using E = Elem<DT>;
  constexpr int kLow = E::kLay.low_bits;
  constexpr uint32_t kLim = v6::kClassEsc - 1;
  const uint32_t body = x & ((1u << (E::kW - 1)) - 1);
  const uint32_t j = Min((ref << kLow | E::kLowMask) - body, kLim << kLow | E::kLowMask) >> kLow;
  return ((x >> (E::kW - 8)) & uint32_t(v6::kSignSym)) | (body == 0 ? 127u : j);
}
// The symbol whose entry index k holds.
__host__ __device__ __forceinline__ int PseudoSource(int k, uint32_t lim) {
  const uint32_t j = uint32_t(v6::class_of_symbol(k));
  return (k & v6::kSignSym) | int(j == 127 ? uint32_t(v6::kClassZero) : j == lim ? uint32_t(v6::kClassEsc) : j + 1);
}
// Symbol sym's exact index.
__host__ __device__ __forceinline__ int ExactIndex(int sym) {
  const int cls = v6::class_of_symbol(sym);
  return (sym & v6::kSignSym) | (cls == v6::kClassZero ? 127 : cls - 1);
}

// The canonical code (version 5's §5.2, by (length, symbol)) of a 256-symbol
// code, thread t < 256 holding symbol t's length `len` (the CTA's other
// threads pass 0). Every thread of the CTA calls it. Returns symbol t's code
// (MSB first) and its index in canonical order; *coded: the symbols with a code.
struct CanonScratch {
  uint16_t per_warp[8][kMaxCodeLen + 1];
  uint32_t first[kMaxCodeLen + 1];  // wide: an invalid table (Kraft sum over 1) may overflow 16 bits
  uint16_t base[kMaxCodeLen + 1], coded;
};
__device__ inline uint32_t CanonicalCode(uint32_t len, CanonScratch& sc, uint32_t* index) {
  const int warp = WarpIdx(), lane = LaneId();
  uint32_t rank = 0;
  if (warp < 8) {
    for (int l = 1; l <= kMaxCodeLen; ++l) {
      const unsigned m = __ballot_sync(kAll, len == uint32_t(l));
      if (len == uint32_t(l)) rank = uint32_t(__popc(m & ((1u << lane) - 1)));
      if (lane == 0) sc.per_warp[warp][l] = uint16_t(__popc(m));
    }
  }
  __syncthreads();
  if (warp == 0) {  // lane l - 1, for length l: its codes before each warp (in place) and in all,
                    // then its first code (the sum of total[i] << (l - i), i < l) and first index
    const int l = lane + 1;
    uint32_t total = 0, first = 0, base = 0;
    if (l <= kMaxCodeLen)
      for (int w = 0; w < 8; ++w) {
        const uint32_t c = sc.per_warp[w][l];
        sc.per_warp[w][l] = uint16_t(total), total += c;
      }
    for (int i = 1; i < kMaxCodeLen; ++i) {
      const uint32_t t = __shfl_sync(kAll, total, i - 1);
      if (i < l) first += t << (l - i), base += t;
    }
    if (l <= kMaxCodeLen) sc.first[l] = first, sc.base[l] = uint16_t(base);
    if (l == kMaxCodeLen) sc.coded = uint16_t(base + total);
  }
  __syncthreads();
  uint32_t code = 0;
  *index = 0;
  if (warp < 8 && len) {
    rank += sc.per_warp[warp][len];
    code = sc.first[len] + rank;
    *index = sc.base[len] + rank;
  }
  return code;
}

}  // namespace cuda6
}  // namespace zipccl
