// The CUDA codec's decompress, accumulate and row kernels (zipccl_cuda.cu's header
// says what runs where).
//
// Included by zipccl_cuda.cu alone (one translation unit for nvcc and for the host
// emulation), after the CUDA runtime or tests/cuda_host_shim.h and its ZC_* macros.
#pragma once

#include <type_traits>

#include "cuda_device.cuh"
#include "zipccl_rows.h"

namespace {

// ---- decompress ----

// What ValidateKernel and TableKernel learn of each stream, for DecodeKernel.
struct StreamInfo {
  int8_t* state;       // [streams] -1 invalid, 0 coded, 1 stored raw
  int64_t* body_at;    // [streams * nb] body offset of each block from the stream start
  int64_t* table_at;   // [streams * ng] offset of each group's table area
  uint8_t* table_ok;   // [streams * ng] the group's table area is valid (§5.5)
  uint8_t* refs;       // [streams * ng * 16] the group's refs (one per block with OWN_REFS, else the first)
  uint16_t* luts;      // [streams * ng * luts_per_group * kLutSize] the symbol code's decode table, then each
                       // coded plane's
  int luts_per_group;  // 1 + the dtype's byte planes
};
constexpr int8_t kCoded = 0, kStoredRaw = 1;
constexpr int kGroupLuts = 1 + zc::kMaxPlanes;

// Each payload row has a status word on the device (0: no error so far). The
// first error wins: the lowest (block, lane) of the row -- the order a serial
// decoder meets them in --, by atomicMax on (kLastPosition - position) above
// the status in bits 0-7; PoisonKernel then keeps only the status.
constexpr uint32_t kLastPosition = 0xFFFFFF;

__device__ void ReportError(uint32_t* status, int64_t row, int64_t block, int lane, int st) {
  const uint32_t position = uint32_t(Min<int64_t>(block * zc::kLanes + lane, kLastPosition));
  atomicMax(&status[row], ((kLastPosition - position) << 8) | uint32_t(st));
}

// §1: a group's table_bytes from its record.
__device__ uint32_t RecordTableBytes(const uint8_t* in, int64_t nb, int64_t g) {
  const uint8_t* r = in + zc::records_offset(nb) + zc::kRecordBytes * g;
  return r[1] | (uint32_t(r[2]) << 8);
}

constexpr int kScanPer = 8;  // ValidateKernel: the sizes each thread sums before a block scan

// at[i] = pos + the sizes before i, for i < count; returns pos + all of them. Each thread sums
// kScanPer consecutive sizes (independent loads, issued together) before one block scan places
// them: a scan step per kScanPer x blockDim.x sizes, not per blockDim.x, so the serial chain over a
// stream's 16K descriptors (64M values) is 16 steps long, not 128.
template <typename SizeOf>
__device__ int64_t PlaceSizes(int64_t count, int64_t pos, int64_t* at, int64_t* sums, SizeOf size_of) {
  for (int64_t i0 = 0; i0 < count; i0 += int64_t(blockDim.x) * kScanPer) {
    const int64_t first = i0 + int64_t(threadIdx.x) * kScanPer;
    uint32_t size[kScanPer];
    int64_t mine = 0, total;
    for (int i = 0; i < kScanPer; ++i) mine += size[i] = first + i < count ? size_of(first + i) : 0;
    int64_t place = pos + BlockExclusiveScan(mine, sums, &total);
    for (int i = 0; i < kScanPer && first + i < count; place += size[i++]) at[first + i] = place;
    pos += total;
  }
  return pos;
}

struct ValidateSmem {
  int64_t sums[kThreads / kWarp];
  unsigned long long first;  // (index << 8) | status of the first failure
  int flags, mask_bits, status;
};

// CUDA block per stream: the header (thread 0), then the group masks, the
// body offsets and the table areas' (scans) and the bounds of all of them,
// as the reference does before decoding any block; the table areas and
// block errors are TableKernel's and DecodeKernel's. Stream s is payload
// row s * row_stride + row_offset. Reads only [row, row + cap).
__global__ void ValidateKernel(int dtype, const uint8_t* payload, int64_t cap, int64_t row_stride,
                               int64_t row_offset, int64_t nstreams, int64_t n, StreamInfo info,
                               uint32_t* status) {
  ZC_SHARED(ValidateSmem, sm);
  const int64_t nb = zc::num_blocks(n), ng = zc::num_groups(nb);
  ZC_FOR_BLOCKS(s, nstreams) {
    const int64_t row = s * row_stride + row_offset;
    const uint8_t* in = payload + row * cap;
    if (threadIdx.x == 0) {
      int st = zc::check_header(in, uint64_t(cap), dtype, uint64_t(n), &sm.flags, &sm.mask_bits);
      const bool raw = sm.flags & zc::kFlagStoredRaw;
      if (st == zc::kOk && raw && zc::max_stream_bytes(n, dtype) > cap) st = zc::kErrTruncated;
      if (st == zc::kOk && !raw && zc::bodies_offset(nb) > cap) st = zc::kErrTruncated;
      sm.status = st;
      sm.first = kNoError;
    }
    __syncthreads();
    if (sm.status == zc::kOk && !(sm.flags & zc::kFlagStoredRaw)) {
      for (int64_t g = threadIdx.x; g < ng; g += blockDim.x)
        if (in[zc::records_offset(nb) + zc::kRecordBytes * g] & ~sm.mask_bits)
          atomicMin(&sm.first, (static_cast<unsigned long long>(g) << 8) | zc::kErrPlanes);
      int64_t pos = zc::bodies_offset(nb);
      pos = PlaceSizes(nb, pos, info.body_at + s * nb, sm.sums,
                       [&](int64_t b) { return zc::load_descriptor(in, b); });
      pos = PlaceSizes(ng, pos, info.table_at + s * ng, sm.sums,
                       [&](int64_t g) { return RecordTableBytes(in, nb, g); });
      __syncthreads();
      if (threadIdx.x == 0 && sm.first == kNoError && pos > cap) sm.first = zc::kErrTruncated;
      __syncthreads();
      if (threadIdx.x == 0 && sm.first != kNoError) sm.status = int(sm.first & 0xFF);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      if (sm.status != zc::kOk) ReportError(status, row, 0, 0, sm.status);
      info.state[s] = sm.status != zc::kOk ? -1 : (sm.flags & zc::kFlagStoredRaw) ? kStoredRaw : kCoded;
    }
    __syncthreads();  // the shared memory is reused by the next stream
  }
}

struct TableSmem {
  uint8_t lens[kThreads / kWarp][kGroupLuts][zc::kMaxSyms];
  uint16_t codes[kThreads / kWarp][zc::kMaxSyms];
  uint8_t area[kThreads / kWarp][zc::kMaxTableBytes];  // the group's table area, copied by its warp
  uint8_t ok[kThreads / kWarp];
};

// Warp per group of every valid coded stream: the warp copies the group's
// table area to shared memory (ValidateKernel has checked that it lies in
// the payload), lane 0 reads and checks it there (refs and stored lengths,
// read_table_area: its serial reads wait on shared memory, not on global
// loads; an area longer than any valid one is read in place, to the same
// verdict), the warp builds the decode tables (build_lut's, a lane per
// symbol) into info.luts.
// Only a coded block makes a group's table matter (§5.5): DecodeKernel
// reports a bad one there.
__global__ void TableKernel(const uint8_t* payload, int64_t cap, int64_t row_stride, int64_t row_offset,
                            int64_t nstreams, int64_t n, StreamInfo info) {
  ZC_SHARED(TableSmem, sm);
  const int64_t nb = zc::num_blocks(n), ng = zc::num_groups(nb), warps = int64_t(gridDim.x) * (blockDim.x / kWarp);
  const int w = WarpId();
  for (int64_t unit = blockIdx.x * int64_t(blockDim.x / kWarp) + w; unit < nstreams * ng; unit += warps) {
    const int64_t s = unit / ng, g = unit % ng;
    if (info.state[s] != kCoded) continue;  // warp-uniform
    const uint8_t* in = payload + (s * row_stride + row_offset) * cap;
    const int mask = in[zc::records_offset(nb) + zc::kRecordBytes * g];
    uint8_t* refs = info.refs + unit * zc::kGroupBlocks;
    const uint32_t bytes = RecordTableBytes(in, nb, g);
    const uint8_t* area = in + info.table_at[unit];
    const bool copied = bytes <= uint32_t(zc::kMaxTableBytes);
    for (uint32_t i = Lane(); copied && i < bytes; i += kWarp) sm.area[w][i] = area[i];
    __syncwarp();
    if (Lane() == 0)
      sm.ok[w] = zc::read_table_area(copied ? sm.area[w] : area, bytes, mask, zc::group_block_count(nb, g), refs,
                                     sm.lens[w][0], reinterpret_cast<uint8_t(*)[zc::kPlaneSyms]>(sm.lens[w][1])) ==
                 zc::kOk;
    __syncwarp();
    const bool ok = sm.ok[w];
    if (Lane() == 0) info.table_ok[unit] = ok;
    for (int t = 0; ok && t < info.luts_per_group; ++t) {
      if (t > 0 && !((mask >> (t - 1)) & 1)) continue;
      const int nsym = t == 0 ? zc::num_symbols(mask) : zc::kPlaneSyms;
      uint16_t* lut = info.luts + (unit * info.luts_per_group + t) * zc::kLutSize;
      for (int i = Lane(); i < zc::kLutSize; i += kWarp) lut[i] = 0;
      if (Lane() == 0) zc::canonical_codes(sm.lens[w][t], sm.codes[w], nsym);
      __syncwarp();
      for (int sym = Lane(); sym < nsym; sym += kWarp) {
        const int len = sm.lens[w][t][sym];
        for (uint32_t fill = 0; len && fill < (1u << (zc::kMaxCodeLen - len)); ++fill)
          lut[sm.codes[w][sym] | (fill << len)] = uint16_t(sym | (len << 8));
      }
      __syncwarp();
    }
  }
}

// §6: reads bits LSB first from bit pos of a lane up to bit end (bits at or
// past it read as 0), as BitReader does, through a 64-bit buffer filled a
// 32-bit aligned word at a time: a load per 32 bits read, where a byte loop
// takes four per peek, and the next word's address never waits on a decoded
// length. The body is at byte `at` of the 4-aligned buffer `words`, which may
// be read up to byte `limit` (words past it read as 0).
class BufferedReader {
 public:
  uint32_t pos;  // bit position in the body
  uint32_t end;  // the bit the lane ends at
  __device__ BufferedReader(const uint8_t* words, uint64_t at, uint64_t limit, uint32_t pos, uint32_t end)
      : pos(pos), end(end), words_(words), limit_(limit), first_(8 * at) {
    const uint64_t bit = 8 * at + pos;
    next_ = bit >> 5;
    buf_ = Load(next_++) >> (bit & 31);
    have_ = 32 - int(bit & 31);
  }
  __device__ uint32_t peek(int len) {  // len <= 32
    if (have_ <= 32) {
      buf_ |= uint64_t(Load(next_++)) << have_;
      have_ += 32;
    }
    const uint32_t left = end - pos;  // end >= pos
    uint32_t x = uint32_t(buf_);
    if (left < 32) x &= (1u << left) - 1;
    return len < 32 ? x & ((1u << len) - 1) : x;
  }
  __device__ bool skip(int len) {
    if (uint32_t(len) > end - pos) return false;
    pos += len;
    buf_ >>= len;
    have_ -= len;
    return true;
  }
  __device__ bool take(int len, uint32_t* v) {
    *v = peek(len);
    return skip(len);
  }
  // FastLane's reads: the buffer after a refill (33 bits or more, not cut at end), a move past len <= 32
  // of its bits with no check against end, and the bit of the body reached (pos is not kept up).
  __device__ uint64_t window() {
    if (have_ <= 32) {
      buf_ |= uint64_t(Load(next_++)) << have_;
      have_ += 32;
    }
    return buf_;
  }
  __device__ void drop(uint32_t len) {
    buf_ >>= len;
    have_ -= int(len);
  }
  __device__ uint32_t reached() const { return uint32_t(32 * next_ - uint64_t(have_) - first_); }

 private:
  __device__ uint32_t Load(uint64_t w) const {  // aligned word w, zero past limit
    if (4 * w + 4 <= limit_) return reinterpret_cast<const uint32_t*>(words_)[w];
    uint32_t v = 0;
    for (uint64_t i = 4 * w; i < limit_ && i < 4 * w + 4; ++i) v |= uint32_t(words_[i]) << (8 * (i - 4 * w));
    return v;
  }
  const uint8_t* words_;
  uint64_t limit_, first_, next_;  // bytes readable; the body's first bit; the next word to load
  uint64_t buf_;  // bits from pos on, have_ of them: more than 32 after a peek (every skip follows a peek of
  int have_;      // at least its length, as in decode_element)
};

// The fast path of a lane. In a group with no coded byte plane (mask bits 0-1 clear: every bfloat16
// group, and the float16 and float32 groups whose planes did not pay, §7 step 2) every field of an
// element sits at a fixed place after its symbol's code, so a 32-bit entry per 12-bit window
// (FastEntryOf) gives all the element's bits but the ref's and the stored fields': an element is one
// table load and shifts of one window, with no check per field. decode_element's checks become three:
// the block's ref exceeds every class less one of the group's codes and fits the exponent field (the
// caller's, once per block: DecodeSmem::dmax), every window had a code (the shortest code length
// seen), and the lane ends where it must. Where one fails, the lane is decoded again through
// decode_element, whose verdict and output stand.
struct FastEntry {
  static constexpr uint32_t kLen = 15;        // bits 0-3: the code's length; 0: no code
  static constexpr int kOffShift = 4;         // bits 4-8: the stored fields' offset (the code, an escape's exponent)
  static constexpr int kTotalShift = 9;       // bits 9-14: the element's bits in its lane (the offset: an implied zero)
  static constexpr uint32_t kRef = 1u << 15;  // classes 1-30: the exponent is the ref less (class - 1)
  static constexpr int kTopShift = 16;        // bits 16-31: the element's top 16 bits the symbol gives, less
                                              // (class - 1) << e_shift (mod 2^16) with kRef
};

// The fast entry of a window from its decode-table entry (symbol | length << 8; build_lut's); *needs:
// the class less one the ref must exceed (-1: none).
__device__ uint32_t FastEntryOf(uint16_t lut_entry, const zc::GroupLayout& gl, int* needs) {
  const uint32_t len = lut_entry >> 8, s = lut_entry & 0xFFu, c = (s >> zc::kTopBits) & (zc::kNumClasses - 1);
  *needs = -1;
  if (!len) return 0;
  const int e_shift = 15 - gl.lay.exp_bits;  // in the top 16 bits (float32's upper half)
  const bool esc = c == uint32_t(zc::kClassEsc), from_ref = !esc && c != uint32_t(zc::kClassZero);
  const uint32_t off = len + (esc ? gl.lay.exp_bits : 0);
  const uint32_t total = zc::implied_symbol(int(s), gl.mask) ? off : off + gl.extra_bits + 8 * gl.stored_planes;
  const uint32_t sign = (gl.mask & zc::kMaskSign) ? s >> zc::kSignBit : 0;
  const uint32_t top = (sign << 15 | (s & 3u) << (e_shift - zc::kTopBits)) - (from_ref ? (c - 1) << e_shift : 0);
  if (from_ref) *needs = int(c - 1);
  return len | off << FastEntry::kOffShift | total << FastEntry::kTotalShift | (from_ref ? FastEntry::kRef : 0) |
         (top & 0xFFFFu) << FastEntry::kTopShift;
}

// Decodes lane k's elements (k, k + 16, ... < count) of a block of a group without coded planes (sign
// coded: SC) into dst (aligned) with the group's fast entries and the block's ref, which exceeds every
// class less one of the entries and fits the exponent field, from r. Returns whether every window had
// a code; the lane's end is the caller's to check (r.reached()).
template <int DT, bool SC>
__device__ bool FastLane(const uint32_t* entries, uint32_t ref, BufferedReader& r, int k, int count, uint8_t* dst) {
  using Element = std::conditional_t<DT == zc::kF32, uint32_t, uint16_t>;
  constexpr int exp_bits = zc::layout_of(DT).exp_bits, e_shift = 15 - exp_bits;  // in the top 16 bits
  constexpr int low_bits = e_shift - zc::kTopBits;  // the stored bits under the top bits
  constexpr int sb = SC ? 0 : 1;                    // the stored sign's
  Element* o = reinterpret_cast<Element*>(dst) + k;
  const uint32_t ref_bits = ref << e_shift;
  uint32_t shortest = FastEntry::kLen;
  for (int i = k; i < count; i += zc::kLanes, o += zc::kLanes) {
    const uint64_t w = r.window();
    const uint32_t entry = entries[uint32_t(w) & (zc::kLutSize - 1)];
    const uint32_t len = entry & FastEntry::kLen, off = (entry >> FastEntry::kOffShift) & 31,
                   total = (entry >> FastEntry::kTotalShift) & 63;
    shortest = Min(shortest, len);
    const uint32_t escaped = (uint32_t(w >> len) & ((1u << exp_bits) - 1)) << e_shift;
    const uint32_t exponent = off != len ? escaped : (entry & FastEntry::kRef) ? ref_bits : 0;
    const uint32_t top = (entry >> FastEntry::kTopShift) + exponent;
    uint32_t f;  // the stored fields: the sign unless SC, the bits under the top bits, float32's low half
    if (DT == zc::kF32) {  // up to 42 bits: the stored fields from a second window
      r.drop(off);
      f = uint32_t(r.window());
      r.drop(total - off);
    } else {
      f = uint32_t(w >> off);
      r.drop(total);
    }
    uint32_t x = top | (f >> sb & ((1u << low_bits) - 1)) | (SC ? 0 : (f & 1u) << 15);
    if (DT == zc::kF32) x = x << 16 | (f >> (sb + low_bits) & 0xFFFFu);
    if (total == off) x = DT == zc::kF32 ? top << 16 : top;  // an implied zero: its sign alone
    *o = Element(x);
  }
  return shortest > 0;
}

struct DecodeSmem {
  int dmax[kThreads / kWarp];  // each warp's largest class less one among the fast entries (-1: none)
  union {
    uint16_t luts[kGroupLuts][zc::kLutSize];  // the group's: symbols, then each coded plane's
    uint32_t fast[zc::kLutSize];              // or, with no coded plane, its fast entries
  };
  uint32_t starts[kDecodeBlocks][zc::kLanes + 1];
  int8_t block_status[kDecodeBlocks];
};

// CUDA block per half group (kDecodeBlocks blocks) of every valid stream of
// dtype DT: the group's decode tables, or its fast entries, in shared memory;
// thread 16 j + k decodes lane k of block j of the half (FastLane, or
// zc::decode_element through a BufferedReader), so that the 16 lanes of a block
// store 16 consecutive elements at each step. Raw blocks are copied by their
// 16 threads, stored-raw streams by all. A block's descriptor and table errors
// count as its lane 0's. Eight CUDA blocks an SM (1,024 threads, 32 warps to
// hide each lane's chain of loads): 64 registers a thread, 25 KB of shared
// memory a block.
template <int DT>
__global__ void __launch_bounds__(kThreads, 8)
    DecodeKernel(const uint8_t* payload, int64_t cap, int64_t row_stride, int64_t row_offset, int64_t nstreams,
                 int64_t n, StreamInfo info, uint8_t* out, uint32_t* status) {
  ZC_SHARED(DecodeSmem, sm);
  constexpr int dtype = DT;
  constexpr zc::Layout lay = zc::layout_of(dtype);
  const int64_t nb = zc::num_blocks(n), ng = zc::num_groups(nb), halves = 2 * ng;
  const int j = threadIdx.x / zc::kLanes, k = threadIdx.x % zc::kLanes;
  ZC_FOR_BLOCKS(unit, nstreams * halves) {
    const int64_t s = unit / halves, g = (unit % halves) / 2, row = s * row_stride + row_offset;
    const int64_t b = g * zc::kGroupBlocks + (unit % 2) * kDecodeBlocks + j, gi = s * ng + g;
    if (info.state[s] < 0 || (unit % 2 && g * zc::kGroupBlocks + kDecodeBlocks >= nb)) continue;  // block-uniform
    const uint8_t* in = payload + row * cap;
    uint8_t* dst = out + (s * n + (b < nb ? b : 0) * zc::kBlock) * lay.elem_bytes;
    if (info.state[s] == kStoredRaw) {  // §1: the elements as they are
      const int64_t first = b * zc::kBlock * lay.elem_bytes, bytes = b < nb ? zc::block_count(n, b) * lay.elem_bytes : 0;
      for (int64_t i = k; i < bytes; i += zc::kLanes) dst[i] = in[zc::kHeaderBytes + first + i];
      continue;
    }
    const int mask = in[zc::records_offset(nb) + zc::kRecordBytes * g];
    const bool table_ok = info.table_ok[gi], fast = !(mask & 3);  // block-uniform: no coded plane
    const zc::GroupLayout gl = zc::group_layout(dtype, mask);
    const uint16_t* group_luts = info.luts + gi * info.luts_per_group * zc::kLutSize;
    if (table_ok && fast) {
      int dmax = -1;
      for (int i = threadIdx.x; i < zc::kLutSize; i += blockDim.x) {
        int needs;
        sm.fast[i] = FastEntryOf(group_luts[i], gl, &needs);
        dmax = Max(dmax, needs);
      }
      dmax = WarpMax(dmax);
      if (Lane() == 0) sm.dmax[WarpId()] = dmax;
    }
    for (int t = 0; table_ok && !fast && t < info.luts_per_group; ++t)
      if (t == 0 || ((mask >> (t - 1)) & 1))
        for (int i = threadIdx.x; i < zc::kLutSize; i += blockDim.x) sm.luts[t][i] = group_luts[t * zc::kLutSize + i];
    const int count = b < nb ? zc::block_count(n, b) : 0;
    const uint32_t size = b < nb ? zc::load_descriptor(in, b) : 0, raw_size = uint32_t(count) * lay.elem_bytes;
    const uint8_t* body = in + (b < nb ? info.body_at[s * nb + b] : 0);
    if (k == 0) {  // the block's checks before its lanes (§2)
      int st = -1;  // -1: a raw block (or none)
      if (b < nb && size != raw_size) {  // the reference's order: the size, the group's tables, the lanes
        st = size > raw_size ? zc::kErrBlockSize : !table_ok ? zc::kErrTable : zc::locate_lanes(body, size, sm.starts[j]);
        if (st != zc::kOk) ReportError(status, row, b, 0, st);
      }
      sm.block_status[j] = int8_t(st);
    }
    __syncthreads();
    if (sm.block_status[j] == -1) {  // §2: a raw block, copied as it is
      for (uint32_t i = k; b < nb && i < raw_size; i += zc::kLanes) dst[i] = body[i];
    } else if (sm.block_status[j] == zc::kOk) {
      const uint32_t ref = info.refs[gi * zc::kGroupBlocks + ((mask & zc::kMaskOwnRefs) ? b % zc::kGroupBlocks : 0)];
      const uint64_t at = uint64_t(body - payload), limit = uint64_t((row + 1) * cap);
      const uint32_t begin = sm.starts[j][k], end = sm.starts[j][k + 1];
      int dmax = -1;
      for (int w = 0; fast && w < kThreads / kWarp; ++w) dmax = Max(dmax, sm.dmax[w]);
      bool done = false;
      const bool aligned = reinterpret_cast<uintptr_t>(dst) % lay.elem_bytes == 0;
      if (fast && int(ref) > dmax && ref < (1u << lay.exp_bits) && aligned) {
        BufferedReader r(payload, at, limit, begin, end);
        done = ((mask & zc::kMaskSign) ? FastLane<DT, true>(sm.fast, ref, r, k, count, dst)
                                       : FastLane<DT, false>(sm.fast, ref, r, k, count, dst)) &&
               zc::lane_end_status(body, k, r.reached(), sm.starts[j]) == zc::kOk;
      }
      if (!done) {  // the fields one by one, each checked: the verdict
        const zc::PlaneCodes pc{mask, {}, {}, {sm.luts[1], sm.luts[2]}};  // fast: no plane table is read
        BufferedReader r(payload, at, limit, begin, end);
        int st = zc::kOk;
        for (int i = k; st == zc::kOk && i < count; i += zc::kLanes)
          st = zc::decode_element(dtype, gl, ref, fast ? group_luts : sm.luts[0], pc, r, dst + i * lay.elem_bytes);
        if (st == zc::kOk) st = zc::lane_end_status(body, k, r.pos, sm.starts[j]);
        if (st != zc::kOk) ReportError(status, row, b, k, st);
      }
    }
    __syncthreads();  // the shared memory is reused by the next unit
  }
}

// The rank-ordered sum of §8 over rows decoded side by side: for each item
// of `items`, k rows of m elements (row j of item i at decoded + ((i * k + j) *
// m) elements); for elements [begin, begin + count) of each item, acc =
// f32(row 0); acc = add_f32(acc, f32(row j)) in row order, stored as
// out_dtype (float32, or rounded to a 16-bit dtype) at out (count elements an
// item) -- each sum once, whatever k. The conversions and the add are the
// shared ones, so sums match the CPU codec bit for bit, NaN payloads and
// signs included (the GPU's own add returns the canonical NaN; add_f32
// applies the format's rule).
__global__ void SumRowsKernel(int dtype, const uint8_t* decoded, int64_t items, int64_t k, int64_t m, int64_t begin,
                              int64_t count, int out_dtype, uint8_t* out) {
  const int eb = zc::layout_of(dtype).elem_bytes, out_eb = zc::layout_of(out_dtype).elem_bytes;
  ZC_FOR_THREADS(e, items * count) {
    const int64_t item = e / count, i = begin + e % count;
    const uint8_t* x = decoded + (item * k * m + i) * eb;
    float acc = zc::element_to_f32(dtype, zc::load_element(x, eb));
    for (int64_t j = 1; j < k; ++j) {
      const float v = zc::element_to_f32(dtype, zc::load_element(x + j * m * eb, eb));
      acc = ZC_INJECTED(3) ? ZC_FADD(acc, v) : zc::add_f32(acc, v);
    }
    zc::store_element(out + e * out_eb, zc::f32_to_element(out_dtype, acc), out_eb);
  }
}

// The end of every decode, CUDA block per item of k payload rows: if a row's
// status word holds an error, the item's whole output becomes all-one bytes
// -- a NaN in bfloat16, float16 and float32, so a result that nobody checks
// cannot pass for data --; then each word keeps only its status (bits 0-7).
__global__ void PoisonKernel(uint32_t* status, int64_t k, int64_t items, uint8_t* out, int64_t item_bytes) {
  ZC_FOR_BLOCKS(item, items) {
    bool corrupt = false;
    for (int64_t j = 0; j < k; ++j) corrupt |= status[item * k + j] != 0;
    __syncthreads();  // every thread has read the words before they are rewritten
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) status[item * k + j] &= 0xFFu;
    for (int64_t i = threadIdx.x; corrupt && i < item_bytes; i += blockDim.x) out[item * item_bytes + i] = 0xFF;
  }
}

// ---- the collectives' rows (zipccl_rows.h) ----

// Up to kSpanLeaves leaves of a flat array: its elements [begin, begin + end[count - 1]).
constexpr int kSpanLeaves = 16;
struct LeafSpan {
  uint8_t* data[kSpanLeaves];
  int64_t end[kSpanLeaves];  // cumulative element counts from begin
  int64_t begin;
  int count;
};

// Moves the span's elements to their places in rows ([k, m], contiguous;
// to_rows) or back from them: thread per element.
__global__ void RowsKernel(zc::RowLayout l, LeafSpan span, int eb, uint8_t* rows, bool to_rows) {
  ZC_FOR_THREADS(e, span.end[span.count - 1]) {
    int leaf = 0;
    while (e >= span.end[leaf]) ++leaf;
    int64_t j, i;
    l.locate(span.begin + e, &j, &i);
    uint8_t* row = rows + (j * l.m + i) * eb;
    uint8_t* x = span.data[leaf] + (e - (leaf ? span.end[leaf - 1] : 0)) * eb;
    for (int b = 0; b < eb; ++b) {
      if (to_rows) row[b] = x[b];
      else x[b] = row[b];
    }
  }
}

// `rows` streams (lengths in sizes) from payload (a row every `pitch` bytes)
// into out at `cap` bytes a row, zeros after each stream. A stream longer
// than cap cannot be chosen by the size consensus (the size pass runs the
// same kernels on the same rows); were it, it is cut, and its decoder
// reports it truncated.
__global__ void CopyRowsKernel(const uint8_t* payload, int64_t pitch, const uint32_t* sizes, int64_t rows,
                               uint8_t* out, int64_t cap) {
  ZC_FOR_THREADS(e, rows * cap) {
    const int64_t r = e / cap, b = e % cap;
    out[e] = b < int64_t(sizes[r]) ? payload[r * pitch + b] : 0;
  }
}

// STORED_RAW streams (FORMAT.md §1) of rows of m elements (contiguous at
// in) into out at `cap` bytes a row, zeros after each.
__global__ void RawRowsKernel(int dtype, const uint8_t* in, int64_t m, int64_t rows, uint8_t* out, int64_t cap) {
  const int64_t body = m * zc::layout_of(dtype).elem_bytes;
  ZC_FOR_THREADS(e, rows * cap) {
    const int64_t r = e / cap, b = e % cap;
    if (b == 0) zc::write_header(out + r * cap, dtype, zc::kFlagStoredRaw, uint64_t(m));
    else if (b >= zc::kHeaderBytes) out[e] = b - zc::kHeaderBytes < body ? in[r * body + b - zc::kHeaderBytes] : 0;
  }
}

}  // namespace
