#include "codec_cpu.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "decode_cpu.h"
#include "encode_cpu.h"

namespace zipccl {
namespace {

// The choices for one group of blocks (FORMAT.md §7 steps 1-3).
struct GroupCode {
  uint8_t refs[kGroupBlocks];
  uint8_t lens[kMaxSyms];
  int mask;  // §1: planes, SIGN, ZEROS, OWN_REFS
  uint8_t plane_lens[kMaxPlanes][kPlaneSyms];
};

// §7 step 2 with the shared (CUDA) functions of zipccl_format.h.
void choose_group_generic(int dtype, const uint8_t* in, int64_t n, int64_t b0, int64_t b1, GroupCode* g) {
  const Layout lay = layout_of(dtype);
  uint32_t emax[kGroupBlocks], gmax = 0;
  int64_t count = 0;
  for (int64_t b = b0; b < b1; ++b) {
    emax[b - b0] = block_emax(dtype, in + b * kBlock * lay.elem_bytes, block_count(n, b));
    gmax = emax[b - b0] > gmax ? emax[b - b0] : gmax;
    count += block_count(n, b);
  }
  static thread_local uint8_t lens[kCandidates][kMaxSyms];
  uint64_t cost[kCandidates];
  for (int c = 0; c < kCandidates; ++c) {
    uint32_t counts[kMaxSyms] = {};
    const int mask = candidate_mask(c);
    int64_t implied = 0;
    for (int64_t b = b0; b < b1; ++b)
      implied += add_symbol_counts(dtype, in + b * kBlock * lay.elem_bytes, block_count(n, b),
                                   (c & 1) ? emax[b - b0] : gmax, mask, counts);
    cost[c] = ~uint64_t(0);
    if (c >= 4 && zero_candidate_skipped(c, lay, count, count - implied)) continue;
    code_lengths(counts, lens[c], num_symbols(mask));
    cost[c] = code_cost(counts, lens[c], mask, lay, count - implied);
  }
  const int best = best_candidate(cost, count);
  g->mask = candidate_mask(best);
  for (int64_t b = b0; b < b1; ++b) g->refs[b - b0] = uint8_t((best & 1) ? emax[b - b0] : gmax);
  std::memcpy(g->lens, lens[best], kMaxSyms);
}

// Asks for the input lines [p, p + bytes): the next group's, while this one is coded.
void prefetch_input(const uint8_t* p, int64_t bytes) {
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i);
}

int64_t store_raw(int dtype, const uint8_t* in, int64_t n, uint8_t* out) {
  write_header(out, dtype, kFlagStoredRaw, uint64_t(n));
  const int64_t bytes = n * layout_of(dtype).elem_bytes;
  if (bytes) std::memcpy(out + kHeaderBytes, in, size_t(bytes));  // in may be null when n == 0
  return kHeaderBytes + bytes;
}

// A group's mask and the codes of its coded byte planes (into codes).
PlaneCodes plane_codes_of(const GroupCode& g, uint16_t (*codes)[kPlaneSyms]) {
  PlaneCodes pc{};
  pc.mask = g.mask;
  for (int p = 0; p < kMaxPlanes; ++p) {
    if (!((g.mask >> p) & 1)) continue;
    canonical_codes(g.plane_lens[p], codes[p], kPlaneSyms);
    pc.lens[p] = g.plane_lens[p];
    pc.codes[p] = codes[p];
  }
  return pc;
}

// §7 steps 1-3 for group b0 / kGroupBlocks into *g: chosen, or taken from a plan.
template <int DT>
void choose_group(const uint8_t* in, int64_t n, int64_t b0, int64_t b1, bool generic, GroupCode* g,
                  QuarterCounts* quarters = nullptr, uint32_t* emax = nullptr) {
  constexpr Layout lay = Elem<DT>::lay;
  const uint8_t* group_in = in + b0 * kBlock * lay.elem_bytes;
  const int64_t count = n - b0 * kBlock < int64_t(kGroupBlocks) * kBlock ? n - b0 * kBlock
                                                                        : int64_t(kGroupBlocks) * kBlock;
  if (generic) choose_group_generic(DT, in, n, b0, b1, g);
  else choose_group_fast<DT>(in, n, b0, b1, g->refs, g->lens, &g->mask, quarters, emax);
  if constexpr (lay.raw_bytes > 0)
    g->mask |= generic ? choose_planes(DT, group_in, count, g->mask, g->plane_lens)
                       : choose_planes_fast<DT>(group_in, count, g->mask, g->plane_lens);
}

template <int DT>
int64_t compress_typed(const uint8_t* in, int64_t n, uint8_t* out, bool generic, const uint8_t* plan, int64_t cap) {
  constexpr Layout lay = Elem<DT>::lay;
  constexpr int es = lay.elem_bytes;
  const int64_t nb = num_blocks(n), limit = kHeaderBytes + n * es;  // coded ends before limit
  // Only out[0, bound) is written; a stream that needs more (cap < limit) fails with -1.
  const int64_t bound = cap >= 0 && cap < limit ? cap : limit;
  int64_t pos = bodies_offset(nb);
  if (pos > bound && bound < limit) return -1;  // no room for the descriptors and records
  std::vector<uint8_t> tables;  // §1: after the bodies
  uint8_t scratch[kBlock * 4];
  GroupCode g;
  uint16_t codes[kMaxSyms];  // the generic coder's
  uint16_t table[kMaxSyms];  // the fast coder's
  uint16_t plane_codes[kMaxPlanes][kPlaneSyms];
  uint8_t area[kMaxTableBytes];
  for (int64_t b0 = 0; b0 < nb && pos < limit; b0 += kGroupBlocks) {
    const int64_t b1 = b0 + kGroupBlocks < nb ? b0 + kGroupBlocks : nb, gi = b0 / kGroupBlocks;
    if (plan) std::memcpy(&g, plan + gi * sizeof(GroupCode), sizeof(GroupCode));
    else choose_group<DT>(in, n, b0, b1, generic, &g);
    const uint32_t area_bytes =
        write_table_area(g.refs, num_refs(g.mask, int(b1 - b0)), g.lens, g.mask, g.plane_lens, area);
    tables.insert(tables.end(), area, area + area_bytes);
    uint8_t* record = out + records_offset(nb) + kRecordBytes * gi;
    record[0] = uint8_t(g.mask);
    record[1] = uint8_t(area_bytes);
    record[2] = uint8_t(area_bytes >> 8);
    const PlaneCodes pc = plane_codes_of(g, plane_codes);
    const bool shared = generic || (g.mask & 3);  // the fast coder has no byte codes
    if (shared) canonical_codes(g.lens, codes, num_symbols(g.mask));
    else encoder_table(g.lens, num_symbols(g.mask), table);
    for (int64_t b = b0; b < b1 && pos < limit; ++b) {
      const int count = block_count(n, b);
      const bool room = pos + int64_t(count) * es <= bound;
      uint8_t* body = room ? out + pos : scratch;
      const uint8_t* src = in + b * kBlock * es;
      const uint32_t ref = g.refs[(g.mask & kMaskOwnRefs) ? b - b0 : 0];
      if (b + kGroupBlocks < nb) prefetch_input(in + (b + kGroupBlocks) * kBlock * es, kBlock * es);  // the next group
      const uint32_t desc = shared ? encode_block(DT, src, count, ref, g.lens, codes, body, pc)
                                   : encode_block_fast<DT>(src, count, ref, g.mask, table, body);
      const int64_t body_bytes = desc & 0xFFFFu;
      if (pos + body_bytes > bound && bound < limit) return -1;
      if (!room && pos + body_bytes <= limit) std::memcpy(out + pos, scratch, size_t(body_bytes));
      store_descriptor(out + kHeaderBytes + kDescBytes * b, desc);
      pos += body_bytes;
    }
  }
  store_fence();  // the bodies' non-temporal stores (stream_copy) before anyone reads them
  if (pos + int64_t(tables.size()) >= limit) return bound < limit ? -1 : store_raw(DT, in, n, out);
  if (pos + int64_t(tables.size()) > bound) return -1;
  if (!tables.empty()) std::memcpy(out + pos, tables.data(), tables.size());
  write_header(out, DT, 0, uint64_t(n));
  return pos + int64_t(tables.size());
}

// Asks for input bytes [from, from + bytes) (clipped to size) ahead of use.
void prefetch_body(const uint8_t* in, int64_t size, int64_t from, int64_t bytes) {
  for (int64_t i = from; i < from + bytes && i < size; i += 64) __builtin_prefetch(in + i);
}

// A group's decode tables (§5.5), built when one of its coded blocks needs them.
struct GroupTables {
  int64_t group = -1;
  int mask = 0;
  uint8_t refs[kGroupBlocks];
  std::vector<uint16_t> lut;         // the generic decoder's (also with byte codes)
  std::vector<DecodeTable> fast;     // the fast decoder's
  std::vector<uint16_t> plane_luts;  // with byte codes: one per plane
  PlaneCodes pc{};

  // Reads and checks group g's table area (bytes at `at`). Returns a Status.
  int build(const uint8_t* at, uint32_t bytes, int64_t g, int group_mask, int nblocks, bool generic, int version) {
    uint8_t lens[kMaxSyms], plane_lens[kMaxPlanes][kPlaneSyms];
    if (read_table_area(at, bytes, group_mask, nblocks, refs, lens, plane_lens, version) != kOk) return kErrTable;
    mask = group_mask;
    pc = PlaneCodes{};
    pc.mask = mask;
    if (generic || (mask & 3)) {
      lut.resize(kLutSize);
      build_lut(lens, lut.data(), num_symbols(mask));
    } else {
      fast.resize(1);
      build_decode_table(lens, num_symbols(mask), &fast[0]);
    }
    if (mask & 3) plane_luts.resize(kMaxPlanes * kLutSize);  // only byte-coded streams pay for these
    for (int p = 0; p < kMaxPlanes; ++p) {
      if (!((mask >> p) & 1)) continue;
      build_lut(plane_lens[p], &plane_luts[p * kLutSize], kPlaneSyms);
      pc.luts[p] = &plane_luts[p * kLutSize];
    }
    group = g;
    return kOk;
  }
};

template <int DT>
int decompress_typed(const uint8_t* in, int64_t size, int64_t n, int version, int mask_bits, uint8_t* out,
                     bool generic) {
  constexpr int es = Elem<DT>::lay.elem_bytes;
  const int64_t nb = num_blocks(n), ng = num_groups(nb), records = records_offset(nb, version);
  const int64_t bodies = bodies_offset(nb, version);
  if (size < bodies) return kErrTruncated;
  int64_t body_total = 0, table_total = 0;
  for (int64_t g = 0; g < ng; ++g) {
    if (in[records + kRecordBytes * g] & ~mask_bits) return kErrPlanes;
    table_total += in[records + kRecordBytes * g + 1] | (in[records + kRecordBytes * g + 2] << 8);
  }
  for (int64_t b = 0; b < nb; ++b) body_total += load_descriptor(in, b, version, 0) & 0xFFFFu;
  if (size - bodies < body_total + table_total) return kErrTruncated;
  GroupTables tables;
  int64_t pos = bodies, table_at = bodies + body_total, asked = 0, ahead = pos;
  for (int64_t b = 0; b < nb; ++b) {
    for (; asked < nb && asked <= b + 2; ++asked) {  // keep the next two blocks' input coming
      const int64_t bytes = load_descriptor(in, asked, version, 0) & 0xFFFFu;
      prefetch_body(in, size, ahead, bytes);
      ahead += bytes;
    }
    const int64_t g = b / kGroupBlocks;
    const uint8_t* record = in + records + kRecordBytes * g;
    const uint32_t table_bytes = record[1] | (record[2] << 8);
    if (b > 0 && b % kGroupBlocks == 0) table_at += in[records + kRecordBytes * (g - 1) + 1] |
                                                     (in[records + kRecordBytes * (g - 1) + 2] << 8);
    const int count = block_count(n, b);
    const uint32_t desc = load_descriptor(in, b, version, uint32_t(count) * es);
    const uint32_t body_bytes = desc & 0xFFFFu, width = desc >> 16;
    uint8_t* dst = out + b * kBlock * es;
    const uint8_t* body = in + pos;
    pos += body_bytes;
    if (width == 0) {  // §2: a raw block
      if (body_bytes != uint32_t(count) * es) return kErrBlockSize;
      std::memcpy(dst, body, body_bytes);
      continue;
    }
    if (width > uint32_t(kMaxWidth) && width != kWidthInBody) return kErrBlockMode;
    if (body_bytes >= uint32_t(count) * es) return kErrBlockSize;
    if (tables.group != g &&
        tables.build(in + table_at, table_bytes, g, record[0], group_block_count(nb, g), generic, version) != kOk)
      return kErrTable;
    const int mask = tables.mask;
    const uint32_t ref = tables.refs[(mask & kMaskOwnRefs) ? b % kGroupBlocks : 0];
    const int status = (generic || (mask & 3))
        ? decode_coded_block(DT, body, desc, count, ref, tables.lut.data(), tables.pc, dst)
        : decode_block_fast<DT>(body, in + size, desc, count, ref, mask, tables.fast[0], dst);
    if (status != kOk) return status;
  }
  return kOk;
}

// Versions 1-2 (FORMAT.md, "Earlier versions"), with the shared block decoder.
int decompress_v2(int dtype, const uint8_t* in, int64_t size, int64_t n, int flags, int mask_bits, uint8_t* out) {
  const int es = layout_of(dtype).elem_bytes;
  const int64_t nb = num_blocks(n), ng = num_groups(nb);
  const uint8_t* masks = in + kHeaderBytes + 4 * nb;  // with kFlagMasks only
  const auto mask_of = [&](int64_t g) { return (flags & kFlagMasks) ? int(masks[g]) : 0; };
  int64_t pos = tables_offset_v2(nb, flags);
  if (size < pos) return kErrTruncated;
  for (int64_t g = 0; g < ng; ++g) {
    if (mask_of(g) & ~mask_bits) return kErrPlanes;
    pos += group_table_bytes_v2(mask_of(g));
  }
  if (size < pos) return kErrTruncated;
  std::vector<uint16_t> luts(3 * kLutSize);
  int64_t table_at = tables_offset_v2(nb, flags), built = -1;
  bool ok = false;
  PlaneCodes pc{};
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t g = b / kGroupBlocks;
    if (b > 0 && b % kGroupBlocks == 0) table_at += group_table_bytes_v2(mask_of(g - 1));
    const uint32_t desc = load_u32(in + kHeaderBytes + 4 * b);
    if ((desc >> 24) == 1 && built != g) {  // tables are checked only when a coded block needs them
      uint8_t lens[kMaxSyms];
      built = g;
      pc = PlaneCodes{};
      pc.mask = mask_of(g);
      ok = unpack_table_v2(in + table_at, lens) == kOk;
      if (ok) build_lut(lens, luts.data());
      for (int p = 0, at = kTableBytes; ok && p < kMaxPlanes; ++p) {
        if (!((pc.mask >> p) & 1)) continue;
        ok = unpack_table_v2(in + table_at + at, lens, kPlaneSyms) == kOk;
        if (ok) build_lut(lens, &luts[(1 + p) * kLutSize], kPlaneSyms);
        pc.luts[p] = &luts[(1 + p) * kLutSize];
        at += kPlaneTableBytes;
      }
    }
    const int64_t body_bytes = desc & 0xFFFFu;
    if (body_bytes > size - pos) return kErrTruncated;
    const PlaneCodes none{mask_of(g), {}, {}, {}};
    const int status = decode_block_v2(dtype, in + pos, desc, block_count(n, b), (built == g && ok) ? luts.data() : nullptr,
                                       out + b * kBlock * es, built == g ? pc : none);
    if (status != kOk) return status;
    pos += body_bytes;
  }
  return kOk;
}

// Asks the kernel for huge pages behind [p, p + bytes) before it is written:
// XLA:CPU hands the codec freshly allocated outputs, whose first touch costs
// a fault per 4 KiB page (about 1 ms per MB on the project's VMs) and far
// fewer with 2 MiB pages. Only the 2 MiB-aligned interior of large ranges is
// advised; a refusal (no transparent huge pages, an old kernel) changes
// nothing. ZIPCCL_NO_HUGE_PAGES=1 turns it off.
void advise_huge_pages(uint8_t* p, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  static const bool off = std::getenv("ZIPCCL_NO_HUGE_PAGES") != nullptr;
  constexpr uintptr_t kHuge = uintptr_t(1) << 21;
  if (off || bytes < int64_t(4 * kHuge)) return;
  const uintptr_t from = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t to = (reinterpret_cast<uintptr_t>(p) + uintptr_t(bytes)) & ~(kHuge - 1);
  if (to > from) madvise(reinterpret_cast<void*>(from), to - from, MADV_HUGEPAGE);
#else
  (void)p, (void)bytes;
#endif
}

// §6: the bits of a sub-stream from its counts (qc, under its block's own
// emax, the sign in bit 7; qz: its exact zeros per sign) coded with a ref
// `shift` above that emax, under the group's mask and code lengths.
uint64_t quarter_bits(const uint16_t* qc, const uint32_t* qz, uint32_t shift, int mask, const uint8_t* lens,
                      int exp_bits) {
  const bool sc = mask & kMaskSign, zeros = mask & kMaskZeros;
  uint64_t bits = 0;
  for (uint32_t s = 0; s < 2; ++s) {
    const uint32_t base = sc ? s << kSignBit : 0;
    const uint32_t esc = base | kClassEsc << kTopBits;
    for (uint32_t c = 0; c < uint32_t(kNumClasses); ++c) {
      const uint32_t d = c - 1 + shift;
      const uint32_t c2 = c == kClassZero ? 0 : c == uint32_t(kClassEsc) || d > uint32_t(kMaxDelta) ? kClassEsc : d + 1;
      for (uint32_t t = 0; t < 4; ++t) {
        uint64_t count = qc[s << kSignBit | c << kTopBits | t];
        if (!count) continue;
        if (zeros && c == kClassZero && t == 0) {  // §4.2: the exact zeros are implied, the rest escape
          const uint64_t implied = (sc || s == 0) ? qz[s] : 0;
          bits += implied * lens[base] + (count - implied) * (lens[esc] + exp_bits);
          continue;
        }
        bits += count * (lens[base | c2 << kTopBits | t] + (c2 == uint32_t(kClassEsc) ? exp_bits : 0));
      }
    }
  }
  return bits;
}

// The body bytes of a block whose sub-streams take bits[4] and whose m
// elements store bits (§2, §7 step 4).
int64_t body_bytes(const uint32_t* bits, int m, int count, int mask, int dtype) {
  const GroupLayout gl = group_layout(dtype, mask);
  int32_t devs[kSubstreams - 1];
  uint32_t coded;
  choose_width(bits, gl.stored_bytes(m), count, gl, devs, &coded);
  const int64_t raw = int64_t(count) * gl.lay.elem_bytes;
  return coded < raw ? coded : raw;
}

// The bytes of a group's table area (§5.5).
int64_t table_area_bytes(const GroupCode& g, int nblocks) {
  uint32_t bits = table_bits(g.lens, num_symbols(g.mask), true);
  for (int p = 0; p < kMaxPlanes; ++p) bits += ((g.mask >> p) & 1) ? table_bits(g.plane_lens[p], kPlaneSyms, false) : 0;
  return num_refs(g.mask, nblocks) + (bits + 7) / 8;
}

// compress_stream's length, from each group's choices and each block's
// sub-stream sizes (from its quarters' symbol counts, element by element
// where the group codes byte planes), without coding.
template <int DT>
int64_t stream_bytes_typed(const uint8_t* in, int64_t n, bool generic, uint8_t* plan) {
  constexpr Layout lay = Elem<DT>::lay;
  constexpr int es = lay.elem_bytes;
  const int64_t nb = num_blocks(n), limit = kHeaderBytes + n * es;
  int64_t total = bodies_offset(nb);
  GroupCode g;
  static thread_local QuarterCounts quarters[kGroupBlocks];
  uint32_t emax[kGroupBlocks];
  uint16_t plane_codes[kMaxPlanes][kPlaneSyms];
  for (int64_t b0 = 0; b0 < nb; b0 += kGroupBlocks) {  // every group: the plan must be whole
    const int64_t b1 = b0 + kGroupBlocks < nb ? b0 + kGroupBlocks : nb;
    choose_group<DT>(in, n, b0, b1, generic, &g, quarters, emax);
    if (plan) std::memcpy(plan + (b0 / kGroupBlocks) * sizeof(GroupCode), &g, sizeof(GroupCode));
    total += table_area_bytes(g, int(b1 - b0));
    const PlaneCodes pc = plane_codes_of(g, plane_codes);
    for (int64_t b = b0; b < b1; ++b) {
      const int count = block_count(n, b), q = substream_len(count);
      const uint32_t ref = g.refs[(g.mask & kMaskOwnRefs) ? b - b0 : 0];
      uint32_t bits[kSubstreams] = {};
      int m = count;
      if (generic || (g.mask & 3)) {  // element by element
        m = 0;
        for (int i = 0; i < count; ++i) {
          const uint32_t x = load_element(in + (b * kBlock + i) * es, es);
          bits[i / q] += element_bits(DT, x, ref, g.lens, pc);
          m += stores_bits(x, lay, g.mask);
        }
      } else {
        const QuarterCounts& qc = quarters[b - b0];
        for (int k = 0; k < kSubstreams; ++k) {
          bits[k] = uint32_t(quarter_bits(qc.counts[k], qc.zeros[k], ref - emax[b - b0], g.mask, g.lens, lay.exp_bits));
          if (g.mask & kMaskZeros) m -= qc.zeros[k][0] + ((g.mask & kMaskSign) ? qc.zeros[k][1] : 0);
        }
      }
      total += body_bytes(bits, m, count, g.mask, DT);
    }
  }
  return total >= limit ? limit : total;
}

}  // namespace

int64_t plan_bytes(int64_t n) { return num_groups(num_blocks(n)) * int64_t(sizeof(GroupCode)); }

namespace {
bool lengths_ok(const uint8_t* lens, int nsym) {
  for (int s = 0; s < nsym; ++s)
    if (lens[s] > kMaxCodeLen) return false;
  return check_code(lens, nsym) == kOk;
}
}  // namespace

bool check_plan(int dtype, const uint8_t* plan, int64_t n) {
  const Layout lay = layout_of(dtype);
  const int allowed = kMaskSign | kMaskZeros | kMaskOwnRefs | ((1 << lay.raw_bytes) - 1);
  const int64_t nb = num_blocks(n);
  for (int64_t gi = 0; gi < num_groups(nb); ++gi) {
    GroupCode g;
    std::memcpy(&g, plan + gi * int64_t(sizeof(GroupCode)), sizeof(GroupCode));
    const int64_t blocks = nb - gi * kGroupBlocks < kGroupBlocks ? nb - gi * kGroupBlocks : kGroupBlocks;
    if ((g.mask & ~allowed) || !lengths_ok(g.lens, num_symbols(g.mask))) return false;
    for (int p = 0; p < lay.raw_bytes; ++p)
      if (((g.mask >> p) & 1) && !lengths_ok(g.plane_lens[p], kPlaneSyms)) return false;
    for (int64_t b = 0; b < blocks; ++b)
      if (g.refs[b] >= (1u << lay.exp_bits) - 1) return false;
  }
  return true;
}

int64_t stream_bytes(int dtype, const uint8_t* in, int64_t n, uint8_t* plan, bool generic) {
  if (dtype == kBF16) return stream_bytes_typed<kBF16>(in, n, generic, plan);
  if (dtype == kF16) return stream_bytes_typed<kF16>(in, n, generic, plan);
  return stream_bytes_typed<kF32>(in, n, generic, plan);
}

int64_t compress_stream(int dtype, const uint8_t* in, int64_t n, uint8_t* out, bool generic, const uint8_t* plan,
                        int64_t cap) {
  advise_huge_pages(out, cap >= 0 && cap < max_stream_bytes(n, dtype) ? cap : max_stream_bytes(n, dtype));
  if (dtype == kBF16) return compress_typed<kBF16>(in, n, out, generic, plan, cap);
  if (dtype == kF16) return compress_typed<kF16>(in, n, out, generic, plan, cap);
  return compress_typed<kF32>(in, n, out, generic, plan, cap);
}

int decompress_stream(int dtype, const uint8_t* in, int64_t size, int64_t n, uint8_t* out, bool generic) {
  int version = 0, flags = 0, mask_bits = 0;
  const int status = check_header(in, uint64_t(size), dtype, uint64_t(n), &version, &flags, &mask_bits);
  if (status != kOk) return status;
  advise_huge_pages(out, n * layout_of(dtype).elem_bytes);
  if (flags & kFlagStoredRaw) {
    const int64_t bytes = n * layout_of(dtype).elem_bytes;
    if (size - kHeaderBytes < bytes) return kErrTruncated;
    if (bytes) std::memcpy(out, in + kHeaderBytes, size_t(bytes));
    return kOk;
  }
  if (version < 3) return decompress_v2(dtype, in, size, n, flags, mask_bits, out);
  if (dtype == kBF16) return decompress_typed<kBF16>(in, size, n, version, mask_bits, out, generic);
  if (dtype == kF16) return decompress_typed<kF16>(in, size, n, version, mask_bits, out, generic);
  return decompress_typed<kF32>(in, size, n, version, mask_bits, out, generic);
}

int decompress_accumulate(int dtype, const uint8_t* in, int64_t cap, int64_t k, int64_t n, float* acc) {
  const int es = layout_of(dtype).elem_bytes;
  std::unique_ptr<uint8_t[]> chunk(new uint8_t[size_t(n > 0 ? n * es : 1)]);
  for (int64_t c = 0; c < k; ++c) {
    const int status = decompress_stream(dtype, in + c * cap, cap, n, chunk.get());
    if (status != kOk) return status;
    accumulate_elements(dtype, chunk.get(), n, acc, c == 0);
  }
  return kOk;
}

namespace {

template <int D>
void accumulate_typed(const uint8_t* x, int64_t n, float* acc, bool first) {
  using T = std::conditional_t<D == kF32, uint32_t, uint16_t>;
  constexpr int64_t kTile = 1024;
  T bits[kTile];
  for (int64_t base = 0; base < n; base += kTile) {  // a tile at a time: x need not be aligned
    const int64_t len = std::min(kTile, n - base);
    std::memcpy(bits, x + base * int64_t(sizeof(T)), size_t(len) * sizeof(T));
    float* a = acc + base;
    if (first) {
      for (int64_t i = 0; i < len; ++i) a[i] = element_to_f32(D, bits[i]);
    } else {
      for (int64_t i = 0; i < len; ++i) a[i] = add_f32(a[i], element_to_f32(D, bits[i]));
    }
  }
}

template <int D>
void round_typed(const float* acc, int64_t n, uint8_t* out) {
  using T = std::conditional_t<D == kF32, uint32_t, uint16_t>;
  constexpr int64_t kTile = 1024;
  T bits[kTile];
  for (int64_t base = 0; base < n; base += kTile) {
    const int64_t len = std::min(kTile, n - base);
    for (int64_t i = 0; i < len; ++i) bits[i] = T(f32_to_element(D, acc[base + i]));
    std::memcpy(out + base * int64_t(sizeof(T)), bits, size_t(len) * sizeof(T));
  }
}

}  // namespace

void accumulate_elements(int dtype, const uint8_t* x, int64_t n, float* acc, bool first) {
  if (dtype == kBF16) return accumulate_typed<kBF16>(x, n, acc, first);
  if (dtype == kF16) return accumulate_typed<kF16>(x, n, acc, first);
  return accumulate_typed<kF32>(x, n, acc, first);
}

void round_elements(int dtype, const float* acc, int64_t n, uint8_t* out) {
  if (dtype == kBF16) return round_typed<kBF16>(acc, n, out);
  if (dtype == kF16) return round_typed<kF16>(acc, n, out);
  return round_typed<kF32>(acc, n, out);
}

}  // namespace zipccl
