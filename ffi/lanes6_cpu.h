// Fast CPU coding of a version-6 block's 32 lanes (docs/FORMAT.md §3), the
// same bytes as encode_body / decode_body of format6.h (tests assert it).
// Encoding: each lane's fields appended to its own buffer, then the body
// spliced from the head and the lanes. Decoding: a table of the block's
// code at its ref (baked from the code's own table in a vector pass, a few
// kept) gives, for a lane's next 12 bits, the value's sign and q, its code's
// length and its bits in the lane; 32 lanes advance in
// lockstep (AVX-512: two vectors of 16), and a block whose lanes do not decode
// cleanly is decoded again by format6.h's decoder, which names the error.
#pragma once

#include <memory>
#include <utility>

#include "stats6_cpu.h"

namespace zipccl {
namespace v6 {

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

// The key table of one code at one ref (§3): for key = an element's sign | q
// (its bits above the low ones), its code and an escape's q (bits 0-25) |
// their bits << 26; the zeros' (+0, -0) at kKeys + sign. (Key q = 0 is a
// subnormal's: an escape.)
template <int DT>
struct KeyTable {
  static constexpr int kKeys = 2 << Elements<DT>::lay.q_bits;
  alignas(64) uint32_t e[kKeys + 2];
  int table = -1;  // which code: a combo, or kCombos + a serial of the group's code
  uint32_t ref = 0;

  void build(const uint8_t* lens, const uint16_t* codes, uint32_t at_ref) {
    constexpr Layout lay = Elements<DT>::lay;
    ref = at_ref;
    for (int sign = 0; sign < 2; ++sign) e[kKeys + sign] = codes[sign << 7] | uint32_t(lens[sign << 7]) << 26;
#if ZC_HAVE_SIMD
    if (simd_enabled()) return simd_build(lens, codes);
    if (avx2_enabled()) return avx2_build(lens, codes);
#endif
    for (int key = 0; key < kKeys; ++key) {
      const uint32_t sign = uint32_t(key) >> lay.q_bits, q = uint32_t(key) & Elements<DT>::q_mask, d = at_ref - q;
      const int cls = (normal_q(q, lay) && d <= uint32_t(kMaxD)) ? int(d) + 1 : kClassEsc, sym = int(sign << 7) | cls;
      const bool esc = cls == kClassEsc;
      e[key] = (codes[sym] | (esc ? q << lens[sym] : 0u)) | uint32_t(lens[sym] + (esc ? lay.q_bits : 0)) << 26;
    }
  }

 private:
#if ZC_HAVE_SIMD
  ZC_SIMD void simd_build(const uint8_t* lens, const uint16_t* codes) {
    constexpr Layout lay = Elements<DT>::lay;
    alignas(64) uint32_t code_len[kNumSyms];  // a symbol's code | its length << 26
    for (int sym = 0; sym < kNumSyms; ++sym) code_len[sym] = codes[sym] | uint32_t(lens[sym]) << 26;
    const __m512i vref = _mm512_set1_epi32(int(ref)), qmask = _mm512_set1_epi32(int(Elements<DT>::q_mask));
    const __m512i four = _mm512_set1_epi32(4), span = _mm512_set1_epi32(int(lay.q_max - 4));
    const __m512i esc = _mm512_set1_epi32(kClassEsc);
    for (int key = 0; key < kKeys; key += 16) {
      const __m512i k = _mm512_add_epi32(_mm512_set1_epi32(key), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
      const __m512i q = _mm512_and_si512(k, qmask), d = _mm512_sub_epi32(vref, q);
      const __mmask16 near = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(q, four), span) &
                             _mm512_cmple_epu32_mask(d, _mm512_set1_epi32(kMaxD));
      const __m512i cls = _mm512_mask_add_epi32(esc, near, d, _mm512_set1_epi32(1));
      const __m512i sym = _mm512_or_si512(_mm512_slli_epi32(_mm512_srli_epi32(k, lay.q_bits), 7), cls);
      __m512i v = _mm512_i32gather_epi32(sym, code_len, 4);
      const __mmask16 escaped = __mmask16(~near);  // an escape: q after the code, q_bits more
      const __m512i len = _mm512_srli_epi32(v, 26);
      v = _mm512_mask_or_epi32(v, escaped, v, _mm512_sllv_epi32(q, len));
      v = _mm512_mask_add_epi32(v, escaped, v, _mm512_set1_epi32(lay.q_bits << 26));
      _mm512_store_si512(e + key, v);
    }
  }

  ZC_AVX2 void avx2_build(const uint8_t* lens, const uint16_t* codes) {  // simd_build, 8 keys a step
    constexpr Layout lay = Elements<DT>::lay;
    alignas(32) uint32_t code_len[kNumSyms];
    for (int sym = 0; sym < kNumSyms; ++sym) code_len[sym] = codes[sym] | uint32_t(lens[sym]) << 26;
    const __m256i vref = _mm256_set1_epi32(int(ref)), qmask = _mm256_set1_epi32(int(Elements<DT>::q_mask));
    const __m256i three = _mm256_set1_epi32(3), qmax = _mm256_set1_epi32(int(lay.q_max)), lim = _mm256_set1_epi32(kMaxD + 1);
    const __m256i esc = _mm256_set1_epi32(kClassEsc), one = _mm256_set1_epi32(1);
    for (int key = 0; key < kKeys; key += 8) {
      const __m256i k = _mm256_add_epi32(_mm256_set1_epi32(key), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      const __m256i q = _mm256_and_si256(k, qmask), d = _mm256_sub_epi32(vref, q);
      const __m256i near = _mm256_and_si256(_mm256_and_si256(_mm256_cmpgt_epi32(q, three), _mm256_cmpgt_epi32(qmax, q)),
                                            _mm256_and_si256(_mm256_cmpgt_epi32(lim, d), _mm256_cmpgt_epi32(d, _mm256_set1_epi32(-1))));
      const __m256i cls = _mm256_blendv_epi8(esc, _mm256_add_epi32(d, one), near);
      const __m256i sym = _mm256_or_si256(_mm256_slli_epi32(_mm256_srli_epi32(k, lay.q_bits), 7), cls);
      const __m256i v = _mm256_i32gather_epi32(reinterpret_cast<const int*>(code_len), sym, 4);
      const __m256i escaped = _mm256_add_epi32(_mm256_or_si256(v, _mm256_sllv_epi32(q, _mm256_srli_epi32(v, 26))),
                                               _mm256_set1_epi32(lay.q_bits << 26));  // q after the code, q_bits more
      _mm256_store_si256(reinterpret_cast<__m256i*>(e + key), _mm256_blendv_epi8(escaped, v, near));
    }
  }
#endif
};

constexpr int kLaneWords = 16 + kBlock / kLanes * 43 / 32 + 1 + 32;  // a zero word before a lane's most words, then a tile's room
constexpr int kBodySlack = 128;  // bytes encode_body_fast may write past a body

#if ZC_HAVE_SIMD
// AVX-512 coding of a full block's 32 lanes as two halves of 16 (lanes
// 16 h .. 16 h + 15 are the values 32 j + 16 h + l): each step appends one
// value's fields to each lane's pending word; the words a step completes are
// staged as a row, and every 16 steps the rows are transposed and each lane
// keeps the words it completed.
struct SimdLanes {
  alignas(64) uint32_t stage[32][16];
  uint16_t stage_mask[32];
  alignas(64) uint32_t words[kLanes][kLaneWords];
  uint32_t count[kLanes];

  template <int DT>
  ZC_SIMD void encode(const typename Elements<DT>::T* x, const uint32_t* keys) {
    for (int h = 0; h < 2; ++h) encode_half<DT>(x, keys, h);
  }

 private:
  template <int DT>
  ZC_SIMD void encode_half(const typename Elements<DT>::T* x, const uint32_t* keys, int h) {
    using El = Elements<DT>;
    constexpr Layout lay = El::lay;
    constexpr int kKeys = KeyTable<DT>::kKeys;
    LaneAppender lanes;
    uint32_t* count = this->count + 16 * h;
    for (int l = 0; l < 16; ++l) count[l] = 0;
    for (int j0 = 0; j0 < kBlock / kLanes; j0 += 16) {
      bool seconds = false;  // fp32: whether a step of these made a second append
      for (int r = 0; r < 16; ++r) {
        const auto* at = x + kLanes * (j0 + r) + 16 * h;
        const __m512i v = sizeof(*at) == 2 ? _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)))
                                           : _mm512_loadu_si512(at);
        const __mmask16 zero = _mm512_testn_epi32_mask(v, _mm512_set1_epi32(int(El::mag_mask)));
        const __m512i key = _mm512_mask_add_epi32(_mm512_srli_epi32(v, lay.low_bits), zero,
                                                  _mm512_srli_epi32(v, El::sign_shift), _mm512_set1_epi32(kKeys));
        const __m512i e = _mm512_i32gather_epi32(key, keys, 4);
        __m512i fv = _mm512_and_si512(e, _mm512_set1_epi32((1 << 26) - 1)), fn = _mm512_srli_epi32(e, 26);
        const __m512i low = _mm512_and_si512(v, _mm512_set1_epi32(int(El::low_mask)));
        __mmask16 joined = __mmask16(~zero), apart = 0;  // fp32: the low bits that do not fit the first append
        if constexpr (DT == kF32) {
          apart = _mm512_mask_cmpgt_epu32_mask(joined, fn, _mm512_set1_epi32(32 - lay.low_bits));
          joined &= __mmask16(~apart);
        }
        fv = _mm512_mask_or_epi32(fv, joined, fv, _mm512_sllv_epi32(low, fn));
        fn = _mm512_mask_add_epi32(fn, joined, fn, _mm512_set1_epi32(lay.low_bits));
        const LaneAppender::Appended first = lanes.put(fv, fn);
        _mm512_store_si512(stage[r], first.low);
        stage_mask[r] = first.full;
        if constexpr (DT == kF32) {  // a step may complete two words (rows r, r + 16)
          stage_mask[16 + r] = 0;
          if (apart) {
            seconds = true;
            const LaneAppender::Appended second =
                lanes.put(_mm512_maskz_mov_epi32(apart, low), _mm512_maskz_mov_epi32(apart, _mm512_set1_epi32(lay.low_bits)));
            _mm512_store_si512(stage[16 + r], second.low);
            stage_mask[16 + r] = second.full;
          }
        }
      }
      keep_words(seconds ? 2 : 1, h);
    }
    alignas(64) uint32_t pending[16];
    _mm512_store_si512(pending, lanes.acc);
    for (int l = 0; l < 16; ++l) {  // a lane's words from word 16: a zero before, its pending bits, zeros
      uint32_t* lane = words[16 * h + l] + 16;
      lane[-1] = 0;
      lane[count[l]] = pending[l];
      std::memset(lane + count[l] + 1, 0, 16 * sizeof(uint32_t));
    }
  }

  // The words the lanes of half h completed in the staged rows (fp32: each
  // step's first and second appends, interleaved in order, two tiles).
  ZC_SIMD void keep_words(int tiles, int h) {
    for (int tile = 0; tile < tiles; ++tile) {
      __m512i r[16];
      uint16_t masks[16];
      for (int j = 0; j < 16; ++j) {
        const int row = tiles == 1 ? j : (j / 2) + (j % 2) * 16 + tile * 8;
        r[j] = _mm512_load_si512(stage[row]);
        masks[j] = stage_mask[row];
      }
      transpose16(r);  // r[l]: lane l's low words after each append, in order
      const __m256i m = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(masks));
      for (int l = 0; l < 16; ++l) {
        const __mmask16 keep = _mm256_test_epi16_mask(m, _mm256_set1_epi16(short(1 << l)));
        uint32_t& c = count[16 * h + l];
        _mm512_storeu_si512(words[16 * h + l] + 16 + c, _mm512_maskz_compress_epi32(keep, r[l]));
        c += uint32_t(__builtin_popcount(keep));
      }
    }
  }
};
#endif

inline uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// A decode table of one code: for every 12-bit window, what the code there
// implies (0: no code starts it; the generic decoder names the error). A
// value's q is its class's distance from the block's ref, its escape's, or 0.
struct Baked {
  static constexpr uint32_t kSym = 0xFF;       // bits 0-7: the symbol, sign << 7 | class
  static constexpr int kLenShift = 16;         // bits 16-19: the code's length
  static constexpr int kUsedShift = 20;        // bits 20-25: the value's bits in its lane
  static constexpr uint32_t kLow = 1u << 26;   // the low bits follow
  static constexpr uint32_t kEsc = 1u << 27;   // q follows the code
  static constexpr uint32_t kNear = 1u << 28;  // classes 1..120: q = ref + 1 - class, which must be normal
  alignas(64) uint32_t entry[kLutSize];

  // The table of the code of lengths lens (at most kMaxCodeLen; 0: no code): the
  // entries of build_lut's table, filled by doubling (the windows of len - 1 bits
  // copied up to len bits, then the codes of length len in theirs).
  template <int DT>
  void bake(const uint8_t* lens) {
    constexpr Layout lay = Elements<DT>::lay;
    uint16_t codes[kNumSyms];
    canonical_codes(lens, codes, kNumSyms);
    uint8_t by_len[kMaxCodeLen + 1][kNumSyms];  // the symbols of each length
    int n[kMaxCodeLen + 1] = {};
    for (int s = 0; s < kNumSyms; ++s)
      if (lens[s] && lens[s] <= kMaxCodeLen) by_len[lens[s]][n[lens[s]]++] = uint8_t(s);
    entry[0] = 0;
    for (int len = 1; len <= kMaxCodeLen; ++len) {
      std::memcpy(entry + (1 << (len - 1)), entry, sizeof(uint32_t) << (len - 1));
      for (int i = 0; i < n[len]; ++i) {
        const uint32_t s = by_len[len][i], cls = s & 127;
        const uint32_t kind = cls == uint32_t(kClassEsc) ? kEsc | kLow : cls == kClassZero ? 0 : kNear | kLow;
        const uint32_t used = len + (kind & kLow ? lay.low_bits : 0) + (kind & kEsc ? lay.q_bits : 0);
        entry[codes[s]] = s | uint32_t(len) << kLenShift | used << kUsedShift | kind;
      }
    }
  }
};

// A code's decode table at one ref (baked from its Baked table): for every
// 12-bit window, the value's sign and q (an escape's q from the stream), the
// code's length, the value's bits in its lane; 0 where no code starts, or
// where a class's q would not be normal (the generic decoder names the error).
struct RefTable {
  static constexpr uint32_t kHi = 0xFFFF;  // bits 0-15: sign << q_bits | q; bits 16-27 as Baked's
  static constexpr uint32_t kKept = 0x0FFF0000;
  alignas(64) uint32_t entry[kLutSize];
  const Baked* from = nullptr;
  uint32_t ref = 0;
  int serial = -1;  // Baked tables are reused (a group's): the code they held

  template <int DT>
  void bake(const Baked& b, uint32_t at_ref) {
    constexpr Layout lay = Elements<DT>::lay;
#if ZC_HAVE_SIMD
    if (simd_enabled()) return simd_bake<DT>(b, at_ref);
    if (avx2_enabled()) return avx2_bake<DT>(b, at_ref);
#endif
    for (int w = 0; w < kLutSize; ++w) {
      const uint32_t e = b.entry[w], cls = e & 127, q = (e & Baked::kNear) ? at_ref + 1 - cls : 0;
      const bool ok = e && (!(e & Baked::kNear) || normal_q(q, lay));
      entry[w] = ok ? (e & kKept) | (e >> 7 & 1) << lay.q_bits | q : 0;
    }
    from = &b, ref = at_ref;
  }

 private:
#if ZC_HAVE_SIMD
  template <int DT>
  ZC_SIMD void simd_bake(const Baked& b, uint32_t at_ref) {
    constexpr Layout lay = Elements<DT>::lay;
    const __m512i ref1 = _mm512_set1_epi32(int(at_ref + 1)), four = _mm512_set1_epi32(4);
    const __m512i span = _mm512_set1_epi32(int(lay.q_max - 4)), one = _mm512_set1_epi32(1);
    for (int w = 0; w < kLutSize; w += 16) {
      const __m512i e = _mm512_load_si512(b.entry + w);
      const __mmask16 near = _mm512_test_epi32_mask(e, _mm512_set1_epi32(int(Baked::kNear)));
      const __m512i q = _mm512_maskz_sub_epi32(near, ref1, _mm512_and_si512(e, _mm512_set1_epi32(127)));
      const __mmask16 ok = _mm512_test_epi32_mask(e, e) & ~(near & _mm512_cmpge_epu32_mask(_mm512_sub_epi32(q, four), span));
      const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(e, 7), one), lay.q_bits);
      const __m512i v = _mm512_or_si512(_mm512_and_si512(e, _mm512_set1_epi32(int(kKept))), _mm512_or_si512(sign, q));
      _mm512_store_si512(entry + w, _mm512_maskz_mov_epi32(ok, v));
    }
    from = &b, ref = at_ref;
  }

  template <int DT>
  ZC_AVX2 void avx2_bake(const Baked& b, uint32_t at_ref) {  // simd_bake, 8 entries a step
    constexpr Layout lay = Elements<DT>::lay;
    const __m256i ref1 = _mm256_set1_epi32(int(at_ref + 1)), three = _mm256_set1_epi32(3);
    const __m256i qmax = _mm256_set1_epi32(int(lay.q_max)), one = _mm256_set1_epi32(1), zero = _mm256_setzero_si256();
    for (int w = 0; w < kLutSize; w += 8) {
      const __m256i e = _mm256_load_si256(reinterpret_cast<const __m256i*>(b.entry + w));
      const __m256i near = _mm256_cmpgt_epi32(_mm256_and_si256(e, _mm256_set1_epi32(int(Baked::kNear))), zero);
      const __m256i q = _mm256_and_si256(near, _mm256_sub_epi32(ref1, _mm256_and_si256(e, _mm256_set1_epi32(127))));
      const __m256i normal = _mm256_and_si256(_mm256_cmpgt_epi32(q, three), _mm256_cmpgt_epi32(qmax, q));
      const __m256i bad = _mm256_or_si256(_mm256_cmpeq_epi32(e, zero), _mm256_andnot_si256(normal, near));
      const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(e, 7), one), lay.q_bits);
      const __m256i v = _mm256_or_si256(_mm256_and_si256(e, _mm256_set1_epi32(int(kKept))), _mm256_or_si256(sign, q));
      _mm256_store_si256(reinterpret_cast<__m256i*>(entry + w), _mm256_andnot_si256(bad, v));
    }
    from = &b, ref = at_ref;
  }
#endif
};

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
  uint32_t hi = e & RefTable::kHi, used = (e >> Baked::kUsedShift) & 63;
  uint64_t rest = w >> len;
  if (e & Baked::kEsc) [[unlikely]] {
    hi |= uint32_t(rest) & El::q_mask;
    rest >>= lay.q_bits;
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

// The dwords at byte + at of 16 lanes (clamped at vsize).
ZC_SIMD inline __m512i simd_dword(const uint8_t* body, __m512i byte, int at, __m512i vsize) {
  return _mm512_i32gather_epi32(_mm512_min_epu32(_mm512_add_epi32(byte, set(uint32_t(at))), vsize), body, 1);
}

// One step of 16 lanes of a block (lanes k0 .. k0 + 15, a value each) with
// AVX-512: the same as decode_value, 16 at once. body has 8 readable bytes
// past vsize (a lane that runs past its end is clamped there and flagged at the end).
// Each lane's window is carried from step to step: win[0] holds the 32 bits at
// pos (a 16-bit element takes at most 27), fp32's win[1] the 32 after them (it
// takes at most 43), and the next window is shifted in from the bits after
// those, gathered beside the table's entries: a step waits on one gather, not
// two in a row.
template <int DT>
ZC_SIMD inline void simd_step(const uint8_t* body, __m512i vsize, const uint32_t* tab, __m512i& pos, __m512i* win,
                              __mmask16& bad, typename Elements<DT>::T* out) {
  using El = Elements<DT>;
  constexpr Layout lay = El::lay;
  constexpr bool kWide = DT == kF32;
  const __m512i byte = _mm512_srli_epi32(pos, 3), shift = _mm512_and_si512(pos, set(7));
  const __m512i w = win[0], hi = kWide ? win[1] : _mm512_setzero_si512();
  const __m512i e = _mm512_i32gather_epi32(_mm512_and_si512(w, set(kLutSize - 1)), tab, 4);
  // the bits after the window: 32 at least (the second dword past 25, where a step needs them)
  const __m512i a = simd_dword(body, byte, kWide ? 8 : 4, vsize);
  __m512i b = kWide ? simd_dword(body, byte, 12, vsize) : _mm512_setzero_si512();
  bad |= _mm512_testn_epi32_mask(e, e);
  const __mmask16 esc = _mm512_test_epi32_mask(e, set(Baked::kEsc));
  const __m512i len = _mm512_and_si512(_mm512_srli_epi32(e, Baked::kLenShift), set(15));
  const __m512i used = _mm512_and_si512(_mm512_srli_epi32(e, Baked::kUsedShift), set(63));
  __m512i after;
  if constexpr (kWide) {
    after = _mm512_shrdv_epi32(a, b, shift);
    b = _mm512_srlv_epi32(b, shift);  // 25 bits at least; a step shifts in 11 at most past after
  } else if (_mm512_cmpgt_epu32_mask(_mm512_add_epi32(used, shift), set(32))) {  // an escape late in its byte
    after = _mm512_shrdv_epi32(a, simd_dword(body, byte, 8, vsize), shift);
  } else {
    after = _mm512_srlv_epi32(a, shift);
  }
  __m512i top = _mm512_and_si512(e, set(RefTable::kHi)), off = len;
  if (esc) {
    top = _mm512_mask_or_epi32(top, esc, top, _mm512_and_si512(_mm512_srlv_epi32(w, len), set(El::q_mask)));
    off = _mm512_mask_add_epi32(off, esc, off, set(lay.q_bits));
  }
  const __m512i f = kWide ? _mm512_shrdv_epi32(w, hi, off) : _mm512_srlv_epi32(w, off);
  const __mmask16 low = _mm512_test_epi32_mask(e, set(Baked::kLow));
  const __m512i x = _mm512_mask_or_epi32(_mm512_slli_epi32(top, lay.low_bits), low, _mm512_slli_epi32(top, lay.low_bits),
                                         _mm512_and_si512(f, set(El::low_mask)));
  if constexpr (kWide) {  // the 128 bits w, hi, after, b moved down by used (< 64)
    const __mmask16 far = _mm512_cmpge_epu32_mask(used, set(32));
    const __m512i s0 = _mm512_mask_mov_epi32(w, far, hi), s1 = _mm512_mask_mov_epi32(hi, far, after);
    const __m512i s2 = _mm512_mask_mov_epi32(after, far, b);
    win[0] = _mm512_shrdv_epi32(s0, s1, used), win[1] = _mm512_shrdv_epi32(s1, s2, used);  // counts mod 32
  } else {
    win[0] = _mm512_shrdv_epi32(w, after, used);  // used <= 27
  }
  pos = _mm512_add_epi32(pos, used);
  if constexpr (sizeof(typename El::T) == 2) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(x));
  else _mm512_storeu_si512(out, x);
}

// The 32 bits at each lane's pos (simd_step's win), bytes clamped as there.
ZC_SIMD inline __m512i simd_window(const uint8_t* body, __m512i vsize, __m512i pos) {
  const __m512i byte = _mm512_srli_epi32(pos, 3);
  return _mm512_shrdv_epi32(simd_dword(body, byte, 0, vsize), simd_dword(body, byte, 4, vsize), _mm512_and_si512(pos, set(7)));
}

// Full blocks' 32 lanes, two vectors of 16 each, NB blocks side by side (the
// lanes at a step's stride: value i of lane k is out[k + 32 i]); false if a
// lane does not end cleanly. Block j: body bodies[j] of sizes[j] bytes, lanes
// from starts[j], table tabs[j], output outs[j].
template <int DT, int NB>
ZC_SIMD bool simd_blocks(const uint8_t* const* bodies, const uint32_t* sizes, const uint32_t (*starts)[kLanes + 1],
                         const uint32_t* const* tabs, typename Elements<DT>::T* const* outs) {
  __m512i pos[NB][2], win[NB][2][2], vsize[NB];
  __mmask16 bad[NB][2] = {};
  for (int j = 0; j < NB; ++j) {
    pos[j][0] = _mm512_loadu_si512(starts[j]), pos[j][1] = _mm512_loadu_si512(starts[j] + 16);
    vsize[j] = _mm512_set1_epi32(int(sizes[j]));
    for (int h = 0; h < 2; ++h) {
      win[j][h][0] = simd_window(bodies[j], vsize[j], pos[j][h]);
      win[j][h][1] = DT == kF32 ? simd_window(bodies[j], vsize[j], _mm512_add_epi32(pos[j][h], set(32))) : _mm512_setzero_si512();
    }
  }
  for (int i = 0; i < kBlock / kLanes; ++i)
    for (int j = 0; j < NB; ++j)
      for (int h = 0; h < 2; ++h)
        simd_step<DT>(bodies[j], vsize[j], tabs[j], pos[j][h], win[j][h], bad[j][h], outs[j] + kLanes * i + 16 * h);
  bool ok = true;
  for (int j = 0; j < NB; ++j) {
    alignas(64) uint32_t end[kLanes];
    _mm512_store_si512(end, pos[j][0]);
    _mm512_store_si512(end + 16, pos[j][1]);
    ok &= !bad[j][0] && !bad[j][1];
    for (int k = 0; k < kLanes; ++k) ok &= end[k] <= starts[j][k + 1] && lane_end_status(bodies[j], k, end[k], starts[j]) == kOk;
  }
  return ok;
}

#endif

}  // namespace v6
}  // namespace zipccl

#include "lanes6_avx2.h"  // Avx2Lanes, avx2_blocks: they take the tables above

namespace zipccl {
namespace v6 {

// Full blocks decoded side by side in the main loop: AVX-512 has registers for 4 (8 chains of 16
// lanes); AVX2 for 2 (8 chains of 8).
constexpr int kSide = 4;
inline int side_count() { return simd_enabled() ? kSide : 2; }

#if ZC_HAVE_SIMD
// Full blocks decoded side by side by the widest vector path here (simd_level() != kPlain).
template <int DT, int NB>
bool vector_blocks(const uint8_t* const* bodies, const uint32_t* sizes, const uint32_t (*starts)[kLanes + 1],
                   const uint32_t* const* tabs, typename Elements<DT>::T* const* outs) {
  return simd_enabled() ? simd_blocks<DT, NB>(bodies, sizes, starts, tabs, outs)
                        : avx2_blocks<DT, NB>(bodies, sizes, starts, tabs, outs);
}

// vector_blocks for k (1 .. kSide) blocks.
template <int DT, int NB = kSide>
bool side_by_side(int k, const uint8_t* const* bodies, const uint32_t* sizes, const uint32_t (*starts)[kLanes + 1],
                  const uint32_t* const* tabs, typename Elements<DT>::T* const* outs) {
  if constexpr (NB > 1)
    if (k < NB) return side_by_side<DT, NB - 1>(k, bodies, sizes, starts, tabs, outs);
  return vector_blocks<DT, NB>(bodies, sizes, starts, tabs, outs);
}

template <int DT>
bool vector_block(const uint8_t* body, uint32_t size, const uint32_t* starts, const uint32_t* tab,
                  typename Elements<DT>::T* out) {
  const uint32_t(*lanes)[kLanes + 1] = reinterpret_cast<const uint32_t(*)[kLanes + 1]>(starts);
  return vector_blocks<DT, 1>(&body, &size, lanes, &tab, &out);
}
#endif

// Writes a coded block's body (count values; its lanes' bits[32], from
// stats_size) to body (kBodySlack bytes of slack after it). With keys (a
// full block, the key table of its code at its ref) the AVX-512 or AVX2 coder
// codes it; else syms (the values' symbols at the block's own ref) and map (to its
// coded ref's, or null) give each value's symbol.
template <int DT>
void encode_body_fast(const typename Elements<DT>::T* x, int count, const uint32_t* bits, const uint8_t* syms,
                      const uint8_t* lens, const uint16_t* codes, const uint8_t* map, const KeyTable<DT>* keys, uint8_t* body) {
  static thread_local std::unique_ptr<uint8_t[][kLaneBytes]> lanes(new uint8_t[kLanes][kLaneBytes]);
  int32_t devs[kLanes - 1];
  uint32_t size;
  const int width = narrowest_width(bits, devs, &size);
  const uint32_t(*words)[kLaneWords] = nullptr;  // the vector coders' lanes
#if ZC_HAVE_SIMD
  if (keys && count == kBlock && simd_enabled()) {
    static thread_local std::unique_ptr<SimdLanes> simd(new SimdLanes());
    simd->encode<DT>(x, keys->e), words = simd->words;
  } else if (keys && count == kBlock && avx2_enabled()) {
    static thread_local std::unique_ptr<Avx2Lanes> avx2(new Avx2Lanes());
    avx2->encode<DT>(x, keys->e), words = avx2->words;
  }
#endif
  if (!words)
    for (int k = 0; k < kLanes; k += 4) encode_lanes<DT, 4>(x, syms, count, k, lens, codes, map, lanes.get());
  FastWriter w{body};
  if (width_field_bits(width) == 3) w.put(uint32_t(width - kWidthShort), 3);
  else w.put(7u | uint32_t(width) << 3, 8);
  for (int k = 0; k + 1 < kLanes; ++k) w.put(uint32_t(devs[k]) & ((1u << width) - 1), uint32_t(width));
#if ZC_HAVE_SIMD
  if (words) {  // each lane's words shifted to its bit offset, a vector at a time
    uint32_t at = uint32_t(head_bits(width));
    for (int k = 0; k < kLanes; ++k) {
      const uint32_t shift = at & 31, n = (shift + bits[k] + 31) / 32;
      uint8_t* dst = body + at / 32 * 4;
      uint32_t first;
      std::memcpy(&first, dst, 4);
      if (simd_enabled()) splice_words(words[k] + 16, dst, shift, n, first & ((1u << shift) - 1));
      else avx2_splice_words(words[k] + 16, dst, shift, n, first & ((1u << shift) - 1));
      at += bits[k];
    }
    return;
  }
#endif
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

template <int DT>
bool decode_body_fast(const uint8_t* body, uint32_t size, const uint8_t* limit, int count, const uint32_t* tab,
                      typename Elements<DT>::T* out) {
  uint32_t starts[kLanes + 1];
  if (locate_lanes_fast(body, size, starts) != kOk) return false;
  bool ok = true;
#if ZC_HAVE_SIMD
  if (count == kBlock && simd_level() != kPlain) {
    if (body + size + 8 <= limit) return vector_block<DT>(body, size, starts, tab, out);
    alignas(64) static thread_local uint8_t padded[kBlock * 4 + 16];  // the stream's last bytes, and 8 more
    std::memcpy(padded, body, size);
    std::memset(padded + size, 0, 16);
    return vector_block<DT>(padded, size, starts, tab, out);
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

}  // namespace v6
}  // namespace zipccl
