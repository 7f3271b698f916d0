// The lane coder and decoder of lanes6_cpu.h with AVX2, for CPUs without
// AVX-512 (avx2_enabled()): the same bytes and verdicts as the AVX-512 and
// plain paths (tests run all three). A full block's 32 lanes are four vectors
// of 8 (lanes 8 h .. 8 h + 7 are the values 32 j + 8 h + l). Included by
// lanes6_cpu.h once its tables (KeyTable, Baked, RefTable) are defined.
#pragma once

#if ZC_HAVE_SIMD
namespace zipccl {
namespace v6 {

// Codes a full block's lanes with a code's key table (KeyTable::e), a quarter
// (8 lanes) at a time: every value's fields are looked up, then each step
// appends one value's fields to each lane's pending word; the words 8 steps
// complete are staged as rows, transposed, and each lane keeps the ones it
// completed. words[k] + 16: lane k's words, a zero word before, zeros after.
struct Avx2Lanes {
  alignas(32) uint32_t words[kLanes][kLaneWords];
  uint32_t count[kLanes];

  template <int DT>
  ZC_AVX2 void encode(const typename Elements<DT>::T* x, const uint32_t* keys) {
    for (int h = 0; h < 4; ++h) encode_quarter<DT>(x, keys, h);
  }

 private:
  static constexpr int kRows = kBlock / kLanes;  // a lane's values
  // A quarter's fields, each step's value's for its lane (fp32: and the low bits of those whose
  // fields pass 32 bits, apart): all looked up first, so that the gathers need not wait on the appends.
  alignas(32) uint32_t field[2][kRows][8], length[2][kRows][8];
  bool apart[kRows];

  template <int DT>
  ZC_AVX2 void fields(const typename Elements<DT>::T* x, const uint32_t* keys, int h) {
    using El = Elements<DT>;
    constexpr Layout lay = El::lay;
    const __m256i mag = _mm256_set1_epi32(int(El::mag_mask)), zeros_key = _mm256_set1_epi32(KeyTable<DT>::kKeys);
    const __m256i code = _mm256_set1_epi32((1 << 26) - 1), low_mask = _mm256_set1_epi32(int(El::low_mask));
    const __m256i low_bits = _mm256_set1_epi32(lay.low_bits);
    for (int j = 0; j < kRows; ++j) {
      const auto* at = x + kLanes * j + 8 * h;
      const __m256i v = sizeof(*at) == 2 ? _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)))
                                         : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
      const __m256i zero = _mm256_cmpeq_epi32(_mm256_and_si256(v, mag), _mm256_setzero_si256());
      const __m256i key = _mm256_blendv_epi8(_mm256_srli_epi32(v, lay.low_bits),
                                             _mm256_add_epi32(_mm256_srli_epi32(v, El::sign_shift), zeros_key), zero);
      const __m256i e = _mm256_i32gather_epi32(reinterpret_cast<const int*>(keys), key, 4);
      __m256i fv = _mm256_and_si256(e, code), fn = _mm256_srli_epi32(e, 26);
      const __m256i low = _mm256_and_si256(v, low_mask);
      __m256i joined = _mm256_andnot_si256(zero, _mm256_set1_epi32(-1));
      if constexpr (DT == kF32) {  // the low bits that do not fit the first append
        const __m256i second = _mm256_and_si256(joined, _mm256_cmpgt_epi32(fn, _mm256_set1_epi32(32 - lay.low_bits)));
        joined = _mm256_andnot_si256(second, joined);
        apart[j] = !_mm256_testz_si256(second, second);
        avx2_store(field[1][j], _mm256_and_si256(second, low));
        avx2_store(length[1][j], _mm256_and_si256(second, low_bits));
      }
      avx2_store(field[0][j], _mm256_or_si256(fv, _mm256_and_si256(joined, _mm256_sllv_epi32(low, fn))));
      avx2_store(length[0][j], _mm256_add_epi32(fn, _mm256_and_si256(joined, low_bits)));
    }
  }

  template <int DT>
  ZC_AVX2 void encode_quarter(const typename Elements<DT>::T* x, const uint32_t* keys, int h) {
    fields<DT>(x, keys, h);
    LaneAppender8 lanes;
    uint32_t* count = this->count + 8 * h;
    for (int l = 0; l < 8; ++l) count[l] = 0;
    for (int j0 = 0; j0 < kRows; j0 += 8) {
      __m256i rows[16], full[16];  // step r's append at 2 r; fp32: its second (the low bits apart) at 2 r + 1
      bool seconds = false;
      for (int r = 0; r < 8; ++r) {
        rows[2 * r] = lanes.put(avx2_load(field[0][j0 + r]), avx2_load(length[0][j0 + r]), &full[2 * r]);
        rows[2 * r + 1] = full[2 * r + 1] = _mm256_setzero_si256();
        if (DT == kF32 && apart[j0 + r]) {
          seconds = true;
          rows[2 * r + 1] = lanes.put(avx2_load(field[1][j0 + r]), avx2_load(length[1][j0 + r]), &full[2 * r + 1]);
        }
      }
      if (seconds) {
        keep_words(rows, full, h);  // steps 0-3, first and second appends interleaved
        keep_words(rows + 8, full + 8, h);
      } else {
        for (int r = 0; r < 8; ++r) rows[r] = rows[2 * r], full[r] = full[2 * r];
        keep_words(rows, full, h);
      }
    }
    alignas(32) uint32_t pending[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(pending), lanes.acc);
    for (int l = 0; l < 8; ++l) {
      uint32_t* lane = words[8 * h + l] + 16;
      lane[-1] = 0;
      lane[count[l]] = pending[l];
      std::memset(lane + count[l] + 1, 0, 16 * sizeof(uint32_t));
    }
  }

  // The words lanes 8 h .. 8 h + 7 completed in 8 staged rows, in order.
  ZC_AVX2 void keep_words(__m256i* rows, const __m256i* full, int h) {
    uint64_t flags = 0;  // byte r: which lanes row r completed
    for (int r = 0; r < 8; ++r) flags |= uint64_t(_mm256_movemask_ps(_mm256_castsi256_ps(full[r]))) << (8 * r);
    transpose8(rows);  // rows[l]: lane l's word after each append
    const LeftPack& pack = left_pack();
    for (int l = 0; l < 8; ++l) {
      const uint32_t keep = uint32_t(_pext_u64(flags, 0x0101010101010101ull << l));
      uint32_t& c = count[8 * h + l];
      const __m256i perm = _mm256_load_si256(reinterpret_cast<const __m256i*>(pack.idx[keep]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(words[8 * h + l] + 16 + c), _mm256_permutevar8x32_epi32(rows[l], perm));
      c += uint32_t(__builtin_popcount(keep));
    }
  }
};

// One step of 8 lanes of a block (a value each): decode_value's work, as
// simd_step does it for 16, 16-bit elements with their window carried in win.
// body has 8 readable bytes past vsize (a lane that runs past its end is
// clamped there and flagged at the end).
template <int DT>
ZC_AVX2 inline __m256i avx2_step(const uint8_t* body, __m256i vsize, const uint32_t* tab, __m256i& pos, __m256i& win,
                                 __m256i& bad) {
  using El = Elements<DT>;
  constexpr Layout lay = El::lay;
  constexpr bool kCarried = DT != kF32;
  const int* bytes = reinterpret_cast<const int*>(body);
  const __m256i byte = _mm256_min_epu32(_mm256_srli_epi32(pos, 3), vsize);
  const __m256i shift = _mm256_and_si256(pos, avx2_set(7));
  __m256i w = kCarried ? win : _mm256_srlv_epi32(_mm256_i32gather_epi32(bytes, byte, 1), shift), hi = _mm256_setzero_si256();
  const __m256i e = _mm256_i32gather_epi32(reinterpret_cast<const int*>(tab), _mm256_and_si256(w, avx2_set(kLutSize - 1)), 4);
  const __m256i at = _mm256_min_epu32(_mm256_add_epi32(byte, avx2_set(4)), vsize);
  __m256i next = kCarried ? _mm256_i32gather_epi32(bytes, at, 1) : _mm256_setzero_si256();  // the 32 bits after win
  bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(e, _mm256_setzero_si256()));
  const __m256i len = _mm256_and_si256(_mm256_srli_epi32(e, Baked::kLenShift), avx2_set(15));
  const __m256i used = _mm256_and_si256(_mm256_srli_epi32(e, Baked::kUsedShift), avx2_set(63));
  // 25 bits are a gathered dword's at least; fp32's fields, and a 16-bit escape late in its byte, need more
  if (DT == kF32 || _mm256_movemask_epi8(_mm256_cmpgt_epi32(_mm256_add_epi32(used, shift), avx2_set(32)))) {
    const __m256i more = _mm256_i32gather_epi32(bytes, kCarried ? _mm256_min_epu32(_mm256_add_epi32(at, avx2_set(4)), vsize)
                                                                 : _mm256_add_epi32(byte, avx2_set(4)), 1);
    const __m256i up = _mm256_sllv_epi32(more, _mm256_sub_epi32(avx2_set(32), shift));  // a shift of 32 gives 0
    if (kCarried) next = _mm256_or_si256(_mm256_srlv_epi32(next, shift), up);
    else w = _mm256_or_si256(w, up), hi = _mm256_srlv_epi32(more, shift);
  } else if (kCarried) {
    next = _mm256_srlv_epi32(next, shift);
  }
  __m256i top = _mm256_and_si256(e, avx2_set(RefTable::kHi)), off = len;
  const __m256i esc = _mm256_cmpgt_epi32(_mm256_and_si256(e, avx2_set(Baked::kEsc)), _mm256_setzero_si256());
  if (!_mm256_testz_si256(esc, esc)) {
    top = _mm256_or_si256(top, _mm256_and_si256(esc, _mm256_and_si256(_mm256_srlv_epi32(w, len), avx2_set(El::q_mask))));
    off = _mm256_add_epi32(off, _mm256_and_si256(esc, avx2_set(lay.q_bits)));
  }
  __m256i f = _mm256_srlv_epi32(w, off);
  if constexpr (DT == kF32) f = _mm256_or_si256(f, _mm256_sllv_epi32(hi, _mm256_sub_epi32(avx2_set(32), off)));
  const __m256i low = _mm256_cmpgt_epi32(_mm256_and_si256(e, avx2_set(Baked::kLow)), _mm256_setzero_si256());
  if constexpr (kCarried)  // used <= 27; a shift of 32 gives 0
    win = _mm256_or_si256(_mm256_srlv_epi32(w, used), _mm256_sllv_epi32(next, _mm256_sub_epi32(avx2_set(32), used)));
  pos = _mm256_add_epi32(pos, used);
  return _mm256_or_si256(_mm256_slli_epi32(top, lay.low_bits), _mm256_and_si256(low, _mm256_and_si256(f, avx2_set(El::low_mask))));
}

// The 32 bits at each lane's pos (avx2_step's win), bytes clamped as there.
ZC_AVX2 inline __m256i avx2_window(const uint8_t* body, __m256i vsize, __m256i pos) {
  const int* bytes = reinterpret_cast<const int*>(body);
  const __m256i byte = _mm256_min_epu32(_mm256_srli_epi32(pos, 3), vsize), shift = _mm256_and_si256(pos, avx2_set(7));
  const __m256i lo = _mm256_i32gather_epi32(bytes, byte, 1);
  const __m256i hi = _mm256_i32gather_epi32(bytes, _mm256_min_epu32(_mm256_add_epi32(byte, avx2_set(4)), vsize), 1);
  return _mm256_or_si256(_mm256_srlv_epi32(lo, shift), _mm256_sllv_epi32(hi, _mm256_sub_epi32(avx2_set(32), shift)));
}

// simd_blocks with AVX2: NB full blocks side by side, each as four vectors of 8 lanes.
template <int DT, int NB>
ZC_AVX2 bool avx2_blocks(const uint8_t* const* bodies, const uint32_t* sizes, const uint32_t (*starts)[kLanes + 1],
                         const uint32_t* const* tabs, typename Elements<DT>::T* const* outs) {
  __m256i pos[NB][4], win[NB][4], vsize[NB], bad[NB];  // bad: one vector a block (registers are few)
  for (int j = 0; j < NB; ++j) {
    vsize[j] = _mm256_set1_epi32(int(sizes[j]));
    for (int h = 0; h < 4; ++h) {
      pos[j][h] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(starts[j] + 8 * h));
      win[j][h] = avx2_window(bodies[j], vsize[j], pos[j][h]);
    }
    bad[j] = _mm256_setzero_si256();
  }
  for (int i = 0; i < kBlock / kLanes; ++i)
    for (int j = 0; j < NB; ++j) {
      __m256i x[4];
      for (int h = 0; h < 4; ++h) x[h] = avx2_step<DT>(bodies[j], vsize[j], tabs[j], pos[j][h], win[j][h], bad[j]);
      auto* out = outs[j] + kLanes * i;
      if constexpr (sizeof(*out) == 2) {
        for (int h = 0; h < 4; h += 2)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8 * h),
                              _mm256_permute4x64_epi64(_mm256_packus_epi32(x[h], x[h + 1]), 0xD8));
      } else {
        for (int h = 0; h < 4; ++h) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8 * h), x[h]);
      }
    }
  bool ok = true;
  for (int j = 0; j < NB; ++j) {
    alignas(32) uint32_t end[kLanes];
    for (int h = 0; h < 4; ++h) _mm256_store_si256(reinterpret_cast<__m256i*>(end + 8 * h), pos[j][h]);
    ok &= bool(_mm256_testz_si256(bad[j], bad[j]));
    for (int k = 0; k < kLanes; ++k) ok &= end[k] <= starts[j][k + 1] && lane_end_status(bodies[j], k, end[k], starts[j]) == kOk;
  }
  return ok;
}

}  // namespace v6
}  // namespace zipccl
#endif  // ZC_HAVE_SIMD
