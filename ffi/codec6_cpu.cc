// Format version 6 on the CPU (codec6_cpu.h). Two coders give the same bytes:
// the generic one runs format6.h's functions step by step as FORMAT6.md §6
// words them; the fast one sizes every candidate code from one histogram of
// each block's symbols by lane, codes each value with one table lookup and
// one append, and decodes with 64-bit windows, falling back to the generic
// decoder for the exact verdict of a block it finds anything wrong in.
#include "codec6_cpu.h"
#include "simd_cpu.h"  // ZC_SIMD, simd_enabled

#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>

namespace zipccl {
namespace v6 {
namespace {

constexpr int kCombos = 2 * kMembers;  // §6 step 2: (member, flip) in the order 2 member + flip
constexpr uint32_t kNoSize = 0xFFFFFFFFu;

// §6: how the encoder codes one block.
struct Choice {
  uint32_t ref, size;  // size: the body's bytes
  int code, flip;
  bool raw;
};

// §6: a group's choices and, if it stores one, its code.
struct GroupChoice {
  bool table;
  uint8_t lens[kNumSyms];
  Choice blocks[kGroupBlocks];
};

int block_elems(int64_t n, int64_t b) { return int(std::min<int64_t>(kBlock, n - b * kBlock)); }

int64_t store_raw(int dtype, const uint8_t* in, int64_t n, uint8_t* out) {
  write_header(out, dtype, kFlagStoredRaw, n);
  const int64_t bytes = n * layout_of(dtype).elem_bytes;
  if (bytes) std::memcpy(out + kHeaderBytes, in, size_t(bytes));
  return kHeaderBytes + bytes;
}

// §6 step 2: the raw-or-family choice from the sizes under the 8 combos.
Choice family_choice(const uint32_t* sizes, uint32_t ref, int count, Layout lay) {
  int best = 0;
  for (int c = 1; c < kCombos; ++c) best = sizes[c] < sizes[best] ? c : best;  // ties: the first
  const uint32_t raw_bytes = uint32_t(count) * uint32_t(lay.elem_bytes);
  if (sizes[best] >= raw_bytes) return {0, raw_bytes, 0, 0, true};
  return {ref, sizes[best], best >> 1, best & 1, false};
}

// §6 step 4's decision from the family choices and each candidate's sizes.
void group_decision(int nbk, const uint32_t (*z)[kGroupBlocks], const uint32_t* cand_ref, const uint8_t (*cand_lens)[kNumSyms],
                    GroupChoice* g) {
  uint64_t fam_total = 0, best_cost = ~uint64_t(0);
  int best = 0;
  for (int b = 0; b < nbk; ++b) fam_total += g->blocks[b].size;
  for (int c = 0; c < 2; ++c) {
    uint64_t cost = kTableBytes;
    for (int b = 0; b < nbk; ++b) cost += std::min<uint64_t>(g->blocks[b].size, z[c][b]);
    if (cost < best_cost) best_cost = cost, best = c;
  }
  g->table = best_cost < fam_total;
  if (!g->table) return;
  std::memcpy(g->lens, cand_lens[best], kNumSyms);
  for (int b = 0; b < nbk; ++b)
    if (z[best][b] < g->blocks[b].size) g->blocks[b] = {cand_ref[best * kGroupBlocks + b], z[best][b], kGroupCode, 0, false};
}

// ---- the generic coder: format6.h, step by step ----------------------------

void choose_group_generic(const uint8_t* in, int64_t count, Layout lay, GroupChoice* g, int* nblocks) {
  const int nbk = int((count + kBlock - 1) / kBlock);
  uint32_t own[kGroupBlocks], top = 0, sizes[kCombos];
  uint8_t lens[kNumSyms];
  for (int b = 0; b < nbk; ++b) {
    const uint8_t* p = in + int64_t(b) * kBlock * lay.elem_bytes;
    const int cnt = block_elems(count, b);
    own[b] = block_ref(p, cnt, lay);
    top = std::max(top, own[b]);
    for (int c = 0; c < kCombos; ++c) {
      block_lengths(c >> 1, c & 1, nullptr, kFamily, lens);
      sizes[c] = body_size(p, cnt, lay, own[b], lens);
    }
    g->blocks[b] = family_choice(sizes, own[b], cnt, lay);
  }
  uint32_t z[2][kGroupBlocks], cand_ref[2 * kGroupBlocks];
  static thread_local uint8_t cand_lens[2][kNumSyms];
  for (int c = 0; c < 2; ++c) {  // the blocks' own refs, then the group's
    uint32_t counts[kNumSyms] = {};
    for (int b = 0; b < nbk; ++b) {
      cand_ref[c * kGroupBlocks + b] = c ? top : own[b];
      const uint8_t* p = in + int64_t(b) * kBlock * lay.elem_bytes;
      for (int i = 0; i < block_elems(count, b); ++i)
        ++counts[symbol_of(load_element(p + i * lay.elem_bytes, lay.elem_bytes), lay, cand_ref[c * kGroupBlocks + b])];
    }
    code_lengths(counts, cand_lens[c], kNumSyms);
    for (int b = 0; b < nbk; ++b)
      z[c][b] = body_size(in + int64_t(b) * kBlock * lay.elem_bytes, block_elems(count, b), lay,
                          cand_ref[c * kGroupBlocks + b], cand_lens[c]);
  }
  group_decision(nbk, z, cand_ref, cand_lens, g);
  *nblocks = nbk;
}

// ---- the fast coder ----------------------------------------------------------

// A block's symbols at its own ref, counted by lane.
struct BlockStats {
  uint32_t ref;
  int count, nused;
  uint8_t used[kNumSyms];            // the symbols present, increasing
  uint16_t rows[kNumSyms][kLanes];   // rows[j][k]: how many of lane k's values have symbol used[j]
  uint32_t counts[kNumSyms];         // the block's symbol counts
};

struct GroupScratch {
  uint16_t hist[kNumSyms][kLanes];  // all zero between blocks
  uint8_t syms[kGroupBlocks][kBlock];
  BlockStats st[kGroupBlocks];
};

// Bits of a value of each symbol beside its code, by dtype.
struct FixedTable {
  uint8_t bits[kNumSyms];
  explicit FixedTable(Layout lay) {
    for (int s = 0; s < kNumSyms; ++s) bits[s] = uint8_t(class_of_symbol(s) > kClassEsc ? 0 : fixed_bits(s, lay));
  }
};

// The family's combos: lengths and canonical codes (shared by coder and decoder).
struct FamilyCodes {
  uint8_t lens[kCombos][kNumSyms];
  uint16_t codes[kCombos][kNumSyms];
  uint16_t luts[kCombos][kLutSize];
  FamilyCodes() {
    for (int c = 0; c < kCombos; ++c) {
      block_lengths(c >> 1, c & 1, nullptr, kFamily, lens[c]);
      canonical_codes(lens[c], codes[c], kNumSyms);
      build_lut(lens[c], luts[c], kNumSyms);
    }
  }
};

const FamilyCodes& family_codes() {
  static const FamilyCodes* f = new FamilyCodes();
  return *f;
}

// The lane bits of a block under code lens (after map, if given), and its
// body's size; kNoSize if a symbol present has no code.
uint32_t stats_size(const BlockStats& s, const uint8_t* lens, const uint8_t* fixed, const uint8_t* map, uint32_t* bits,
                    int32_t* devs, int* width) {
  uint16_t acc[kLanes] = {};
  for (int j = 0; j < s.nused; ++j) {
    const int sym = map ? map[s.used[j]] : s.used[j];
    if (!lens[sym]) return kNoSize;
    const uint16_t c = uint16_t(lens[sym] + fixed[sym]);
    for (int k = 0; k < kLanes; ++k) acc[k] = uint16_t(acc[k] + s.rows[j][k] * c);  // <= 128 * 43
  }
  for (int k = 0; k < kLanes; ++k) bits[k] = acc[k];
  uint32_t size;
  *width = choose_width(bits, devs, &size);
  return size;
}

uint32_t stats_size(const BlockStats& s, const uint8_t* lens, const uint8_t* fixed, const uint8_t* map = nullptr) {
  uint32_t bits[kLanes];
  int32_t devs[kLanes - 1];
  int width;
  return stats_size(s, lens, fixed, map, bits, devs, &width);
}

// §6 step 4: the symbol map of a block whose ref is raised by shift.
void shift_map(uint32_t shift, uint8_t* map) {
  for (int s = 0; s < kNumSyms; ++s) map[s] = uint8_t(class_of_symbol(s) > kClassEsc ? s : shifted_symbol(s, shift));
}

// One dtype's layout at compile time, so that shifts and masks are constants.
template <int DT>
struct Elements {
  using T = std::conditional_t<DT == kF32, uint32_t, uint16_t>;
  static constexpr Layout lay = layout_of(DT);
  static constexpr uint32_t q_mask = (1u << lay.q_bits) - 1, low_mask = (1u << lay.low_bits) - 1;
  static constexpr uint32_t mag_mask = DT == kF32 ? 0x7FFFFFFFu : 0x7FFFu;
  static constexpr int sign_shift = 8 * sizeof(T) - 1;
  static uint32_t q(uint32_t x) { return (x >> lay.low_bits) & q_mask; }
};

// Counts one block's symbols at its own ref (§6 step 1) into st, its symbols into syms.
template <int DT>
void block_stats(const typename Elements<DT>::T* x, int count, GroupScratch& gs, uint8_t* syms, BlockStats& st) {
  using El = Elements<DT>;
  uint32_t ref = 0;
  for (int i = 0; i < count; ++i) {
    const uint32_t q = El::q(x[i]);
    ref = std::max(ref, normal_q(q, El::lay) ? q : 0u);
  }
  for (int i = 0; i < count; ++i) {
    const uint32_t v = x[i], q = El::q(v), d = ref - q;
    const uint32_t cls = (v & El::mag_mask) == 0 ? 0u : (normal_q(q, El::lay) && d <= uint32_t(kMaxD)) ? d + 1 : uint32_t(kClassEsc);
    syms[i] = uint8_t((v >> El::sign_shift) << 7 | cls);
  }
  for (int i = 0; i < count; ++i) ++gs.hist[syms[i]][i & (kLanes - 1)];
  st.ref = ref;
  st.count = count;
  st.nused = 0;
  for (int s = 0; s < kNumSyms; ++s) {
    uint32_t total = 0;
    for (int k = 0; k < kLanes; ++k) total += gs.hist[s][k];
    st.counts[s] = total;
    if (!total) continue;
    std::memcpy(st.rows[st.nused], gs.hist[s], sizeof gs.hist[s]);
    std::memset(gs.hist[s], 0, sizeof gs.hist[s]);
    st.used[st.nused++] = uint8_t(s);
  }
}

// §6 steps 1-4 for one group (count elements at in), from its blocks' stats.
template <int DT>
void choose_group_fast(const uint8_t* in, int64_t count, const FixedTable& fixed, GroupScratch& gs, GroupChoice* g,
                       int* nblocks) {
  using El = Elements<DT>;
  const int nbk = int((count + kBlock - 1) / kBlock);
  const FamilyCodes& fam = family_codes();
  uint32_t top = 0, sizes[kCombos];
  bool same_refs = true;
  for (int b = 0; b < nbk; ++b) {
    BlockStats& st = gs.st[b];
    block_stats<DT>(reinterpret_cast<const typename El::T*>(in) + int64_t(b) * kBlock, block_elems(count, b), gs, gs.syms[b], st);
    for (int c = 0; c < kCombos; ++c) sizes[c] = stats_size(st, fam.lens[c], fixed.bits);
    g->blocks[b] = family_choice(sizes, st.ref, st.count, El::lay);
    same_refs = same_refs && st.ref == gs.st[0].ref;
    top = std::max(top, st.ref);
  }
  static thread_local uint8_t cand_lens[2][kNumSyms];
  uint32_t z[2][kGroupBlocks], cand_ref[2 * kGroupBlocks], counts[kNumSyms] = {};
  for (int b = 0; b < nbk; ++b)
    for (int j = 0; j < gs.st[b].nused; ++j) counts[gs.st[b].used[j]] += gs.st[b].counts[gs.st[b].used[j]];
  code_lengths(counts, cand_lens[0], kNumSyms);
  for (int b = 0; b < nbk; ++b) {
    cand_ref[b] = gs.st[b].ref;
    z[0][b] = stats_size(gs.st[b], cand_lens[0], fixed.bits);
  }
  // At one ref for all, the group-ref candidate is the own-ref one: it ties, and the first is kept.
  if (same_refs) {
    for (int b = 0; b < nbk; ++b) z[1][b] = kNoSize;
  } else {
    uint8_t maps[kGroupBlocks][kNumSyms];
    std::memset(counts, 0, sizeof counts);
    for (int b = 0; b < nbk; ++b) {
      shift_map(top - gs.st[b].ref, maps[b]);
      for (int j = 0; j < gs.st[b].nused; ++j) counts[maps[b][gs.st[b].used[j]]] += gs.st[b].counts[gs.st[b].used[j]];
    }
    code_lengths(counts, cand_lens[1], kNumSyms);
    for (int b = 0; b < nbk; ++b) {
      cand_ref[kGroupBlocks + b] = top;
      z[1][b] = stats_size(gs.st[b], cand_lens[1], fixed.bits, maps[b]);
    }
  }
  group_decision(nbk, z, cand_ref, cand_lens, g);
  *nblocks = nbk;
}

// Appends bit fields LSB first with one 8-byte store each: at most 56 bits
// a put, and 8 writable bytes past the last byte it ends in.
struct FastWriter {
  uint8_t* p;
  uint64_t acc = 0;
  uint32_t n = 0;  // < 8 between puts
  void put(uint64_t v, uint32_t len) {
    acc |= v << n;
    n += len;
    std::memcpy(p, &acc, 8);
    const uint32_t bytes = n >> 3;
    p += bytes;
    acc = bytes ? acc >> (8 * bytes) : acc;  // bytes <= 7
    n &= 7;
  }
};

constexpr int kLaneBytes = (kBlock / kLanes) * 48 / 8 + 16;  // a lane's most bytes (43 bits a value), and slack

// Codes lanes k0 .. k0 + NL - 1 of a block, each into its own buffer lanes[k].
template <int DT, int NL>
void encode_lanes(const typename Elements<DT>::T* x, const uint8_t* syms, int count, int k0, const uint8_t* lens,
                  const uint16_t* codes, const uint8_t* map, uint8_t (*lanes)[kLaneBytes]) {
  using El = Elements<DT>;
  FastWriter w[NL];
  for (int l = 0; l < NL; ++l) w[l].p = lanes[k0 + l];
  const int steps = (count - k0 + kLanes - 1) / kLanes;  // lane k0's values; the others have as many or one fewer
  for (int j = 0; j < steps; ++j) {
#pragma GCC unroll 8
    for (int l = 0; l < NL; ++l) {
      const int i = k0 + l + kLanes * j;
      if (NL > 1 && i >= count) break;
      const int s = map ? map[syms[i]] : syms[i], cls = class_of_symbol(s);
      const uint64_t low = uint32_t(x[i]) & El::low_mask;
      uint64_t v = codes[s];
      uint32_t len = lens[s];
      if (cls == kClassEsc) v |= (El::q(x[i]) | low << El::lay.q_bits) << len, len += El::lay.q_bits + El::lay.low_bits;
      else if (cls != kClassZero) v |= low << len, len += El::lay.low_bits;
      w[l].put(v, len);
    }
  }
}

// Writes a coded block's body (its size from stats_size) to body (8 bytes of
// slack after it). syms: the values' symbols at the block's own ref; map:
// to its coded ref's, or null.
template <int DT>
void encode_body_fast(const typename Elements<DT>::T* x, const uint8_t* syms, const BlockStats& st, const uint8_t* fixed,
                      const uint8_t* lens, const uint16_t* codes, const uint8_t* map, uint8_t* body) {
  static thread_local std::unique_ptr<uint8_t[][kLaneBytes]> lanes(new uint8_t[kLanes][kLaneBytes]);
  uint32_t bits[kLanes];
  int32_t devs[kLanes - 1];
  int width;
  stats_size(st, lens, fixed, map, bits, devs, &width);
  for (int k = 0; k < kLanes; k += 4) encode_lanes<DT, 4>(x, syms, st.count, k, lens, codes, map, lanes.get());
  FastWriter w{body};
  if (width_field_bits(width) == 3) w.put(uint32_t(width - kWidthShort), 3);
  else w.put(7u | uint32_t(width) << 3, 8);
  for (int k = 0; k + 1 < kLanes; ++k) w.put(uint32_t(devs[k]) & ((1u << width) - 1), uint32_t(width));
  for (int k = 0; k < kLanes; ++k) {  // the lanes back to back
    const uint8_t* lane = lanes[k];
    uint32_t left = bits[k];
    for (; left >= 32; left -= 32, lane += 4) {
      uint32_t v;
      std::memcpy(&v, lane, 4);
      w.put(v, 32);
    }
    if (left) {
      uint64_t v;
      std::memcpy(&v, lane, 8);
      w.put(v & ((uint64_t(1) << left) - 1), left);
    }
  }
}

// ---- the fast decoder --------------------------------------------------------

inline uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// A decode table baked for one code and one ref: for every 12-bit window,
// everything its code implies (0: no code starts it, or a class whose q
// would not be normal: the generic decoder names the error).
struct Baked {
  static constexpr uint32_t kHiMask = 0xFFFF;  // bits 0-15: sign | q of the element, >> hi_shift
  static constexpr int kLenShift = 16;         // bits 16-19: the code's length
  static constexpr int kUsedShift = 20;        // bits 20-25: the element's bits in its lane (an escape: without q)
  static constexpr uint32_t kLow = 1u << 26;   // the low bits follow
  static constexpr uint32_t kEsc = 1u << 27;   // q follows the code
  uint32_t entry[kLutSize];
  int table = -1;  // which code: a combo, or kCombos + the group's index
  uint32_t ref = 0;
};

template <int DT>
void bake(const uint16_t* lut, uint32_t ref, Baked* t) {
  using El = Elements<DT>;
  constexpr int hi_shift = El::lay.low_bits + El::lay.q_bits - 10 > 0 ? 0 : 0;  // sign | q fits 16 bits as is
  (void)hi_shift;
  for (int w = 0; w < kLutSize; ++w) {
    const uint32_t e = lut[w], len = e >> 8, s = e & 0xFF, cls = s & 127, sign = s >> 7;
    uint32_t v = 0;
    if (len && cls == kClassEsc) {
      v = sign << (El::lay.q_bits) | Baked::kEsc | Baked::kLow | (len + El::lay.low_bits) << Baked::kUsedShift;
    } else if (len && cls == kClassZero) {
      v = sign << El::lay.q_bits | len << Baked::kUsedShift;
    } else if (len && normal_q(ref + 1 - cls, El::lay)) {
      v = (sign << El::lay.q_bits | (ref + 1 - cls)) | Baked::kLow | (len + El::lay.low_bits) << Baked::kUsedShift;
    }
    t->entry[w] = v ? v | len << Baked::kLenShift : 0;
  }
}

struct Cursor {
  uint32_t pos, end;
};

// Decodes the next value of a lane at cursor c into *out; bad collects errors.
template <int DT, bool kChecked>
inline void decode_value(const uint8_t* body, const uint8_t* limit, Cursor& c, const uint32_t* tab,
                         typename Elements<DT>::T* out, uint32_t& bad) {
  using El = Elements<DT>;
  constexpr Layout lay = El::lay;
  const uint8_t* p = body + (c.pos >> 3);
  uint64_t w;
  if (!kChecked || p + 8 <= limit) {
    w = load64(p);
  } else {
    w = 0;
    for (int b = 0; p + b < limit && b < 8; ++b) w |= uint64_t(p[b]) << (8 * b);
  }
  w >>= c.pos & 7;
  const uint32_t e = tab[w & (kLutSize - 1)], len = (e >> Baked::kLenShift) & 15;
  uint32_t hi = e & Baked::kHiMask, used = (e >> Baked::kUsedShift) & 63;
  uint64_t rest = w >> len;
  if (e & Baked::kEsc) [[unlikely]] {
    hi |= uint32_t(rest) & El::q_mask;
    rest >>= lay.q_bits;
    used += lay.q_bits;
  }
  const uint32_t low = uint32_t(rest) & ((e & Baked::kLow) ? El::low_mask : 0u);
  bad |= e == 0;
  c.pos += used;
  bad |= c.pos > c.end;
  c.pos = c.pos > c.end ? c.end : c.pos;  // a bad lane reads no further
  *out = typename El::T(hi << lay.low_bits | low);
}

template <int DT, bool kChecked, size_t... L>
inline void decode_step(const uint8_t* body, const uint8_t* limit, Cursor* c, const uint32_t* tab,
                        typename Elements<DT>::T* out, uint32_t& bad, std::index_sequence<L...>) {
  (decode_value<DT, kChecked>(body, limit, c[L], tab, out + L, bad), ...);
}

// Decodes lanes k0 .. k0 + NL - 1 of a block (steps values each, lanes from
// starts) into out; false if anything is wrong (the caller asks the generic
// decoder why). Checked: bytes past limit (the buffer's end) are not read.
template <int DT, int NL, bool kChecked>
bool decode_lanes(const uint8_t* body, const uint8_t* limit, const uint32_t* starts, int k0, int steps, const uint32_t* tab,
                  typename Elements<DT>::T* out) {
  Cursor c[NL];
  uint32_t bad = 0;
  for (int l = 0; l < NL; ++l) c[l] = {starts[k0 + l], starts[k0 + l + 1]};
  for (int j = 0; j < steps; ++j)
    decode_step<DT, kChecked>(body, limit, c, tab, out + k0 + kLanes * j, bad, std::make_index_sequence<NL>());
  for (int l = 0; l < NL; ++l) bad |= lane_end_status(body, k0 + l, c[l].pos, starts) != kOk;
  return !bad;
}

// locate_lanes of format6.h with 64-bit reads where the body is long enough
// (the same starts and Status: it falls back to it otherwise, or on an error).
inline int locate_lanes_fast(const uint8_t* body, uint32_t size, uint32_t* starts) {
  if (size < 8 + (3 + 5 + (kLanes - 1) * kMaxWidth) / 8 + 1) return locate_lanes(body, size, starts);
  const uint32_t f = body[0] & 7;
  const int width = f == 7 ? (body[0] >> 3) : int(f) + kWidthShort, field = f == 7 ? 8 : 3;
  if (width < 1 || width > kMaxWidth) return locate_lanes(body, size, starts);
  const uint32_t head = uint32_t(field + (kLanes - 1) * width), end = 8 * size, base = length_base(size, head);
  int64_t at = head;
  starts[0] = head;
  for (int k = 0; k + 1 < kLanes; ++k) {
    const uint32_t bit = uint32_t(field + k * width);
    const uint32_t v = uint32_t(load64(body + (bit >> 3)) >> (bit & 7)) & ((1u << width) - 1);
    at += int64_t(base) + (int64_t(v) - ((v >> (width - 1)) ? (int64_t(1) << width) : 0));
    starts[k + 1] = uint32_t(at);
    if (at < starts[k] || at > end) return locate_lanes(body, size, starts);
  }
  starts[kLanes] = end;
  return kOk;
}

#if ZC_HAVE_SIMD
ZC_SIMD inline __m512i set(uint32_t v) { return _mm512_set1_epi32(int(v)); }

// One step of 16 lanes of a block (lanes k0 .. k0 + 15, a value each) with
// AVX-512: the same as decode_value, 16 at once. body has 8 readable bytes
// past vsize (a lane that runs past its end is clamped there and flagged at the end).
template <int DT>
ZC_SIMD inline void simd_step(const uint8_t* body, __m512i vsize, const uint32_t* tab, __m512i& pos, __mmask16& bad,
                              typename Elements<DT>::T* out) {
  using El = Elements<DT>;
  constexpr Layout lay = El::lay;
  const __m512i byte = _mm512_min_epu32(_mm512_srli_epi32(pos, 3), vsize);
  const __m512i shift = _mm512_and_si512(pos, set(7));
  const __m512i lo = _mm512_i32gather_epi32(byte, body, 1);
  __m512i w = _mm512_srlv_epi32(lo, shift), hi = _mm512_setzero_si512();
  const __m512i e = _mm512_i32gather_epi32(_mm512_and_si512(w, set(kLutSize - 1)), tab, 4);
  bad |= _mm512_testn_epi32_mask(e, e);
  const __mmask16 esc = _mm512_test_epi32_mask(e, set(Baked::kEsc));
  const __m512i len = _mm512_and_si512(_mm512_srli_epi32(e, Baked::kLenShift), set(15));
  const __m512i used = _mm512_mask_add_epi32(_mm512_and_si512(_mm512_srli_epi32(e, Baked::kUsedShift), set(63)), esc,
                                             _mm512_and_si512(_mm512_srli_epi32(e, Baked::kUsedShift), set(63)),
                                             set(lay.q_bits));
  // 25 bits of w are the window's at least; fp32's fields, and a 16-bit escape late in its byte, need more
  if (DT == kF32 || _mm512_cmpgt_epu32_mask(_mm512_add_epi32(used, shift), set(32))) {
    hi = _mm512_i32gather_epi32(_mm512_add_epi32(byte, set(4)), body, 1);
    w = _mm512_shrdv_epi32(lo, hi, shift);
    hi = _mm512_srlv_epi32(hi, shift);
  }
  __m512i top = _mm512_and_si512(e, set(Baked::kHiMask)), off = len;
  if (esc) {
    top = _mm512_mask_or_epi32(top, esc, top, _mm512_and_si512(_mm512_srlv_epi32(w, len), set(El::q_mask)));
    off = _mm512_mask_add_epi32(off, esc, off, set(lay.q_bits));
  }
  const __m512i f = DT == kF32 ? _mm512_shrdv_epi32(w, hi, off) : _mm512_srlv_epi32(w, off);
  const __mmask16 low = _mm512_test_epi32_mask(e, set(Baked::kLow));
  const __m512i x = _mm512_mask_or_epi32(_mm512_slli_epi32(top, lay.low_bits), low, _mm512_slli_epi32(top, lay.low_bits),
                                         _mm512_and_si512(f, set(El::low_mask)));
  pos = _mm512_add_epi32(pos, used);
  if constexpr (sizeof(typename El::T) == 2) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(x));
  else _mm512_storeu_si512(out, x);
}

// A full block's 32 lanes, two vectors of 16 side by side (the lanes at a
// step's stride: value i of lane k is out[k + 32 i]); false if a lane does
// not end cleanly.
template <int DT>
ZC_SIMD bool simd_block(const uint8_t* body, uint32_t size, const uint32_t* starts, const uint32_t* tab,
                        typename Elements<DT>::T* out) {
  __m512i pos0 = _mm512_loadu_si512(starts), pos1 = _mm512_loadu_si512(starts + 16);
  const __m512i vsize = _mm512_set1_epi32(int(size));
  __mmask16 bad0 = 0, bad1 = 0;
  for (int j = 0; j < kBlock / kLanes; ++j) {
    simd_step<DT>(body, vsize, tab, pos0, bad0, out + kLanes * j);
    simd_step<DT>(body, vsize, tab, pos1, bad1, out + kLanes * j + 16);
  }
  alignas(64) uint32_t end[kLanes];
  _mm512_store_si512(end, pos0);
  _mm512_store_si512(end + 16, pos1);
  bool ok = !bad0 && !bad1;
  for (int k = 0; k < kLanes; ++k) ok &= end[k] <= starts[k + 1] && lane_end_status(body, k, end[k], starts) == kOk;
  return ok;
}
#endif

template <int DT>
bool decode_body_fast(const uint8_t* body, uint32_t size, const uint8_t* limit, int count, const uint32_t* tab,
                      typename Elements<DT>::T* out) {
  uint32_t starts[kLanes + 1];
  if (locate_lanes_fast(body, size, starts) != kOk) return false;
  bool ok = true;
#if ZC_HAVE_SIMD
  if (count == kBlock && simd_enabled()) {
    if (body + size + 8 <= limit) return simd_block<DT>(body, size, starts, tab, out);
    alignas(64) static thread_local uint8_t padded[kBlock * 4 + 16];  // the stream's last bytes, and 8 more
    std::memcpy(padded, body, size);
    std::memset(padded + size, 0, 16);
    return simd_block<DT>(padded, size, starts, tab, out);
  }
#endif
  if (count == kBlock && body + size + 8 <= limit) {
    for (int k = 0; k < kLanes; k += 8) ok &= decode_lanes<DT, 8, false>(body, limit, starts, k, kBlock / kLanes, tab, out);
    return ok;
  }
  for (int k = 0; k < kLanes; ++k)
    ok &= decode_lanes<DT, 1, true>(body, limit, starts, k, (count - k + kLanes - 1) / kLanes, tab, out);
  return ok;
}

// ---- streams -----------------------------------------------------------------

template <int DT>
int64_t compress_typed(int dtype, const uint8_t* in, int64_t n, uint8_t* out, bool generic, bool write) {
  const Layout lay = layout_of(dtype);
  const FixedTable fixed(lay);
  const FamilyCodes& fam = family_codes();
  const int64_t nb = num_blocks(n), data_at = data_offset(nb), room = n * lay.elem_bytes - kDescBytes * nb;
  const int64_t cap = kHeaderBytes + n * lay.elem_bytes;  // out's bytes
  static thread_local std::unique_ptr<GroupScratch> scratch;
  static thread_local std::unique_ptr<uint8_t[]> record;  // a body near out's end, with slack
  if (!scratch) scratch.reset(new GroupScratch()), record.reset(new uint8_t[kMaxRecord + 8]);
  GroupScratch& gs = *scratch;
  int64_t end = 0;
  if (room <= 0) return write ? store_raw(dtype, in, n, out) : kHeaderBytes + n * lay.elem_bytes;
  GroupChoice g;
  uint16_t gcodes[kNumSyms];
  uint8_t lens[kNumSyms], map[kNumSyms];
  uint16_t codes[kNumSyms];
  for (int64_t b0 = 0; b0 < nb; b0 += kGroupBlocks) {
    const uint8_t* gin = in + b0 * kBlock * lay.elem_bytes;
    const int64_t count = std::min<int64_t>(int64_t(kGroupBlocks) * kBlock, n - b0 * kBlock);
    int nbk;
    if (generic) choose_group_generic(gin, count, lay, &g, &nbk);
    else choose_group_fast<DT>(gin, count, fixed, gs, &g, &nbk);
    int64_t bytes = g.table ? kTableBytes : 0;
    for (int b = 0; b < nbk; ++b) bytes += g.blocks[b].size;
    if (end + bytes >= room) return write ? store_raw(dtype, in, n, out) : kHeaderBytes + n * lay.elem_bytes;
    if (!write) {
      end += bytes;
      continue;
    }
    if (g.table) canonical_codes(g.lens, gcodes, kNumSyms);
    for (int b = 0; b < nbk; ++b) {
      const Choice& c = g.blocks[b];
      const int cnt = block_elems(count, b);
      const uint8_t* bin = gin + int64_t(b) * kBlock * lay.elem_bytes;
      uint8_t* rec = out + data_at + end;
      if (b == 0 && g.table) pack_table(g.lens, rec), rec += kTableBytes;
      if (c.raw) {
        std::memcpy(rec, bin, size_t(c.size));
      } else if (generic) {
        block_lengths(c.code, c.flip, g.lens, kFamily, lens);
        canonical_codes(lens, codes, kNumSyms);
        encode_body(bin, cnt, lay, c.ref, lens, codes, rec);
      } else {
        const bool group = c.code == kGroupCode;
        const int combo = 2 * c.code + c.flip;
        if (c.ref != gs.st[b].ref) shift_map(c.ref - gs.st[b].ref, map);
        const bool direct = (rec - out) + int64_t(c.size) + 8 <= cap;
        encode_body_fast<DT>(reinterpret_cast<const typename Elements<DT>::T*>(bin), gs.syms[b], gs.st[b], fixed.bits,
                            group ? g.lens : fam.lens[combo], group ? gcodes : fam.codes[combo],
                            c.ref != gs.st[b].ref ? map : nullptr, direct ? rec : record.get());
        if (!direct) std::memcpy(rec, record.get(), c.size);
      }
      end += (b == 0 && g.table ? kTableBytes : 0) + c.size;
      store_desc(out + kHeaderBytes + kDescBytes * (b0 + b), uint32_t(end), c.ref, c.code, c.flip, c.raw, b == 0 && g.table);
    }
  }
  if (write) write_header(out, dtype, 0, n);
  return data_at + end;
}

template <int DT>
int decompress_typed(int dtype, const uint8_t* in, int64_t size, int64_t n, uint8_t* out, bool generic) {
  const Layout lay = layout_of(dtype);
  int flags = 0;
  int status = check_header(in, size, dtype, n, &flags);
  if (status != kOk) return status;
  if (flags & kFlagStoredRaw) {
    if (size - kHeaderBytes < n * lay.elem_bytes) return kErrTruncated;
    if (n) std::memcpy(out, in + kHeaderBytes, size_t(n * lay.elem_bytes));
    return kOk;
  }
  const int64_t nb = num_blocks(n), data_at = data_offset(nb);
  if (size < data_at) return kErrTruncated;
  const FamilyCodes& fam = family_codes();
  static thread_local std::unique_ptr<uint16_t[]> glut, lut;
  if (!glut) glut.reset(new uint16_t[kLutSize]), lut.reset(new uint16_t[kLutSize]);
  int64_t lut_group = -1;  // the group (and 2 group + flip) glut decodes
  constexpr int kBakedCache = 8;
  static thread_local std::unique_ptr<Baked[]> baked;
  if (!baked) baked.reset(new Baked[kBakedCache]);
  for (int i = 0; i < kBakedCache; ++i) baked[i].table = -1;  // group indices are this stream's
  int next_baked = 0;
  uint8_t lens[kNumSyms], glens[kNumSyms];
  for (int64_t b = 0; b < nb; ++b) {
    const int cnt = block_elems(n, b);
    BlockPlan p;
    status = plan_block(in, size, nb, b, cnt, lay, &p);
    if (status != kOk) return status;
    const uint8_t* body = in + data_at + p.start;
    uint8_t* dst = out + b * kBlock * lay.elem_bytes;
    const uint32_t bytes = p.end - p.start;
    if (p.d.raw) {
      std::memcpy(dst, body, bytes);
      continue;
    }
    const uint16_t* table = nullptr;
    if (p.d.code == kGroupCode) {
      status = unpack_table(in + data_at + p.table_at, glens);
      if (status != kOk) return status;
      if (!generic && lut_group != 2 * (b / kGroupBlocks) + p.d.flip) {
        block_lengths(kGroupCode, int(p.d.flip), glens, kFamily, lens);
        build_lut(lens, glut.get(), kNumSyms);
        lut_group = 2 * (b / kGroupBlocks) + p.d.flip;
      }
      table = glut.get();
    } else {
      table = fam.luts[2 * p.d.code + p.d.flip];
    }
    if (generic) {
      block_lengths(int(p.d.code), int(p.d.flip), glens, kFamily, lens);
      build_lut(lens, lut.get(), kNumSyms);
      table = lut.get();
    } else {
      const int which = int(p.d.code == kGroupCode ? kCombos + lut_group : 2 * p.d.code + p.d.flip);
      Baked* t = nullptr;  // a small cache: blocks mostly share a few (code, ref) pairs
      for (int i = 0; i < kBakedCache && !t; ++i) t = baked[i].table == which && baked[i].ref == p.d.ref ? &baked[i] : nullptr;
      if (!t) {
        t = &baked[next_baked++ % kBakedCache];
        bake<DT>(table, p.d.ref, t);
        t->table = which, t->ref = p.d.ref;
      }
      if (decode_body_fast<DT>(body, bytes, in + size, cnt, t->entry, reinterpret_cast<typename Elements<DT>::T*>(dst)))
        continue;
    }
    status = decode_body(body, bytes, cnt, lay, p.d.ref, table, dst);
    if (status != kOk) return status;
  }
  return kOk;
}

}  // namespace

int64_t compress_stream(int dtype, const uint8_t* in, int64_t n, uint8_t* out, bool generic) {
  if (dtype == kBF16) return compress_typed<kBF16>(dtype, in, n, out, generic, true);
  if (dtype == kF16) return compress_typed<kF16>(dtype, in, n, out, generic, true);
  return compress_typed<kF32>(dtype, in, n, out, generic, true);
}

int64_t stream_bytes(int dtype, const uint8_t* in, int64_t n, bool generic) {
  if (dtype == kBF16) return compress_typed<kBF16>(dtype, in, n, nullptr, generic, false);
  if (dtype == kF16) return compress_typed<kF16>(dtype, in, n, nullptr, generic, false);
  return compress_typed<kF32>(dtype, in, n, nullptr, generic, false);
}

int decompress_stream(int dtype, const uint8_t* in, int64_t size, int64_t n, uint8_t* out, bool generic) {
  if (dtype == kBF16) return decompress_typed<kBF16>(dtype, in, size, n, out, generic);
  if (dtype == kF16) return decompress_typed<kF16>(dtype, in, size, n, out, generic);
  return decompress_typed<kF32>(dtype, in, size, n, out, generic);
}

}  // namespace v6
}  // namespace zipccl
