// Format version 6 on the CPU (codec6_cpu.h). Two coders give the same bytes:
// the generic one runs format6.h's functions step by step as FORMAT.md §6
// words them; the fast one sizes every candidate code from one histogram of
// each block's symbols by lane, codes each value with one table lookup and
// one append (AVX-512 or AVX2 where the CPU has them), and decodes with 64-bit
// windows, falling back to the generic
// decoder for the exact verdict of a block it finds anything wrong in.
#include "codec6_cpu.h"
#include "accumulate_cpu.h"
#include "code_lengths_cpu.h"
#include "lanes6_cpu.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>

namespace zipccl {
namespace v6 {
namespace {

// §6: how the encoder codes one block.
struct Choice {
  uint32_t ref, size;  // size: the body's bytes
  int code, flip;
  bool raw;
  uint16_t bits[kLanes];  // a coded block's lanes' bits (set once the group's choices are made)
};

// §6: a group's choices and, if it stores one, its code.
struct GroupChoice {
  bool table;
  uint8_t lens[kNumSyms];
  Choice blocks[kGroupBlocks];
};

thread_local int64_t fallbacks = 0;  // generic_fallbacks()

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
  if (sizes[best] >= raw_bytes) return {0, raw_bytes, 0, 0, true, {}};
  return {ref, sizes[best], best >> 1, best & 1, false, {}};
}

// §6 step 4's decision from the family choices and each candidate's sizes; returns the candidate
// (the group's code, if g->table).
int group_decision(int nbk, const uint32_t (*z)[kGroupBlocks], const uint32_t* cand_ref, const uint8_t (*cand_lens)[kNumSyms],
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
  if (!g->table) return best;
  std::memcpy(g->lens, cand_lens[best], kNumSyms);
  for (int b = 0; b < nbk; ++b)
    if (z[best][b] < g->blocks[b].size) g->blocks[b] = {cand_ref[best * kGroupBlocks + b], z[best][b], kGroupCode, 0, false, {}};
  return best;
}

// ---- the generic coder: format6.h, step by step ----------------------------

void choose_group_generic(const uint8_t* in, int64_t count, Layout lay, GroupChoice* g) {
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
  uint8_t cand_lens[2][kNumSyms];
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
  for (int b = 0; b < nbk; ++b) {
    Choice& c = g->blocks[b];
    if (c.raw) continue;
    uint32_t bits[kLanes];
    block_lengths(c.code, c.flip, g->lens, kFamily, lens);
    lane_bits(in + int64_t(b) * kBlock * lay.elem_bytes, block_elems(count, b), lay, c.ref, lens, bits);
    for (int k = 0; k < kLanes; ++k) c.bits[k] = uint16_t(bits[k]);
  }
}

// ---- the fast coder ----------------------------------------------------------

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

// §6 steps 1-4 for one group (count elements at in), from its blocks' stats.
template <int DT>
void choose_group_fast(const uint8_t* in, int64_t count, const FixedTable& fixed, GroupScratch& gs, GroupChoice* g) {
  using El = Elements<DT>;
  const int nbk = int((count + kBlock - 1) / kBlock);
  const FamilyCodes& fam = family_codes();
  uint32_t top = 0, sizes[kCombos];
  bool same_refs = true;
  uint16_t fam_bits[kCombos][kLanes], cand_bits[2][kGroupBlocks][kLanes];  // each sized code's lane bits
  for (int b = 0; b < nbk; ++b) {
    BlockStats& st = gs.st[b];
    block_stats<DT>(reinterpret_cast<const typename El::T*>(in) + int64_t(b) * kBlock, block_elems(count, b), gs, gs.syms[b], st);
    // exact sizes only where a combo can be the smallest: the others' least exceeds one's most
    uint64_t total[kCombos], bound = ~uint64_t(0);
    family_totals(st, fixed.family, total);
    for (int c = 0; c < kCombos; ++c) bound = std::min(bound, most_size(total[c]));
    for (int c = 0; c < kCombos; ++c) sizes[c] = least_size(total[c]) <= bound ? stats_size(st, fam.lens[c], fixed.bits, nullptr, fam_bits[c]) : kNoSize;
    Choice& choice = g->blocks[b] = family_choice(sizes, st.ref, st.count, El::lay);
    if (!choice.raw) std::memcpy(choice.bits, fam_bits[2 * choice.code + choice.flip], sizeof choice.bits);
    same_refs = same_refs && st.ref == gs.st[0].ref;
    top = std::max(top, st.ref);
  }
  uint8_t cand_lens[2][kNumSyms];
  uint32_t z[2][kGroupBlocks], cand_ref[2 * kGroupBlocks], counts[kNumSyms] = {};
  for (int b = 0; b < nbk; ++b)
    for (int j = 0; j < gs.st[b].nused; ++j) counts[gs.st[b].used[j]] += gs.st[b].counts[gs.st[b].used[j]];
  fast_code_lengths<kNumSyms>(counts, cand_lens[0]);  // code_lengths, faster
  for (int b = 0; b < nbk; ++b) {
    cand_ref[b] = gs.st[b].ref;
    // exact only where it can be below the family's size (else min(family, z) is the family's)
    const bool can = least_size(total_bits(gs.st[b], cand_lens[0], fixed.bits)) < g->blocks[b].size;
    z[0][b] = can ? stats_size(gs.st[b], cand_lens[0], fixed.bits, nullptr, cand_bits[0][b]) : kNoSize;
  }
  // At one ref for all, the group-ref candidate is the own-ref one: it ties, and the first is kept.
  uint8_t maps[kGroupBlocks][kNumSyms];  // each block's symbols at the group ref (when refs differ)
  if (same_refs) {
    for (int b = 0; b < nbk; ++b) z[1][b] = kNoSize;
  } else {
    std::memset(counts, 0, sizeof counts);
    for (int b = 0; b < nbk; ++b) {
      shift_map(top - gs.st[b].ref, maps[b]);
      for (int j = 0; j < gs.st[b].nused; ++j) counts[maps[b][gs.st[b].used[j]]] += gs.st[b].counts[gs.st[b].used[j]];
    }
    fast_code_lengths<kNumSyms>(counts, cand_lens[1]);
    for (int b = 0; b < nbk; ++b) {
      cand_ref[kGroupBlocks + b] = top;
      const bool can = least_size(total_bits(gs.st[b], cand_lens[1], fixed.bits, maps[b])) < g->blocks[b].size;
      z[1][b] = can ? stats_size(gs.st[b], cand_lens[1], fixed.bits, maps[b], cand_bits[1][b]) : kNoSize;
    }
  }
  const int best = group_decision(nbk, z, cand_ref, cand_lens, g);
  for (int b = 0; b < nbk; ++b)
    if (g->blocks[b].code == kGroupCode) std::memcpy(g->blocks[b].bits, cand_bits[best][b], sizeof g->blocks[b].bits);
}

// The family combos' decode tables for one dtype, built once.
template <int DT>
const Baked* family_baked() {
  static const Baked* tables = [] {
    Baked* t = new Baked[kCombos];
    for (int c = 0; c < kCombos; ++c) t[c].bake<DT>(family_codes().lens[c]);
    return t;
  }();
  return tables;
}

// ---- streams -----------------------------------------------------------------

// A group's plan (stream_bytes's, for compress_stream): its choices and its
// coded blocks' lanes' bits, so that coding it needs no sizing.
constexpr int kBlockPlanBytes = 8 + 2 * kLanes;                             // ref u16, code | flip << 4 | raw << 5, pad, size u32, bits
constexpr int kGroupPlanBytes = 128 + kGroupBlocks * kBlockPlanBytes;      // table flag, the table (§4), pad; the blocks

void write_plan(const GroupChoice& g, int nbk, uint8_t* p) {
  std::memset(p, 0, kGroupPlanBytes);
  p[0] = g.table;
  if (g.table) pack_table(g.lens, p + 1);
  for (int b = 0; b < nbk; ++b) {
    const Choice& c = g.blocks[b];
    uint8_t* q = p + 128 + b * kBlockPlanBytes;
    const uint16_t ref = uint16_t(c.ref);
    std::memcpy(q, &ref, 2);
    q[2] = uint8_t(c.code | c.flip << 4 | int(c.raw) << 5);
    std::memcpy(q + 4, &c.size, 4);
    std::memcpy(q + 8, c.bits, sizeof c.bits);
  }
}

// A group's choices from its plan; false if they are out of range (what
// check_plan refuses: the coder's memory safety, not that it is the plan of these values).
bool read_plan(const uint8_t* p, int64_t count, Layout lay, GroupChoice* g) {
  g->table = p[0] != 0;
  if (p[0] > 1 || (g->table && unpack_table(p + 1, g->lens) != kOk)) return false;
  const int nbk = int((count + kBlock - 1) / kBlock);
  for (int b = 0; b < nbk; ++b) {
    const uint8_t* q = p + 128 + b * kBlockPlanBytes;
    Choice& c = g->blocks[b];
    uint16_t ref;
    std::memcpy(&ref, q, 2);
    std::memcpy(&c.size, q + 4, 4);
    std::memcpy(c.bits, q + 8, sizeof c.bits);
    c.ref = ref, c.code = q[2] & 15, c.flip = q[2] >> 4 & 1, c.raw = q[2] >> 5 & 1;
    const uint32_t raw_bytes = uint32_t(block_elems(count, b)) * uint32_t(lay.elem_bytes);
    if (q[2] >> 6 || c.ref >> lay.q_bits) return false;
    if (c.raw) {
      if (c.size != raw_bytes || c.code || c.flip || c.ref) return false;
      continue;
    }
    if (!(c.code < kMembers || (c.code == kGroupCode && g->table)) || c.size >= raw_bytes) return false;
    uint32_t bits[kLanes], size;
    int32_t devs[kLanes - 1];
    for (int k = 0; k < kLanes; ++k) {  // no lane longer than 128 values of 43 bits: the lane buffers' room
      if (c.bits[k] > kBlock / kLanes * 43) return false;
      bits[k] = c.bits[k];
    }
    narrowest_width(bits, devs, &size);
    if (size != c.size) return false;
  }
  return true;
}

template <int DT>
int64_t compress_typed(int dtype, const uint8_t* in, int64_t n, uint8_t* out, bool generic, bool write, uint8_t* plan,
                       bool planned, int64_t cap) {
  using T = typename Elements<DT>::T;
  const Layout lay = layout_of(dtype);
  const FixedTable fixed(lay);
  const FamilyCodes& fam = family_codes();
  const int64_t nb = num_blocks(n), data_at = data_offset(nb), raw_len = kHeaderBytes + n * lay.elem_bytes;
  const int64_t room = n * lay.elem_bytes - kDescBytes * nb;  // a coded stream's data below this, or it is raw
  if (cap < 0) cap = raw_len;
  const auto raw = [&]() -> int64_t {
    if (plan && !planned) {  // a plan that codes the same: every block raw
      GroupChoice all_raw{};
      for (int64_t b0 = 0; b0 < nb; b0 += kGroupBlocks) {
        const int64_t count = std::min<int64_t>(int64_t(kGroupBlocks) * kBlock, n - b0 * kBlock);
        for (int b = 0; b * int64_t(kBlock) < count; ++b)
          all_raw.blocks[b] = {0, uint32_t(block_elems(count, b) * lay.elem_bytes), 0, 0, true, {}};
        write_plan(all_raw, int((count + kBlock - 1) / kBlock), plan + b0 / kGroupBlocks * kGroupPlanBytes);
      }
    }
    return !write ? raw_len : raw_len <= cap ? store_raw(dtype, in, n, out) : -1;
  };
  if (room <= 0) return raw();
  static thread_local std::unique_ptr<GroupScratch> scratch;
  static thread_local std::unique_ptr<uint8_t[]> record;  // a body near out's end, with slack
  if (!scratch) scratch.reset(new GroupScratch()), record.reset(new uint8_t[kMaxRecord + kBodySlack]);
  GroupScratch& gs = *scratch;
  constexpr int kKeyCache = 4;
  static thread_local std::unique_ptr<KeyTable<DT>[]> key_cache;
  if (!key_cache) key_cache.reset(new KeyTable<DT>[kKeyCache]);
  for (int i = 0; i < kKeyCache; ++i) key_cache[i].table = -1;  // group serials are this stream's
  int next_key = 0, group_serial = 0;
  GroupChoice g;
  uint16_t gcodes[kNumSyms], codes[kNumSyms];
  uint8_t lens[kNumSyms], map[kNumSyms];
  int64_t end = 0;
  bool fits = write;  // still writing: the coded stream so far is within cap
  for (int64_t b0 = 0; b0 < nb; b0 += kGroupBlocks) {
    const uint8_t* gin = in + b0 * kBlock * lay.elem_bytes;
    const int64_t count = std::min<int64_t>(int64_t(kGroupBlocks) * kBlock, n - b0 * kBlock);
    const int nbk = int((count + kBlock - 1) / kBlock);
    uint8_t* gplan = plan ? plan + b0 / kGroupBlocks * kGroupPlanBytes : nullptr;
    if (planned) read_plan(gplan, count, lay, &g);  // checked by the caller (check_plan)
    else if (generic) choose_group_generic(gin, count, lay, &g);
    else choose_group_fast<DT>(gin, count, fixed, gs, &g);
    if (gplan && !planned) write_plan(g, nbk, gplan);
    int64_t bytes = g.table ? kTableBytes : 0;
    for (int b = 0; b < nbk; ++b) bytes += g.blocks[b].size;
    if (end + bytes >= room) return raw();
    fits = fits && data_at + end + bytes <= cap;
    if (!fits) {  // sized only: the stream may yet be raw (and fit), or not fit
      end += bytes;
      continue;
    }
    if (g.table) canonical_codes(g.lens, gcodes, kNumSyms), ++group_serial;
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
        const bool direct = (rec - out) + int64_t(c.size) + kBodySlack <= cap;
        KeyTable<DT>* keys = nullptr;  // a small cache: blocks mostly share a few (code, ref) pairs
        const uint8_t* syms = gs.syms[b];
        const uint8_t* to_ref = nullptr;
#if ZC_HAVE_SIMD
        if (cnt == kBlock && simd_level() != kPlain) {
          const int which = group ? kCombos + group_serial : combo;
          for (int i = 0; i < kKeyCache && !keys; ++i) keys = key_cache[i].table == which && key_cache[i].ref == c.ref ? &key_cache[i] : nullptr;
          if (!keys) {
            keys = &key_cache[next_key++ % kKeyCache];
            keys->build(group ? g.lens : fam.lens[combo], group ? gcodes : fam.codes[combo], c.ref);
            keys->table = which;
          }
        }
#endif
        if (!keys && planned) {  // the portable coder takes symbols: at the coded ref here
          for (int i = 0; i < cnt; ++i) gs.syms[b][i] = uint8_t(symbol_of(load_element(bin + i * lay.elem_bytes, lay.elem_bytes), lay, c.ref));
        } else if (!keys && c.ref != gs.st[b].ref) {
          shift_map(c.ref - gs.st[b].ref, map), to_ref = map;
        }
        uint32_t bits[kLanes];
        for (int k = 0; k < kLanes; ++k) bits[k] = c.bits[k];
        encode_body_fast<DT>(reinterpret_cast<const T*>(bin), cnt, bits, syms, group ? g.lens : fam.lens[combo],
                             group ? gcodes : fam.codes[combo], to_ref, keys, direct ? rec : record.get());
        if (!direct) std::memcpy(rec, record.get(), c.size);
      }
      end += (b == 0 && g.table ? kTableBytes : 0) + c.size;
      store_desc(out + kHeaderBytes + kDescBytes * (b0 + b), uint32_t(end), c.ref, c.code, c.flip, c.raw, b == 0 && g.table);
    }
  }
  if (!write) return data_at + end;
  if (!fits) return -1;  // coded, and longer than cap
  write_header(out, dtype, 0, n);
  return data_at + end;
}

// Decodes elements [begin, begin + count) (begin a multiple of kBlock) into out.
template <int DT>
int decompress_typed(int dtype, const uint8_t* in, int64_t size, int64_t n, int64_t begin, int64_t count, uint8_t* out,
                     bool generic) {
  const Layout lay = layout_of(dtype);
  int flags = 0;
  int status = check_header(in, size, dtype, n, &flags);
  if (status != kOk) return status;
  if (flags & kFlagStoredRaw) {
    if (size - kHeaderBytes < n * lay.elem_bytes) return kErrTruncated;
    if (count) std::memcpy(out, in + kHeaderBytes + begin * lay.elem_bytes, size_t(count * lay.elem_bytes));
    return kOk;
  }
  const int64_t nb = num_blocks(n), data_at = data_offset(nb), b_first = begin / kBlock, b_end = num_blocks(begin + count);
  if (size < data_at) return kErrTruncated;
  const FamilyCodes& fam = family_codes();
  static thread_local std::unique_ptr<uint16_t[]> glut, lut;
  if (!glut) glut.reset(new uint16_t[kLutSize]), lut.reset(new uint16_t[kLutSize]);
  int64_t lut_group = -1;  // the group (2 group + flip) gbaked and, once built, glut decode
  bool glut_built = false;  // glut is wanted only by the generic decoder's verdict on a block
  static thread_local std::unique_ptr<Baked> gbaked;
  if (!gbaked) gbaked.reset(new Baked());
  constexpr int kRefTables = 8;  // a small cache: blocks mostly share a few (code, ref) pairs
  static thread_local std::unique_ptr<RefTable[]> ref_tables;
  if (!ref_tables) ref_tables.reset(new RefTable[kRefTables]);
  for (int i = 0; i < kRefTables; ++i)  // the family's stay: their Baked tables never change
    if (ref_tables[i].from == gbaked.get()) ref_tables[i].from = nullptr;
  int next_ref_table = 0, group_serial = 0;
  const Baked* fam_baked = family_baked<DT>();
  uint8_t lens[kNumSyms], glens[kNumSyms], gflipped[kNumSyms];  // gflipped: lut_group's lengths
  using T = typename Elements<DT>::T;
  // Full coded blocks wait here to be decoded side by side (their lanes' chains overlap): within a
  // group (the group's tables stay), at most kSide - 1 (a failing batch is decoded again one by one).
  struct Waiting {
    const uint8_t* body;
    uint32_t bytes, ref, starts[kLanes + 1];
    const uint16_t* lut;
    const RefTable* tab;
    T* dst;
  } wait[kSide];
  int waiting = 0;
  const auto built = [&](const uint16_t* table) {  // table, glut built if it is glut
    if (table == glut.get() && !glut_built) build_lut(gflipped, glut.get(), kNumSyms), glut_built = true;
    return table;
  };
  const auto decode_alone = [&](const Waiting& w) {  // the exact verdict, or the values
    return decode_body(w.body, w.bytes, kBlock, lay, w.ref, built(w.lut), reinterpret_cast<uint8_t*>(w.dst));
  };
  const auto flush = [&]() {  // the waiting blocks, in block order
    const int k = waiting;
    waiting = 0;
    if (!k) return int(kOk);
#if ZC_HAVE_SIMD
    const uint8_t* bodies[kSide] = {};
    uint32_t sizes[kSide] = {}, lanes[kSide][kLanes + 1];
    const uint32_t* tabs[kSide] = {};
    T* outs[kSide] = {};
    for (int j = 0; j < k; ++j) {
      bodies[j] = wait[j].body, sizes[j] = wait[j].bytes, tabs[j] = wait[j].tab->entry, outs[j] = wait[j].dst;
      std::memcpy(lanes[j], wait[j].starts, sizeof lanes[j]);
    }
    if (side_by_side<DT>(k, bodies, sizes, lanes, tabs, outs)) return int(kOk);
    fallbacks += k;
#endif
    for (int j = 0; j < k; ++j)
      if (const int st = decode_alone(wait[j]); st != kOk) return st;
    return int(kOk);
  };
  int64_t table_at = -1;  // the group table glens holds (its stream offset)
  for (int64_t b = b_first; b < b_end; ++b) {
    const int cnt = block_elems(n, b);
    BlockPlan p{};
    status = plan_block(in, size, nb, b, cnt, lay, &p);
    if (status != kOk) {  // the waiting block comes first
      const int first = flush();
      return first != kOk ? first : status;
    }
    const uint8_t* body = in + data_at + p.start;
    uint8_t* dst = out + (b - b_first) * kBlock * lay.elem_bytes;
    const uint32_t bytes = p.end - p.start;
    if (p.d.raw) {
      std::memcpy(dst, body, bytes);
      continue;
    }
    if (!generic && b + 1 < b_end) {  // the next record, while this one decodes: its lanes are read 16 lines at a time
      const uint32_t next = std::min<uint32_t>(read_desc(in, b + 1).end, uint32_t(size - data_at));
      for (uint32_t at = p.end; at < next; at += 64) __builtin_prefetch(in + data_at + at);
    }
    const uint16_t* table = nullptr;
    const Baked* baked = nullptr;
    if (p.d.code == kGroupCode) {
      if (table_at != int64_t(p.table_at)) {  // a group's blocks share its table: unpacked once
        status = unpack_table(in + data_at + p.table_at, glens);
        if (status != kOk) {
          const int first = flush();
          return first != kOk ? first : status;
        }
        table_at = p.table_at;
      }
      if (!generic && lut_group != 2 * (b / kGroupBlocks) + p.d.flip) {
        if ((status = flush()) != kOk) return status;  // the waiting block may take the tables rebuilt here
        block_lengths(kGroupCode, int(p.d.flip), glens, kFamily, gflipped);
        gbaked->bake<DT>(gflipped);
        glut_built = false;
        lut_group = 2 * (b / kGroupBlocks) + p.d.flip;
        ++group_serial;
      }
      table = glut.get(), baked = gbaked.get();
    } else {
      table = fam.luts[2 * p.d.code + p.d.flip], baked = &fam_baked[2 * p.d.code + p.d.flip];
    }
    if (generic) {
      block_lengths(int(p.d.code), int(p.d.flip), glens, kFamily, lens);
      build_lut(lens, lut.get(), kNumSyms);
      table = lut.get();
    } else {
      const int serial = baked == gbaked.get() ? group_serial : 0;
      RefTable* t = nullptr;
      for (int i = 0; i < kRefTables && !t; ++i)
        t = ref_tables[i].from == baked && ref_tables[i].ref == p.d.ref && ref_tables[i].serial == serial ? &ref_tables[i] : nullptr;
      if (!t) {
        t = &ref_tables[next_ref_table++ % kRefTables];
        while (std::any_of(wait, wait + waiting, [&](const Waiting& w) { return w.tab == t; }))
          t = &ref_tables[next_ref_table++ % kRefTables];  // not a waiting block's (kRefTables > kSide)
        t->bake<DT>(*baked, p.d.ref);
        t->serial = serial;
      }
#if ZC_HAVE_SIMD
      if (cnt == kBlock && simd_level() != kPlain && body + bytes + 8 <= in + size &&
          locate_lanes_fast(body, bytes, wait[waiting].starts) == kOk) {
        Waiting& w = wait[waiting++];
        w.body = body, w.bytes = bytes, w.ref = p.d.ref, w.lut = table, w.tab = t, w.dst = reinterpret_cast<T*>(dst);
        if (waiting == side_count()) status = flush();
        if (status != kOk) return status;
        continue;
      }
#endif
      if ((status = flush()) != kOk) return status;
      if (decode_body_fast<DT>(body, bytes, in + size, cnt, t->entry, reinterpret_cast<T*>(dst))) continue;
      ++fallbacks;
    }
    status = decode_body(body, bytes, cnt, lay, p.d.ref, built(table), dst);
    if (status != kOk) return status;
  }
  if ((status = flush()) != kOk) return status;
  return kOk;
}

}  // namespace

int64_t compress_stream(int dtype, const uint8_t* in, int64_t n, uint8_t* out, bool generic, const uint8_t* plan,
                        int64_t cap) {
  if (n > max_elements(dtype)) return -1;
  uint8_t* p = const_cast<uint8_t*>(plan);  // read only when planned
  if (dtype == kBF16) return compress_typed<kBF16>(dtype, in, n, out, generic, true, p, plan, cap);
  if (dtype == kF16) return compress_typed<kF16>(dtype, in, n, out, generic, true, p, plan, cap);
  return compress_typed<kF32>(dtype, in, n, out, generic, true, p, plan, cap);
}

int64_t stream_bytes(int dtype, const uint8_t* in, int64_t n, uint8_t* plan, bool generic) {
  if (n > max_elements(dtype)) return -1;
  if (dtype == kBF16) return compress_typed<kBF16>(dtype, in, n, nullptr, generic, false, plan, false, -1);
  if (dtype == kF16) return compress_typed<kF16>(dtype, in, n, nullptr, generic, false, plan, false, -1);
  return compress_typed<kF32>(dtype, in, n, nullptr, generic, false, plan, false, -1);
}

int64_t plan_bytes(int64_t n) { return num_groups(num_blocks(n)) * kGroupPlanBytes; }

bool check_plan(int dtype, const uint8_t* plan, int64_t n) {
  const Layout lay = layout_of(dtype);
  GroupChoice g;
  for (int64_t b0 = 0; b0 < num_blocks(n); b0 += kGroupBlocks)
    if (!read_plan(plan + b0 / kGroupBlocks * kGroupPlanBytes, std::min<int64_t>(int64_t(kGroupBlocks) * kBlock, n - b0 * kBlock),
                   lay, &g))
      return false;
  return true;
}

int decompress_stream(int dtype, const uint8_t* in, int64_t size, int64_t n, uint8_t* out, bool generic) {
  if (dtype == kBF16) return decompress_typed<kBF16>(dtype, in, size, n, 0, n, out, generic);
  if (dtype == kF16) return decompress_typed<kF16>(dtype, in, size, n, 0, n, out, generic);
  return decompress_typed<kF32>(dtype, in, size, n, 0, n, out, generic);
}

int64_t generic_fallbacks() { return fallbacks; }

int decompress_range(int dtype, const uint8_t* in, int64_t size, int64_t n, int64_t begin, int64_t count, uint8_t* out) {
  if (begin < 0 || count < 0 || begin % kBlock || count > n - begin || (count % kBlock && begin + count != n)) return kErrCount;
  if (dtype == kBF16) return decompress_typed<kBF16>(dtype, in, size, n, begin, count, out, false);
  if (dtype == kF16) return decompress_typed<kF16>(dtype, in, size, n, begin, count, out, false);
  return decompress_typed<kF32>(dtype, in, size, n, begin, count, out, false);
}

int decompress_accumulate(int dtype, const uint8_t* in, int64_t cap, int64_t k, int64_t n, float* acc) {
  return accumulate_tiled(dtype, k, n, acc, [&](int64_t j, int64_t begin, int64_t count, uint8_t* out) {
    return decompress_range(dtype, in + j * cap, cap, n, begin, count, out);
  });
}

}  // namespace v6
}  // namespace zipccl
