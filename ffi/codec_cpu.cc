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

#include "encode_cpu.h"
#include "lanes_cpu.h"

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
void choose_group(const uint8_t* in, int64_t n, int64_t b0, int64_t b1, bool generic, GroupCode* g) {
  constexpr Layout lay = Elem<DT>::lay;
  const uint8_t* group_in = in + b0 * kBlock * lay.elem_bytes;
  const int64_t count = n - b0 * kBlock < int64_t(kGroupBlocks) * kBlock ? n - b0 * kBlock
                                                                        : int64_t(kGroupBlocks) * kBlock;
  if (generic) choose_group_generic(DT, in, n, b0, b1, g);
  else choose_group_fast<DT>(in, n, b0, b1, g->refs, g->lens, &g->mask);
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
  uint16_t codes[kMaxSyms];
  uint16_t plane_codes[kMaxPlanes][kPlaneSyms];
  uint8_t area[kMaxTableBytes];
  static thread_local LaneCoder coder;  // its word arrays are large: not on the stack
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
    canonical_codes(g.lens, codes, num_symbols(g.mask));
    const bool fast = !generic && coder.prepare<DT>(g.lens, codes, pc);
    for (int64_t b = b0; b < b1 && pos < limit; ++b) {
      const int count = block_count(n, b);
      const bool room = pos + int64_t(count) * es <= bound;
      uint8_t* body = room ? out + pos : scratch;
      const uint8_t* src = in + b * kBlock * es;
      const uint32_t ref = g.refs[(g.mask & kMaskOwnRefs) ? b - b0 : 0];
      if (b + kGroupBlocks < nb) prefetch_input(in + (b + kGroupBlocks) * kBlock * es, kBlock * es);  // the next group
      const int64_t body_bytes = fast ? coder.encode<DT>(src, count, ref, body)
                                      : encode_block(DT, src, count, ref, g.lens, codes, body, pc);
      if (pos + body_bytes > bound && bound < limit) return -1;
      if (!room && pos + body_bytes <= limit) std::memcpy(out + pos, scratch, size_t(body_bytes));
      store_descriptor(out + kHeaderBytes + kDescBytes * b, uint32_t(body_bytes));
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
  std::vector<uint16_t> luts;  // the symbol code's, then each coded plane's
  LaneDecoder fast;            // the fast decoder's tables, when it takes the group
  bool use_fast = false;
  PlaneCodes pc{};

  // Reads and checks group g's table area (bytes at `at`). Returns a Status.
  template <int DT>
  int build(const uint8_t* at, uint32_t bytes, int64_t g, int group_mask, int nblocks, bool generic) {
    uint8_t lens[kMaxSyms], plane_lens[kMaxPlanes][kPlaneSyms];
    if (read_table_area(at, bytes, group_mask, nblocks, refs, lens, plane_lens) != kOk) return kErrTable;
    mask = group_mask;
    pc = PlaneCodes{};
    pc.mask = mask;
    luts.resize((1 + kMaxPlanes) * kLutSize);
    build_lut(lens, luts.data(), num_symbols(mask));
    for (int p = 0; p < kMaxPlanes; ++p) {
      if (!((mask >> p) & 1)) continue;
      build_lut(plane_lens[p], &luts[(1 + p) * kLutSize], kPlaneSyms);
      pc.luts[p] = &luts[(1 + p) * kLutSize];
    }
    use_fast = !generic && fast.prepare<DT>(luts.data(), pc);
    group = g;
    return kOk;
  }
};

template <int DT>
int decompress_typed(const uint8_t* in, int64_t size, int64_t n, int mask_bits, uint8_t* out, bool generic) {
  constexpr int es = Elem<DT>::lay.elem_bytes;
  const int64_t nb = num_blocks(n), ng = num_groups(nb), records = records_offset(nb), bodies = bodies_offset(nb);
  if (size < bodies) return kErrTruncated;
  int64_t body_total = 0, table_total = 0;
  for (int64_t g = 0; g < ng; ++g) {
    if (in[records + kRecordBytes * g] & ~mask_bits) return kErrPlanes;
    table_total += in[records + kRecordBytes * g + 1] | (in[records + kRecordBytes * g + 2] << 8);
  }
  for (int64_t b = 0; b < nb; ++b) body_total += load_descriptor(in, b);
  if (size - bodies < body_total + table_total) return kErrTruncated;
  static thread_local GroupTables tables;  // its decoder's tables are large: not on the stack
  tables.group = -1;
  int64_t pos = bodies, table_at = bodies + body_total, asked = 0, ahead = pos;
  const auto table_bytes_of = [&](int64_t g) { return uint32_t(in[records + kRecordBytes * g + 1] |
                                                               (in[records + kRecordBytes * g + 2] << 8)); };
  for (int64_t b = 0; b < nb;) {
    for (; asked < nb && asked <= b + 2 + LaneDecoder::kRun; ++asked) {  // keep the next blocks' input coming
      const int64_t bytes = load_descriptor(in, asked);
      prefetch_body(in, size, ahead, bytes);
      ahead += bytes;
    }
    const int64_t g = b / kGroupBlocks;
    if (b > 0 && b % kGroupBlocks == 0) table_at += table_bytes_of(g - 1);
    const int count = block_count(n, b);
    const uint32_t body_bytes = load_descriptor(in, b);
    uint8_t* dst = out + b * kBlock * es;
    const uint8_t* body = in + pos;
    if (body_bytes == uint32_t(count) * es) {  // §2: a raw block
      std::memcpy(dst, body, body_bytes);
      pos += body_bytes, ++b;
      continue;
    }
    if (body_bytes > uint32_t(count) * es) return kErrBlockSize;
    if (tables.group != g && tables.build<DT>(in + table_at, table_bytes_of(g), g, in[records + kRecordBytes * g],
                                              group_block_count(nb, g), generic) != kOk)
      return kErrTable;
    // A run of this group's coded blocks from b (one for the shared decoder), decoded together.
    const uint8_t* run_bodies[LaneDecoder::kRun];
    uint32_t run_sizes[LaneDecoder::kRun], run_refs[LaneDecoder::kRun];
    int run_counts[LaneDecoder::kRun];
    uint8_t* run_outs[LaneDecoder::kRun];
    int j = 0;
    for (const int most = tables.use_fast ? LaneDecoder::kRun : 1; j < most && b + j < nb && (b + j) / kGroupBlocks == g; ++j) {
      const int cj = block_count(n, b + j);
      const uint32_t sj = load_descriptor(in, b + j);
      if (sj >= uint32_t(cj) * es) break;  // raw or corrupt: after the run
      run_bodies[j] = in + pos, run_sizes[j] = sj, run_counts[j] = cj, run_outs[j] = out + (b + j) * kBlock * es;
      run_refs[j] = tables.refs[(tables.mask & kMaskOwnRefs) ? (b + j) % kGroupBlocks : 0];
      pos += sj;
    }
    const int status = tables.use_fast
        ? tables.fast.decode<DT>(j, run_bodies, run_sizes, in + size - run_bodies[0], run_counts, run_refs, run_outs)
        : decode_coded_block(DT, body, body_bytes, count, run_refs[0], tables.luts.data(), tables.pc, dst);
    if (status != kOk) return status;
    b += j;
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

// The bytes of a group's table area (§5.5).
int64_t table_area_bytes(const GroupCode& g, int nblocks) {
  uint32_t bits = table_bits(g.lens, num_symbols(g.mask), true);
  for (int p = 0; p < kMaxPlanes; ++p) bits += ((g.mask >> p) & 1) ? table_bits(g.plane_lens[p], kPlaneSyms, false) : 0;
  return num_refs(g.mask, nblocks) + (bits + 7) / 8;
}

// compress_stream's length, from each group's choices and each block's lane
// sizes, without coding.
template <int DT>
int64_t stream_bytes_typed(const uint8_t* in, int64_t n, bool generic, uint8_t* plan) {
  constexpr Layout lay = Elem<DT>::lay;
  constexpr int es = lay.elem_bytes;
  const int64_t nb = num_blocks(n), limit = kHeaderBytes + n * es;
  int64_t total = bodies_offset(nb);
  GroupCode g;
  uint16_t codes[kMaxSyms];
  uint16_t plane_codes[kMaxPlanes][kPlaneSyms];
  static thread_local LaneCoder coder;  // its word arrays are large: not on the stack
  for (int64_t b0 = 0; b0 < nb; b0 += kGroupBlocks) {  // every group: the plan must be whole
    const int64_t b1 = b0 + kGroupBlocks < nb ? b0 + kGroupBlocks : nb;
    choose_group<DT>(in, n, b0, b1, generic, &g);
    if (plan) std::memcpy(plan + (b0 / kGroupBlocks) * sizeof(GroupCode), &g, sizeof(GroupCode));
    total += table_area_bytes(g, int(b1 - b0));
    const PlaneCodes pc = plane_codes_of(g, plane_codes);
    canonical_codes(g.lens, codes, num_symbols(g.mask));
    const bool fast = !generic && coder.prepare<DT>(g.lens, codes, pc);
    for (int64_t b = b0; b < b1; ++b) {
      const int count = block_count(n, b);
      const uint8_t* src = in + b * kBlock * es;
      const uint32_t ref = g.refs[(g.mask & kMaskOwnRefs) ? b - b0 : 0];
      uint32_t bits[kLanes] = {};
      if (fast) {
        coder.lane_bits<DT>(src, count, ref, bits);
      } else {
        for (int i = 0; i < count; ++i) bits[i % kLanes] += element_bits(DT, load_element(src + i * es, es), ref, g.lens, pc);
      }
      int32_t devs[kLanes - 1];
      uint32_t coded;
      choose_width(bits, devs, &coded);
      total += coded < uint32_t(count) * es ? coded : uint32_t(count) * es;
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
  int flags = 0, mask_bits = 0;
  const int status = check_header(in, uint64_t(size), dtype, uint64_t(n), &flags, &mask_bits);
  if (status != kOk) return status;
  advise_huge_pages(out, n * layout_of(dtype).elem_bytes);
  if (flags & kFlagStoredRaw) {
    const int64_t bytes = n * layout_of(dtype).elem_bytes;
    if (size - kHeaderBytes < bytes) return kErrTruncated;
    if (bytes) std::memcpy(out, in + kHeaderBytes, size_t(bytes));
    return kOk;
  }
  if (dtype == kBF16) return decompress_typed<kBF16>(in, size, n, mask_bits, out, generic);
  if (dtype == kF16) return decompress_typed<kF16>(in, size, n, mask_bits, out, generic);
  return decompress_typed<kF32>(in, size, n, mask_bits, out, generic);
}

int decompress_accumulate(int dtype, const uint8_t* in, int64_t cap, int64_t k, int64_t n, float* acc) {
  return accumulate_rows(dtype, in, cap, k, n, acc, [](int d, const uint8_t* s, int64_t size, int64_t m, uint8_t* out) {
    return decompress_stream(d, s, size, m, out);
  });
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
