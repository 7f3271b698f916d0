// Fast CPU coding of a full block's 16 lanes (FORMAT.md §2, §6), the same
// bytes as encode_block / decode_coded_block of zipccl_format.h (tests assert
// it). Element i of a block is in lane i % 16, so 16 consecutive elements are
// one element of each lane: the lanes are coded in lockstep, a "step" of 16
// elements at a time, by AVX-512 where the CPU has it (simd_enabled()) and by
// plain loops otherwise. Groups that code byte planes and partial blocks take
// the shared coder.
//
// Encoding: each lane's fields are appended to its own 64-bit accumulator and
// flushed a 32-bit word at a time into its own word array; the block's body is
// then spliced from the width field, the length deviations and the 16 arrays at
// their bit offsets. Decoding: each lane reads a 64-bit window at its bit
// position, looks its 12 bits up in a table whose entry holds everything the
// element's symbol implies (code length, field offsets, the element's total
// bits, exponent class, top bits, sign), and advances. A block whose lanes do
// not decode cleanly is decoded again by the shared decoder, which names the
// first error in the format's order.
#pragma once

#include "simd_cpu.h"

namespace zipccl {

constexpr int kSteps = kBlock / kLanes;                // elements per lane of a full block
constexpr int kLaneStride = 16 + 2 * kSteps * 42 / 64 + 32;  // words per lane array: padding, fp32's worst case
constexpr int kBodySlack = 128;                         // bytes a decoder may read past a body (a window, clamped)
constexpr uint32_t kSpliceSlack = 128;                  // bytes the coder may write past a body (LaneCoder::splice)

// The element fields that follow the symbol's code, per dtype and group (§6).
template <int DT, bool SC>
struct LaneLayout {
  static constexpr Layout lay = Elem<DT>::lay;
  static constexpr int extra_bits = lay.extra_bits - (SC ? 1 : 0);  // the stored extra value
  static constexpr int plane_bits = 8 * lay.raw_bytes;             // stored byte planes
  static constexpr int stored_bits = extra_bits + plane_bits;
  static constexpr int sign_shift = 8 * lay.elem_bytes - 1;
};

// A decode table entry (12-bit window -> what the symbol there implies,
// under one ref): 0 where no code starts the window, or where a class would
// decode below exponent 1 (§6: corrupt).
struct LaneEntry {
  static constexpr uint32_t kLen = 15;             // bits 0-3: code length
  static constexpr int kOffShift = 4;              // bits 4-8: where the stored fields start (code + escape)
  static constexpr uint32_t kEsc = 1u << 9;        // the exponent follows the code
  static constexpr uint32_t kImplied = 1u << 10;   // an implied zero: nothing else stored
  static constexpr int kKnownShift = 11;           // bits 11-25: the element's bits the symbol gives, >> known_shift
  static constexpr int kTotalShift = 26;           // bits 26-31: the element's bits in its lane
};

struct LaneCoder {
  int mask = 0;
  const uint8_t* lens = nullptr;
  const uint16_t* codes = nullptr;
  PlaneCodes pc{};
  static constexpr int kKeys = 2048;     // (sign, exponent, top bits) of bf16 and fp32; fp16 has 256
  alignas(64) uint32_t keys[2 * kKeys];  // the key table (key_fields, simd_fields), under keys_ref
  uint32_t keys_ref = ~0u;
  alignas(64) uint32_t stage[2 * kLanes][kLanes];  // a tile of rows of low words (fp32: two per step)
  uint16_t stage_mask[2 * kLanes];
  alignas(64) uint32_t words[kLanes * kLaneStride];
  alignas(64) uint32_t body_words[kBlock + 64];

  // Takes the group's codes; false if the fast coder cannot (coded byte planes).
  template <int DT>
  bool prepare(const uint8_t* group_lens, const uint16_t* group_codes, const PlaneCodes& planes) {
    mask = planes.mask, lens = group_lens, codes = group_codes, pc = planes, keys_ref = ~0u;
    return !(mask & 3);
  }

  // The bits of each lane of a block of count elements under ref (§2).
  template <int DT>
  void lane_bits(const uint8_t* in, int count, uint32_t ref, uint32_t* bits) {
    if (count == kBlock) return dispatch<DT>([&](auto sc, auto zeros) { full_lane_bits<DT, decltype(sc)::value, decltype(zeros)::value>(in, ref, bits); });
    constexpr int es = Elem<DT>::lay.elem_bytes;
    for (int k = 0; k < kLanes; ++k) bits[k] = 0;
    for (int i = 0; i < count; ++i) bits[i % kLanes] += element_bits(DT, load_element(in + i * es, es), ref, lens, pc);
  }

  // encode_block of zipccl_format.h: the block's body bytes (its descriptor).
  template <int DT>
  uint32_t encode(const uint8_t* in, int count, uint32_t ref, uint8_t* body) {
    if (count != kBlock) return encode_block(DT, in, count, ref, lens, codes, body, pc);
    uint32_t bits[kLanes];
    dispatch<DT>([&](auto sc, auto zeros) { encode_lanes<DT, decltype(sc)::value, decltype(zeros)::value>(in, ref, bits); });
    int32_t devs[kLanes - 1];
    uint32_t coded;
    const int width = choose_width(bits, devs, &coded);
    const uint32_t raw_block = uint32_t(kBlock) * Elem<DT>::lay.elem_bytes;
    if (coded >= raw_block) {
      std::memcpy(body, in, raw_block);
      return raw_block;
    }
    if (coded + kSpliceSlack <= raw_block) {  // straight into body, which has raw_block bytes of room
      splice(width, devs, bits, body);
    } else {
      splice(width, devs, bits, reinterpret_cast<uint8_t*>(body_words));
      std::memcpy(body, body_words, coded);
    }
    return coded;
  }

 private:
  template <int DT, class F>
  void dispatch(F f) {
    using T = std::true_type;
    using N = std::false_type;
    const bool sc = mask & kMaskSign, zeros = mask & kMaskZeros;
    if (sc && zeros) f(T{}, T{});
    else if (sc) f(T{}, N{});
    else if (zeros) f(N{}, T{});
    else f(N{}, N{});
  }

  // One element's fields (§6) under the key table built for the block's ref
  // (build_keys): v1 (n1 bits) the code, an escape's exponent and the stored
  // extra value (and fp16's stored byte), v2 (n2 bits) fp32's stored bytes.
  // At most 26 bits each. simd_fields does the same for 16 elements.
  template <int DT, bool SC, bool ZEROS>
  void key_fields(uint32_t x, uint32_t* v1, uint32_t* n1, uint32_t* v2, uint32_t* n2) const {
    using LL = LaneLayout<DT, SC>;
    constexpr int key_shift = DT == kF16 ? 8 : DT == kBF16 ? 5 : 21;
    uint32_t key = x >> key_shift;
    bool stored = true;
    if constexpr (ZEROS) {  // §4.2: an implied zero takes its entry at key + kKeys
      stored = (x & (SC ? ~0u >> (32 - LL::sign_shift) : ~0u)) != 0;
      key += stored ? 0 : kKeys;
    }
    const uint32_t entry = keys[key], h = DT == kF32 ? x >> 16 : x, sign = h >> 15;
    uint32_t v = entry & ((1u << 26) - 1), n = entry >> 26;
    if (stored) {
      uint32_t extra;  // the stored extra value (fp16: and the stored byte)
      if constexpr (DT == kF16) extra = SC ? (x & 0xFFu) : sign | (x & 0xFFu) << 1;
      else extra = SC ? (h & 31u) : (h & 31u) << 1 | sign;
      v |= extra << n;
      n += DT == kF16 ? LL::extra_bits + 8 : LL::extra_bits;
    }
    *v1 = v, *n1 = n;
    *v2 = DT == kF32 ? x & 0xFFFFu : 0, *n2 = DT == kF32 && stored ? 16 : 0;
  }

  template <int DT, bool SC, bool ZEROS>
  void full_lane_bits(const uint8_t* in, uint32_t ref, uint32_t* bits) {
#if ZC_HAVE_SIMD
    if (simd_enabled()) return simd_lanes<DT, SC, ZEROS, false>(in, ref, bits);
#endif
    if (keys_ref != ref) build_keys<DT, SC, ZEROS>(ref);
    for (int k = 0; k < kLanes; ++k) {
      uint32_t total = 0;
      for (int i = k; i < kBlock; i += kLanes) {
        uint32_t v1, n1, v2, n2;
        key_fields<DT, SC, ZEROS>(Elem<DT>::bits(in, i), &v1, &n1, &v2, &n2);
        total += n1 + n2;
      }
      bits[k] = total;
    }
  }

  // Codes every lane of a full block into its word array (words, from word
  // 16 of its stride; the words around it zero); bits receives their lengths.
  // Without SIMD a lane at a time, its pending bits in a register.
  template <int DT, bool SC, bool ZEROS>
  void encode_lanes(const uint8_t* in, uint32_t ref, uint32_t* bits) {
#if ZC_HAVE_SIMD
    if (simd_enabled()) return simd_lanes<DT, SC, ZEROS, true>(in, ref, bits);
#endif
    if (keys_ref != ref) build_keys<DT, SC, ZEROS>(ref);
    for (int k = 0; k < kLanes; ++k) {
      uint32_t* lane = words + k * kLaneStride + 16;
      uint64_t acc = 0;
      uint32_t nb = 0, total = 0, at = 0;
      const auto put = [&](uint32_t v, uint32_t n) {
        acc |= uint64_t(v) << nb;
        nb += n;
        if (nb >= 32) {
          lane[at++] = uint32_t(acc);
          acc >>= 32, nb -= 32;
        }
      };
      for (int i = k; i < kBlock; i += kLanes) {
        uint32_t v1, n1, v2, n2;
        key_fields<DT, SC, ZEROS>(Elem<DT>::bits(in, i), &v1, &n1, &v2, &n2);
        put(v1, n1);
        if (DT == kF32) put(v2, n2);
        total += n1 + n2;
      }
      lane[-1] = 0;
      for (int j = 0; j < 17; ++j) lane[at + j] = j == 0 ? uint32_t(acc) : 0;
      bits[k] = total;
    }
  }

  // The key table under ref: per (sign, exponent, top bits) key, the code of
  // its symbol and an escape's exponent (bits 0-25) | their bits << 26; with
  // ZEROS, the zero keys' implied entries at key + kKeys.
  template <int DT, bool SC, bool ZEROS>
  void build_keys(uint32_t ref) {
    using E = Elem<DT>;
    constexpr int keys_of = DT == kF16 ? 256 : 2048;
    for (uint32_t k = 0; k < uint32_t(keys_of); ++k) {
      const uint32_t sign = k >> (DT == kF16 ? 7 : 10), e = (k >> 2) & E::all_ones, t = k & 3u;
      uint32_t sym = symbol_of(e, t, ref);
      if (ZEROS && e == 0 && t == 0) {  // implied, or (-0 without SC, a subnormal) an escape: §4.2
        const uint32_t implied = SC ? sign << kSignBit : 0;
        keys[k + kKeys] = codes[implied] | uint32_t(lens[implied]) << 26;
        sym = uint32_t(kClassEsc) << kTopBits;
      }
      if (SC) sym |= sign << kSignBit;
      const bool esc = escapes(int(sym));
      keys[k] = (codes[sym] | (esc ? e << lens[sym] : 0u)) | uint32_t(lens[sym] + (esc ? E::lay.exp_bits : 0)) << 26;
    }
    keys_ref = ref;
  }

#if ZC_HAVE_SIMD
  // The fields of 16 elements x (one per lane) under the key table built for
  // the block's ref (keys): v1 (n1 bits), and fp32's stored bytes in v2 (n2 bits).
  template <int DT, bool SC, bool ZEROS>
  ZC_SIMD void simd_fields(__m512i x, __m512i* v1, __m512i* n1, __m512i* v2, __m512i* n2) const {
    using LL = LaneLayout<DT, SC>;
    constexpr int key_shift = DT == kF16 ? 8 : DT == kBF16 ? 5 : 21;
    __m512i key = _mm512_srli_epi32(x, key_shift);
    __mmask16 stored = 0xFFFF;
    if constexpr (ZEROS) {  // §4.2: a zero key takes its implied entry (at key + kKeys) when every stored bit is 0
      const uint32_t bits = SC ? ~0u >> (32 - LL::sign_shift) : ~0u;
      const __mmask16 implied = _mm512_testn_epi32_mask(x, _mm512_set1_epi32(int(bits)));
      key = _mm512_mask_add_epi32(key, implied, key, _mm512_set1_epi32(kKeys));
      stored = __mmask16(~implied);
    }
    const __m512i entry = _mm512_i32gather_epi32(key, keys, 4);
    __m512i v = _mm512_and_si512(entry, _mm512_set1_epi32((1 << 26) - 1)), n = _mm512_srli_epi32(entry, 26);
    const __m512i h = DT == kF32 ? _mm512_srli_epi32(x, 16) : x;
    const __m512i sign = _mm512_srli_epi32(h, 15);
    __m512i extra;  // the stored extra value (fp16: and the stored byte)
    if constexpr (DT == kF16) {
      const __m512i raw = _mm512_and_si512(x, _mm512_set1_epi32(0xFF));
      extra = SC ? raw : _mm512_or_si512(sign, _mm512_slli_epi32(raw, 1));
    } else {
      const __m512i mant = _mm512_and_si512(h, _mm512_set1_epi32(0x1F));
      extra = SC ? mant : _mm512_or_si512(_mm512_slli_epi32(mant, 1), sign);
    }
    constexpr int extra_bits = DT == kF16 ? LL::extra_bits + 8 : LL::extra_bits;
    *v1 = _mm512_mask_or_epi32(v, stored, v, _mm512_sllv_epi32(extra, n));
    *n1 = _mm512_mask_add_epi32(n, stored, n, _mm512_set1_epi32(extra_bits));
    if constexpr (DT == kF32) {
      *v2 = _mm512_and_si512(x, _mm512_set1_epi32(0xFFFF));
      *n2 = _mm512_maskz_mov_epi32(stored, _mm512_set1_epi32(16));
    }
  }

  // The lanes' fields, 16 elements (a step) at a time: with WRITE coded into
  // the word arrays as encode_lanes does, else only counted. Each step's
  // appends leave every lane's low 32 bits in a row of stage and the lanes that
  // filled a word in a mask; 16 steps at a time the rows are transposed and
  // each lane keeps its filled words.
  template <int DT, bool SC, bool ZEROS, bool WRITE>
  ZC_SIMD void simd_lanes(const uint8_t* in, uint32_t ref, uint32_t* bits) {
    using E = Elem<DT>;
    if (keys_ref != ref) build_keys<DT, SC, ZEROS>(ref);
    LaneAppender app;  // each lane's pending bits
    __m512i total = _mm512_setzero_si512();
    uint32_t count[kLanes] = {};  // words each lane has kept
    const auto put = [&](__m512i v, __m512i n) ZC_SIMD { return app.put(v, n); };
    for (int i0 = 0; i0 < kBlock; i0 += kLanes * kLanes) {  // 16 steps
      bool seconds = false;  // fp32: whether a step of these made a second append
      for (int i = i0, r = 0; i < i0 + kLanes * kLanes; i += kLanes, ++r) {
        __m512i x, v1, n1, v2, n2;
        if constexpr (E::lay.elem_bytes == 2) x = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 2 * i)));
        else x = _mm512_loadu_si512(in + 4 * i);
        simd_fields<DT, SC, ZEROS>(x, &v1, &n1, &v2, &n2);
        total = _mm512_add_epi32(total, n1);
        if (DT == kF32) total = _mm512_add_epi32(total, n2);
        if (!WRITE) continue;
        __mmask16 apart = 0;  // fp32: lanes whose stored bytes do not fit in the first append (n1 > 16)
        if constexpr (DT == kF32) {
          apart = _mm512_cmpgt_epu32_mask(n1, _mm512_set1_epi32(16));
          v1 = _mm512_mask_or_epi32(v1, __mmask16(~apart), v1, _mm512_sllv_epi32(v2, n1));
          n1 = _mm512_mask_add_epi32(n1, __mmask16(~apart), n1, n2);
        }
        auto [low, full] = put(v1, n1);
        if constexpr (DT == kF32) {  // then a second append where needed: a step may fill two words (rows r, r + 16)
          stage_mask[kLanes + r] = 0;
          if (apart) {
            seconds = true;
            auto [low2, full2] = put(_mm512_maskz_mov_epi32(apart, v2), _mm512_maskz_mov_epi32(apart, n2));
            _mm512_store_si512(stage[kLanes + r], low2);
            stage_mask[kLanes + r] = full2;
          }
        }
        _mm512_store_si512(stage[r], low);
        stage_mask[r] = full;
      }
      if (WRITE) keep_words(seconds ? 2 : 1, count);  // without second appends, the first rows alone
    }
    _mm512_storeu_si512(bits, total);
    if (!WRITE) return;
    alignas(64) uint32_t low[kLanes];
    _mm512_store_si512(low, app.acc);
    for (int k = 0; k < kLanes; ++k) {
      uint32_t* lane = words + k * kLaneStride + 16;
      lane[-1] = 0;
      lane[count[k]] = low[k];  // the last, partial word
      std::memset(lane + count[k] + 1, 0, 16 * sizeof(uint32_t));
    }
  }

  // The words the lanes filled in the staged rows (tiles of 16 rows: for fp32
  // the rows of each step's first and second appends, interleaved in order).
  ZC_SIMD void keep_words(int tiles, uint32_t* count) {
    for (int tile = 0; tile < tiles; ++tile) {
      __m512i r[kLanes];
      uint16_t masks[kLanes];
      for (int j = 0; j < kLanes; ++j) {  // fp32: step j's first append, then its second
        const int row = tiles == 1 ? j : (j / 2) + (j % 2) * kLanes + tile * (kLanes / 2);
        r[j] = _mm512_load_si512(stage[row]);
        masks[j] = stage_mask[row];
      }
      transpose16(r);  // r[k]: lane k's low words after each append, in order
      const __m256i m = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(masks));
      for (int k = 0; k < kLanes; ++k) {
        const __mmask16 keep = _mm256_test_epi16_mask(m, _mm256_set1_epi16(short(1 << k)));
        _mm512_storeu_si512(words + k * kLaneStride + 16 + count[k], _mm512_maskz_compress_epi32(keep, r[k]));
        count[k] += uint32_t(__builtin_popcount(keep));
      }
    }
  }

#endif

  // The body from the width field, the deviations and the lanes' word
  // arrays, each shifted to its bit offset, into out (any alignment; up to
  // kSpliceSlack bytes past the body are written too, with zeros or garbage).
  void splice(int width, const int32_t* devs, const uint32_t* bits, uint8_t* out) {
    const int head = head_bits(width);
    std::memset(out, 0, size_t(head / 32 + 2) * 4);
    BitWriter w{out, 0, 0};
    put_width(width, w);
    for (int k = 0; k + 1 < kLanes; ++k) w.put(uint32_t(devs[k]) & ((1u << width) - 1), width);
    w.flush();
    uint32_t at = uint32_t(head);
    for (int k = 0; k < kLanes; ++k) {
      const uint32_t* src = words + k * kLaneStride + 16;
      const uint32_t s = at & 31, n = (s + bits[k] + 31) / 32;
      uint8_t* dst = out + at / 32 * 4;
      uint32_t first;
      std::memcpy(&first, dst, 4);
      first &= (1u << s) - 1;  // the bits before this lane's (s == 0: none)
#if ZC_HAVE_SIMD
      if (simd_enabled()) {
        splice_words(src, dst, s, n, first);
        at += bits[k];
        continue;
      }
#endif
      for (uint32_t i = 0; i <= n; ++i) {
        const uint32_t v = i == n ? 0 : (src[i] << s) | (s ? src[int(i) - 1] >> (32 - s) : 0) | (i == 0 ? first : 0);
        std::memcpy(dst + 4 * i, &v, 4);
      }
      at += bits[k];
    }
  }

};

struct LaneDecoder {
  static constexpr int kRun = 4;  // full blocks decoded at once: their lanes' dependency chains overlap
  int mask = 0;
  uint32_t table_ref = ~0u;       // the ref the table was built for
  const uint16_t* lut = nullptr;  // the shared decoder's, for blocks this one does not take
  PlaneCodes pc{};
  alignas(64) uint32_t table[kLutSize];

  // Takes a group's codes; false if this decoder cannot (coded byte planes).
  template <int DT>
  bool prepare(const uint16_t* group_lut, const PlaneCodes& planes) {
    mask = planes.mask, lut = group_lut, pc = planes, table_ref = ~0u;
    return !(mask & 3);
  }

  // decode_coded_block of zipccl_format.h for `blocks` (at most kRun) coded
  // blocks of the group: block j has body bodies[j] of sizes[j] bytes, counts[j]
  // elements, ref refs[j], output outs[j]; `readable` bytes may be read from
  // bodies[0] (the rest of the stream). Returns the first failing block's
  // Status (in block order), else kOk.
  template <int DT>
  int decode(int blocks, const uint8_t* const* bodies, const uint32_t* sizes, int64_t readable, const int* counts,
             const uint32_t* refs, uint8_t* const* outs) {
    Run& run = run_;
    run.n = 0;
    for (int j = 0; j < blocks; ++j) {
      const int status = locate_lanes(bodies[j], sizes[j], run.starts[j]);
      if (status != kOk || counts[j] != kBlock) return decode_each<DT>(blocks, bodies, sizes, counts, refs, outs);
      const int64_t left = readable - (bodies[j] - bodies[0]);
      run.bodies[j] = bodies[j];
      if (left < int64_t(sizes[j]) + kBodySlack) {  // windows are read 8 bytes at a time, clamped to the body
        std::memcpy(run.padded[j], bodies[j], sizes[j]);
        std::memset(run.padded[j] + sizes[j], 0, kBodySlack);
        run.bodies[j] = run.padded[j];
      }
      run.sizes[j] = sizes[j], run.outs[j] = outs[j];
      ++run.n;
    }
    for (int j = 0; j < run.n;) {  // runs of blocks under one ref (own refs may differ)
      if (refs[j] != table_ref) build<DT>(refs[j]);
      int m = 1;
      while (j + m < run.n && refs[j + m] == table_ref) ++m;
      const bool ok = (mask & kMaskSign) ? lanes<DT, true>(j, m) : lanes<DT, false>(j, m);
      if (!ok) return decode_each<DT>(blocks, bodies, sizes, counts, refs, outs);  // the verdict, in the format's order
      j += m;
    }
    return kOk;
  }

 private:
  struct Run {  // blocks decoded together
    int n;
    const uint8_t* bodies[kRun];
    uint32_t sizes[kRun];
    uint8_t* outs[kRun];
    uint32_t starts[kRun][kLanes + 1];
    alignas(64) uint8_t padded[kRun][kBlock * 4 + kBodySlack];
  } run_;

  template <int DT>
  int decode_each(int blocks, const uint8_t* const* bodies, const uint32_t* sizes, const int* counts,
                  const uint32_t* refs, uint8_t* const* outs) {
    for (int j = 0; j < blocks; ++j) {
      const int status = decode_coded_block(DT, bodies[j], sizes[j], counts[j], refs[j], lut, pc, outs[j]);
      if (status != kOk) return status;
    }
    return kOk;
  }

  // What the symbol of an entry gives of the element's bits sits above bit
  // known_shift (bf16, and fp32's top half: bits 5-15; fp16: bits 8-15).
  template <int DT>
  static constexpr int known_shift() { return DT == kF16 ? 8 : 5; }

  template <int DT>
  void build(uint32_t ref) {
    using E = Elem<DT>;
    const int stored = E::lay.extra_bits - ((mask & kMaskSign) ? 1 : 0) + 8 * E::lay.raw_bytes;
    for (int w = 0; w < kLutSize; ++w) {
      const uint32_t len = lut[w] >> 8, s = lut[w] & 0xFFu;
      const uint32_t c = (s >> kTopBits) & (kNumClasses - 1), t = s & 3u;
      const bool esc = c == uint32_t(kClassEsc), implied = implied_symbol(int(s), mask);
      table[w] = 0;
      if (!len || (c != uint32_t(kClassZero) && !esc && c - 1 >= ref)) continue;  // no code; an exponent below 1
      const uint32_t e = esc || c == uint32_t(kClassZero) ? 0 : ref - (c - 1);
      const uint32_t sign = (mask & kMaskSign) ? s >> kSignBit : 0;
      const uint32_t known = sign << 15 | e << E::e_shift | t << E::t_shift;  // of the element's top 16 bits
      const uint32_t off = len + (esc ? E::lay.exp_bits : 0), total = implied ? off : off + stored;
      table[w] = len | off << LaneEntry::kOffShift | (esc ? LaneEntry::kEsc : 0) | (implied ? LaneEntry::kImplied : 0) |
                 (known >> known_shift<DT>()) << LaneEntry::kKnownShift | total << LaneEntry::kTotalShift;
    }
    table_ref = ref;
  }

  // Element bits from a table entry and the window at its code (64 bits: fp32's fields may pass 32).
  template <int DT, bool SC>
  static uint32_t element(uint32_t entry, uint64_t w) {
    using E = Elem<DT>;
    const uint32_t len = entry & LaneEntry::kLen, off = (entry >> LaneEntry::kOffShift) & 31;
    uint32_t top = ((entry >> LaneEntry::kKnownShift) & 0x7FFFu) << known_shift<DT>();
    if (entry & LaneEntry::kEsc) top |= (uint32_t(w >> len) & E::all_ones) << E::e_shift;
    const uint32_t f = uint32_t(w >> off);  // the stored fields
    if constexpr (DT == kBF16) {
      if (entry & LaneEntry::kImplied) return top;
      return SC ? top | (f & 31u) : top | (f & 1u) << 15 | ((f >> 1) & 31u);
    } else if constexpr (DT == kF16) {
      if (entry & LaneEntry::kImplied) return top;
      return SC ? top | (f & 0xFFu) : top | (f & 1u) << 15 | ((f >> 1) & 0xFFu);
    } else {
      if (entry & LaneEntry::kImplied) return top << 16;
      return SC ? (top | (f & 31u)) << 16 | ((f >> 5) & 0xFFFFu)
                : (top | (f & 1u) << 15 | ((f >> 1) & 31u)) << 16 | ((f >> 6) & 0xFFFFu);
    }
  }

  // Blocks j .. j + m - 1 of the run, in lockstep (m <= kRun; their steps
  // interleaved where all kRun go together); false if a lane does not decode cleanly.
  template <int DT, bool SC>
  bool lanes(int j, int m) {
#if ZC_HAVE_SIMD
    if (simd_enabled()) {
      if (m == kRun) return simd_lanes<DT, SC, kRun>(j);
      for (int b = 0; b < m; ++b)
        if (!simd_lanes<DT, SC, 1>(j + b)) return false;
      return true;
    }
#endif
    constexpr int es = Elem<DT>::lay.elem_bytes;
    for (int b = j; b < j + m; ++b) {
      const uint8_t* body = run_.bodies[b];
      const uint32_t size = run_.sizes[b];
      uint32_t pos[kLanes];
      bool bad = false;
      for (int k = 0; k < kLanes; ++k) pos[k] = run_.starts[b][k];
      for (int i = 0; i < kBlock; ++i) {
        const int k = i % kLanes;
        const uint64_t w = load_u64(body + std::min(pos[k] >> 3, size)) >> (pos[k] & 7);
        const uint32_t entry = table[w & (kLutSize - 1)];
        bad |= entry == 0;
        const uint32_t x = element<DT, SC>(entry, w);
        std::memcpy(run_.outs[b] + i * es, &x, es);
        pos[k] += entry >> LaneEntry::kTotalShift;
      }
      if (bad || !ends_ok(body, pos, run_.starts[b])) return false;
    }
    return true;
  }

  // §2, §6: every lane ends where the next starts, the last in the body's last byte with zero padding.
  static bool ends_ok(const uint8_t* body, const uint32_t* pos, const uint32_t* starts) {
    for (int k = 0; k < kLanes; ++k)
      if (lane_end_status(body, k, pos[k], starts) != kOk || pos[k] > starts[k + 1]) return false;
    return true;
  }

#if ZC_HAVE_SIMD
  ZC_SIMD static __m512i set(uint32_t v) { return _mm512_set1_epi32(int(v)); }

  // One step (16 elements, one per lane) of a block: decodes them to out,
  // advances pos, flags bad lanes.
  template <int DT, bool SC>
  ZC_SIMD static void simd_step(const uint32_t* table, const uint8_t* body, __m512i vsize, __m512i& pos, __mmask16& bad,
                                uint8_t* out) {
    using E = Elem<DT>;
    // The window: 32 bits from the lane's byte, shifted to its bit: 25 of them at
    // least, enough for the code and for a 16-bit element's fields but where an
    // element of 26 bits starts at bit 7 of its byte (rare: then, and for fp32's
    // stored bytes, the next 32 bits join them).
    const __m512i byte = _mm512_min_epu32(_mm512_srli_epi32(pos, 3), vsize);
    const __m512i shift = _mm512_and_si512(pos, set(7));
    const __m512i lo = _mm512_i32gather_epi32(byte, body, 1);
    __m512i w = _mm512_srlv_epi32(lo, shift);
    const __m512i entry = _mm512_i32gather_epi32(_mm512_and_si512(w, set(kLutSize - 1)), table, 4);
    const __m512i total = _mm512_srli_epi32(entry, LaneEntry::kTotalShift);
    pos = _mm512_add_epi32(pos, total);
    bad |= _mm512_testn_epi32_mask(entry, entry);
    __m512i hi = _mm512_setzero_si512();
    if (DT == kF32 || _mm512_cmpgt_epu32_mask(_mm512_add_epi32(total, shift), set(32))) {
      hi = _mm512_i32gather_epi32(_mm512_add_epi32(byte, set(4)), body, 1);
      w = _mm512_shrdv_epi32(lo, hi, shift);
      hi = _mm512_srlv_epi32(hi, shift);  // fp32: the bits after w's 32
    }
    // the symbol's bits, an escape's exponent from the window
    __m512i top = _mm512_and_si512(_mm512_srli_epi32(entry, LaneEntry::kKnownShift - known_shift<DT>()),
                                   set(0x7FFFu << known_shift<DT>()));
    const __mmask16 esc = _mm512_test_epi32_mask(entry, set(LaneEntry::kEsc));
    if (esc) {
      const __m512i e = _mm512_and_si512(_mm512_srlv_epi32(w, _mm512_and_si512(entry, set(LaneEntry::kLen))), set(E::all_ones));
      top = _mm512_mask_or_epi32(top, esc, top, _mm512_slli_epi32(e, E::e_shift));
    }
    // the stored fields
    const __m512i off = _mm512_and_si512(_mm512_srli_epi32(entry, LaneEntry::kOffShift), set(31));
    const __m512i f = DT == kF32 ? _mm512_shrdv_epi32(w, hi, off) : _mm512_srlv_epi32(w, off);
    const __mmask16 stored = _mm512_testn_epi32_mask(entry, set(LaneEntry::kImplied));
    __m512i x;
    if constexpr (DT == kBF16) {
      x = SC ? _mm512_and_si512(f, set(31))
             : _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(f, set(1)), 15), _mm512_and_si512(_mm512_srli_epi32(f, 1), set(31)));
      x = _mm512_mask_or_epi32(top, stored, top, x);
    } else if constexpr (DT == kF16) {
      x = SC ? _mm512_and_si512(f, set(0xFF))
             : _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(f, set(1)), 15), _mm512_and_si512(_mm512_srli_epi32(f, 1), set(0xFF)));
      x = _mm512_mask_or_epi32(top, stored, top, x);
    } else {
      constexpr int eb = SC ? 5 : 6;  // the stored extra value, then the two bytes
      __m512i hi16 = _mm512_and_si512(f, set(31));
      if (!SC) hi16 = _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(f, set(1)), 15), _mm512_and_si512(_mm512_srli_epi32(f, 1), set(31)));
      x = _mm512_or_si512(_mm512_slli_epi32(hi16, 16), _mm512_and_si512(_mm512_srli_epi32(f, eb), set(0xFFFF)));
      x = _mm512_mask_or_epi32(_mm512_slli_epi32(top, 16), stored, _mm512_slli_epi32(top, 16), x);
    }
    if constexpr (E::lay.elem_bytes == 2) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(x));
    else _mm512_storeu_si512(out, x);
  }

  // Blocks j .. j + NB - 1 of the run, their steps interleaved.
  template <int DT, bool SC, int NB>
  ZC_SIMD bool simd_lanes(int j) {
    constexpr int es = Elem<DT>::lay.elem_bytes;
    __m512i pos[NB], vsize[NB];
    __mmask16 bad[NB];
    for (int b = 0; b < NB; ++b) {
      pos[b] = _mm512_loadu_si512(run_.starts[j + b]);
      vsize[b] = _mm512_set1_epi32(int(run_.sizes[j + b]));
      bad[b] = 0;
    }
    for (int i = 0; i < kBlock; i += kLanes)
      for (int b = 0; b < NB; ++b)
        simd_step<DT, SC>(table, run_.bodies[j + b], vsize[b], pos[b], bad[b], run_.outs[j + b] + i * es);
    for (int b = 0; b < NB; ++b) {
      alignas(64) uint32_t end[kLanes];
      _mm512_store_si512(end, pos[b]);
      if (bad[b] || !ends_ok(run_.bodies[j + b], end, run_.starts[j + b])) return false;
    }
    return true;
  }
#endif
};

}  // namespace zipccl
