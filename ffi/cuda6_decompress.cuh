// Format version 6 on CUDA: decompress (docs/FORMAT.md §2, §3), one kernel
// and no serial prologue.
//
// DecodeKernel<DT>: persistent CTAs of 8 warps, each CTA a run of batches of 8
// blocks (half a group), a warp per block and a thread per lane. The family's
// decode tables (a 10-bit first lookup per combo, whose u16 entry carries the
// value's top bits and its code's length; the few longer codes from a 12-bit
// table in global memory) are copied to shared memory once per CTA, as built
// at compile time (Tables::fam); a group's
// table is checked and its 12-bit table (u32 entries that also carry the
// value's whole length) built by the CTA when one of the batch's
// blocks takes the group's code (once per group and CTA). Every block plans
// itself from its descriptors (format6.h plan_block), locates its lanes (a
// thread a deviation, a warp scan) and decodes them: FastLane, a 32-bit window
// over three stream words in registers, the rare values (escapes, long codes,
// errors) in a call; a lane it does not accept is decoded again by DecodeLane,
// format6.h's decode_element step by step, for the verdict. A failing block
// reports (block + 1) << 8 | status by atomicMin, a failing header or length
// its status alone: the stream's verdict is the lowest, as the reference's
// first error. A launch decodes a batch of streams, a run of CTAs each
// (item = blockIdx.x / the run's length), at any byte alignment.
//
// AccumulateKernel<DT>: the reduce step on the same block decoder: a CTA takes
// one block at a time through an item's k rows, up to 8 rows at once (a warp a
// row, each with its row's group table, built by the warp: BuildWarpGroupTable;
// past 8 rows, filled from the row's code as WarpCodesKernel worked it out once:
// CachedCode), or, with 4 rows or fewer, the rows of several blocks at once (2
// rows: 4 blocks; SumSpan), each warp decoding its row's block into a slot in
// shared memory (dynamic: up to ~216 KB a CTA); then its 256 threads add the
// slots in row order to 16 float32 sums each, in registers (AddSlots: a round's
// slots, 16-byte loads, one NaN test a round), and round them once into the
// output: no decoded row is written to memory, and the rows of a block decode in
// parallel.
#pragma once

#include "cuda6_device.cuh"

namespace zipccl {
namespace cuda6 {

constexpr int kDecodeWarps = 8, kDecodeThreads = kWarp * kDecodeWarps;
constexpr int kDecodeMinCtas = 4;  // an SM's: at most 64 registers

// A warp's group table entry (u16, AccumulateKernel): FamEntry's where it is fast; an escape's
// (slow: bits 0-3 are 0) sym << 4 | length << 12, which Group16Slow turns into build_lut's sym |
// length << 8 for SlowValue; 0 for a window that starts no code.
template <int DT>
__host__ __device__ __forceinline__ uint16_t Group16Entry(uint32_t sym, uint32_t clen) {
  const uint32_t fast = FamEntry<DT>(sym, clen);
  return uint16_t(fast ? fast : clen ? sym << 4 | clen << 12 : 0u);
}
__device__ __forceinline__ uint32_t Group16Slow(uint32_t e) { return (e >> 4 & 0xFFu) | (e >> 12) << 8; }

// A group's canonical code, for the exact decoder's lookups (LongLookup): by canonical index i
// (codes in (length, symbol) order), its symbol, length and first 12-bit window (MSB first).
struct GroupCode {
  uint16_t start[v6::kNumSyms + 1];
  uint8_t order[v6::kNumSyms], olen[v6::kNumSyms];
  uint32_t kraft, coded;  // the windows that start a code ([0, kraft)); the codes
  // the lowest ref at which every class the code holds gives a normal q (its largest distance + 4;
  // 0 if it holds none): a block at this ref or over needs no per-value check (FastLane's kCheck)
  uint32_t safe_ref;
};

// Symbol sym's term (of code length len) in its code's safe_ref: its class's distance + 4, if it
// is coded and has one.
__device__ __forceinline__ uint32_t SafeRefOf(uint32_t sym, uint32_t len) {
  const uint32_t cls = sym & (v6::kSignSym - 1);
  return len && cls != uint32_t(v6::kClassZero) && cls < uint32_t(v6::kClassEsc) ? cls - 1 + 4 : 0u;
}

struct DecodeSmem {
  alignas(16) uint16_t fam[kCombos][1 << kPeek];  // Tables::fam's, the dtype's (LoadFamily)
  alignas(16) uint32_t group[kLutSize];    // the group's code (FastEntry, 12 bits: only escapes are slow)
  GroupCode code;
  uint32_t entry[v6::kNumSyms];            // the group table's entry (FastEntry) by canonical index
  CanonScratch canon;
  uint32_t longest;
  uint32_t need[kDecodeWarps], table_at[kDecodeWarps];
};

// The last canonical index (of `coded`) whose first window (MSB first) is at or before w.
__device__ __forceinline__ uint32_t FirstCodeAt(const GroupCode& g, uint32_t coded, uint32_t w) {
  uint32_t i = 0;
  for (uint32_t lo = 0, hi = coded; lo + 1 < hi;) {
    const uint32_t mid = (lo + hi) / 2;
    if (g.start[mid] <= w) lo = mid, i = mid;
    else hi = mid;
  }
  return i;
}

// A group's 12-bit decode table (lut, indexed LSB first, 16-byte aligned), by doubling: the table
// of l bits is that of l - 1 bits twice over, then each code of length l at its slot (its l bits
// reversed: g.start's top l; the codes from[l] .. from[l + 1] - 1 by canonical index, entry[i]
// its entry); the table of no bits is one window of no code (0). A prefix code (Kraft sum at most
// 1) writes each slot at most once and leaves the windows past its Kraft sum 0. Thread t of
// kThreads (a warp's lanes, or a CTA's threads) calls it, sync() their barrier; it ends with one.
// Every thread does the same work, 16-byte copies and a store a code (filled window by window, a
// thread's range of windows cost its code runs, and a warp its slowest thread's, the one holding
// the long codes' short runs: docs/GPU.md, "Seventh version").
template <int kThreads, typename Entry, typename Sync>
__device__ __forceinline__ void FillByDoubling(Entry* lut, const Entry* entry, const GroupCode& g,
                                               const uint32_t (&from)[kMaxCodeLen + 2], int t, Sync sync) {
  constexpr int kVec = int(sizeof(Words4) / sizeof(Entry));
  if (t == 0) lut[0] = 0;
  sync();
#pragma unroll
  for (int l = 1; l <= kMaxCodeLen; ++l) {
    const int half = 1 << (l - 1), vecs = half / kVec;  // the entries and 16-byte words to copy
    if (half < kVec) {
      if (t < half) lut[half + t] = lut[t];
    } else {
      const Words4* src = reinterpret_cast<const Words4*>(lut);
      Words4* dst = reinterpret_cast<Words4*>(lut + half);
#pragma unroll
      for (int k = 0; k < (vecs + kThreads - 1) / kThreads; ++k)
        if (vecs % kThreads == 0 || t + k * kThreads < vecs) dst[t + k * kThreads] = src[t + k * kThreads];
    }
    sync();
    for (uint32_t i = from[l] + uint32_t(t); i < from[l + 1]; i += uint32_t(kThreads))
      lut[Reverse(uint32_t(g.start[i]) >> (kMaxCodeLen - l), l)] = entry[i];
    sync();
  }
}

// §4: checks the group table at `table` (122 bytes, in the stream) and builds
// its decode table, read with the sign inverted if flip (§2: a flip applies to
// any code). Every thread of the CTA (256) calls it. Returns a Status.
template <int DT>
__device__ inline int BuildGroupTable(DecodeSmem& s, const uint8_t* table, int flip) {
  const int sym = int(threadIdx.x), cls = sym & (v6::kSignSym - 1);
  const int j = ((sym >> 7) ^ flip) * 122 + cls;  // its length's place among the 244 valid symbols'
  const uint32_t len = cls <= v6::kClassEsc ? (table[j / 2] >> (4 * (j & 1))) & 15u : 0u;
  if (sym == 0) s.code.kraft = 0, s.code.safe_ref = 0, s.longest = 0;
  __syncthreads();
  if (len) {
    atomicAdd(&s.code.kraft, len <= uint32_t(kMaxCodeLen) ? 1u << (kMaxCodeLen - len) : 0u), atomicMax(&s.longest, len);
    atomicMax(&s.code.safe_ref, SafeRefOf(uint32_t(sym), len));
  }
  __syncthreads();
  const uint32_t kraft = s.code.kraft;
  const bool ok = s.longest <= uint32_t(kMaxCodeLen) && kraft != 0 && kraft <= uint32_t(kLutSize);
  uint32_t index;
  const uint32_t code = CanonicalCode(ok ? len : 0u, s.canon, &index);
  GroupCode& g = s.code;
  if (ok && len) {
    g.order[index] = uint8_t(sym), g.olen[index] = uint8_t(len), g.start[index] = uint16_t(code << (kMaxCodeLen - len));
    s.entry[index] = FastEntry<DT>(uint32_t(sym), len);
  }
  if (sym == 0) g.coded = s.canon.coded, g.start[s.canon.coded] = uint16_t(kraft);  // start[coded]: the end
  __syncthreads();
  if (!ok) return kErrGroupTable;
  uint32_t from[kMaxCodeLen + 2];
#pragma unroll
  for (int l = 1; l <= kMaxCodeLen; ++l) from[l] = s.canon.base[l];
  from[kMaxCodeLen + 1] = s.canon.coded;
  FillByDoubling<256>(s.group, s.entry, g, from, sym, [] { __syncthreads(); });
  return kOk;
}

// The code at a 12-bit window (LSB first) as build_lut's entry (sym | length << 8, 0 = none):
// the family's 12-bit table, or (lut12 null) the group's canonical code by a binary search.
__device__ __forceinline__ uint32_t LongLookup(uint32_t window, const uint16_t* lut12, const GroupCode& g) {
  if (lut12) return lut12[window & (kLutSize - 1)];
  const uint32_t w = Reverse(window, kMaxCodeLen);
  if (w >= g.kraft) return 0;
  const uint32_t i = FirstCodeAt(g, g.coded, w);
  return g.order[i] | uint32_t(g.olen[i]) << 8;
}

// The 32-bit word idx from `in` (4-byte aligned: a stream's start rounded down), its bytes at or
// past `size` read as 0.
__device__ __forceinline__ uint32_t StreamWord(const uint8_t* in, int64_t size, int64_t idx) {
  if (4 * idx + 4 <= size) return reinterpret_cast<const uint32_t*>(in)[idx];
  uint32_t v = 0;
  for (int k = 0; k < 4; ++k)
    if (4 * idx + k < size) v |= uint32_t(in[4 * idx + k]) << (8 * k);
  return v;
}

// §3, exactly as format6.h decode_element: a lane of `len` bits from bit `bit`
// of `in` (size bytes, 4-byte aligned): `values` elements to y[lane],
// y[lane + 32], ... The window past the lane's end
// holds the next lane's bits, which decode nothing the reference's zeros would
// not (a code that fits the lane is found the same either way; one that does not
// fails either way). Returns a Status | the bits taken << 32 (no pointer out: a
// call without a stack frame). The fast path's fallback: a lane it did not
// accept (FastLane) is decoded again here.
template <int DT>
__device__ ZC_NOINLINE uint64_t DecodeLane(const uint8_t* in, int64_t size, int64_t bit, uint32_t len, uint32_t ref,
                                           const uint16_t* lut12, const GroupCode& g, typename Elem<DT>::Word* y,
                                           int lane, int values) {
  using E = Elem<DT>;
  constexpr v6::Layout lay = E::kLay;
  int64_t idx = bit / 32;
  uint64_t buf = StreamWord(in, size, idx++) >> (bit % 32);
  int held = 32 - int(bit % 32);
  uint32_t taken = 0;
  auto refill = [&] {
    if (held < 32) buf |= uint64_t(StreamWord(in, size, idx++)) << held, held += 32;
  };
  for (int i = 0; i < values; ++i) {
    refill();
    const uint32_t e = LongLookup(uint32_t(buf), lut12, g);
    if (!(e >> 8)) return uint64_t(kErrBitstream);
    const uint32_t clen = e >> 8, sym = e & 0xFF, cls = sym & 127;
    uint32_t q = 0, head = clen;
    if (cls == uint32_t(v6::kClassEsc)) {
      q = uint32_t(buf >> clen) & E::kQMask, head += lay.q_bits;
    } else if (cls != uint32_t(v6::kClassZero)) {
      q = ref - (cls - 1);
      if (!v6::normal_q(q, lay)) return uint64_t(kErrBitstream);
    }
    buf >>= head, held -= int(head), taken += head;
    uint32_t low = 0;
    if (cls != uint32_t(v6::kClassZero)) {
      if (E::kBytes == 4) refill();  // 12 + 10 + 21 bits may exceed the 32 a refill guarantees
      low = uint32_t(buf) & E::kLowMask;
      buf >>= lay.low_bits, held -= lay.low_bits, taken += lay.low_bits;
    }
    if (taken > len) return uint64_t(kErrBitstream);
    y[lane + kWarp * i] = typename E::Word((sym >> 7) << (E::kW - 1) | q << lay.low_bits | low);
  }
  return uint64_t(kOk) | uint64_t(taken) << 32;
}

// The fast path's rare values (a slow entry e: an escape, a code longer than
// kPeek bits or none), from the 32 bits at the lane's position: a family code's
// from its 12-bit table (lut12), the group's from e (its 12-bit table leaves only
// escapes and windows of no code). Returns the
// value (fp32: its top 16 bits, the caller takes the low 21) | bits taken << 32
// | a zero << 40, or kSlowError (a window of no code, or a class whose q is not normal).
constexpr uint64_t kSlowError = 1ull << 41;
template <int DT>
__device__ ZC_NOINLINE uint64_t SlowValue(uint32_t peek, uint32_t e, uint32_t ref, const uint16_t* lut12) {
  using E = Elem<DT>;
  constexpr v6::Layout lay = E::kLay;
  if (lut12) e = lut12[peek & (kLutSize - 1)];
  const uint32_t clen = e >> 8, sym = e & 0xFF, cls = sym & 127;
  if (!clen) return kSlowError;
  uint32_t q = 0, n = clen;
  if (cls == uint32_t(v6::kClassEsc)) {
    q = (peek >> n) & E::kQMask, n += lay.q_bits;
  } else if (cls != uint32_t(v6::kClassZero)) {
    q = ref - (cls - 1);
    if (!v6::normal_q(q, lay)) return kSlowError;
  }
  const bool zero = cls == uint32_t(v6::kClassZero);
  uint32_t v = (sym >> 7) << 15 | q << Fast<DT>::kLow16;
  if (E::kBytes == 2 && !zero) v |= (peek >> n) & E::kLowMask, n += lay.low_bits;
  return v | uint64_t(n) << 32 | uint64_t(zero) << 40;
}

// The most bits a value takes (its code, an escape's q, its low bits).
template <int DT>
constexpr int kMaxValueBits = kMaxCodeLen + Elem<DT>::kLay.q_bits + Elem<DT>::kLay.low_bits;

// §3, the common path: a lane of `values` elements from bit `bit` of words into y[lane], y[lane + 32], ...
// through a 32-bit window over three stream words held in registers, a word loaded as one is
// consumed (the caller checked that `values` values of kMaxValueBits stay in the stream's whole
// words). kCheck: the block's code holds classes whose q is not normal at its ref (a family
// code: ref < 123; a group code: ref < its safe_ref), so each value's is checked (d <= ref - 4,
// folded into a maximum and tested at the lane's end; with ref < 4 only zeros pass; the caller
// sent ref >= q_max to DecodeLane). Returns the bits taken; *ok false if a value failed (the
// lane's later values are then garbage, and DecodeLane decodes it again for the reference's
// verdict).
template <int DT, bool kCheck, bool kGroup16, typename Entry>
__device__ __forceinline__ uint32_t FastLane(const uint32_t* __restrict__ words, uint64_t bit, uint32_t ref,
                                             const Entry* lut, uint32_t mask, const uint16_t* lut12,
                                             typename Elem<DT>::Word* y, int at, int values, bool* ok) {
  using E = Elem<DT>;
  constexpr v6::Layout lay = E::kLay;
  const uint32_t pos0 = uint32_t(bit % 32), qadd = ref << Fast<DT>::kLow16;
  constexpr bool k32 = sizeof(Entry) == 4;
  uint32_t dseen = 0, nonzero = 0;  // kCheck: the largest d (shifted) of a fast value; one was not a zero
  // pos counts bits from the lane's first word (FunnelR takes it mod 32); cur holds word pos / 32
  // of it, next and after the two after that; the next to load is w[pos / 32]
  const uint32_t* __restrict__ w = words + bit / 32 + 2;
  uint32_t cur = w[-2], next = w[-1], after = w[0], pos = pos0;
  bool good = true;
  static_assert(E::kBytes == 4 || kMaxValueBits<DT> < 32, "a 16-bit value ends at most one word on");
  static_assert(kMaxCodeLen + lay.q_bits < 32 && lay.low_bits < 32, "so does each of a float32's two steps");
  auto advance = [&](uint32_t from) {  // from: pos before the step's bits, fewer than 32
    if ((pos ^ from) & 32u) cur = next, next = after, after = w[pos / 32];
  };
#pragma unroll 8  // (a full lane is 128 values; the loop's own instructions, ~8 a round, ~1 a value)
  for (int i = 0; i < values; ++i) {
    // the entry for the window's low bits: the mask is a LOP3 that ptxas keeps apart, so that the
    // address is one IMAD of the masked index (from `peek & mask` ptxas made a shift, a mask and an add)
    const uint32_t peek = FunnelR(cur, next, pos), e = lut[BitSelect(0u, peek, mask)], from = pos;
    // the entry's fields: a u32's (FastEntry), or a u16's (FamEntry)
    const uint32_t clen16 = e & 15u, out = k32 ? e : e & Fast<DT>::kTop;  // (a u32 zero's low bits are 0)
    const bool zero = k32 ? (e & kZeroBit) != 0 : (e & kZero16) != 0;
    uint32_t v;
    bool has_low = !zero;  // fp32: the low bits follow
    // an escape, a long code or none (u32: no bits for the value): no break, so that the loop has one exit
    if (k32 ? e < (1u << 27) : clen16 == 0) {
      const uint64_t r = SlowValue<DT>(peek, kGroup16 ? Group16Slow(e) : e, ref, lut12);
      good = good && !(r & kSlowError);
      v = uint32_t(r), pos += uint32_t(r >> 32) & 0xFF, has_low = !((r >> 40) & 1);
    } else {
      if (kCheck) {  // d << kDShift (u32) or << kLow16 (u16; a zero's d reads 0); one was not a zero
        dseen = Max(dseen, k32 ? e & (0x7Fu << kDShift) : (0u - out) & 0x7FFFu);
        nonzero |= ~e & (k32 ? kZeroBit : kZero16);
      }
      if (E::kBytes == 2) {
        // the low bits after the code: the window shifted by the entry, whose low 5 bits are the
        // code's length (FunnelR takes it mod 32), put in the entry's low bits by one bit select
        const uint32_t low = FunnelR(peek, 0u, e);
        v = BitSelect(e, low, E::kLowMask) + qadd;
      } else {
        v = out + qadd;
      }
      v = zero ? out : v;
      // the value's bits (u16: the code's, and in 16-bit dtypes a nonzero's low bits)
      pos += k32 ? e >> 27 : clen16 + (E::kBytes == 2 && !(e & kZero16) ? uint32_t(lay.low_bits) : 0u);
    }
    advance(from);
    if (E::kBytes == 4) {  // the 21 low bits after the code (and an escape's q)
      uint32_t low = 0;
      if (has_low) low = FunnelR(cur, next, pos) & E::kLowMask, pos += lay.low_bits, advance(pos - lay.low_bits);
      v = v << 16 | low;
    }
    y[at] = typename Elem<DT>::Word(v);
    at += kWarp;
  }
  // kCheck: every fast value's q = ref - d >= 4 (with ref < 4, only zeros)
  if (kCheck) good = good && (ref < 4 ? !nonzero : dseen <= (ref - 4) << (k32 ? kDShift : Fast<DT>::kLow16));
  *ok = good;
  return pos - pos0;
}

// What DecodeBlock reads a block's code from: the family's first lookups (FamEntry) and the
// group's code, a CTA's 12-bit table (FastEntry, DecodeKernel) or, kWarpGroup, a warp's
// (Group16Entry, AccumulateKernel), with its canonical code for the exact decoder.
struct BlockTables {
  const uint16_t (*fam)[1 << kPeek];
  const uint32_t* group;
  const uint16_t* group16;
  const GroupCode* code;
};

// §2, §3: block b, by its warp, into y (value i at y[i], as elements: the block's in
// DecodeKernel's output, or AccumulateKernel's row slot in shared memory). `in` may lie anywhere:
// the stream's words are read from it rounded down to 4 bytes (mis bytes before it). Returns the
// block's Status (the same in every lane).
template <int DT, bool kWarpGroup>
__device__ inline int DecodeBlock(const uint8_t* in, int mis, int64_t size, int64_t nb, int64_t b, int count,
                                  const v6::BlockPlan& p, int plan_status, int table_status, const BlockTables& t,
                                  const Tables* tables, typename Elem<DT>::Word* y) {
  using E = Elem<DT>;
  const int lane = LaneId();
  if (plan_status != kOk) return plan_status;
  const uint8_t* body = in + v6::data_offset(nb) + p.start;
  if (p.d.raw) {
    for (int i = lane; i < count; i += kWarp) y[i] = typename E::Word(load_element(body + i * E::kBytes, E::kBytes));
    return kOk;
  }
  const bool group = p.d.code == uint32_t(v6::kGroupCode);
  if (group && table_status != kOk) return table_status;
  const int c = int(2 * p.d.code + p.d.flip);
  // the lanes (format6.h locate_lanes): a lane a deviation, a warp scan
  const uint32_t bytes = p.end - p.start, end = 8 * bytes;
  BitReader r{body, bytes, 0, end};
  uint32_t f;
  if (!r.take(3, &f)) return kErrBody;
  int width = int(f) + kWidthShort;
  if (f == 7) {
    if (!r.take(5, &f) || f < 1 || f > uint32_t(kMaxWidth)) return kErrBody;
    width = int(f);
  }
  const uint32_t head = r.pos + uint32_t((kWarp - 1) * width), base = v6::length_base(bytes, head);
  int64_t mine = 0;
  if (lane < kWarp - 1) {
    const uint32_t at = r.pos + uint32_t(lane * width);
    const uint32_t v = at < end ? BitReader{body, bytes, at, end}.peek(width) : 0u;
    mine = int64_t(base) + int64_t(v) - ((v >> (width - 1)) ? int64_t(1) << width : 0);
  }
  const int64_t after = WarpInclusiveScan(mine), last = __shfl_sync(kAll, after, kWarp - 1);
  const bool bad = __ballot_sync(kAll, mine < 0) != 0;
  if (bad || head > end || head + last > end) return kErrBody;
  const uint32_t from = head + uint32_t(after - mine), len = lane < kWarp - 1 ? uint32_t(mine) : end - from;
  // the lane's elements
  const int values = count > lane ? (count - lane + kWarp - 1) / kWarp : 0;
  const int64_t bit = 8 * (int64_t(body - in) + mis) + from;  // from the aligned words
  const uint8_t* aligned = in - mis;
  const uint16_t* lut12 = group ? nullptr : tables->lut12[c];
  // the fast path where `values` values of the most bits stay in the stream's whole words and no
  // class's q exceeds q_max; it accepts a lane that decoded and ended where it must, else
  // DecodeLane decodes it again
  const uint32_t ref = p.d.ref;
  uint32_t used = 0;
  int st = kOk;
  bool ok = ref < E::kLay.q_max && bit / 32 + 2 + (31 + int64_t(values) * kMaxValueBits<DT>) / 32 < (size + mis) / 4;
  const bool fast = ok;
  if (ok) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(aligned);
    // (a group code holds the classes its group's values took: at the group's ref, or at a block's
    // own ref at or over the others', none gives q < 4, and no value is checked)
    const bool check = ref < (group ? t.code->safe_ref : uint32_t(v6::kMaxD + 4));
    const uint64_t at = uint64_t(bit);
    constexpr uint32_t kGroupMask = kLutSize - 1, kFamMask = (1u << kPeek) - 1;
    if (group && kWarpGroup)
      used = check ? FastLane<DT, true, true>(words, at, ref, t.group16, kGroupMask, lut12, y, lane, values, &ok)
                   : FastLane<DT, false, true>(words, at, ref, t.group16, kGroupMask, lut12, y, lane, values, &ok);
    else if (group)
      used = check ? FastLane<DT, true, false>(words, at, ref, t.group, kGroupMask, lut12, y, lane, values, &ok)
                   : FastLane<DT, false, false>(words, at, ref, t.group, kGroupMask, lut12, y, lane, values, &ok);
    else
      used = check ? FastLane<DT, true, false>(words, at, ref, t.fam[c], kFamMask, lut12, y, lane, values, &ok)
                   : FastLane<DT, false, false>(words, at, ref, t.fam[c], kFamMask, lut12, y, lane, values, &ok);
    ok = ok && (lane < kWarp - 1 ? used == len : used <= len);
  }
  if (!ok) {  // the lane's values written again
    const uint64_t r = DecodeLane<DT>(aligned, size + mis, bit, len, ref, lut12, *t.code, y, lane, values);
    st = int(uint32_t(r)), used = uint32_t(r >> 32);
    // FastLane refuses only a lane DecodeLane refuses (they decode the same values). (4: the host
    // emulation's strict mode, in which a lane FastLane refused is refused, so that its tests see
    // every lane of a valid stream take the fast path: a refusal there is no error, only slow.)
    if (ZC_INJECTED(4) && fast && st == kOk) st = kErrBitstream;
  }
  if (st == kOk && lane < kWarp - 1) st = used == len ? kOk : kErrTrailing;  // format6.h lane_end_status
  if (st == kOk && lane == kWarp - 1) {
    const uint32_t pos = from + used;
    st = (pos + 7) / 8 != bytes || ((pos & 7) && (body[pos / 8] >> (pos & 7))) ? kErrTrailing : kOk;
  }
  const unsigned failed = __ballot_sync(kAll, st != kOk);  // the first failing lane's
  return failed ? __shfl_sync(kAll, st, __popc((failed & (0u - failed)) - 1)) : kOk;
}

// §1: a stream's header against dtype DT and n, and its length against size. Returns a Status;
// *flags its flags.
template <int DT>
__device__ __forceinline__ int StreamStatus(const uint8_t* in, int64_t size, int64_t n, int* flags) {
  const int64_t nb = (n + kBlock - 1) / kBlock;
  int st = v6::check_header(in, size, DT, n, flags);
  if (st == kOk && (*flags & kFlagStoredRaw) && size - kHeaderBytes < n * Elem<DT>::kBytes) st = kErrTruncated;
  if (st == kOk && !(*flags & kFlagStoredRaw) && size < v6::data_offset(nb)) st = kErrTruncated;
  return st;
}

// The family's decode tables (Tables::fam, built at compile time) into shared memory, 16 bytes a
// load (every thread of a CTA of `threads`; a barrier follows).
template <int DT>
__device__ __forceinline__ void LoadFamily(uint16_t (*fam)[1 << kPeek], const Tables* tables, int threads) {
  constexpr int kWords = int(sizeof(Tables::fam[0]) / sizeof(Words4));
  const Words4* src = reinterpret_cast<const Words4*>(tables->fam[DT - 1]);
  Words4* dst = reinterpret_cast<Words4*>(fam);
  for (int i = int(threadIdx.x); i < kWords; i += threads) dst[i] = src[i];
}

// Batch j (blocks 8 j .. 8 j + 7, half a group) of a coded stream at `in` (any alignment, size
// bytes, nb blocks), a warp a block, by every thread of the CTA: the blocks' plans, the group's
// table when a block takes it (s.group; *built: the 2 group + flip it holds, -1 none), block b
// decoded into y + 4096 b. A failing block's verdict goes to *status by atomicMin.
template <int DT>
__device__ inline void DecodeBatch(DecodeSmem& s, const uint8_t* in, int64_t size, int64_t n, int64_t j,
                                   const Tables* tables, typename Elem<DT>::Word* y, unsigned long long* status,
                                   int64_t* built, int* table_status) {
  using E = Elem<DT>;
  const int w = WarpIdx(), lane = LaneId(), mis = int(reinterpret_cast<uintptr_t>(in) % 4);
  const int64_t nb = (n + kBlock - 1) / kBlock, b = j * kDecodeWarps + w;
  const int count = b < nb ? int(Min<int64_t>(kBlock, n - b * kBlock)) : 0;
  v6::BlockPlan p{};
  const int plan_status = b < nb ? v6::plan_block(in, size, nb, b, count, E::kLay, &p) : kErrDescriptor;
  const bool group = b < nb && plan_status == kOk && !p.d.raw && p.d.code == uint32_t(v6::kGroupCode);
  if (lane == 0) s.need[w] = group ? 1u << p.d.flip : 0u, s.table_at[w] = p.table_at;
  __syncthreads();
  uint32_t needs = 0, at = 0;
  for (int i = kDecodeWarps - 1; i >= 0; --i) needs |= s.need[i], at = s.need[i] ? s.table_at[i] : at;
  // a round per group code the batch's blocks read (its flip; both only in a hostile stream), the
  // other blocks in the first
  bool decoded = false;
  for (int f = 0; f < 2; ++f) {
    if (needs ? !((needs >> f) & 1) : f == 1) continue;
    const int64_t key = 2 * (b / kGroupBlocks) + f;  // the same in every thread: a batch is in one group
    if (needs && *built != key) *table_status = BuildGroupTable<DT>(s, in + v6::data_offset(nb) + at, f), *built = key;
    if (b < nb && (group ? p.d.flip == uint32_t(f) : !decoded)) {
      const BlockTables t{s.fam, s.group, nullptr, &s.code};
      const int bs = DecodeBlock<DT, false>(in, mis, size, nb, b, count, p, plan_status, *table_status, t, tables,
                                            y + b * kBlock);
      if (bs != kOk && lane == 0) atomicMin(status, (unsigned long long)(b + 1) << 8 | (unsigned long long)bs);
    }
    decoded = true;
    __syncthreads();  // before the table is rebuilt, or the next batch's plans
  }
}

// Decodes `items` streams of n elements, item i at in + i * pitch (size bytes each, any
// alignment), into y + i * n; status[i] (set to ~0 before) receives the stream's verdict.
// grid = items x a run of CTAs per item (persistent: each loops over its share of the batches).
template <int DT>
__global__ void __launch_bounds__(kDecodeThreads, kDecodeMinCtas) DecodeKernel(const uint8_t* in, int64_t pitch,
                                                               int64_t size, int64_t n, int64_t items,
                                                               const Tables* tables, typename Elem<DT>::Word* y,
                                                               unsigned long long* status) {
  using E = Elem<DT>;
  ZC_SHARED(DecodeSmem, s);
  const int tid = int(threadIdx.x);
  const int64_t ctas = gridDim.x / items, item = blockIdx.x / ctas, cta = blockIdx.x % ctas;
  in += item * pitch, y += item * n, status += item, tables = TablesOr(tables);
  const int64_t nb = (n + kBlock - 1) / kBlock;
  int flags = 0;
  const int st = StreamStatus<DT>(in, size, n, &flags);
  if (st != kOk) {
    if (cta == 0 && tid == 0) atomicMin(status, (unsigned long long)st);
    return;
  }
  if (flags & kFlagStoredRaw) {
    const uint8_t* src = in + kHeaderBytes;
    const bool aligned = reinterpret_cast<uintptr_t>(src) % E::kBytes == 0;
    for (int64_t i = cta * int64_t(kDecodeThreads) + tid; i < n; i += ctas * kDecodeThreads)
      y[i] = aligned ? reinterpret_cast<const typename E::Word*>(src)[i]
                     : typename E::Word(load_element(src + i * E::kBytes, E::kBytes));
    return;
  }
  LoadFamily<DT>(s.fam, tables, kDecodeThreads);
  __syncthreads();
  const int64_t batches = (nb + kDecodeWarps - 1) / kDecodeWarps, per = (batches + ctas - 1) / ctas;
  int64_t built = -1;  // 2 group + flip of the code s.group holds
  int table_status = kOk;
  for (int64_t j = cta * per; j < Min<int64_t>(batches, (cta + 1) * per); ++j)
    DecodeBatch<DT>(s, in, size, n, j, tables, y, status, &built, &table_status);
}

// A warp's group code (AccumulateKernel, a warp a row): its 12-bit table, each code's entry by
// canonical index (the table's fill reads them), and the canonical code. 16-bit dtypes take
// DecodeKernel's u32 entries (FastEntry: fewer instructions a value); float32 u16 ones
// (Group16Entry), so that 8 row warps' tables and slots of float32 blocks fit 227 KB.
template <int DT>
struct WarpCode {
  using Entry = std::conditional_t<Elem<DT>::kBytes == 2, uint32_t, uint16_t>;
  static constexpr bool k32 = sizeof(Entry) == 4;
  alignas(16) Entry lut[kLutSize];
  Entry entry[v6::kNumSyms];
  GroupCode code;
};
static_assert(sizeof(WarpCode<kBF16>) % 16 == 0 && sizeof(WarpCode<kF32>) % 16 == 0,
              "each warp's table 16-byte aligned (FillByDoubling's copies)");

// §4 by one warp: checks the group table at `table` (122 bytes, in the stream) and writes its
// canonical code to g, each code's entry (by canonical index) to entry and each length's first
// index to from (every lane's), read with the sign inverted if flip (BuildGroupTable's, for a
// warp: lane l holds symbols 8 l .. 8 l + 7; the codes of each length counted a byte each in
// three words and ranked by one warp scan of each). Every lane of the warp calls it; g and entry
// may be in shared or global memory (only written). Returns a Status.
template <int DT, typename Entry>
__device__ inline int WarpGroupCode(Entry* entry, GroupCode& g, const uint8_t* table, int flip,
                                    uint32_t (&from)[kMaxCodeLen + 2]) {
  constexpr int kPer = 256 / kWarp;  // symbols a lane
  const int lane = LaneId();
  // the lane's symbols are one sign's classes 8 (lane % 16) .. + 7, whose lengths are 4 bytes of the
  // table (two a byte: 122 a sign), the 4th a byte only for classes 120 and 121
  const int cls0 = kPer * (lane % 16), at = ((lane / 16) ^ flip) * (v6::kTableBytes / 2) + cls0 / 2;
  uint32_t len[kPer], kraft = 0, longest = 0, safe = 0;
  uint64_t nibbles = 0;  // per length l, this lane's codes of length l (at most 8) at nibble l - 1
#pragma unroll
  for (int j = 0; j < kPer; j += 2) {
    const uint32_t byte = cls0 + j <= v6::kClassEsc ? table[at + j / 2] : 0u;  // (cls0 + j even: then both valid)
    len[j] = byte & 15u, len[j + 1] = byte >> 4;
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    longest = Max(longest, len[j]), safe = Max(safe, SafeRefOf(uint32_t(kPer * lane + j), len[j]));
    if (len[j] - 1u < uint32_t(kMaxCodeLen))
      kraft += 1u << (kMaxCodeLen - len[j]), nibbles += 1ull << (4 * (len[j] - 1));
  }
  uint32_t count[3];  // the nibbles as bytes: length l's count is byte (l - 1) % 4 of word (l - 1) / 4
#pragma unroll
  for (int q = 0; q < 3; ++q) {
    const uint32_t x = uint32_t(nibbles >> (16 * q)) & 0xFFFFu;
    count[q] = (x & 0xFu) | (x & 0xF0u) << 4 | (x & 0xF00u) << 8 | (x & 0xF000u) << 12;
  }
  kraft = RedAdd(kraft), longest = RedMax(longest), safe = RedMax(safe);
  if (longest > uint32_t(kMaxCodeLen) || kraft == 0 || kraft > uint32_t(kLutSize)) return kErrGroupTable;
  // per length l (byte (l - 1) % 4 of word (l - 1) / 4, at most 244 each): the codes in lower lanes, in all
  uint32_t below[3], total[3];
#pragma unroll
  for (int q = 0; q < 3; ++q) {
    const uint32_t incl = WarpInclusiveScan(count[q]);
    below[q] = incl - count[q], total[q] = __shfl_sync(kAll, incl, kWarp - 1);
  }
  // canonical (by (length, symbol), as CanonicalCode): length l's first code and index, warp-uniform,
  // kept by lane l for the symbols' shuffles
  uint32_t first = 0, coded = 0, first_l = 0, from_l = 0;
  from[0] = 0;
#pragma unroll
  for (int l = 1; l <= kMaxCodeLen; ++l) {
    from[l] = coded;
    if (lane == l) first_l = first, from_l = coded;
    const uint32_t codes = total[(l - 1) / 4] >> (8 * ((l - 1) % 4)) & 0xFFu;
    first = (first + codes) << 1, coded += codes;
  }
  // a symbol's rank among the codes of its length: those of lower lanes (below's byte), then this
  // lane's lower symbols (a symbol without a code gets garbage, never stored)
  uint32_t code[kPer], index[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const uint32_t l = len[j], b = l - 1, word = b < 4 ? below[0] : b < 8 ? below[1] : below[2];
    uint32_t rank = word >> (8 * (b % 4)) & 0xFFu;
#pragma unroll
    for (int i = 0; i < j; ++i) rank += len[i] == l;
    code[j] = __shfl_sync(kAll, first_l, int(l)) + rank, index[j] = __shfl_sync(kAll, from_l, int(l)) + rank;
  }
  from[kMaxCodeLen + 1] = coded;
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (len[j]) {
      const int sym = kPer * lane + j;
      g.order[index[j]] = uint8_t(sym), g.olen[index[j]] = uint8_t(len[j]);
      g.start[index[j]] = uint16_t(code[j] << (kMaxCodeLen - len[j]));
      entry[index[j]] = sizeof(Entry) == 4 ? FastEntry<DT>(uint32_t(sym), len[j]) : Group16Entry<DT>(uint32_t(sym), len[j]);
    }
  if (lane == 0) g.kraft = kraft, g.coded = coded, g.start[coded] = uint16_t(kraft), g.safe_ref = safe;  // start[coded]: the end
  return kOk;
}

// WarpGroupCode and the 12-bit table into t (a warp's, in shared memory). Returns a Status.
template <int DT>
__device__ inline int BuildWarpGroupTable(WarpCode<DT>& t, const uint8_t* table, int flip) {
  uint32_t from[kMaxCodeLen + 2];
  const int status = WarpGroupCode<DT>(t.entry, t.code, table, flip, from);
  if (status != kOk) return status;
  __syncwarp();
  FillByDoubling<kWarp>(t.lut, t.entry, t.code, from, LaneId(), [] { __syncwarp(); });
  return kOk;
}

// The reduce step's CUDA blocks: kRowWarps warps, each decoding one row's block at a time into
// its slot; the 256 threads then add the slots in row order, 16 sums each.
constexpr int kRowWarps = 8, kSumThreads = kWarp * kRowWarps, kSumsPerThread = kBlock / kSumThreads;

// The blocks whose rows AccumulateKernel decodes at once with `row_warps` row warps: as many as
// the row warps hold all k rows of (a warp a row and block), else one (rounds of row_warps rows).
__host__ __device__ __forceinline__ int SumSpan(int64_t k, int row_warps) {
  return k > 0 && k <= row_warps / 2 ? int(row_warps / k) : 1;
}
constexpr size_t kFamBytes = sizeof(uint16_t) * kCombos * (1 << kPeek);

// AccumulateKernel's dynamic shared memory with `row_warps` row warps: the family's first
// lookups, then per row warp its WarpCode, then per row warp its slot (a block's elements).
constexpr size_t WarpCodeBytes(int elem_bytes) {
  return elem_bytes == 2 ? sizeof(WarpCode<kBF16>) : sizeof(WarpCode<kF32>);
}
constexpr size_t SumSmemBytes(int row_warps, int elem_bytes) {
  return kFamBytes + size_t(row_warps) * (WarpCodeBytes(elem_bytes) + size_t(kBlock) * size_t(elem_bytes));
}
static_assert(kFamBytes % 16 == 0 && WarpCodeBytes(2) % 16 == 0 && WarpCodeBytes(4) % 16 == 0,
              "the slots are 16-byte aligned (AddSlots' loads)");
static_assert(SumSmemBytes(kRowWarps, 2) <= 232448 && SumSmemBytes(kRowWarps, 4) <= 232448,
              "8 rows fit the 227 KB an H100's CUDA block may have");

// The reduce step of more rows than row warps (a warp decodes several rows of each block, so it
// would build each group code once a row and block): each row's group codes are worked out once,
// a warp a group by WarpCodesKernel, into the workspace (WarpGroupCode's entries, code and first
// indices, ~2 KB a group and row), and a row warp loads them and fills its 12-bit table (~470
// warp instructions where the whole build is ~1,290: docs/GPU.md, "Tenth version"). status:
// WarpGroupCode's, or kNotCached where the group's first block does not give a table (no block
// of the group plans with one; a row warp that needs one builds it).
constexpr int kNotCached = -1;
template <int DT>
struct alignas(16) CachedCode {
  typename WarpCode<DT>::Entry entry[v6::kNumSyms];
  GroupCode code;
  uint32_t from[kMaxCodeLen + 2];
  int32_t status;
};
static_assert(offsetof(WarpCode<kBF16>, code) == offsetof(WarpCode<kBF16>, entry) + sizeof(WarpCode<kBF16>::entry) &&
                  offsetof(WarpCode<kF32>, code) == offsetof(WarpCode<kF32>, entry) + sizeof(WarpCode<kF32>::entry) &&
                  offsetof(CachedCode<kBF16>, code) == sizeof(CachedCode<kBF16>::entry) &&
                  offsetof(CachedCode<kF32>, code) == sizeof(CachedCode<kF32>::entry) &&
                  (sizeof(WarpCode<kF32>::entry) + sizeof(GroupCode)) % 4 == 0,
              "a cached code's entries and code are one run of words, as a warp's");
inline int64_t CodeCacheBytes(int dtype, int64_t items, int64_t k, int64_t n) {
  const int64_t groups = ((n + kBlock - 1) / kBlock + kGroupBlocks - 1) / kGroupBlocks;
  return k > kRowWarps ? items * k * groups * int64_t(dtype == kF32 ? sizeof(CachedCode<kF32>) : sizeof(CachedCode<kBF16>))
                       : 0;
}

// A warp a row and group: its CachedCode (items x k rows, ng groups each, in that order). grid =
// (items k ng + kRowWarps - 1) / kRowWarps CUDA blocks of kSumThreads.
template <int DT>
__global__ void __launch_bounds__(kSumThreads) WarpCodesKernel(const uint8_t* const* rows, int64_t size, int64_t k,
                                                               int64_t n, int64_t items, CachedCode<DT>* cache) {
  const int64_t nb = (n + kBlock - 1) / kBlock, ng = (nb + kGroupBlocks - 1) / kGroupBlocks;
  const int64_t job = int64_t(blockIdx.x) * kRowWarps + WarpIdx();
  if (job >= items * k * ng) return;
  CachedCode<DT>& c = cache[job];
  const uint8_t* in = rows[job / ng];
  int flags = 0, status = kNotCached;
  uint32_t at = 0, from[kMaxCodeLen + 2] = {};
  // (the table plan_block gives each of the group's blocks that take its code, if it gives one)
  if (StreamStatus<DT>(in, size, n, &flags) == kOk && !(flags & kFlagStoredRaw) &&
      v6::group_table_at(in, size, nb, job % ng * kGroupBlocks, &at))
    status = WarpGroupCode<DT>(c.entry, c.code, in + v6::data_offset(nb) + at, 0, from);
  if (LaneId() == 0) {
    for (int l = 0; l < kMaxCodeLen + 2; ++l) c.from[l] = from[l];
    c.status = status;
  }
}

// A row warp's table from its CachedCode c (status not kNotCached): the entries and the code
// copied, the 12-bit table filled. Returns the code's Status.
template <int DT>
__device__ inline int LoadWarpGroupTable(WarpCode<DT>& t, const CachedCode<DT>& c) {
  constexpr int kWords = int((sizeof(t.entry) + sizeof(GroupCode)) / 4);
  const uint32_t* src = reinterpret_cast<const uint32_t*>(c.entry);
  uint32_t* dst = reinterpret_cast<uint32_t*>(t.entry);
  const int status = c.status;
  if (status != kOk) return status;
  for (int i = LaneId(); i < kWords; i += kWarp) dst[i] = src[i];
  uint32_t from[kMaxCodeLen + 2];
#pragma unroll
  for (int l = 0; l < kMaxCodeLen + 2; ++l) from[l] = c.from[l];
  __syncwarp();
  FillByDoubling<kWarp>(t.lut, t.entry, t.code, from, LaneId(), [] { __syncwarp(); });
  return kOk;
}

// Row r's block b (count elements) by one warp into slot: the row's header, its block plan,
// the warp's group table when the block takes the group's code (built again only when the row,
// the group or the flip changed: *built holds the key; from the row's CachedCodes where codes is
// not null, the group's and the flip 0), DecodeBlock. A row whose header fails
// leaves the slot as it was (CTA 0 reported it; the item's sums are poisoned). Returns the
// block's Status.
template <int DT>
__device__ inline int DecodeRowBlock(const uint8_t* in, int64_t size, int64_t n, int64_t b, int count, int64_t r,
                                     WarpCode<DT>& wc, const uint16_t (*fam)[1 << kPeek], const Tables* tables,
                                     const CachedCode<DT>* codes, typename Elem<DT>::Word* slot, int64_t* built,
                                     int* table_status) {
  using E = Elem<DT>;
  const int64_t nb = (n + kBlock - 1) / kBlock, ng = (nb + kGroupBlocks - 1) / kGroupBlocks;
  int flags = 0;
  if (StreamStatus<DT>(in, size, n, &flags) != kOk) return kOk;
  if (flags & kFlagStoredRaw) {
    for (int i = LaneId(); i < count; i += kWarp)
      slot[i] = typename E::Word(load_element(in + kHeaderBytes + (b * kBlock + i) * E::kBytes, E::kBytes));
    return kOk;
  }
  v6::BlockPlan p{};
  const int plan_status = v6::plan_block(in, size, nb, b, count, E::kLay, &p);
  if (plan_status == kOk)  // the record's lines into L1 while the table is built and the lanes located
    for (uint32_t at = p.start + 128u * uint32_t(LaneId()); at < p.end; at += 128u * kWarp)
      PrefetchL1(in + v6::data_offset(nb) + at);
  if (plan_status == kOk && !p.d.raw && p.d.code == uint32_t(v6::kGroupCode)) {
    const int64_t key = 2 * (r * ng + b / kGroupBlocks) + p.d.flip;
    if (*built != key) {
      const CachedCode<DT>* c = codes && !p.d.flip ? codes + b / kGroupBlocks : nullptr;
      *table_status = c && c->status != kNotCached
                          ? LoadWarpGroupTable<DT>(wc, *c)
                          : BuildWarpGroupTable<DT>(wc, in + v6::data_offset(nb) + p.table_at, int(p.d.flip));
      *built = key;
    }
  }
  const int mis = int(reinterpret_cast<uintptr_t>(in) % 4);
  constexpr bool k32 = WarpCode<DT>::k32;  // DecodeKernel's entries (kWarpGroup: Group16Entry's)
  BlockTables t{fam, nullptr, nullptr, &wc.code};
  if constexpr (k32) t.group = wc.lut;
  else t.group16 = wc.lut;
  return DecodeBlock<DT, !k32>(in, mis, size, nb, b, count, p, plan_status, *table_status, t, tables, slot);
}

// A thread's 16 sums of a block: elements Index(tid, j), j < 16, a 16-byte load's worth of
// adjacent elements (8 bf16 or fp16, 4 fp32) from each 4 KB of the slot, so that a warp's loads
// are 512 consecutive bytes (no bank conflict) and a thread's 16 values take 2 (fp32 4) loads.
template <int DT>
struct SumSlot {
  static constexpr int kAdjacent = 16 / Elem<DT>::kBytes, kLoads = kSumsPerThread / kAdjacent, kWords = 4 * kLoads;
  __device__ __forceinline__ static int Index(int tid, int j) {
    return (j / kAdjacent) * (kSumThreads * kAdjacent) + tid * kAdjacent + j % kAdjacent;
  }
};

// Element j's bits of a thread's 16, from its loads' words (two elements a word for bf16 and fp16).
template <int DT>
__device__ __forceinline__ uint32_t SlotElement(const uint32_t (&words)[SumSlot<DT>::kWords], int j) {
  if constexpr (Elem<DT>::kBytes == 4) return words[j];
  else return j % 2 ? words[j / 2] >> 16 : words[j / 2] & 0xFFFFu;
}

// An element as a float32 by the hardware's widening: bf16 a shift, fp16 the half-to-float
// conversion (ZC_F16_TO_F32: exact but for a NaN's payload, which AddSlots restores), fp32 its bits.
template <int DT>
__device__ __forceinline__ float WidenFast(const uint32_t (&words)[SumSlot<DT>::kWords], int j) {
  if constexpr (DT == kBF16) return bits_to_f32(j % 2 ? words[j / 2] & 0xFFFF0000u : words[j / 2] << 16);
  else if constexpr (DT == kF16) return ZC_F16_TO_F32(SlotElement<DT>(words, j));
  else return bits_to_f32(words[j]);
}

// A thread's 16 words' worth of slot s (SumSlot's elements), two 16-byte loads (fp32 four).
template <int DT>
__device__ __forceinline__ void LoadSlot(const typename Elem<DT>::Word* slot,
                                         uint32_t (&words)[SumSlot<DT>::kWords]) {
#pragma unroll
  for (int m = 0; m < SumSlot<DT>::kLoads; ++m) {
    const Words4 v = reinterpret_cast<const Words4*>(slot)[m * kSumThreads + threadIdx.x];
    words[4 * m] = v.x, words[4 * m + 1] = v.y, words[4 * m + 2] = v.z, words[4 * m + 3] = v.w;
  }
}

// One round's `here` slots added in slot order to the thread's sums `from` (first: slot 0's values
// are the sums), into sum: by the GPU's add and widening, or (kExact) by FORMAT.md §7's rule
// (add_f32) with each value widened exactly (element_to_f32).
template <int DT, bool kExact>
__device__ __forceinline__ void AddRound(const typename Elem<DT>::Word* slots, int here, bool first,
                                         const float (&from)[kSumsPerThread], float (&sum)[kSumsPerThread]) {
  uint32_t words[SumSlot<DT>::kWords];
#pragma unroll
  for (int j = 0; j < kSumsPerThread; ++j) sum[j] = from[j];
  for (int s = 0; s < here; ++s) {
    LoadSlot<DT>(slots + s * kBlock, words);
#pragma unroll
    for (int j = 0; j < kSumsPerThread; ++j) {
      const float f = kExact ? element_to_f32(DT, SlotElement<DT>(words, j)) : WidenFast<DT>(words, j);
      sum[j] = first && s == 0 ? f : kExact ? add_f32(sum[j], f) : ZC_FADD(sum[j], f);
    }
  }
}

// The `here` slots' values (this thread's 16 of each, SumSlot's) added in slot order to the
// thread's sums in float32 (first: slot 0's values are the sums). A sum is the GPU's add, the
// IEEE sum with subnormals kept, unless it is a NaN, where FORMAT.md §7's rule (add_f32) differs,
// and an fp16 NaN's payload may not survive the hardware's widening. A NaN stays a NaN through
// later adds, so one test of the 16 sums after all the slots finds any: then the thread adds
// the slots again from its sums before them, by the rule and with each value widened exactly
// (rare: a branch, not the rule's selects for every value).
template <int DT>
__device__ __forceinline__ void AddSlots(const typename Elem<DT>::Word* slots, int here, bool first,
                                         float (&acc)[kSumsPerThread]) {
  float sum[kSumsPerThread];
  AddRound<DT, false>(slots, here, first, acc, sum);
  bool nan = false;
#pragma unroll
  for (int j = 0; j < kSumsPerThread; ++j) nan = nan || sum[j] != sum[j];
  if (nan && !ZC_INJECTED(3))  // (3: the GPU's add and widening alone, which the NaN tests must catch)
    AddRound<DT, true>(slots, here, first, acc, sum);
#pragma unroll
  for (int j = 0; j < kSumsPerThread; ++j) acc[j] = sum[j];
}

// The reduce step (FORMAT.md §7) without the decoded rows in memory: `items` items of k rows,
// row r of item i at rows[i k + r] (size bytes each, any alignment), each a stream of n
// elements. A CUDA block takes one block b (4,096 elements) at a time through the item's rows:
// its row warps (row_warps <= 8, as shared memory allows) decode rows r0 .. r0 + row_warps - 1
// of block b into their slots at once, then every thread adds the slots' values, in row order,
// to its 16 float32 sums in registers (add_f32; the first row's value is the sum), and so on to
// the last row; the sums are rounded once into out + i n (out_dtype: float32 or DT). So the rows
// are decoded in parallel (row_warps of them), and the sums of a block never leave the SM.
// verdicts[i k + r] (~0 before) receives row r's verdict. codes: the rows' CachedCodes
// (WarpCodesKernel's) or null. kBlocks (SumSpan(k, row_warps) > 1: k <= row_warps / 2): a round
// decodes all k rows of `span` = row_warps / k blocks at once (warp w: row w % k of block b + w / k)
// and adds each block's k slots (a kernel of its own: no sums live across its decodes, so that
// neither kernel spills). grid = items x a run of CUDA blocks per item, each looping over its
// share of the blocks. At most 128 registers (launch bounds of two CTAs an SM), so that shared
// memory alone bounds its CTAs an SM.
template <int DT, bool kBlocks>
__global__ void __launch_bounds__(kSumThreads, 2) AccumulateKernel(
    const uint8_t* const* rows, int64_t size, int64_t k, int64_t n, int64_t items, int row_warps,
    const Tables* tables, const CachedCode<DT>* codes, int out_dtype, uint8_t* out, unsigned long long* verdicts) {
  using E = Elem<DT>;
  ZC_DYNAMIC_SHARED(smem);
  auto* fam = reinterpret_cast<uint16_t (*)[1 << kPeek]>(smem);
  WarpCode<DT>* wcs = reinterpret_cast<WarpCode<DT>*>(smem + kFamBytes);
  auto* slots = reinterpret_cast<typename E::Word*>(smem + kFamBytes + size_t(row_warps) * sizeof(WarpCode<DT>));
  const int tid = int(threadIdx.x), w = WarpIdx(), lane = LaneId();
  const int64_t ctas = gridDim.x / items, item = blockIdx.x / ctas, cta = blockIdx.x % ctas;
  const int out_bytes = out_dtype == kF32 ? 4 : 2;
  rows += item * k, out += item * n * out_bytes, verdicts += item * k, tables = TablesOr(tables);
  const int64_t ng = ((n + kBlock - 1) / kBlock + kGroupBlocks - 1) / kGroupBlocks;
  if (codes) codes += item * k * ng;
  if (cta == 0)  // every row's header (n = 0 too), once
    for (int64_t r = tid; r < k; r += kSumThreads) {
      int flags = 0;
      const int st = StreamStatus<DT>(rows[r], size, n, &flags);
      if (st != kOk) atomicMin(&verdicts[r], (unsigned long long)st);
    }
  LoadFamily<DT>(fam, tables, kSumThreads);
  __syncthreads();
  const int span = kBlocks ? SumSpan(k, row_warps) : 1;  // blocks a round
  const int64_t nb = (n + kBlock - 1) / kBlock, per = ((nb + ctas - 1) / ctas + span - 1) / span * span;
  const int64_t end = Min<int64_t>(nb, (cta + 1) * per);
  const auto store = [&](int64_t b, const float (&sums)[kSumsPerThread]) {  // block b's sums, rounded
    const int count = int(Min<int64_t>(kBlock, n - b * kBlock));
#pragma unroll
    for (int j = 0; j < kSumsPerThread; ++j) {
      const int i = SumSlot<DT>::Index(tid, j);
      if (i < count) store_element(out + (b * kBlock + i) * out_bytes, f32_to_element(out_dtype, sums[j]), out_bytes);
    }
  };
  // warp w decodes row r of block bw into its slot, then a barrier
  int64_t built = -1;  // the key of the code in the warp's table (DecodeRowBlock)
  int table_status = kOk;
  const auto decode = [&](int64_t bw, int64_t r) {
    if (bw < end && r < k) {
      const int count = int(Min<int64_t>(kBlock, n - bw * kBlock));
      const int bs = DecodeRowBlock<DT>(rows[r], size, n, bw, count, r, wcs[w], fam, tables,
                                        codes ? codes + r * ng : nullptr, slots + w * kBlock, &built, &table_status);
      if (bs != kOk && lane == 0) atomicMin(&verdicts[r], (unsigned long long)(bw + 1) << 8 | (unsigned long long)bs);
    }
    __syncthreads();
  };
  // (a slot's values past its block's count are garbage, never stored)
  if constexpr (kBlocks) {
    const int kk = int(k), wb = w / kk;  // the warp's block in a round (its row: w % kk)
    for (int64_t b = cta * per; b < end; b += span) {
      decode(wb < span ? b + wb : end, w % kk);
      for (int q = 0; q < span && b + q < end; ++q) {  // each block's k slots, its sums stored at once
        float acc[kSumsPerThread] = {};
        AddSlots<DT>(slots + q * kk * kBlock, kk, true, acc);
        store(b + q, acc);
      }
      __syncthreads();  // before the slots are written again
    }
  } else {
    for (int64_t b = cta * per; b < end; ++b) {
      float acc[kSumsPerThread] = {};
      for (int64_t r0 = 0; r0 < k; r0 += row_warps) {
        decode(w < row_warps ? b : end, r0 + w);
        AddSlots<DT>(slots, int(Min<int64_t>(row_warps, k - r0)), r0 == 0, acc);
        __syncthreads();  // before the slots are written again
      }
      store(b, acc);
    }
  }
}

}  // namespace cuda6
}  // namespace zipccl
