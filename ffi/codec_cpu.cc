#include "codec_cpu.h"

#include <cstring>
#include <vector>

#include "decode_cpu.h"
#include "encode_cpu.h"

namespace zipccl {
namespace {

// The choices for one group of blocks (FORMAT.md §7 steps 1-2).
struct GroupCode {
  uint32_t refs[kGroupBlocks];
  uint8_t lens[kNumSyms];
  bool sign_coded;
};

// A group's raw byte planes (§7 step 3): which it codes, and their lengths.
struct GroupPlanes {
  int mask;
  uint8_t lens[kMaxPlanes][kPlaneSyms];
};

// Adds a block's symbol counts of one sign, taken under ref r (32 classes),
// as they are under ref r + delta: class c in 1..30 becomes c + delta, or
// escapes past the last class (30, or 14 with sign_coded, where the class
// also takes the sign in its bit 4). (Classes 0 and ESC stay: the block has no
// exponent in (r, ALL_ONES).)
void add_shifted_counts(const uint32_t* own, uint32_t delta, bool sign_coded, uint32_t sign, uint32_t* counts) {
  const uint32_t max_delta = sign_coded ? kSignMaxDelta : kMaxDelta, flag = sign_coded ? sign << 4 : 0;
  for (uint32_t c = 0; c < uint32_t(kNumClasses); ++c) {
    const uint32_t d = c - 1 + delta;  // of classes 1..30
    const uint32_t to = c == kClassZero ? flag : c == uint32_t(kClassEsc) || d > max_delta ? kClassEsc : (d + 1) | flag;
    for (int t = 0; t < (1 << kTopBits); ++t) counts[(to << kTopBits) + t] += own[(c << kTopBits) + t];
  }
}

// Code lengths and choice of the candidates (§7 step 2) from their counts.
void choose_candidate(const uint32_t (*counts)[kNumSyms], int exp_bits, bool same, const uint32_t* emax,
                      uint32_t gmax, int nblocks, GroupCode* g) {
  uint8_t lens[kCandidates][kNumSyms];
  for (int c = 0; c < kCandidates; ++c) {
    if (same && (c & 1)) std::memcpy(lens[c], lens[c - 1], kNumSyms);  // the same counts as c - 1
    else fast_code_lengths(counts[c], lens[c]);
  }
  const int best = best_candidate(counts, lens, exp_bits);
  for (int b = 0; b < nblocks; ++b) g->refs[b] = (best & 1) ? emax[b] : gmax;
  std::memcpy(g->lens, lens[best], kNumSyms);
  g->sign_coded = best >= 2;
}

// Chooses refs and code for blocks [b0, b1) from each block's counts under
// its own emax, per sign: candidates with own refs add them as they are,
// those with the group's ref shifted to gmax.
template <int DT>
void choose_group_fast(const uint8_t* in, int64_t n, int64_t b0, int64_t b1, GroupCode* g) {
  uint32_t emax[kGroupBlocks], own[kGroupBlocks][2][kNumSyms], gmax = 0;
  for (int64_t b = b0; b < b1; ++b) {
    emax[b - b0] = block_counts<DT>(in + b * kBlock * Elem<DT>::lay.elem_bytes, block_count(n, b), own[b - b0]);
    gmax = emax[b - b0] > gmax ? emax[b - b0] : gmax;
  }
  uint32_t counts[kCandidates][kNumSyms] = {};
  bool same = true;  // every block's emax is gmax: both refs give the same counts
  for (int64_t b = b0; b < b1; ++b) {
    for (uint32_t sign = 0; sign < 2; ++sign)
      for (int c = 0; c < kCandidates; ++c)
        add_shifted_counts(own[b - b0][sign], (c & 1) ? 0 : gmax - emax[b - b0], c >= 2, sign, counts[c]);
    same &= emax[b - b0] == gmax;
  }
  choose_candidate(counts, Elem<DT>::lay.exp_bits, same, emax, gmax, int(b1 - b0), g);
}

// The same choice with the shared (CUDA) functions of zipccl_format.h.
void choose_group_generic(int dtype, const uint8_t* in, int64_t n, int64_t b0, int64_t b1, GroupCode* g) {
  const int es = layout_of(dtype).elem_bytes;
  uint32_t emax[kGroupBlocks], gmax = 0;
  for (int64_t b = b0; b < b1; ++b) {
    emax[b - b0] = block_emax(dtype, in + b * kBlock * es, block_count(n, b));
    gmax = emax[b - b0] > gmax ? emax[b - b0] : gmax;
  }
  uint32_t counts[kCandidates][kNumSyms] = {};
  uint8_t lens[kCandidates][kNumSyms];
  for (int c = 0; c < kCandidates; ++c) {
    for (int64_t b = b0; b < b1; ++b)
      add_symbol_counts(dtype, in + b * kBlock * es, block_count(n, b), (c & 1) ? emax[b - b0] : gmax, c >= 2,
                        counts[c]);
    code_lengths(counts[c], lens[c]);
  }
  const int best = best_candidate(counts, lens, layout_of(dtype).exp_bits);
  for (int64_t b = b0; b < b1; ++b) g->refs[b - b0] = (best & 1) ? emax[b - b0] : gmax;
  std::memcpy(g->lens, lens[best], kNumSyms);
  g->sign_coded = best >= 2;
}

// Asks for the lines a block body will be written to: the encoder stores
// them in bursts, which would otherwise wait for each line in turn.
void prefetch_for_write(uint8_t* p, int64_t bytes) {
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i, 1);
}

int64_t store_raw(int dtype, const uint8_t* in, int64_t n, uint8_t* out) {
  write_header(out, dtype, kFlagStoredRaw, uint64_t(n));
  const int64_t bytes = n * layout_of(dtype).elem_bytes;
  if (bytes) std::memcpy(out + kHeaderBytes, in, size_t(bytes));  // in may be null when n == 0
  return kHeaderBytes + bytes;
}

// plane_code_bits of zipccl_format.h, same result: four histograms (a run of
// equal bytes would otherwise wait on its own increments) and the fast
// Huffman lengths.
template <int DT>
uint64_t plane_code_bits_fast(const uint8_t* in, int64_t count, int64_t stride, int p, uint8_t* lens) {
  constexpr int es = Elem<DT>::lay.elem_bytes;
  uint32_t h[4][kPlaneSyms] = {};
  int64_t i = 0;
  for (; i + 3 * stride < count; i += 4 * stride)
    for (int k = 0; k < 4; ++k) ++h[k][in[(i + k * stride) * es + p]];
  for (; i < count; i += stride) ++h[0][in[i * es + p]];
  uint32_t counts[kPlaneSyms];
  uint64_t bits = 0;
  for (int v = 0; v < kPlaneSyms; ++v) counts[v] = h[0][v] + h[1][v] + h[2][v] + h[3][v];
  fast_code_lengths<kPlaneSyms>(counts, lens);
  for (int v = 0; v < kPlaneSyms; ++v) bits += uint64_t(counts[v]) * lens[v];
  return bits;
}

// choose_planes of zipccl_format.h, same result, with the fast counts.
template <int DT>
int choose_planes_fast(const uint8_t* in, int64_t count, uint8_t (*lens)[kPlaneSyms]) {
  int mask = 0;
  for (int p = 0; p < Elem<DT>::lay.raw_bytes; ++p) {
    const int64_t ns = (count + kPlaneSampleStride - 1) / kPlaneSampleStride;
    if (!plane_sample_pays(plane_code_bits_fast<DT>(in, count, kPlaneSampleStride, p, lens[p]), ns)) continue;
    if (plane_code_bits_fast<DT>(in, count, 1, p, lens[p]) + 8 * kPlaneTableBytes < 8 * uint64_t(count))
      mask |= 1 << p;
  }
  return mask;
}

// §7 step 3 for every group. The planes come first because where the bodies
// start depends on every group's tables.
template <int DT>
void choose_all_planes(const uint8_t* in, int64_t n, bool generic, std::vector<GroupPlanes>* planes) {
  constexpr Layout lay = Elem<DT>::lay;
  const int64_t ng = num_groups(num_blocks(n)), group = int64_t(kGroupBlocks) * kBlock;
  planes->assign(ng, GroupPlanes{});
  if constexpr (lay.raw_bytes > 0) {
    for (int64_t g = 0; g < ng; ++g) {
      GroupPlanes& gp = (*planes)[g];
      const uint8_t* src = in + g * group * lay.elem_bytes;
      const int64_t count = n - g * group < group ? n - g * group : group;
      gp.mask = generic ? choose_planes(DT, src, count, gp.lens) : choose_planes_fast<DT>(src, count, gp.lens);
    }
  }
}

template <int DT>
int64_t compress_typed(const uint8_t* in, int64_t n, uint8_t* out, bool generic) {
  constexpr int es = Elem<DT>::lay.elem_bytes;
  const int64_t nb = num_blocks(n), ng = num_groups(nb), limit = kHeaderBytes + n * es;  // coded ends before limit
  std::vector<GroupPlanes> planes;
  choose_all_planes<DT>(in, n, generic, &planes);
  const int flags = kFlagMasks;  // §7 step 5: a coded stream always has its masks
  int64_t table_at = tables_offset(nb, flags), pos = table_at;
  for (int64_t g = 0; g < ng; ++g) pos += group_table_bytes(planes[g].mask);
  uint8_t scratch[kBlock * 4];
  GroupCode g;
  uint16_t codes[kNumSyms];  // the generic coder's
  uint16_t table[kNumSyms];  // the fast coder's
  uint16_t plane_codes[kMaxPlanes][kPlaneSyms];
  for (int64_t b0 = 0; b0 < nb && pos < limit; b0 += kGroupBlocks) {
    const int64_t b1 = b0 + kGroupBlocks < nb ? b0 + kGroupBlocks : nb;
    if (generic) choose_group_generic(DT, in, n, b0, b1, &g);
    else choose_group_fast<DT>(in, n, b0, b1, &g);
    pack_table(g.lens, out + table_at);
    table_at += kTableBytes;
    const GroupPlanes& gp = planes[b0 / kGroupBlocks];
    PlaneCodes pc{};
    pc.mask = gp.mask | (g.sign_coded ? kMaskSign : 0);
    out[kHeaderBytes + 4 * nb + b0 / kGroupBlocks] = uint8_t(pc.mask);
    for (int p = 0; p < kMaxPlanes; ++p) {
      if (!((gp.mask >> p) & 1)) continue;
      pack_table(gp.lens[p], out + table_at, kPlaneSyms);
      table_at += kPlaneTableBytes;
      canonical_codes(gp.lens[p], plane_codes[p], kPlaneSyms);
      pc.lens[p] = gp.lens[p];
      pc.codes[p] = plane_codes[p];
    }
    const bool shared = generic || (pc.mask & 3);  // the fast coder has no byte codes
    if (shared) canonical_codes(g.lens, codes);
    else encoder_table(g.lens, table);
    for (int64_t b = b0; b < b1 && pos < limit; ++b) {
      const int count = block_count(n, b);
      const bool room = pos + int64_t(count) * es <= limit;
      uint8_t* body = room ? out + pos : scratch;
      const uint8_t* src = in + b * kBlock * es;
      if (room) prefetch_for_write(body, int64_t(count) * es);
      const uint32_t desc = shared ? encode_block(DT, src, count, g.refs[b - b0], g.lens, codes, body, pc)
                                   : g.sign_coded ? encode_block_fast<DT, true>(src, count, g.refs[b - b0], table, body)
                                                  : encode_block_fast<DT, false>(src, count, g.refs[b - b0], table, body);
      const int64_t body_bytes = desc & 0xFFFFu;
      if (!room && pos + body_bytes <= limit) std::memcpy(out + pos, scratch, size_t(body_bytes));
      store_u32(out + kHeaderBytes + 4 * b, desc);
      pos += body_bytes;
    }
  }
  if (pos >= limit) return store_raw(DT, in, n, out);
  write_header(out, DT, flags, uint64_t(n));
  return pos;
}

// Asks for input bytes [from, from + bytes) (clipped to size) ahead of use.
void prefetch_input(const uint8_t* in, int64_t size, int64_t from, int64_t bytes) {
  for (int64_t i = from; i < from + bytes && i < size; i += 64) __builtin_prefetch(in + i);
}

// A group's decode tables, built when one of its coded blocks needs them.
struct GroupTables {
  int64_t group = -1;
  std::vector<uint16_t> lut;      // the generic decoder's (also with byte codes)
  std::vector<DecodeTable> fast;  // the fast decoder's
  std::vector<uint16_t> plane_luts;  // with byte codes: one per plane
  PlaneCodes pc{};

  // Unpacks and checks group g's tables at `at` (§5.3, §5.4). Returns a Status.
  int build(const uint8_t* at, int64_t g, int mask, bool generic) {
    uint8_t lens[kMaxSyms];
    if (unpack_table(at, lens) != kOk) return kErrTable;
    pc = PlaneCodes{};
    pc.mask = mask;
    at += kTableBytes;
    if (generic || (mask & 3)) {
      lut.resize(kLutSize);
      build_lut(lens, lut.data());
    } else {
      fast.resize(1);
      build_decode_table(lens, &fast[0]);
    }
    if (mask & 3) plane_luts.resize(kMaxPlanes * kLutSize);  // only byte-coded streams pay for these
    for (int p = 0; p < kMaxPlanes; ++p) {
      if (!((mask >> p) & 1)) continue;
      if (unpack_table(at, lens, kPlaneSyms) != kOk) return kErrTable;
      build_lut(lens, &plane_luts[p * kLutSize], kPlaneSyms);
      pc.luts[p] = &plane_luts[p * kLutSize];
      at += kPlaneTableBytes;
    }
    group = g;
    return kOk;
  }
};

template <int DT>
int decompress_typed(const uint8_t* in, int64_t size, int64_t n, int flags, int mask_bits, uint8_t* out,
                     bool generic) {
  constexpr int es = Elem<DT>::lay.elem_bytes;
  const int64_t nb = num_blocks(n), ng = num_groups(nb);
  const uint8_t* masks = in + kHeaderBytes + 4 * nb;  // §1: with kFlagMasks only
  const auto mask_of = [&](int64_t g) { return (flags & kFlagMasks) ? int(masks[g]) : 0; };
  int64_t pos = tables_offset(nb, flags);
  if (size < pos) return kErrTruncated;
  for (int64_t g = 0; g < ng; ++g) {
    if (mask_of(g) & ~mask_bits) return kErrPlanes;
    pos += group_table_bytes(mask_of(g));
  }
  if (size < pos) return kErrTruncated;
  GroupTables tables;
  int64_t table_at = tables_offset(nb, flags);  // group b / kGroupBlocks's tables
  int64_t asked = 0, ahead = pos;  // the bodies of blocks below asked were asked for, up to ahead
  for (int64_t b = 0; b < nb; ++b) {
    for (; asked < nb && asked <= b + 2; ++asked) {  // keep the next two blocks' input coming
      const int64_t bytes = load_u32(in + kHeaderBytes + 4 * asked) & 0xFFFFu;
      prefetch_input(in, size, ahead, bytes);
      ahead += bytes;
    }
    const int64_t g = b / kGroupBlocks;
    const int mask = mask_of(g);
    if (b > 0 && b % kGroupBlocks == 0) table_at += group_table_bytes(mask_of(g - 1));
    const uint32_t desc = load_u32(in + kHeaderBytes + 4 * b);
    const bool coded = (desc >> 24) == 1;
    if (coded && tables.group != g && tables.build(in + table_at, g, mask, generic) != kOk) return kErrTable;
    const int64_t body_bytes = desc & 0xFFFFu;
    if (body_bytes > size - pos) return kErrTruncated;
    const int count = block_count(n, b);
    uint8_t* dst = out + b * kBlock * es;
    const bool ready = coded && tables.group == g;
    const DecodeTable* fast = ready ? tables.fast.data() : nullptr;
    const int status = (generic || (mask & 3))
        ? decode_block(DT, in + pos, desc, count, ready ? tables.lut.data() : nullptr, dst, tables.pc)
        : (mask & kMaskSign) ? decode_block_fast<DT, true>(in + pos, in + size, desc, count, fast, dst)
                             : decode_block_fast<DT, false>(in + pos, in + size, desc, count, fast, dst);
    if (status != kOk) return status;
    pos += body_bytes;
  }
  return kOk;
}

}  // namespace

int64_t compress_stream(int dtype, const uint8_t* in, int64_t n, uint8_t* out, bool generic) {
  if (dtype == kBF16) return compress_typed<kBF16>(in, n, out, generic);
  if (dtype == kF16) return compress_typed<kF16>(in, n, out, generic);
  return compress_typed<kF32>(in, n, out, generic);
}

int decompress_stream(int dtype, const uint8_t* in, int64_t size, int64_t n, uint8_t* out, bool generic) {
  int flags = 0, mask_bits = 0;
  const int status = check_header(in, uint64_t(size), dtype, uint64_t(n), &flags, &mask_bits);
  if (status != kOk) return status;
  if (flags & kFlagStoredRaw) {
    const int64_t bytes = n * layout_of(dtype).elem_bytes;
    if (size - kHeaderBytes < bytes) return kErrTruncated;
    if (bytes) std::memcpy(out, in + kHeaderBytes, size_t(bytes));
    return kOk;
  }
  if (dtype == kBF16) return decompress_typed<kBF16>(in, size, n, flags, mask_bits, out, generic);
  if (dtype == kF16) return decompress_typed<kF16>(in, size, n, flags, mask_bits, out, generic);
  return decompress_typed<kF32>(in, size, n, flags, mask_bits, out, generic);
}

int decompress_accumulate(int dtype, const uint8_t* in, int64_t cap, int64_t k, int64_t n, float* acc) {
  const int es = layout_of(dtype).elem_bytes;
  std::vector<uint8_t> chunk(size_t(n * es));
  for (int64_t c = 0; c < k; ++c) {
    const int status = decompress_stream(dtype, in + c * cap, cap, n, chunk.data());
    if (status != kOk) return status;
    for (int64_t j = 0; j < n; ++j) {
      const float v = element_to_f32(dtype, load_element(chunk.data() + j * es, es));
      acc[j] = c == 0 ? v : acc[j] + v;
    }
  }
  return kOk;
}

}  // namespace zipccl
