// The CUDA codec's decompress, accumulate and row kernels (zipccl_cuda.cu's header
// says what runs where).
//
// Included by zipccl_cuda.cu alone (one translation unit for nvcc and for the host
// emulation), after the CUDA runtime or tests/cuda_host_shim.h and its ZC_* macros.
#pragma once

#include "cuda_device.cuh"
#include "zipccl_rows.h"

namespace {

// ---- decompress ----

// What ValidateKernel learns of each stream, for DecodeKernel.
struct StreamInfo {
  int8_t* state;       // [streams] -1 invalid, 0 coded (version 3), 1 stored raw, 2 coded (versions 1-2)
  int64_t* body_at;    // [streams * nb] body offset of each block from the stream start
  int64_t* table_at;   // [streams * ng] offset of each group's tables
  uint8_t* table_ok;   // [streams * ng] versions 1-2: the group's tables are valid (§5.3)
};
constexpr int8_t kCoded = 0, kStoredRaw = 1, kCodedV2 = 2, kCodedV3 = 3;

// Each payload row has a status word on the device (0: no error so far). The
// first error wins: the lowest (block, sub-stream) of the row -- the order a
// serial decoder meets them in --, by atomicMax on (kLastPosition - position)
// above the status in bits 0-7; PoisonKernel then keeps only the status.
constexpr uint32_t kLastPosition = 0xFFFFFF;

__device__ void ReportError(uint32_t* status, int64_t row, int64_t block, int sub, int st) {
  const uint32_t position = uint32_t(Min<int64_t>(block * zc::kSubstreams + sub, kLastPosition));
  atomicMax(&status[row], ((kLastPosition - position) << 8) | uint32_t(st));
}

// Versions 1-2: group g's plane mask in a coded stream with these header flags.
__device__ int StreamMaskV2(const uint8_t* in, int64_t nb, int flags, int64_t g) {
  return (flags & zc::kFlagMasks) ? in[zc::kHeaderBytes + 4 * nb + g] : 0;
}

// Versions 1-2: checks group tables at `at` with mask. Returns a Status.
__device__ int GroupTablesStatusV2(const uint8_t* at, int mask) {
  uint8_t lens[zc::kMaxSyms];
  if (zc::unpack_table_v2(at, lens) != zc::kOk) return zc::kErrTable;
  at += zc::kTableBytes;
  for (int p = 0; p < zc::kMaxPlanes; ++p) {
    if (!((mask >> p) & 1)) continue;
    if (zc::unpack_table_v2(at, lens, zc::kPlaneSyms) != zc::kOk) return zc::kErrTable;
    at += zc::kPlaneTableBytes;
  }
  return zc::kOk;
}

// Versions 3-4, §1: a group's table_bytes from its record.
__device__ uint32_t RecordTableBytes(const uint8_t* in, int64_t nb, int64_t g, int version) {
  const uint8_t* r = in + zc::records_offset(nb, version) + zc::kRecordBytes * g;
  return r[1] | (uint32_t(r[2]) << 8);
}

struct ValidateSmem {
  int64_t sums[kThreads / kWarp];
  unsigned long long first;  // (index << 8) | status of the first failure
  int version, flags, mask_bits, status;
};

// Versions 1-2 of ValidateKernel's stream (see there).
__device__ void ValidateV2(const uint8_t* in, int64_t cap, int64_t s, int64_t nb, int64_t ng,
                                        StreamInfo info, ValidateSmem& sm) {
  int64_t pos = zc::tables_offset_v2(nb, sm.flags), total;
  for (int64_t g0 = 0; g0 < ng; g0 += blockDim.x) {
    const int64_t g = g0 + threadIdx.x;
    const int mask = g < ng ? StreamMaskV2(in, nb, sm.flags, g) : 0;
    if (mask & ~sm.mask_bits) atomicMin(&sm.first, (static_cast<unsigned long long>(g) << 8) | zc::kErrPlanes);
    const int64_t at = BlockExclusiveScan(g < ng ? zc::group_table_bytes_v2(mask) : 0, sm.sums, &total);
    if (g < ng) info.table_at[s * ng + g] = pos + at;
    pos += total;
  }
  if (threadIdx.x == 0 && sm.first == kNoError && pos > cap) sm.first = zc::kErrTruncated;
  for (int64_t g = threadIdx.x; g < ng && pos <= cap; g += blockDim.x)
    info.table_ok[s * ng + g] =
        GroupTablesStatusV2(in + info.table_at[s * ng + g], StreamMaskV2(in, nb, sm.flags, g)) == zc::kOk;
  __syncthreads();
  for (int64_t b0 = 0; b0 < nb && sm.first == kNoError; b0 += blockDim.x) {
    const int64_t b = b0 + threadIdx.x;
    const uint32_t desc = b < nb ? zc::load_u32(in + zc::kHeaderBytes + 4 * b) : 0;
    const int64_t at = pos + BlockExclusiveScan(desc & 0xFFFFu, sm.sums, &total);
    if (b < nb) {
      info.body_at[s * nb + b] = at;
      const int st = (desc >> 24) == 1 && !info.table_ok[s * ng + b / zc::kGroupBlocks] ? zc::kErrTable
                     : int64_t(desc & 0xFFFFu) > cap - at                               ? zc::kErrTruncated
                                                                                       : zc::kOk;
      if (st != zc::kOk) atomicMin(&sm.first, (static_cast<unsigned long long>(b) << 8) | unsigned(st));
    }
    pos += total;
    __syncthreads();  // sm.first, for the loop condition
  }
}

// CUDA block per stream: the header (thread 0), then in version 3 the
// group masks, the body offsets and the table areas' (scans) and the bounds
// of all of them, as the reference does before decoding any block; the
// table areas and block errors are DecodeKernel's.
// Versions 1-2: the masks, the table offsets (a scan), the tables (thread
// per group), the body offsets (a scan) and each block's checks -- its
// group's tables if it is coded, then its bounds; the first failing block in
// stream order is the stream's error, mode, body size and bitstream errors
// are DecodeKernel's. Stream s is payload row s * row_stride + row_offset.
// Reads only [row, row + cap).
__global__ void ValidateKernel(int dtype, const uint8_t* payload, int64_t cap, int64_t row_stride,
                               int64_t row_offset, int64_t nstreams, int64_t n, StreamInfo info,
                               uint32_t* status) {
  ZC_SHARED(ValidateSmem, sm);
  const int64_t nb = zc::num_blocks(n), ng = zc::num_groups(nb);
  ZC_FOR_BLOCKS(s, nstreams) {
    const int64_t row = s * row_stride + row_offset;
    const uint8_t* in = payload + row * cap;
    if (threadIdx.x == 0) {
      int st = zc::check_header(in, uint64_t(cap), dtype, uint64_t(n), &sm.version, &sm.flags, &sm.mask_bits);
      const bool raw = sm.flags & zc::kFlagStoredRaw, v3 = sm.version >= 3;
      if (st == zc::kOk && raw && zc::max_stream_bytes(n, dtype) > cap) st = zc::kErrTruncated;
      if (st == zc::kOk && !raw && (v3 ? zc::bodies_offset(nb, sm.version) : zc::tables_offset_v2(nb, sm.flags)) > cap)
        st = zc::kErrTruncated;
      sm.status = st;
      sm.first = kNoError;
    }
    __syncthreads();
    const bool coded = sm.status == zc::kOk && !(sm.flags & zc::kFlagStoredRaw);
    if (coded && sm.version >= 3) {
      for (int64_t g = threadIdx.x; g < ng; g += blockDim.x)
        if (in[zc::records_offset(nb, sm.version) + zc::kRecordBytes * g] & ~sm.mask_bits)
          atomicMin(&sm.first, (static_cast<unsigned long long>(g) << 8) | zc::kErrPlanes);
      int64_t pos = zc::bodies_offset(nb, sm.version), total;
      for (int64_t b0 = 0; b0 < nb; b0 += blockDim.x) {
        const int64_t b = b0 + threadIdx.x;
        const uint32_t desc = b < nb ? zc::load_descriptor(in, b, sm.version, 0) : 0;
        const int64_t at = pos + BlockExclusiveScan(desc & 0xFFFFu, sm.sums, &total);
        if (b < nb) info.body_at[s * nb + b] = at;
        pos += total;
      }
      for (int64_t g0 = 0; g0 < ng; g0 += blockDim.x) {
        const int64_t g = g0 + threadIdx.x;
        const int64_t at = pos + BlockExclusiveScan(g < ng ? RecordTableBytes(in, nb, g, sm.version) : 0, sm.sums,
                                                    &total);
        if (g < ng) info.table_at[s * ng + g] = at;
        pos += total;
      }
      __syncthreads();
      if (threadIdx.x == 0 && sm.first == kNoError && pos > cap) sm.first = zc::kErrTruncated;
      __syncthreads();  // the table areas are read and checked by DecodeKernel, into its shared memory
      if (threadIdx.x == 0 && sm.first != kNoError) sm.status = int(sm.first & 0xFF);
    } else if (coded) {
      ValidateV2(in, cap, s, nb, ng, info, sm);
      if (threadIdx.x == 0 && sm.first != kNoError) sm.status = int(sm.first & 0xFF);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      if (sm.status != zc::kOk) ReportError(status, row, 0, 0, sm.status);
      info.state[s] = sm.status != zc::kOk                ? -1
                      : (sm.flags & zc::kFlagStoredRaw)    ? kStoredRaw
                      : sm.version == zc::kVersion         ? kCoded
                      : sm.version == 3                    ? kCodedV3
                                                           : kCodedV2;
    }
    __syncthreads();  // the shared memory is reused by the next stream
  }
}

struct DecodeSmem {
  uint16_t luts[1 + zc::kMaxPlanes][zc::kLutSize];  // the symbols', then each plane's
  uint16_t codes[zc::kMaxSyms];
  uint8_t lens[zc::kMaxSyms];
  uint8_t area_lens[1 + zc::kMaxPlanes][zc::kMaxSyms];  // version 3: a group's table area
  uint8_t refs[zc::kGroupBlocks];
  uint8_t stage[kDecodeThreads][kStage * 4];  // each thread's last kStage decoded elements
  int64_t stage_at[kDecodeThreads];            // where in its block they go (bytes)
  int stage_bytes[kDecodeThreads];
  int implied[kDecodeThreads];   // version 3, ZEROS: each sub-stream's implied zeros
  uint32_t end3[zc::kGroupBlocks];  // ... where each block's sub-stream 3 ends
  int8_t ok[kDecodeThreads];     // ... whether each sub-stream decoded
  bool table_ok;                 // version 3: the group's table area is valid
};

// build_lut of zipccl_format.h by a CUDA block, from code lengths in shared
// memory: the threads clear the table, one lane computes the canonical
// codes, a thread per symbol fills its entries.
__device__ void BlockBuildLut(const uint8_t* lens, int nsym, uint16_t* lut, DecodeSmem& sm) {
  for (int w = threadIdx.x; w < zc::kLutSize; w += blockDim.x) lut[w] = 0;
  __syncthreads();
  if (threadIdx.x == 0) zc::canonical_codes(lens, sm.codes, nsym);
  __syncthreads();
  for (int s = threadIdx.x; s < nsym; s += blockDim.x) {
    const int len = lens[s];
    for (uint32_t fill = 0; len && fill < (1u << (zc::kMaxCodeLen - len)); ++fill)
      lut[sm.codes[s] | (fill << len)] = uint16_t(s | (len << 8));
  }
  __syncthreads();
}

// Versions 1-2: the same from a stored table of 4-bit lengths.
__device__ void BlockBuildLutV2(const uint8_t* table, int nsym, uint16_t* lut, DecodeSmem& sm) {
  for (int j = threadIdx.x; j < nsym / 2; j += blockDim.x) {
    sm.lens[2 * j] = table[j] & 15;
    sm.lens[2 * j + 1] = table[j] >> 4;
  }
  __syncthreads();
  BlockBuildLut(sm.lens, nsym, lut, sm);
}

// Stages kStage elements of each thread in shared memory for the CUDA
// block's coalesced store: thread t's elements go to group_out + at.
__device__ void StoreStaged(DecodeSmem& sm, uint8_t* group_out, int elem_bytes) {
  __syncthreads();
  const int row_bytes = kStage * elem_bytes;  // thread t's elements are row t
  for (int idx = threadIdx.x; idx < kDecodeThreads * row_bytes; idx += blockDim.x) {
    const int t = idx / row_bytes, byte = idx % row_bytes;
    if (byte < sm.stage_bytes[t]) group_out[sm.stage_at[t] + byte] = sm.stage[t][byte];
  }
  __syncthreads();
}

// Versions 1-2 of DecodeKernel's group (see there).
__device__ void DecodeGroupV2(int dtype, const uint8_t* in, int64_t s, int64_t g, int64_t row, int64_t n,
                              StreamInfo info, uint8_t* group_out, DecodeSmem& sm, uint32_t* status) {
  const zc::Layout lay = zc::layout_of(dtype);
  const int64_t nb = zc::num_blocks(n), ng = zc::num_groups(nb);
  const int flags = in[6], mask = StreamMaskV2(in, nb, flags, g);
  const bool ok = info.table_ok[s * ng + g];
  if (ok) {
    const uint8_t* table = in + info.table_at[s * ng + g];
    BlockBuildLutV2(table, zc::kNumSyms, sm.luts[0], sm);
    table += zc::kTableBytes;
    for (int p = 0; p < zc::kMaxPlanes; ++p) {
      if (!((mask >> p) & 1)) continue;
      BlockBuildLutV2(table, zc::kPlaneSyms, sm.luts[1 + p], sm);
      table += zc::kPlaneTableBytes;
    }
  }
  const int j = threadIdx.x / zc::kSubstreams, k = threadIdx.x % zc::kSubstreams;
  const int64_t b = g * zc::kGroupBlocks + j;
  const int count = b < nb ? zc::block_count(n, b) : 0, q = zc::substream_len(count);
  const uint32_t desc = b < nb ? zc::load_u32(in + zc::kHeaderBytes + 4 * b) : 0;
  const uint8_t* body = b < nb ? in + info.body_at[s * nb + b] : in;
  uint32_t bounds[zc::kSubstreams + 1] = {};
  int st = zc::kOk;
  bool coded = false;
  if (b < nb && (desc >> 24) == 0) {  // a raw body
    const uint32_t size = desc & 0xFFFFu, part = (size + zc::kSubstreams - 1) / zc::kSubstreams;
    uint8_t* to = group_out + int64_t(j) * zc::kBlock * lay.elem_bytes;
    if (size != uint32_t(count) * lay.elem_bytes) st = zc::kErrBlockSize;
    for (uint32_t i = k * part; st == zc::kOk && i < Min(size, (k + 1) * part); ++i) to[i] = body[i];
  } else if (b < nb && (desc >> 24) != 1) {
    st = zc::kErrBlockMode;
  } else if (b < nb) {
    st = zc::locate_substreams_v2(body, desc & 0xFFFFu, count, zc::group_layout_v2(lay, mask), bounds);
    if (st == zc::kOk && !ok) st = zc::kErrTable;
    coded = st == zc::kOk;
  }
  const zc::PlaneCodes pc{mask, {}, {}, {sm.luts[1], sm.luts[2]}};
  zc::BitReaderV2 r{body + bounds[k], bounds[k + 1] - bounds[k], 0};
  const int begin = k * q, end = Min(count, begin + q);
  for (int i0 = 0; i0 < zc::kBlock / zc::kSubstreams; i0 += kStage) {  // the same rounds for every thread
    int m = 0;
    for (; coded && st == zc::kOk && m < kStage && begin + i0 + m < end; ++m)
      st = zc::decode_element_v2(dtype, body, count, begin + i0 + m, (desc >> 16) & 0xFFu, sm.luts[0], pc, r,
                                 sm.stage[threadIdx.x] + m * lay.elem_bytes);
    sm.stage_bytes[threadIdx.x] = m * lay.elem_bytes;
    sm.stage_at[threadIdx.x] = (int64_t(j) * zc::kBlock + begin + i0) * lay.elem_bytes;
    StoreStaged(sm, group_out, lay.elem_bytes);
  }
  if (coded && st == zc::kOk && !r.finished()) st = zc::kErrTrailing;
  if (st != zc::kOk) ReportError(status, row, b, k, st);
}

// Version 3 of DecodeKernel's group: the group's table area is read into
// shared memory (thread 0) and its decode tables built; thread 4 j + k has
// sub-stream k of block j. A block's descriptor errors and a missing table
// are reported at its sub-stream 0. In a ZEROS group each thread first
// decodes its sub-stream only to count implied zeros (where the stored
// area starts depends on them), then again into the output; otherwise once,
// the stored area's place being known.
__device__ void DecodeGroup(int dtype, const uint8_t* in, int64_t s, int64_t g, int64_t row, int64_t n,
                            StreamInfo info, uint8_t* group_out, DecodeSmem& sm, uint32_t* status) {
  const zc::Layout lay = zc::layout_of(dtype);
  const int version = info.state[s] == kCodedV3 ? 3 : zc::kVersion;
  const int64_t nb = zc::num_blocks(n), ng = zc::num_groups(nb);
  const int mask = in[zc::records_offset(nb, version) + zc::kRecordBytes * g], nblocks = zc::group_block_count(nb, g);
  if (threadIdx.x == 0)
    sm.table_ok = zc::read_table_area(in + info.table_at[s * ng + g], RecordTableBytes(in, nb, g, version), mask,
                                      nblocks, sm.refs, sm.area_lens[0],
                                      reinterpret_cast<uint8_t(*)[zc::kPlaneSyms]>(sm.area_lens[1]),
                                      version) == zc::kOk;
  __syncthreads();
  const bool ok = sm.table_ok;
  if (ok) {
    BlockBuildLut(sm.area_lens[0], zc::num_symbols(mask), sm.luts[0], sm);
    for (int p = 0; p < zc::kMaxPlanes; ++p)
      if ((mask >> p) & 1) BlockBuildLut(sm.area_lens[1 + p], zc::kPlaneSyms, sm.luts[1 + p], sm);
  }
  const int j = threadIdx.x / zc::kSubstreams, k = threadIdx.x % zc::kSubstreams;
  const int64_t b = g * zc::kGroupBlocks + j;
  const int count = b < nb ? zc::block_count(n, b) : 0, q = zc::substream_len(count);
  const uint32_t desc = b < nb ? zc::load_descriptor(in, b, version, uint32_t(count) * lay.elem_bytes) : 0;
  const uint32_t size = desc & 0xFFFFu, width = desc >> 16;
  const uint8_t* body = b < nb ? in + info.body_at[s * nb + b] : in;
  const zc::GroupLayout gl = zc::group_layout(dtype, mask);
  uint32_t starts[zc::kSubstreams + 1] = {};
  int st = zc::kOk;
  bool coded = false;
  if (b < nb && width == 0) {  // a raw body
    const uint32_t part = (size + zc::kSubstreams - 1) / zc::kSubstreams;
    uint8_t* to = group_out + int64_t(j) * zc::kBlock * lay.elem_bytes;
    if (size != uint32_t(count) * lay.elem_bytes) st = k == 0 ? zc::kErrBlockSize : zc::kOk;
    for (uint32_t i = k * part; size == uint32_t(count) * lay.elem_bytes && i < Min(size, (k + 1) * part); ++i)
      to[i] = body[i];
  } else if (b < nb && width > uint32_t(zc::kMaxWidth) && width != zc::kWidthInBody) {
    st = k == 0 ? zc::kErrBlockMode : zc::kOk;
  } else if (b < nb && size >= uint32_t(count) * lay.elem_bytes) {
    st = k == 0 ? zc::kErrBlockSize : zc::kOk;
  } else if (b < nb && !ok) {
    st = k == 0 ? zc::kErrTable : zc::kOk;
  } else if (b < nb) {
    st = zc::locate_substreams(body, size, count, int(width), gl, starts);
    coded = st == zc::kOk;
    if (k != 0) st = zc::kOk;  // a block's error is reported once, at sub-stream 0
  }
  const zc::PlaneCodes pc{mask, {}, {}, {sm.luts[1], sm.luts[2]}};
  const uint32_t ref = sm.refs[(mask & zc::kMaskOwnRefs) ? j : 0];
  const int begin = k * q, end = Min(count, begin + q);
  // Where the stored area starts is known unless the group has ZEROS (or the
  // body is too short for it: then it is corrupt, found after the sub-streams).
  const int64_t at = int64_t(size) - gl.stored_bytes(count);
  const bool two_pass = coded && ((mask & zc::kMaskZeros) || at < 0);
  zc::BitReader r{body, size, starts[k], starts[k + 1]};
  int implied = 0, unused = 0;
  for (int i = begin; two_pass && st == zc::kOk && i < end; ++i)  // the first pass: check and count
    st = zc::decode_element(dtype, gl, ref, sm.luts[0], pc, r, zc::StoredArea{nullptr, 0}, &unused, &implied, nullptr);
  if (two_pass && st == zc::kOk) st = zc::substream_end_status(k, r.pos, starts);
  sm.implied[threadIdx.x] = implied;
  sm.ok[threadIdx.x] = st == zc::kOk;
  if (k == zc::kSubstreams - 1) sm.end3[j] = r.pos;
  __syncthreads();
  bool go = coded && st == zc::kOk;  // whether this thread decodes into the output
  int first = begin;                 // its sub-stream's first stored element
  zc::StoredArea area{body + (at > 0 ? at : 0), count};
  if (two_pass) {
    int m = count;
    for (int i = 0; i < zc::kSubstreams; ++i) {
      m -= sm.implied[zc::kSubstreams * j + i];
      first -= i < k ? sm.implied[zc::kSubstreams * j + i] : 0;
      go = go && sm.ok[zc::kSubstreams * j + i];
    }
    const int area_st = go ? zc::check_stored_area(body, size, sm.end3[j], m, gl, &area) : zc::kOk;
    if (k == zc::kSubstreams - 1 && area_st != zc::kOk) st = area_st;  // after sub-stream 3, once
    go = go && area_st == zc::kOk;
  }
  zc::BitReader w{body, size, starts[k], starts[k + 1]};  // the pass into the output, kStage elements at a time
  int stored = first, zeros = 0;
  for (int i0 = 0; i0 < zc::kBlock / zc::kSubstreams; i0 += kStage) {  // the same rounds for every thread
    int m = 0;
    for (; go && st == zc::kOk && m < kStage && begin + i0 + m < end; ++m)
      st = zc::decode_element(dtype, gl, ref, sm.luts[0], pc, w, area, &stored, &zeros,
                              sm.stage[threadIdx.x] + m * lay.elem_bytes);
    sm.stage_bytes[threadIdx.x] = m * lay.elem_bytes;
    sm.stage_at[threadIdx.x] = (int64_t(j) * zc::kBlock + begin + i0) * lay.elem_bytes;
    StoreStaged(sm, group_out, lay.elem_bytes);
  }
  if (go && !two_pass && st == zc::kOk) {  // the single pass's checks: sub-streams 0-2 end, then the area
    zc::StoredArea checked;
    st = zc::substream_end_status(k, w.pos, starts);
    if (st == zc::kOk && k == zc::kSubstreams - 1) st = zc::check_stored_area(body, size, w.pos, count, gl, &checked);
  }
  if (st != zc::kOk) ReportError(status, row, b, k, st);
}

// CUDA block per group of every valid stream: builds the group's decode
// tables in shared memory, then thread 4 j + k decodes sub-stream k of the
// group's block j, kStage elements at a time into shared memory, from where
// the CUDA block stores them, lanes on consecutive bytes. Raw bodies are
// copied, a quarter per thread; stored-raw streams by all.
__global__ void DecodeKernel(int dtype, const uint8_t* payload, int64_t cap, int64_t row_stride, int64_t row_offset,
                             int64_t nstreams, int64_t n, StreamInfo info, uint8_t* out, uint32_t* status) {
  ZC_SHARED(DecodeSmem, sm);
  const zc::Layout lay = zc::layout_of(dtype);
  const int64_t nb = zc::num_blocks(n), ng = zc::num_groups(nb);
  ZC_FOR_BLOCKS(unit, nstreams * ng) {
    const int64_t s = unit / ng, g = unit % ng, row = s * row_stride + row_offset;
    const uint8_t* in = payload + row * cap;
    const int64_t first = g * zc::kGroupBlocks * zc::kBlock;
    uint8_t* group_out = out + (s * n + first) * lay.elem_bytes;
    if (info.state[s] < 0) continue;
    if (info.state[s] == kStoredRaw) {
      const int64_t bytes = Min<int64_t>(n - first, zc::kGroupBlocks * zc::kBlock) * lay.elem_bytes;
      for (int64_t i = threadIdx.x; i < bytes; i += blockDim.x) group_out[i] = in[zc::kHeaderBytes + first * lay.elem_bytes + i];
      continue;
    }
    if (info.state[s] == kCodedV2) DecodeGroupV2(dtype, in, s, g, row, n, info, group_out, sm, status);
    else DecodeGroup(dtype, in, s, g, row, n, info, group_out, sm, status);
    __syncthreads();  // the shared memory is reused by the next group
  }
}

// §8: acc = f32(x) for row 0, acc = add_f32(acc, f32(x)) after, in row
// order. The conversions and the add are the shared ones, so sums match the
// CPU codec bit for bit, NaN payloads and signs included (the GPU's own add
// returns the canonical NaN; add_f32 applies the format's rule).
__global__ void AccumulateKernel(int dtype, const uint8_t* x, float* acc, int64_t count, bool first) {
  const int eb = zc::layout_of(dtype).elem_bytes;
  ZC_FOR_THREADS(i, count) {
    const float v = zc::element_to_f32(dtype, zc::load_element(x + i * eb, eb));
    acc[i] = first ? v : ZC_INJECTED(3) ? ZC_FADD(acc[i], v) : zc::add_f32(acc[i], v);
  }
}

// Rounds the float32 sums to a 16-bit output dtype (round to nearest even).
__global__ void RoundKernel(const float* acc, int out_dtype, uint16_t* out, int64_t count) {
  ZC_FOR_THREADS(i, count) out[i] = uint16_t(zc::f32_to_element(out_dtype, acc[i]));
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

// The float32 sums into out as out_dtype (float32, or rounded to a 16-bit dtype).
__global__ void StoreSumsKernel(const float* acc, int out_dtype, uint8_t* out, int64_t count) {
  const int eb = zc::layout_of(out_dtype).elem_bytes;
  ZC_FOR_THREADS(i, count) zc::store_element(out + i * eb, zc::f32_to_element(out_dtype, acc[i]), eb);
}

}  // namespace
