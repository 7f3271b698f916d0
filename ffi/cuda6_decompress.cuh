// Format version 6 on CUDA: decompress (docs/FORMAT6.md §2, §3), one kernel
// and no serial prologue.
//
// DecodeKernel<DT>: persistent CTAs of 8 warps, each CTA a run of batches of 8
// blocks (half a group), a warp per block and a thread per lane. The family's
// decode tables (a 10-bit first lookup; the few longer codes from a 12-bit
// table in global memory) are copied to shared memory once per CTA; a group's
// table is checked and its 12-bit decode table built by the CTA when one of
// the batch's blocks takes the group's code (once per group and CTA). Every
// block plans itself from its descriptors (format6.h plan_block), locates its
// lanes (a thread a deviation, a warp scan) and decodes them. A failing block
// reports (block + 1) << 8 | status by atomicMin, a failing header or length
// its status alone: the stream's verdict is the lowest, as the reference's
// first error.
#pragma once

#include "cuda6_device.cuh"

namespace zipccl {
namespace cuda6 {

constexpr int kDecodeWarps = 8, kDecodeThreads = kWarp * kDecodeWarps;

struct DecodeSmem {
  uint16_t fam[kCombos][1 << kPeek];  // Tables::lut10
  uint16_t group[kLutSize];           // the group's code: sym | length << 8, 0 = no code
  uint16_t start[v6::kNumSyms + 1];   // canonical index i's first 12-bit window, MSB first
  uint8_t order[v6::kNumSyms], olen[v6::kNumSyms];
  CanonScratch canon;
  uint32_t kraft, longest;
  uint32_t need[kDecodeWarps], table_at[kDecodeWarps];
};

// §4: checks the group table at `table` (122 bytes, in the stream) and builds
// its decode table, read with the sign inverted if flip (§2: a flip applies to
// any code). Every thread of the CTA (256) calls it. Returns a Status.
__device__ inline int BuildGroupTable(DecodeSmem& s, const uint8_t* table, int flip) {
  const int sym = int(threadIdx.x), cls = sym & (v6::kSignSym - 1);
  const int j = ((sym >> 7) ^ flip) * 122 + cls;  // its length's place among the 244 valid symbols'
  const uint32_t len = cls <= v6::kClassEsc ? (table[j / 2] >> (4 * (j & 1))) & 15u : 0u;
  if (sym == 0) s.kraft = 0, s.longest = 0;
  __syncthreads();
  if (len) atomicAdd(&s.kraft, len <= uint32_t(kMaxCodeLen) ? 1u << (kMaxCodeLen - len) : 0u), atomicMax(&s.longest, len);
  __syncthreads();
  const uint32_t kraft = s.kraft;
  const bool ok = s.longest <= uint32_t(kMaxCodeLen) && kraft != 0 && kraft <= uint32_t(kLutSize);
  uint32_t index;
  const uint32_t code = CanonicalCode(ok ? len : 0u, s.canon, &index);
  if (ok && len) s.order[index] = uint8_t(sym), s.olen[index] = uint8_t(len), s.start[index] = uint16_t(code << (kMaxCodeLen - len));
  __syncthreads();
  if (!ok) return kErrGroupTable;
  // thread t: the 16 windows from 16 t, MSB first; the codes' ranges are consecutive from 0 to kraft
  const uint32_t coded = s.canon.coded, from = 16 * uint32_t(sym);
  uint32_t i = 0;
  for (uint32_t lo = 0, hi = coded; lo + 1 < hi;) {  // the last index starting at or before `from`
    const uint32_t mid = (lo + hi) / 2;
    if (s.start[mid] <= from) lo = mid, i = mid;
    else hi = mid;
  }
  for (uint32_t w = from; w < from + 16; ++w) {
    while (i + 1 < coded && s.start[i + 1] <= w) ++i;
    s.group[Reverse(w, kMaxCodeLen)] = w < kraft ? uint16_t(s.order[i] | s.olen[i] << 8) : 0;
  }
  __syncthreads();
  return kOk;
}

// The 32-bit word idx of the stream, its bytes at or past `size` read as 0.
__device__ __forceinline__ uint32_t StreamWord(const uint8_t* in, int64_t size, int64_t idx) {
  if (4 * idx + 4 <= size) return reinterpret_cast<const uint32_t*>(in)[idx];
  uint32_t v = 0;
  for (int k = 0; k < 4; ++k)
    if (4 * idx + k < size) v |= uint32_t(in[4 * idx + k]) << (8 * k);
  return v;
}

// §3: a lane of `len` bits from stream bit `bit`: `values` elements to y[0],
// y[32], ... The window past the lane's end holds the next lane's bits, which
// decode nothing the reference's zeros would not (a code that fits the lane is
// found the same either way; one that does not fails either way). *used: the
// bits taken. Returns a Status.
template <int DT>
__device__ __forceinline__ int DecodeLane(const uint8_t* in, int64_t size, int64_t bit, uint32_t len, uint32_t ref,
                                          const uint16_t* lut, uint32_t mask, const uint16_t* fallback,
                                          typename Elem<DT>::Word* y, int values, uint32_t* used) {
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
    uint32_t e = lut[uint32_t(buf) & mask];
    if (!(e >> 8) && fallback) e = fallback[uint32_t(buf) & (kLutSize - 1)];
    if (!(e >> 8)) return kErrBitstream;
    const uint32_t clen = e >> 8, sym = e & 0xFF, cls = sym & 127;
    uint32_t q = 0, head = clen;
    if (cls == uint32_t(v6::kClassEsc)) {
      q = uint32_t(buf >> clen) & E::kQMask, head += lay.q_bits;
    } else if (cls != uint32_t(v6::kClassZero)) {
      q = ref - (cls - 1);
      if (!v6::normal_q(q, lay)) return kErrBitstream;
    }
    buf >>= head, held -= int(head), taken += head;
    uint32_t low = 0;
    if (cls != uint32_t(v6::kClassZero)) {
      if (E::kBytes == 4) refill();  // 12 + 10 + 21 bits may exceed the 32 a refill guarantees
      low = uint32_t(buf) & E::kLowMask;
      buf >>= lay.low_bits, held -= lay.low_bits, taken += lay.low_bits;
    }
    if (taken > len) return kErrBitstream;
    y[kWarp * i] = typename E::Word((sym >> 7) << (E::kW - 1) | q << lay.low_bits | low);
  }
  *used = taken;
  return kOk;
}

// §2, §3: block b, by its warp. Returns the block's Status (the same in every lane).
template <int DT>
__device__ inline int DecodeBlock(const uint8_t* in, int64_t size, int64_t nb, int64_t b, int count,
                                  const v6::BlockPlan& p, int plan_status, int table_status, const DecodeSmem& s,
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
  uint32_t used = 0;
  int st = DecodeLane<DT>(in, size, 8 * int64_t(body - in) + from, len, p.d.ref, group ? s.group : s.fam[c],
                          group ? kLutSize - 1 : (1u << kPeek) - 1, group ? nullptr : tables->lut12[c], y + lane,
                          values, &used);
  if (st == kOk && lane < kWarp - 1) st = used == len ? kOk : kErrTrailing;  // format6.h lane_end_status
  if (st == kOk && lane == kWarp - 1) {
    const uint32_t pos = from + used;
    st = (pos + 7) / 8 != bytes || ((pos & 7) && (body[pos / 8] >> (pos & 7))) ? kErrTrailing : kOk;
  }
  const unsigned failed = __ballot_sync(kAll, st != kOk);  // the first failing lane's
  return failed ? __shfl_sync(kAll, st, __popc((failed & (0u - failed)) - 1)) : kOk;
}

template <int DT>
__global__ void __launch_bounds__(kDecodeThreads) DecodeKernel(const uint8_t* in, int64_t size, int64_t n,
                                                               const Tables* tables, typename Elem<DT>::Word* y,
                                                               unsigned long long* status) {
  using E = Elem<DT>;
  ZC_SHARED(DecodeSmem, s);
  const int tid = int(threadIdx.x), w = WarpIdx(), lane = LaneId();
  const int64_t nb = (n + kBlock - 1) / kBlock;
  int flags = 0;
  int st = v6::check_header(in, size, DT, n, &flags);
  if (st == kOk && (flags & kFlagStoredRaw) && size - kHeaderBytes < n * E::kBytes) st = kErrTruncated;
  if (st == kOk && !(flags & kFlagStoredRaw) && size < v6::data_offset(nb)) st = kErrTruncated;
  if (st != kOk) {
    if (blockIdx.x == 0 && tid == 0) atomicMin(status, (unsigned long long)st);
    return;
  }
  if (flags & kFlagStoredRaw) {
    const typename E::Word* src = reinterpret_cast<const typename E::Word*>(in + kHeaderBytes);
    for (int64_t i = blockIdx.x * int64_t(kDecodeThreads) + tid; i < n; i += int64_t(gridDim.x) * kDecodeThreads)
      y[i] = src[i];
    return;
  }
  for (int i = tid; i < kCombos * (1 << kPeek); i += kDecodeThreads) s.fam[i >> kPeek][i & ((1 << kPeek) - 1)] = tables->lut10[i >> kPeek][i & ((1 << kPeek) - 1)];
  __syncthreads();
  const int64_t batches = (nb + kDecodeWarps - 1) / kDecodeWarps, per = (batches + gridDim.x - 1) / gridDim.x;
  int64_t built = -1;  // 2 group + flip of the code s.group holds
  int table_status = kOk;
  for (int64_t j = blockIdx.x * per; j < Min<int64_t>(batches, (blockIdx.x + 1) * per); ++j) {
    const int64_t b = j * kDecodeWarps + w;
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
      if (needs && built != key) table_status = BuildGroupTable(s, in + v6::data_offset(nb) + at, f), built = key;
      if (b < nb && (group ? p.d.flip == uint32_t(f) : !decoded)) {
        const int bs = DecodeBlock<DT>(in, size, nb, b, count, p, plan_status, table_status, s, tables, y + b * kBlock);
        if (bs != kOk && lane == 0) atomicMin(status, (unsigned long long)(b + 1) << 8 | (unsigned long long)bs);
      }
      decoded = true;
      __syncthreads();  // before the table is rebuilt, or the next batch's plans
    }
  }
}

}  // namespace cuda6
}  // namespace zipccl
