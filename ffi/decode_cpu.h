// Fast CPU decoder: tables built per group decode up to three symbols per
// 12-bit window; the four sub-streams are decoded in lockstep (four dependency
// chains) into symbol bytes, and a second pass turns symbols, stored bytes and
// extra bits into elements.
#pragma once

#include "simd_cpu.h"

namespace zipccl {

// Decode tables of a group, one entry per 12-bit window (LSB first).
// multi: up to three symbols per lookup, for a buffer filled downwards:
//   bits 0-3    bits taken by the entry's symbols
//   bit 4       kEscaped: the only symbol escapes, its exponent follows
//   bit 5       kInvalid: no code starts the window (it takes no bits)
//   bits 6-7    symbols written: 1 to 3
//   bits 8-15   third symbol, bits 16-23 second, bits 24-31 first
// A 32-bit store at out - 3 puts the first symbol at out, the second below it,
// and the rest at positions still to be written. Further symbols are included
// while their codes fit in the window and none escapes.
// single: symbol | code length << 8 | kSingleEscaped | kSingleInvalid, for
// the last symbols of a sub-stream.
constexpr uint32_t kEscaped = 0x10, kInvalid = 0x20;
constexpr uint32_t kSingleEscaped = 0x1000, kSingleInvalid = 0x2000;
struct DecodeTable {
  uint32_t multi[kLutSize];
  uint16_t single[kLutSize];
  bool escapes;  // some escape symbol has a code
};

inline uint32_t multi_entry(uint32_t bits, uint32_t n, uint32_t s1, uint32_t s2, uint32_t s3) {
  return bits | n << 6 | s3 << 8 | s2 << 16 | s1 << 24;
}

// The plain builder: codes filled in strided, then each window's entry from
// its first code and the entry (of two symbols) of the bits after it.
inline void build_decode_table_plain(const uint8_t* lens, int nsym, DecodeTable* t) {
  uint16_t codes[kMaxSyms];
  fast_canonical_codes(lens, codes, nsym);
  uint32_t kraft = 0;
  for (int s = 0; s < nsym; ++s) kraft += lens[s] ? 1u << (kMaxCodeLen - lens[s]) : 0;
  uint32_t two[kLutSize];  // entries of at most two symbols
  if (kraft < uint32_t(kLutSize))
    for (int w = 0; w < kLutSize; ++w) t->single[w] = kSingleInvalid, two[w] = t->multi[w] = multi_entry(kInvalid, 1, 0, 0, 0);
  for (int s = 0; s < nsym; ++s)
    for (uint32_t r = 0; lens[s] && r < (1u << (kMaxCodeLen - lens[s])); ++r)
      t->single[codes[s] | (r << lens[s])] = uint16_t(s | (lens[s] << 8) | (escapes(s) ? kSingleEscaped : 0));
  for (int pass = 0; pass < 2; ++pass) {
    uint32_t* out = pass ? t->multi : two;
    for (uint32_t s1 = 0; s1 < uint32_t(nsym); ++s1) {
      const uint32_t l1 = lens[s1], room = kMaxCodeLen - l1;  // room: bits after the first code
      for (uint32_t r = 0; l1 && r < (1u << room); ++r) {     // r: those bits
        const uint32_t next = t->single[r], l2 = (next >> 8) & 15, s2 = next & 0xFF;
        const bool ok2 = !escapes(int(s1)) && !(next & (kSingleInvalid | kSingleEscaped)) && l2 <= room;
        const uint32_t after = pass ? two[r] : 0;  // for the third symbol, if it fits too
        const bool ok3 = pass && ok2 && (after >> 6 & 3) == 2 && (after & 15) <= room;
        out[codes[s1] | (r << l1)] = multi_entry(l1 + (ok3 ? after & 15 : ok2 ? l2 : 0), 1 + ok2 + ok3, s1,
                                                 ok2 ? s2 : 0, ok3 ? (after >> 16) & 0xFF : 0) |
                                     (escapes(int(s1)) ? kEscaped : 0);
      }
    }
  }
}

#if ZC_HAVE_SIMD
// A canonical code (§5.2) for decoding 32 windows at once. A window read MSB
// first, v, is a left-justified code: the codes of length l are the values
// [end[l - 1], end[l]), so a code's length is 1 + the number of ends <= v,
// and its symbol follows from its rank among the codes.
struct SimdCode {
  __m512i len_of_block[2];  // ends of lengths up to 7 are multiples of 32: their count per 32 values
  __m512i end[kMaxCodeLen + 1];
  __m512i start, rank;  // per length: its first code (left-justified) and that code's rank
  __m512i by_rank[4];
};

struct SimdCodes {  // 32 decoded windows
  __m512i sym, len;
  __mmask32 valid;  // a code starts the window
  __mmask32 ok;     // ... and it does not escape
};

ZC_SIMD inline void simd_code(const uint8_t* lens, int nsym, SimdCode* c) {
  alignas(64) uint16_t start[32] = {}, rank[32] = {};
  alignas(64) uint8_t by_rank[kMaxSyms] = {}, len_of_block[kNumSyms];
  uint16_t end[kMaxCodeLen + 1] = {};
  int count[kMaxCodeLen + 1] = {};
  for (int s = 0; s < nsym; ++s) ++count[lens[s]];
  for (int l = 1, code = 0, r = 0; l <= kMaxCodeLen; ++l) {
    start[l] = uint16_t(code << (kMaxCodeLen - l)), rank[l] = uint16_t(r);
    code += count[l], r += count[l];
    end[l] = uint16_t(code << (kMaxCodeLen - l));
    code <<= 1;
  }
  for (int s = 0, next[kMaxCodeLen + 1] = {}; s < nsym; ++s)
    if (lens[s]) by_rank[rank[lens[s]] + next[lens[s]]++] = uint8_t(s);
  for (int b = 0; b < kNumSyms; ++b) {
    len_of_block[b] = 1;
    for (int l = 1; l <= 7; ++l) len_of_block[b] += 32 * b >= end[l];
  }
  for (int h = 0; h < 2; ++h) c->len_of_block[h] = _mm512_load_si512(len_of_block + 64 * h);
  for (int h = 0; h < 4; ++h) c->by_rank[h] = _mm512_load_si512(by_rank + 64 * h);
  for (int l = 0; l <= kMaxCodeLen; ++l) c->end[l] = _mm512_set1_epi16(short(end[l]));
  c->start = _mm512_load_si512(start);
  c->rank = _mm512_load_si512(rank);
}

ZC_SIMD inline SimdCodes simd_decode(const SimdCode& c, __m512i v) {
  constexpr __mmask64 even = 0x5555555555555555ull;  // the low bytes of 16-bit lanes
  SimdCodes d;
  d.len = _mm512_maskz_permutex2var_epi8(even, c.len_of_block[0], _mm512_srli_epi16(v, 5), c.len_of_block[1]);
  for (int l = 8; l < kMaxCodeLen; ++l)
    d.len = _mm512_mask_add_epi16(d.len, _mm512_cmpge_epu16_mask(v, c.end[l]), d.len, _mm512_set1_epi16(1));
  const __m512i offset = _mm512_srlv_epi16(_mm512_sub_epi16(v, _mm512_permutexvar_epi16(d.len, c.start)),
                                           _mm512_sub_epi16(_mm512_set1_epi16(kMaxCodeLen), d.len));
  const __m512i r = _mm512_add_epi16(_mm512_permutexvar_epi16(d.len, c.rank), offset);
  const __m512i low = _mm512_maskz_permutex2var_epi8(even, c.by_rank[0], r, c.by_rank[1]);
  const __m512i high = _mm512_maskz_permutex2var_epi8(even, c.by_rank[2], r, c.by_rank[3]);
  d.sym = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(r, _mm512_set1_epi16(128)), low, high);
  d.valid = _mm512_cmplt_epu16_mask(v, c.end[kMaxCodeLen]);
  const __m512i esc = _mm512_set1_epi16(kClassEsc << kTopBits);
  d.ok = d.valid & _mm512_cmpneq_epi16_mask(_mm512_and_si512(d.sym, esc), esc);
  return d;
}

// build_decode_table_plain, 32 windows at a time (the same tables).
ZC_SIMD inline void build_decode_table_simd(const uint8_t* lens, int nsym, DecodeTable* t) {
  SimdCode code;
  simd_code(lens, nsym, &code);
  const __m512i one = _mm512_set1_epi16(1), twelve = _mm512_set1_epi16(kMaxCodeLen);
  const __m512i low12 = _mm512_set1_epi16(kLutSize - 1);
  for (int m = 0; m < kLutSize / 32; ++m) {
    // v of window 32m + i: the 12-bit reversal of i (bits 7-11) and of 32m (bits 0-6)
    int rev_m = 0;
    for (int b = 0; b < 7; ++b) rev_m |= ((m >> b) & 1) << (6 - b);
    const __m512i v1 = _mm512_or_si512(lanes(kReverse5Words), _mm512_set1_epi16(short(rev_m)));
    const SimdCodes c1 = simd_decode(code, v1);
    const __m512i v2 = _mm512_and_si512(_mm512_sllv_epi16(v1, c1.len), low12);  // the bits after it
    const SimdCodes c2 = simd_decode(code, v2);
    const __m512i len12 = _mm512_add_epi16(c1.len, c2.len);
    const __mmask32 ok2 = c1.ok & c2.ok & _mm512_cmple_epu16_mask(len12, twelve);
    const __m512i v3 = _mm512_and_si512(_mm512_sllv_epi16(v2, c2.len), low12);
    const SimdCodes c3 = simd_decode(code, v3);
    const __mmask32 ok3 = ok2 & c3.ok & _mm512_cmple_epu16_mask(_mm512_add_epi16(len12, c3.len), twelve);
    __m512i bits = _mm512_maskz_mov_epi16(c1.valid, c1.len);
    bits = _mm512_mask_add_epi16(bits, ok2, bits, c2.len);
    bits = _mm512_mask_add_epi16(bits, ok3, bits, c3.len);
    __m512i n = _mm512_mask_add_epi16(one, ok2, one, one);
    n = _mm512_mask_add_epi16(n, ok3, n, one);
    bits = _mm512_mask_mov_epi16(bits, c1.valid & ~c1.ok, _mm512_or_si512(bits, _mm512_set1_epi16(kEscaped)));
    bits = _mm512_mask_mov_epi16(bits, ~c1.valid, _mm512_or_si512(bits, _mm512_set1_epi16(kInvalid)));
    const __m512i s1 = _mm512_maskz_mov_epi16(c1.valid, c1.sym);
    const __m512i low = _mm512_or_si512(_mm512_or_si512(bits, _mm512_slli_epi16(n, 6)),
                                        _mm512_slli_epi16(_mm512_maskz_mov_epi16(ok3, c3.sym), 8));
    const __m512i high = _mm512_or_si512(_mm512_maskz_mov_epi16(ok2, c2.sym), _mm512_slli_epi16(s1, 8));
    _mm512_storeu_si512(t->multi + 32 * m, _mm512_permutex2var_epi16(low, lanes(kJoinLow), high));
    _mm512_storeu_si512(t->multi + 32 * m + 16, _mm512_permutex2var_epi16(low, lanes(kJoinHigh), high));
    __m512i single = _mm512_or_si512(c1.sym, _mm512_slli_epi16(c1.len, 8));
    single = _mm512_mask_mov_epi16(single, c1.valid & ~c1.ok, _mm512_or_si512(single, _mm512_set1_epi16(short(kSingleEscaped))));
    _mm512_storeu_si512(t->single + 32 * m, _mm512_mask_mov_epi16(single, ~c1.valid, _mm512_set1_epi16(short(kSingleInvalid))));
  }
}
#endif

// The decode tables of a group from its valid code lengths (nsym symbols).
inline void build_decode_table(const uint8_t* lens, int nsym, DecodeTable* t) {
  t->escapes = false;
  for (int s = 0; s < nsym; ++s) t->escapes |= escapes(s) && lens[s] != 0;
#if ZC_HAVE_SIMD
  if (simd_enabled()) return build_decode_table_simd(lens, nsym, t);
#endif
  build_decode_table_plain(lens, nsym, t);
}

// A sub-stream being decoded into symbol bytes, downwards from out. buf holds
// the valid bits, then a 1 above them (so their count costs no register and
// no work per lookup); refills load 8 bytes at p. bad collects the entries'
// kInvalid bits.
struct Reader {
  const uint8_t* p;
  uint64_t buf;
  uint8_t* out;
  uint32_t bad;

  uint64_t valid_bits() const { return uint64_t(63 ^ __builtin_clzll(buf)); }  // the sentinel's position
  void refill() {  // to at least 56 valid bits
    const uint64_t v = valid_bits(), nv = v | 56;
    const uint64_t bits = (buf & ((1ull << v) - 1)) | load_u64(p) << v;
    p += (63 ^ v) >> 3;
    buf = (bits & ((1ull << nv) - 1)) | 1ull << nv;
  }
  void take(uint32_t n) { buf >>= n & 15; }
  // After an escape symbol at sym: its exponent, into esc at the same position.
  template <int EscBits>
  void take_exponent(const uint8_t* sym, uint8_t* esc, const uint8_t* base) {
    refill();
    esc[sym - base] = uint8_t(buf & ((1u << EscBits) - 1));
    buf >>= EscBits;
  }
  // One lookup, one to three symbols. Needs 12 valid bits in buf. EscBits:
  // the exponent width after an escape, 0 if the code has no escape symbol
  // (the test for one costs much in this loop).
  template <int EscBits>
  void step(const DecodeTable& t, uint8_t* esc, const uint8_t* base) {
    const uint32_t e = t.multi[buf & (kLutSize - 1)];
    std::memcpy(out - 3, &e, 4);
    take(e);
    bad |= e;
    out -= (e & 0xFF) >> 6;
    if (EscBits && __builtin_expect(e & kEscaped, 0)) take_exponent<EscBits>(out + 1, esc, base);
  }
  // One symbol. Needs 12 valid bits in buf.
  template <int EscBits>
  void step_one(const DecodeTable& t, uint8_t* esc, const uint8_t* base) {
    const uint32_t e = t.single[buf & (kLutSize - 1)];
    *out = uint8_t(e);
    buf >>= (e >> 8) & 15;
    bad |= e >> 8;  // kSingleInvalid >> 8 == kInvalid
    if (EscBits && (e & kSingleEscaped)) take_exponent<EscBits>(out, esc, base);
    --out;
  }
};

// Symbols of a block being decoded: symbol i of sub-stream k at sym[k][kTop - i],
// with an escape's exponent at esc[k][kTop - i].
constexpr int kSymCap = kBlock / kSubstreams + 8;
constexpr int kTop = kSymCap - 4;  // room for 3 bytes written below the last symbol
struct BlockSymbols {
  alignas(64) uint8_t sym[kSubstreams][kSymCap];
  alignas(64) uint8_t esc[kSubstreams][kSymCap];
};

// A block of up to 4096 symbols of at most 20 bits each: reads past its
// sub-streams stay below this, whatever the input.
constexpr int kStreamSlack = (kBlock / kSubstreams) * kMaxElementBits / 8 + 16;

// Decodes the four sub-streams (at bit start[k] of bits, len[k] symbols) into
// bs; rd receives the readers' final state.
template <int EscBits>
__attribute__((always_inline)) inline void decode_symbols_body(const uint8_t* bits, const uint32_t* start,
                                                               const int* len, const DecodeTable& t,
                                                               BlockSymbols& bs, Reader* rd) {
  Reader r0{bits + (start[0] >> 3), 1, bs.sym[0] + kTop, 0}, r1{bits + (start[1] >> 3), 1, bs.sym[1] + kTop, 0};
  Reader r2{bits + (start[2] >> 3), 1, bs.sym[2] + kTop, 0}, r3{bits + (start[3] >> 3), 1, bs.sym[3] + kTop, 0};
  r0.refill(), r1.refill(), r2.refill(), r3.refill();  // four chains, in registers
  r0.buf >>= start[0] & 7, r1.buf >>= start[1] & 7, r2.buf >>= start[2] & 7, r3.buf >>= start[3] & 7;
  const uint8_t* lim[kSubstreams];  // down to it, 4 steps of up to 3 symbols fit
  for (int k = 0; k < kSubstreams; ++k) lim[k] = bs.sym[k] + kTop - len[k] + 12;
  while (r0.out >= lim[0] && r1.out >= lim[1] && r2.out >= lim[2] && r3.out >= lim[3]) {
    r0.refill(), r1.refill(), r2.refill(), r3.refill();
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {  // 56 valid bits cover four 12-bit lookups
      r0.step<EscBits>(t, bs.esc[0], bs.sym[0]);
      r1.step<EscBits>(t, bs.esc[1], bs.sym[1]);
      r2.step<EscBits>(t, bs.esc[2], bs.sym[2]);
      r3.step<EscBits>(t, bs.esc[3], bs.sym[3]);
    }
  }
  rd[0] = r0, rd[1] = r1, rd[2] = r2, rd[3] = r3;
  for (bool more = true; more;) {  // the last symbols: still a lookup per sub-stream in turn
    more = false;
    for (int k = 0; k < kSubstreams; ++k) {
      const ptrdiff_t left = rd[k].out - (bs.sym[k] + kTop - len[k]);
      if (left <= 0) continue;
      more = true;
      rd[k].refill();
      if (left >= 3) rd[k].step<EscBits>(t, bs.esc[k], bs.sym[k]);
      else rd[k].step_one<EscBits>(t, bs.esc[k], bs.sym[k]);
    }
  }
}

template <int EscBits>
void decode_symbols(const uint8_t* bits, const uint32_t* start, const int* len, const DecodeTable& t,
                    BlockSymbols& bs, Reader* rd) {
  decode_symbols_body<EscBits>(bits, start, len, t, bs, rd);
}

#if ZC_HAVE_SIMD
template <int EscBits>  // the same with BMI2's shifts
ZC_SIMD void decode_symbols_simd(const uint8_t* bits, const uint32_t* start, const int* len, const DecodeTable& t,
                                 BlockSymbols& bs, Reader* rd) {
  decode_symbols_body<EscBits>(bits, start, len, t, bs, rd);
}
#endif

// §4 decoding of the class: the exponent per class under ref (escapes: 0, the
// exponent comes from the stream); kBadExp for a class that would give e < 1.
// (A corrupt ref can give exponents too wide for the dtype: they are cut as
// join_element cuts them.)
constexpr uint16_t kBadExp = 0x100;
inline void class_exponents(uint32_t ref, uint16_t* exps) {
  for (int c = 0; c < kNumClasses; ++c) {
    const bool coded = c != kClassZero && c != kClassEsc;
    exps[c] = uint16_t(!coded ? 0 : uint32_t(c - 1) < ref ? ref - (c - 1) : kBadExp);
  }
}

template <int DT, bool SC>
uint32_t unpack_extra(const uint8_t* extras, int j) {
  constexpr int w = Elem<DT>::lay.extra_bits - SC;
  if constexpr (w == 0) return 0;
  const uint32_t bit = uint32_t(j) * w;
  uint32_t two = extras[bit >> 3];
  if ((bit & 7) + w > 8) two |= uint32_t(extras[(bit >> 3) + 1]) << 8;
  return (two >> (bit & 7)) & ((1u << w) - 1);
}

// Joins symbols, stored bytes and extras (of the m stored elements at area)
// into the block's elements (§3); with SC the sign comes from the symbol
// (§4.1), with ZEROS implied zeros store nothing (§4.2). Returns false on an
// invalid symbol.
template <int DT, bool SC, bool ZEROS>
bool join_elements(const uint8_t* area, int m, int count, const uint16_t* exps, const BlockSymbols& bs,
                   uint8_t* out) {
  using E = Elem<DT>;
  constexpr Layout lay = E::lay;
  const uint8_t* extras = area + m * lay.raw_bytes;
  const int q = substream_len(count);
  for (int i = 0, k = 0, j = 0, n = 0; i < count; ++i, ++j) {
    if (j == q) ++k, j = 0;  // symbol j of sub-stream k
    const uint32_t s = bs.sym[k][kTop - j], c = (s >> kTopBits) & (kNumClasses - 1), sign = s >> kSignBit;
    const uint32_t e = c == uint32_t(kClassEsc) ? bs.esc[k][kTop - j] : exps[c];
    if (e == kBadExp) return false;
    if (ZEROS && (s & (kNumSyms - 1)) == 0) {  // an implied zero
      const uint32_t x = SC ? sign << (8 * lay.elem_bytes - 1) : 0;
      std::memcpy(out + i * lay.elem_bytes, &x, lay.elem_bytes);
      continue;
    }
    const uint32_t stored = unpack_extra<DT, SC>(extras, n);
    const uint32_t h = E::join_top(e, s & 3u, SC ? stored << 1 | sign : stored);
    if constexpr (lay.elem_bytes == 2) {
      const uint16_t x = uint16_t(h | (lay.raw_bytes ? area[n] : 0));
      std::memcpy(out + 2 * i, &x, 2);
    } else {
      const uint32_t x = h << 16 | area[2 * n + 1] << 8 | area[2 * n];
      std::memcpy(out + 4 * i, &x, 4);
    }
    ++n;
  }
  return true;
}

#if ZC_HAVE_SIMD
// 32 bytes from p, in reverse order, as 16-bit lanes.
ZC_SIMD inline __m512i bytes_to_words_reversed(const uint8_t* p) {
  const __m512i bytes = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_maskz_permutexvar_epi8(0x5555555555555555ull, lanes(kReverseToWords), bytes);
}

// The exponent and top mantissa bits of 32 symbols s (an escape's exponent
// from esc, in the same order), in their places in an element's top 16
// bits; bad collects kBadExp.
template <int DT>
ZC_SIMD inline __m512i exponent_and_top_bits(__m512i s, __m512i vexps, const uint8_t* esc, __m512i* bad) {
  using E = Elem<DT>;
  const __m512i c = _mm512_and_si512(_mm512_srli_epi16(s, kTopBits), _mm512_set1_epi16(kNumClasses - 1));
  const __mmask32 escaped = _mm512_cmpeq_epi16_mask(c, _mm512_set1_epi16(kClassEsc));
  __m512i e = _mm512_permutexvar_epi16(c, vexps);
  if (escaped) e = _mm512_mask_mov_epi16(e, escaped, bytes_to_words_reversed(esc));  // rare
  *bad = _mm512_or_si512(*bad, e);  // kBadExp: bit 8
  // e | t: (s << t_shift) & the top bits' place
  return _mm512_ternarylogic_epi32(_mm512_slli_epi16(e, E::e_shift), _mm512_slli_epi16(s, E::t_shift),
                                   _mm512_set1_epi16(3 << E::t_shift), 0xF8);  // a | (b & c)
}

// join_elements for a full block without ZEROS.
template <int DT, bool SC>
ZC_SIMD bool join_elements_simd(const uint8_t* area, const uint16_t* exps, const BlockSymbols& bs, uint8_t* out) {
  using E = Elem<DT>;
  constexpr Layout lay = E::lay;
  constexpr int q = kBlock / kSubstreams;
  const uint8_t* extras = area + kBlock * lay.raw_bytes;
  const __m512i vexps = _mm512_loadu_si512(exps);
  __m512i bad = _mm512_setzero_si512();
  for (int k = 0; k < kSubstreams; ++k) {
    for (int j = 0; j < q; j += 32) {
      const int i = k * q + j;
      const int at = kTop - j - 31;  // symbols j .. j + 31, downwards
      const __m512i s = bytes_to_words_reversed(bs.sym[k] + at);
      __m512i h = exponent_and_top_bits<DT>(s, vexps, bs.esc[k] + at, &bad);
      if constexpr (SC) {  // the sign from the symbols; five raw bits for bf16 and fp32, none for fp16
        h = _mm512_or_si512(h, _mm512_slli_epi16(_mm512_srli_epi16(s, kSignBit), 15));
        if constexpr (DT == kF16) {
          h = _mm512_or_si512(h, _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(area + i))));
        } else {
          const __m512i bytes = _mm512_maskz_loadu_epi8(0xFFFFF, extras + i / 8 * 5);
          h = _mm512_ternarylogic_epi32(
              h, _mm512_srlv_epi16(_mm512_permutexvar_epi8(lanes(kFiveBitBytes), bytes), lanes(kFiveBitShifts)),
              _mm512_set1_epi16(0x1F), 0xF8);  // a | (b & c)
        }
      } else if constexpr (DT == kF16) {
        uint32_t signs;
        std::memcpy(&signs, extras + i / 8, 4);
        h = _mm512_or_si512(h, _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(area + i))));
        h = _mm512_mask_mov_epi16(h, signs, _mm512_or_si512(h, _mm512_set1_epi16(short(0x8000))));
      } else {
        const __m512i bytes = _mm512_maskz_loadu_epi8(0xFFFFFF, extras + i / 8 * 6);
        const __m512i x = _mm512_and_si512(
            _mm512_srlv_epi16(_mm512_permutexvar_epi8(lanes(kSixBitBytes), bytes), lanes(kSixBitShifts)),
            _mm512_set1_epi16(0x3F));
        h = _mm512_ternarylogic_epi32(h, _mm512_slli_epi16(x, 15), _mm512_srli_epi16(x, 1), 0xFE);
      }
      if constexpr (lay.elem_bytes == 2) {
        _mm512_storeu_si512(out + 2 * i, h);
      } else {
        const __m512i low = _mm512_loadu_si512(area + 2 * i);
        _mm512_storeu_si512(out + 4 * i, _mm512_permutex2var_epi16(low, lanes(kJoinLow), h));
        _mm512_storeu_si512(out + 4 * i + 64, _mm512_permutex2var_epi16(low, lanes(kJoinHigh), h));
      }
    }
  }
  return !_mm512_test_epi16_mask(bad, _mm512_set1_epi16(0x100));
}

// w-bit fields f, f + 1, ... (LSB first) of the extras, which end at end,
// one per 16-bit lane (fields past the end read as 0).
template <int w>
ZC_SIMD inline __m512i load_fields(const uint8_t* extras, const uint8_t* end, int f) {
  const int bit = f * w;
  const uint8_t* from = extras + bit / 8;
  const int64_t want = ((7 + 31 * w) >> 3) + 2, have = end - from;  // the last lane's second byte, at most
  const __m512i bytes = _mm512_maskz_loadu_epi8(_bzhi_u64(~0ull, unsigned(have < want ? (have > 0 ? have : 0) : want)),
                                                from);
  const __m512i at = _mm512_add_epi16(_mm512_set1_epi16(short(bit & 7)), lanes(kFieldBits<w>));
  const __m512i first = _mm512_srli_epi16(at, 3);  // each lane: bytes first and first + 1, low and high
  const __m512i index = _mm512_add_epi16(_mm512_or_si512(first, _mm512_slli_epi16(first, 8)), _mm512_set1_epi16(0x100));
  const __m512i two = _mm512_permutexvar_epi8(index, bytes);
  return _mm512_and_si512(_mm512_srlv_epi16(two, _mm512_and_si512(at, _mm512_set1_epi16(7))),
                          _mm512_set1_epi16((1 << w) - 1));
}

// join_elements for a full block with ZEROS: a lane per element, the stored
// elements' raw bytes and extra values expanded to the lanes that are no
// implied zero (VBMI2).
template <int DT, bool SC>
ZC_SIMD bool join_elements_zeros_simd(const uint8_t* area, const uint8_t* end, int m, const uint16_t* exps,
                                      const BlockSymbols& bs, uint8_t* out) {
  using E = Elem<DT>;
  constexpr Layout lay = E::lay;
  constexpr int q = kBlock / kSubstreams, w = lay.extra_bits - SC;
  const uint8_t* extras = area + m * lay.raw_bytes;
  const __m512i vexps = _mm512_loadu_si512(exps);
  __m512i bad = _mm512_setzero_si512();
  int n = 0;  // stored elements so far
  for (int k = 0; k < kSubstreams; ++k) {
    for (int j = 0; j < q; j += 32) {
      const int i = k * q + j;
      const int at = kTop - j - 31;  // symbols j .. j + 31, downwards
      const __m512i s = bytes_to_words_reversed(bs.sym[k] + at);
      const __mmask32 keep = _mm512_test_epi16_mask(s, _mm512_set1_epi16(kNumSyms - 1));  // no implied zero
      __m512i h = exponent_and_top_bits<DT>(s, vexps, bs.esc[k] + at, &bad);
      __m512i sign = SC ? _mm512_slli_epi16(_mm512_srli_epi16(s, kSignBit), 15) : _mm512_setzero_si512();
      // fp16: the raw byte; fp32: the low 16 bits. Loaded as k contiguous lanes, then expanded in
      // a register (see write_stored_zeros_simd on clang 14 and compressing stores).
      const __mmask32 first_k = __mmask32(_bzhi_u32(~0u, unsigned(__builtin_popcount(keep))));
      __m512i low = _mm512_setzero_si512();
      if constexpr (DT == kF16)
        low = _mm512_cvtepu8_epi16(_mm256_maskz_expand_epi8(keep, _mm256_maskz_loadu_epi8(first_k, area + n)));
      if constexpr (DT == kF32) low = _mm512_maskz_expand_epi16(keep, _mm512_maskz_loadu_epi16(first_k, area + 2 * n));
      if constexpr (w > 0) {
        const __m512i x = _mm512_maskz_expand_epi16(keep, load_fields<w>(extras, end, n));
        if constexpr (SC) h = _mm512_or_si512(h, x);  // extra >> 1, five bits (bf16, fp32)
        else if constexpr (DT == kF16) sign = _mm512_slli_epi16(x, 15);
        else h = _mm512_ternarylogic_epi32(h, _mm512_slli_epi16(x, 15), _mm512_srli_epi16(x, 1), 0xFE);
      }
      h = _mm512_or_si512(h, sign);
      if constexpr (DT == kF16) h = _mm512_or_si512(h, low);
      if constexpr (lay.elem_bytes == 2) {
        _mm512_storeu_si512(out + 2 * i, h);
      } else {
        _mm512_storeu_si512(out + 4 * i, _mm512_permutex2var_epi16(low, lanes(kJoinLow), h));
        _mm512_storeu_si512(out + 4 * i + 64, _mm512_permutex2var_epi16(low, lanes(kJoinHigh), h));
      }
      n += __builtin_popcount(keep);
    }
  }
  return !_mm512_test_epi16_mask(bad, _mm512_set1_epi16(0x100));
}
#endif

// Decodes one coded block (descriptor desc, count elements, ref) of a group
// with mask SC, ZEROS and no byte planes; table: its group's decode table;
// end: the end of the input, which the block's body ends before.
template <int DT, bool SC, bool ZEROS>
int decode_block_fast(const uint8_t* body, const uint8_t* end, uint32_t desc, int count, uint32_t ref,
                      const DecodeTable& table, uint8_t* out) {
  using E = Elem<DT>;
  constexpr Layout lay = E::lay;
  const uint32_t size = desc & 0xFFFFu;
  const GroupLayout gl = group_layout(DT, (SC ? kMaskSign : 0) | (ZEROS ? kMaskZeros : 0));
  uint32_t starts[kSubstreams + 1];
  int status = locate_substreams(body, size, count, int(desc >> 16), gl, starts);
  if (status != kOk) return status;

  // Reads past the sub-streams, however corrupt, stay within kStreamSlack
  // bytes after the block's end: read in place if the input goes on that
  // far, else from a copy with zeros after it.
  const uint8_t* bits = body;
  alignas(64) uint8_t copy[kBlock * 4 + kStreamSlack];
  if (end - (body + size) < kStreamSlack) {
    std::memcpy(copy, body, size);
    std::memset(copy + size, 0, kStreamSlack);
    bits = copy;
  }
  int len[kSubstreams];
  const int q = substream_len(count);
  for (int k = 0; k < kSubstreams; ++k) {
    const int n = count - k * q;
    len[k] = n < 0 ? 0 : n < q ? n : q;
  }
  // The output lines are wanted for writing by the join, after the long decode.
  for (uint32_t i = 0; i < uint32_t(count) * lay.elem_bytes; i += 64) __builtin_prefetch(out + i, 1);
  BlockSymbols bs;
  Reader rd[kSubstreams];
  constexpr int x = lay.exp_bits;  // bits after an escape
#if ZC_HAVE_SIMD
  if (simd_enabled())
    table.escapes ? decode_symbols_simd<x>(bits, starts, len, table, bs, rd)
                  : decode_symbols_simd<0>(bits, starts, len, table, bs, rd);
  else
#endif
    table.escapes ? decode_symbols<x>(bits, starts, len, table, bs, rd)
                  : decode_symbols<0>(bits, starts, len, table, bs, rd);
  uint32_t end3 = 0;
  for (int k = 0; k < kSubstreams; ++k) {
    if (rd[k].bad & kInvalid) return kErrBitstream;
    const uint64_t pos = uint64_t(rd[k].p - bits) * 8 - rd[k].valid_bits();
    if (pos > starts[k + 1]) return kErrBitstream;
    if (k + 1 < kSubstreams && pos < starts[k + 1]) return kErrTrailing;
    end3 = uint32_t(pos);
  }
  int m = count;
  if constexpr (ZEROS)
    for (int k = 0; k < kSubstreams; ++k)
      for (int j = 0; j < len[k]; ++j) m -= (bs.sym[k][kTop - j] & (kNumSyms - 1)) == 0;
  StoredArea area;
  status = check_stored_area(body, size, end3, m, gl, &area);
  if (status != kOk) return status;
  uint16_t exps[kNumClasses];
  class_exponents(ref, exps);
#if ZC_HAVE_SIMD
  if (!ZEROS && count == kBlock && simd_enabled())
    return join_elements_simd<DT, SC>(area.at, exps, bs, out) ? kOk : kErrBitstream;
  if (ZEROS && count == kBlock && simd_enabled())
    return join_elements_zeros_simd<DT, SC>(area.at, body + size, m, exps, bs, out) ? kOk : kErrBitstream;
#endif
  return join_elements<DT, SC, ZEROS>(area.at, m, count, exps, bs, out) ? kOk : kErrBitstream;
}

template <int DT>
int decode_block_fast(const uint8_t* body, const uint8_t* end, uint32_t desc, int count, uint32_t ref, int mask,
                      const DecodeTable& table, uint8_t* out) {
  switch (symbol_mask(mask)) {
    case 0: return decode_block_fast<DT, false, false>(body, end, desc, count, ref, table, out);
    case kMaskSign: return decode_block_fast<DT, true, false>(body, end, desc, count, ref, table, out);
    case kMaskZeros: return decode_block_fast<DT, false, true>(body, end, desc, count, ref, table, out);
    default: return decode_block_fast<DT, true, true>(body, end, desc, count, ref, table, out);
  }
}

}  // namespace zipccl
