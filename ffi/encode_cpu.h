// Fast CPU encoder (FORMAT.md §7): a block's symbols are counted once, under
// its own emax; the group's two candidate codes follow from those counts. The
// four sub-streams of a block are coded in lockstep (four writers in flight),
// the codes of up to eight elements merged into one 64-bit write.
#pragma once

#include "simd_cpu.h"

namespace zipccl {

#if ZC_HAVE_SIMD
// The top 16 bits of 32 elements from element i.
template <int DT>
ZC_SIMD __m512i load_tops(const uint8_t* in, int i) {
  if constexpr (Elem<DT>::lay.elem_bytes == 2) return _mm512_loadu_si512(in + 2 * i);
  return _mm512_permutex2var_epi16(_mm512_loadu_si512(in + 4 * i), lanes(kOddWords),
                                   _mm512_loadu_si512(in + 4 * i + 64));
}

// symbol_of for the 32 tops h under ref; *esc flags the escapes.
template <int DT, bool SC = false>
ZC_SIMD __m512i symbols_of(__m512i h, __m512i ref, __mmask32* esc) {
  using E = Elem<DT>;
  constexpr int max_delta = SC ? kSignMaxDelta : kMaxDelta;
  const __m512i e = _mm512_and_si512(_mm512_srli_epi16(h, E::e_shift), _mm512_set1_epi16(E::all_ones));
  const __m512i t = _mm512_and_si512(_mm512_srli_epi16(h, E::t_shift), _mm512_set1_epi16(3));
  // d = ref - e wraps when e > ref: min(d, max_delta + 1) + 1 is then the escape class
  __m512i c = _mm512_min_epu16(_mm512_sub_epi16(ref, e), _mm512_set1_epi16(max_delta + 1));
  c = _mm512_maskz_add_epi16(_mm512_test_epi16_mask(e, e), c, _mm512_set1_epi16(1));
  *esc = _mm512_cmpeq_epi16_mask(c, _mm512_set1_epi16(max_delta + 2));
  if constexpr (SC)  // the sign in class bit 4; escapes are class 31
    c = _mm512_mask_mov_epi16(_mm512_or_si512(c, _mm512_and_si512(_mm512_srli_epi16(h, 11), _mm512_set1_epi16(16))),
                              *esc, _mm512_set1_epi16(kClassEsc));
  return _mm512_or_si512(_mm512_slli_epi16(c, kTopBits), t);
}

// §7 step 1 for a full block.
template <int DT>
ZC_SIMD uint32_t block_emax_simd(const uint8_t* in) {
  using E = Elem<DT>;
  const __m512i all_ones = _mm512_set1_epi16(E::all_ones);
  __m512i emax = _mm512_setzero_si512();
  for (int i = 0; i < kBlock; i += 32) {
    const __m512i e = _mm512_and_si512(_mm512_srli_epi16(load_tops<DT>(in, i), E::e_shift), all_ones);
    emax = _mm512_mask_max_epu16(emax, _mm512_cmpneq_epi16_mask(e, all_ones), emax, e);
  }
  emax = _mm512_max_epu16(emax, _mm512_srli_epi32(emax, 16));
  return _mm512_reduce_max_epu32(_mm512_and_si512(emax, _mm512_set1_epi32(0xFFFF)));
}

// block_counts for a full block: its symbols and signs as bytes, then counted
// in eight sub-histograms, so that repeats of a frequent symbol do not wait
// on each other's increments.
template <int DT>
ZC_SIMD uint32_t block_counts_simd(const uint8_t* in, uint32_t (*counts)[kNumSyms]) {
  const uint32_t emax = block_emax_simd<DT>(in);
  const __m512i ref = _mm512_set1_epi16(short(emax));
  alignas(64) uint8_t syms[kBlock];
  for (int i = 0; i < kBlock; i += 32) {
    __mmask32 esc;
    const __m512i h = load_tops<DT>(in, i);
    const __m512i sign = _mm512_and_si512(_mm512_srli_epi16(h, 8), _mm512_set1_epi16(0x80));  // bit 7
    _mm256_store_si256(reinterpret_cast<__m256i*>(syms + i),
                       _mm512_cvtepi16_epi8(_mm512_or_si512(symbols_of<DT>(h, ref, &esc), sign)));
  }
  uint16_t h[8][2 * kNumSyms] = {};
  for (int i = 0; i < kBlock; i += 8)
    for (int j = 0; j < 8; ++j) ++h[j][syms[i + j]];
  for (int s = 0; s < 2 * kNumSyms; ++s)
    counts[s >> 7][s & 127] = h[0][s] + h[1][s] + h[2][s] + h[3][s] + h[4][s] + h[5][s] + h[6][s] + h[7][s];
  return emax;
}
#endif

// §7 steps 1-2 for one block: returns its emax and sets counts[sign][kNumSyms]
// to its symbol counts under ref = emax, per sign. The plain path counts
// (sign, exponent, top bits) keys, whose histogram gives both.
template <int DT>
uint32_t block_counts(const uint8_t* in, int count, uint32_t (*counts)[kNumSyms]) {
#if ZC_HAVE_SIMD
  if (count == kBlock && simd_enabled()) return block_counts_simd<DT>(in, counts);
#endif
  using E = Elem<DT>;
  constexpr uint32_t keys = 2 * E::keys;  // the sign above the key
  uint16_t h[2][keys] = {};  // two sub-histograms: see block_counts_simd
  int i = 0;
  for (; i + 2 <= count; i += 2) ++h[0][E::signed_key(E::top(in, i))], ++h[1][E::signed_key(E::top(in, i + 1))];
  if (i < count) ++h[0][E::signed_key(E::top(in, i))];
  uint32_t emax = 0;
  for (uint32_t k = 0; k < keys; ++k) {
    const uint32_t e = (k >> kTopBits) & E::all_ones;
    if ((h[0][k] || h[1][k]) && e < E::all_ones && e > emax) emax = e;
  }
  std::memset(counts, 0, 2 * kNumSyms * sizeof(uint32_t));
  for (uint32_t k = 0; k < keys; ++k)
    counts[k / E::keys][symbol_of((k >> kTopBits) & E::all_ones, k & 3, emax)] += h[0][k] + h[1][k];
  return emax;
}

// code_lengths of zipccl_format.h (§5.1) over NSYM symbols (128 or 256),
// same result: the leaves are sorted once, and each flattening round keeps
// them sorted but for new ties.
template <int NSYM = kNumSyms>
inline void fast_code_lengths(const uint32_t* counts, uint8_t* lens) {
  constexpr int kShift = NSYM == 256 ? 8 : 7;
  constexpr uint32_t kSym = NSYM - 1;
  static_assert(NSYM == 1 << kShift, "128 or 256 symbols");
  uint32_t leaf[NSYM + 2];  // count << kShift | symbol, ascending; then two past the end
  int n = 0;
  for (int s = 0; s < NSYM; ++s)
    if (counts[s]) leaf[n++] = counts[s] << kShift | uint32_t(s);  // group counts are at most 2^16
  std::sort(leaf, leaf + n);
  std::memset(lens, 0, NSYM);
  if (n == 1) lens[leaf[0] & kSym] = 1;
  if (n < 2) return;
  // Past the end of either queue, weights read as more than any true weight.
  leaf[n] = leaf[n + 1] = ~0u;
  uint32_t node[NSYM + 1];        // weights of internal nodes in creation order
  uint8_t height[NSYM + 1] = {};  // of internal nodes: their deepest leaf's depth below them
  uint16_t parent[2 * NSYM + 1];  // of leaves 0..n-1, then of nodes n..; last: a dummy
  const int dummy = 2 * NSYM;
  for (;;) {
    int li = 0, ni = 0;
    for (int made = 0; made < n - 1; ++made) {  // two-queue Huffman, leaves first on ties
      node[made] = node[made + 1] = ~0u;
      // The two lightest fronts, branch-free (which queue wins is data).
      const uint32_t l0 = leaf[li] >> kShift, l1 = leaf[li + 1] >> kShift, n0 = node[ni], n1 = node[ni + 1];
      const bool a_leaf = l0 <= n0, b_leaf = a_leaf ? l1 <= n0 : l0 <= n1;
      const int leaves = a_leaf + b_leaf, nodes = 2 - leaves;
      const uint16_t p = uint16_t(n + made);
      parent[leaves > 0 ? li : dummy] = p;
      parent[leaves > 1 ? li + 1 : dummy] = p;
      parent[nodes > 0 ? n + ni : dummy] = p;
      parent[nodes > 1 ? n + ni + 1 : dummy] = p;
      const uint32_t b = b_leaf ? (a_leaf ? l1 : l0) : (a_leaf ? n0 : n1);
      node[made] = (a_leaf ? l0 : n0) + b;
      const uint32_t h0 = nodes > 0 ? height[ni] : 0, h1 = nodes > 1 ? height[ni + 1] : 0;
      height[made] = uint8_t((h0 > h1 ? h0 : h1) + 1);
      li += leaves, ni += nodes;
    }
    if (height[n - 2] <= kMaxCodeLen) break;  // the root's height: the longest code
    for (int i = 0; i < n; ++i) {  // halve, rounding up; ties now order by symbol
      const uint32_t v = (((leaf[i] >> kShift) + 1) >> 1) << kShift | (leaf[i] & kSym);
      int j = i;
      for (; j > 0 && leaf[j - 1] > v; --j) leaf[j] = leaf[j - 1];
      leaf[j] = v;
    }
  }
  uint8_t depth[2 * NSYM];
  depth[2 * n - 2] = 0;
  for (int i = 2 * n - 3; i >= 0; --i) depth[i] = uint8_t(depth[parent[i]] + 1);
  for (int i = 0; i < n; ++i) lens[leaf[i] & kSym] = depth[i];
}

// The encoder's code table: code | length << 12 per symbol (lengths <= 12).
inline void encoder_table(const uint8_t* lens, uint16_t* table) {
  uint16_t codes[kNumSyms] = {};
  fast_canonical_codes(lens, codes);
  for (int s = 0; s < kNumSyms; ++s) table[s] = uint16_t(codes[s] | (lens[s] << 12));
}

// Bit writer that stores 8 bytes at a time and advances by whole bytes (its
// buffer has 8 bytes of slack); values are at most 56 bits.
struct Writer {
  uint8_t* out;
  uint64_t acc;
  uint64_t nbits;
  void put(uint64_t value, uint64_t len) {
    acc |= value << nbits;
    nbits += len;
    std::memcpy(out, &acc, 8);
    out += nbits >> 3;
    acc >>= nbits & 56;
    nbits &= 7;
  }
  void flush() {
    if (nbits) *out++ = uint8_t(acc);
  }
};

// Keys of the plain encoder: (exponent, top bits), with SC the sign above them.
template <int DT, bool SC>
constexpr uint32_t kKeys = SC ? 2 * Elem<DT>::keys : Elem<DT>::keys;

template <int DT, bool SC>
uint32_t key_of(uint32_t h) {
  return SC ? Elem<DT>::signed_key(h) : Elem<DT>::key(h);
}

// The plain encoder's table under ref: per key, the bits written (§6: the
// symbol's code, then an escape's exponent and, with SC, sign) | their count << 24.
template <int DT, bool SC>
void key_codes(uint32_t ref, const uint16_t* table, uint32_t* codes) {
  using E = Elem<DT>;
  for (uint32_t k = 0; k < kKeys<DT, SC>; ++k) {
    const uint32_t e = (k >> kTopBits) & E::all_ones, sign = k / E::keys;
    const uint32_t s = symbol_of<SC>(e, k & 3, ref, sign), len = table[s] >> 12;
    codes[k] = escapes(s) ? ((table[s] & 0xFFFu) | (e | sign << E::lay.exp_bits) << len) |
                                (len + E::lay.exp_bits + SC) << 24
                          : (table[s] & 0xFFFu) | len << 24;
  }
}

// Codes elements [begin, end), two per write. (Writers are passed by value:
// kept in registers, as the bytes they store could alias anything in memory.)
template <int DT, bool SC>
Writer encode_keys(const uint8_t* in, int begin, int end, const uint32_t* codes, Writer w) {
  using E = Elem<DT>;
  int i = begin;
  for (; i + 2 <= end; i += 2) {
    const uint32_t a = codes[key_of<DT, SC>(E::top(in, i))], b = codes[key_of<DT, SC>(E::top(in, i + 1))];
    w.put((a & 0xFFFFFFu) | uint64_t(b & 0xFFFFFFu) << (a >> 24), (a >> 24) + (b >> 24));
  }
  if (i < end) {
    const uint32_t a = codes[key_of<DT, SC>(E::top(in, i))];
    w.put(a & 0xFFFFFFu, a >> 24);
  }
  return w;
}

// Writes the raw bytes and packed extra bits of a coded block (§2, §3); with
// SC the sign (bit 0 of extra) is coded, not stored.
template <int DT, bool SC>
void write_low_bits(const uint8_t* in, int count, uint8_t* body) {
  using E = Elem<DT>;
  constexpr Layout lay = E::lay;
  for (int i = 0; i < count; ++i)
    if constexpr (lay.raw_bytes > 0) std::memcpy(body + i * lay.raw_bytes, in + i * lay.elem_bytes, lay.raw_bytes);
  uint8_t* area = body + count * lay.raw_bytes;
  constexpr int w = lay.extra_bits - SC;
  for (int i = 0; w && i < count; i += 8) {  // 8 values fill w bytes
    uint64_t v = 0;
    const int m = count - i < 8 ? count - i : 8;
    for (int j = 0; j < m; ++j) v |= uint64_t(E::extra(E::top(in, i + j)) >> SC) << (j * w);
    std::memcpy(area + (i / 8) * w, &v, size_t((m * w + 7) / 8));
  }
}

#if ZC_HAVE_SIMD
// The encoder's tables: the code table in registers, and the key table for
// elements with escapes, built when first needed.
template <int DT, bool SC>
struct SimdTables {
  __m512i t[4];
  uint32_t ref;
  const uint16_t* table;
  bool built;
  uint32_t codes[kKeys<DT, SC>];

  const uint32_t* key_table() {
    if (!built) key_codes<DT, SC>(ref, table, codes), built = true;
    return codes;
  }
};

// Codes 32 elements from i: codes merged pairwise into 32-bit, then 64-bit
// lanes (at most 48 bits without escapes), then eight per write when they fit
// in 56 bits.
template <int DT, bool SC>
ZC_SIMD inline Writer encode_chunk_simd(const uint8_t* in, int i, __m512i vref, SimdTables<DT, SC>& tab, Writer w) {
  const __m512i lo16 = _mm512_set1_epi32(0xFFFF), lo32 = _mm512_set1_epi64(0xFFFFFFFF);
  __mmask32 esc;
  const __m512i s = symbols_of<DT, SC>(load_tops<DT>(in, i), vref, &esc);
  if (esc) return encode_keys<DT, SC>(in, i, i + 32, tab.key_table(), w);  // exponents follow some codes
  const __m512i ent = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(s, _mm512_set1_epi16(64)),
                                              _mm512_permutex2var_epi16(tab.t[0], s, tab.t[1]),
                                              _mm512_permutex2var_epi16(tab.t[2], s, tab.t[3]));
  const __m512i c1 = _mm512_and_si512(ent, _mm512_set1_epi16(0xFFF)), l1 = _mm512_srli_epi16(ent, 12);
  const __m512i c2 = _mm512_or_si512(_mm512_and_si512(c1, lo16),
                                     _mm512_sllv_epi32(_mm512_srli_epi32(c1, 16), _mm512_and_si512(l1, lo16)));
  const __m512i l2 = _mm512_madd_epi16(l1, _mm512_set1_epi16(1));
  const __m512i c4 = _mm512_or_si512(_mm512_and_si512(c2, lo32),
                                     _mm512_sllv_epi64(_mm512_srli_epi64(c2, 32), _mm512_and_si512(l2, lo32)));
  const __m512i l4 = _mm512_add_epi64(_mm512_and_si512(l2, lo32), _mm512_srli_epi64(l2, 32));
  // eights in the even 64-bit lanes: low four | high four << low length
  const __m512i c8 = _mm512_or_si512(
      c4, _mm512_shuffle_epi32(_mm512_sllv_epi64(c4, _mm512_shuffle_epi32(l4, _MM_PERM_BABA)), _MM_PERM_DCDC));
  const __m512i l8 = _mm512_add_epi64(l4, _mm512_shuffle_epi32(l4, _MM_PERM_DCDC));
  alignas(64) uint64_t code[8], len[8];
  if ((_mm512_cmple_epu64_mask(l8, _mm512_set1_epi64(56)) & 0x55) == 0x55) {
    _mm512_store_si512(code, c8);
    _mm512_store_si512(len, l8);
    for (int k = 0; k < 8; k += 2) w.put(code[k], len[k]);
  } else {
    _mm512_store_si512(code, c4);
    _mm512_store_si512(len, l4);
    for (int k = 0; k < 8; ++k) w.put(code[k], len[k]);
  }
  return w;
}

// Codes the four sub-streams of a full block, a chunk of each in turn: four
// independent writers in flight.
template <int DT, bool SC>
ZC_SIMD void encode_substreams_simd(const uint8_t* in, uint32_t ref, const uint16_t* table, Writer* w) {
  SimdTables<DT, SC> tab;
  for (int j = 0; j < 4; ++j) tab.t[j] = _mm512_loadu_si512(table + 32 * j);
  tab.ref = ref, tab.table = table, tab.built = false;
  const __m512i vref = _mm512_set1_epi16(short(ref));
  constexpr int q = kBlock / kSubstreams;
  Writer w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];
  for (int i = 0; i < q; i += 32) {
    w0 = encode_chunk_simd<DT, SC>(in, i, vref, tab, w0);
    w1 = encode_chunk_simd<DT, SC>(in, q + i, vref, tab, w1);
    w2 = encode_chunk_simd<DT, SC>(in, 2 * q + i, vref, tab, w2);
    w3 = encode_chunk_simd<DT, SC>(in, 3 * q + i, vref, tab, w3);
  }
  w[0] = w0, w[1] = w1, w[2] = w2, w[3] = w3;
}

// write_low_bits for a full block.
template <int DT, bool SC>
ZC_SIMD void write_low_bits_simd(const uint8_t* in, uint8_t* body) {
  constexpr Layout lay = Elem<DT>::lay;
  uint8_t* area = body + kBlock * lay.raw_bytes;
  for (int i = 0; i < kBlock; i += 32) {
    const __m512i h = load_tops<DT>(in, i);
    if constexpr (DT == kF16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(body + i), _mm512_cvtepi16_epi8(h));
      const uint32_t signs = _mm512_movepi16_mask(h);
      if constexpr (!SC) std::memcpy(area + i / 8, &signs, 4);
      continue;
    }
    if constexpr (DT == kF32)
      _mm512_storeu_si512(body + 2 * i, _mm512_permutex2var_epi16(_mm512_loadu_si512(in + 4 * i), lanes(kEvenWords),
                                                                   _mm512_loadu_si512(in + 4 * i + 64)));
    if constexpr (SC) {
      // extra >> 1 = h & 0x1F, 5 bits; two, four in 20 bits, then eight per 40 bits in the even 64-bit lanes
      const __m512i two = _mm512_madd_epi16(_mm512_and_si512(h, _mm512_set1_epi16(0x1F)), _mm512_set1_epi32(0x00200001));
      const __m512i four = _mm512_and_si512(_mm512_or_si512(two, _mm512_srli_epi64(two, 22)), _mm512_set1_epi64(0xFFFFF));
      const __m512i eight = _mm512_or_si512(four, _mm512_slli_epi64(_mm512_shuffle_epi32(four, _MM_PERM_BADC), 20));
      const __m512i packed = _mm512_permutexvar_epi8(lanes(kPack40), eight);
      _mm256_mask_storeu_epi8(area + i / 8 * 5, 0xFFFFF, _mm512_castsi512_si256(packed));
      continue;
    }
    // extra = (h & 0x1F) << 1 | h >> 15, 6 bits; two, four, then eight per 48 bits
    const __m512i extra = _mm512_ternarylogic_epi32(_mm512_slli_epi16(h, 1), _mm512_set1_epi16(0x3E),
                                                    _mm512_srli_epi16(h, 15), 0xEA);  // (a & b) | c
    const __m512i two = _mm512_madd_epi16(extra, _mm512_set1_epi32(0x00400001));
    const __m512i four = _mm512_or_si512(two, _mm512_srli_epi64(two, 20));
    const __m512i packed = _mm512_permutexvar_epi8(lanes(kPack24), four);
    _mm256_mask_storeu_epi8(area + i / 8 * 6, 0xFFFFFF, _mm512_castsi512_si256(packed));
  }
}
#endif

// Stream buffer of one sub-stream: every element at most 20 bits, plus slack.
constexpr int kStreamBytes = kBlock / kSubstreams * kMaxElementBits / 8 + 16;

// Encodes one block (see encode_block) under ref with its group's encoder
// table into body, which has room for count * elem_bytes bytes; SC: the group
// codes the sign (§4.1). Returns the block's descriptor.
template <int DT, bool SC>
uint32_t encode_block_fast(const uint8_t* in, int count, uint32_t ref, const uint16_t* table, uint8_t* body) {
  constexpr Layout lay = Elem<DT>::lay;
  alignas(64) uint8_t streams[kSubstreams][kStreamBytes];
  const int q = substream_len(count);
#if ZC_HAVE_SIMD
  const bool simd = count == kBlock && simd_enabled();
#else
  const bool simd = false;
#endif
  Writer w[kSubstreams];
  for (int k = 0; k < kSubstreams; ++k) w[k] = {streams[k], 0, 0};
#if ZC_HAVE_SIMD
  if (simd) encode_substreams_simd<DT, SC>(in, ref, table, w);
#endif
  if (!simd) {
    uint32_t codes[kKeys<DT, SC>];
    key_codes<DT, SC>(ref, table, codes);
    for (int k = 0; k < kSubstreams; ++k)
      w[k] = encode_keys<DT, SC>(in, k * q < count ? k * q : count, (k + 1) * q < count ? (k + 1) * q : count, codes,
                                 w[k]);
  }
  uint32_t stream_bytes[kSubstreams];
  const uint32_t sizes_at = uint32_t(count) * lay.raw_bytes + extra_area_bytes(count, group_layout(lay, SC ? kMaskSign : 0));
  uint32_t coded = sizes_at + kSubstreamHeader;
  for (int k = 0; k < kSubstreams; ++k) {
    w[k].flush();
    stream_bytes[k] = uint32_t(w[k].out - streams[k]);
    coded += stream_bytes[k];
  }
  const uint32_t raw_block = uint32_t(count) * lay.elem_bytes;
  if (coded >= raw_block) {
    std::memcpy(body, in, raw_block);
    return make_descriptor(raw_block, 0, 0);
  }
#if ZC_HAVE_SIMD
  if (simd) write_low_bits_simd<DT, SC>(in, body);
#endif
  if (!simd) write_low_bits<DT, SC>(in, count, body);
  uint8_t* dst = body + sizes_at;
  for (int k = 0; k + 1 < kSubstreams; ++k) {
    *dst++ = uint8_t(stream_bytes[k]);
    *dst++ = uint8_t(stream_bytes[k] >> 8);
  }
  for (int k = 0; k < kSubstreams; ++k) {
    std::memcpy(dst, streams[k], stream_bytes[k]);
    dst += stream_bytes[k];
  }
  return make_descriptor(coded, ref, 1);
}


}  // namespace zipccl
