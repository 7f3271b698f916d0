// Fast CPU block coder: the same bytes as encode_block/decode_block of
// zipccl_format.h (tests assert it), restructured for one core:
// - split/join run as separate branch-free passes the compiler vectorises;
// - each exponent's code, escape bits included, comes from one per-block
//   table lookup;
// - the four sub-streams are coded in lockstep, so four independent
//   dependency chains overlap in the pipeline.
#pragma once

#include <cstring>
#include <type_traits>

#include "zipccl_format.h"

namespace zipccl {

template <int DT>
struct Elem {
  static constexpr Layout lay = DT == kBF16 ? Layout{2, 8, 1, 0} : DT == kF16 ? Layout{2, 5, 1, 3} : Layout{4, 8, 3, 0};
  using U = std::conditional_t<lay.elem_bytes == 2, uint16_t, uint32_t>;
};

inline uint64_t load_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Decoder-side tables for one block: LUT entry -> (exponent or escape, length).
struct BitStream {
  const uint8_t* p;    // next byte to load
  const uint8_t* end;  // one past the sub-stream's last byte
  uint64_t buf;
  int cnt;             // valid bits in buf
  const uint8_t* start;
  void refill() {
    buf |= load_u64(p) << cnt;
    p += (63 - cnt) >> 3;
    cnt |= 56;
  }
  uint64_t consumed_bits() const { return uint64_t(p - start) * 8 - cnt; }
};

// Splits count elements into exponents e[] and raw bytes (written at body),
// and fills extra[] for float16.
template <int DT>
void split_block(const uint8_t* in, int count, uint8_t* e, uint8_t* raw, uint8_t* extra) {
  using U = typename Elem<DT>::U;
  for (int i = 0; i < count; ++i) {
    U x;
    std::memcpy(&x, in + i * sizeof(U), sizeof(U));
    if constexpr (DT == kBF16) {
      e[i] = uint8_t(x >> 7);
      raw[i] = uint8_t(((x & 0x7Fu) << 1) | (x >> 15));
    } else if constexpr (DT == kF16) {
      e[i] = uint8_t((x >> 10) & 0x1Fu);
      raw[i] = uint8_t(x);
      extra[i] = uint8_t(((x >> 15) << 2) | ((x >> 8) & 3u));
    } else {
      e[i] = uint8_t(x >> 23);
      raw[3 * i] = uint8_t(x);
      raw[3 * i + 1] = uint8_t(x >> 8);
      raw[3 * i + 2] = uint8_t((((x >> 16) & 0x7Fu) << 1) | (x >> 31));
    }
  }
}

template <int DT>
void join_block(const uint8_t* e, const uint8_t* raw, const uint8_t* extra, int count, uint8_t* out) {
  using U = typename Elem<DT>::U;
  for (int i = 0; i < count; ++i) {
    U x;
    if constexpr (DT == kBF16) {
      x = U(((raw[i] & 1u) << 15) | (uint32_t(e[i]) << 7) | (raw[i] >> 1));
    } else if constexpr (DT == kF16) {
      x = U(((extra[i] >> 2) << 15) | (uint32_t(e[i]) << 10) | ((extra[i] & 3u) << 8) | raw[i]);
    } else {
      const uint8_t* r = raw + 3 * i;
      x = ((uint32_t(r[2]) & 1u) << 31) | (uint32_t(e[i]) << 23) | (uint32_t(r[2] >> 1) << 16) |
          (uint32_t(r[1]) << 8) | r[0];
    }
    std::memcpy(out + i * sizeof(U), &x, sizeof(U));
  }
}

// Encodes one block (see encode_block). Returns its descriptor.
template <int DT>
uint32_t encode_block_fast(const uint8_t* in, int count, const uint8_t (*lens)[kNumSyms],
                           const uint16_t (*codes)[kNumSyms], uint8_t* body) {
  constexpr Layout lay = Elem<DT>::lay;
  constexpr uint32_t all_ones = (1u << lay.exp_bits) - 1;
  alignas(64) uint8_t e[kBlock + 8], extra[kBlock + 8];
  alignas(64) uint8_t streams[kSubstreams][kBlock * 3 + 16];
  split_block<DT>(in, count, e, body, extra);

  uint32_t hist4[4][256] = {};
  int i = 0;
  for (; i + 4 <= count; i += 4) {
    ++hist4[0][e[i]];
    ++hist4[1][e[i + 1]];
    ++hist4[2][e[i + 2]];
    ++hist4[3][e[i + 3]];
  }
  for (; i < count; ++i) ++hist4[0][e[i]];
  uint32_t hist[256];
  for (int v = 0; v < 256; ++v) hist[v] = hist4[0][v] + hist4[1][v] + hist4[2][v] + hist4[3][v];
  uint32_t ref = 0;
  int table = 0;
  choose_code(hist, lay, lens, &ref, &table);

  // code[v] = the bits written for exponent v (escape included), len[v] their count
  uint32_t code[all_ones + 1];
  uint8_t len[all_ones + 1];
  for (uint32_t v = 0; v <= all_ones; ++v) {
    const int s = symbol_of(v, ref, all_ones);
    code[v] = codes[table][s] | (s == kSymEsc ? v << lens[table][s] : 0);
    len[v] = uint8_t(lens[table][s] + (s == kSymEsc ? lay.exp_bits : 0));
  }

  const int q = substream_len(count);
  uint8_t* out[kSubstreams];
  uint64_t acc[kSubstreams] = {};
  int nbits[kSubstreams] = {};
  for (int k = 0; k < kSubstreams; ++k) out[k] = streams[k];
  auto put = [&](int k, int idx) {
    uint32_t v = code[e[idx]];
    int l = len[e[idx]];
    if constexpr (lay.extra_bits) {
      v |= uint32_t(extra[idx]) << l;
      l += lay.extra_bits;
    }
    acc[k] |= uint64_t(v) << nbits[k];
    nbits[k] += l;
    std::memcpy(out[k], &acc[k], 8);
    const int bytes = nbits[k] >> 3;
    out[k] += bytes;
    acc[k] >>= bytes * 8;
    nbits[k] &= 7;
  };
  const int last = count - (kSubstreams - 1) * q;  // elements in the last sub-stream (may be <= 0)
  const int full = last < 0 ? 0 : last;
  for (int j = 0; j < full; ++j)
    for (int k = 0; k < kSubstreams; ++k) put(k, k * q + j);
  for (int k = 0; k < kSubstreams; ++k)
    for (int j = full; j < q && k * q + j < count; ++j) put(k, k * q + j);

  uint32_t stream_bytes[kSubstreams];
  uint32_t coded = uint32_t(count) * lay.raw_bytes + 2 * (kSubstreams - 1);
  for (int k = 0; k < kSubstreams; ++k) {
    if (nbits[k]) *out[k]++ = uint8_t(acc[k]);
    stream_bytes[k] = uint32_t(out[k] - streams[k]);
    coded += stream_bytes[k];
  }
  const uint32_t raw_block_bytes = uint32_t(count) * lay.elem_bytes;
  if (coded >= raw_block_bytes) {
    std::memcpy(body, in, raw_block_bytes);
    return make_descriptor(raw_block_bytes, 0, 0);
  }
  uint8_t* w = body + count * lay.raw_bytes;
  for (int k = 0; k + 1 < kSubstreams; ++k) {
    *w++ = uint8_t(stream_bytes[k]);
    *w++ = uint8_t(stream_bytes[k] >> 8);
  }
  for (int k = 0; k < kSubstreams; ++k) {
    std::memcpy(w, streams[k], stream_bytes[k]);
    w += stream_bytes[k];
  }
  return make_descriptor(coded, ref, uint32_t(table + 1));
}

// Decodes one block (see decode_block). Returns a Status.
template <int DT>
int decode_block_fast(const uint8_t* body, uint32_t desc, int count, const uint16_t* lut, uint8_t* out) {
  constexpr Layout lay = Elem<DT>::lay;
  const uint32_t size = desc & 0xFFFFu, ref = (desc >> 16) & 0xFFu, mode = desc >> 24;
  if (mode == 0) {
    if (size != uint32_t(count) * lay.elem_bytes) return kErrBlockSize;
    std::memcpy(out, body, size);
    return kOk;
  }
  if (mode > kNumTables) return kErrBlockMode;
  uint32_t bounds[kSubstreams + 1];
  int status = locate_substreams(body, size, count, lay, bounds);
  if (status != kOk) return status;

  // The bitstreams, copied so that 8-byte loads past a sub-stream stay in bounds.
  alignas(64) uint8_t bits[kBlock * 4 + 32];
  const uint32_t nbytes = size - bounds[0];
  std::memcpy(bits, body + bounds[0], nbytes);
  std::memset(bits + nbytes, 0, 32);
  // sym_e[s]: exponent of symbol s, or 0xFFFF for escape / invalid (e would be <= 0)
  uint16_t sym_e[kNumSyms];
  sym_e[kSymZero] = 0;
  for (int s = 1; s < kSymEsc; ++s) sym_e[s] = uint32_t(s - 1) < ref ? uint16_t(ref - (s - 1)) : 0xFFFF;
  sym_e[kSymEsc] = 0xFFFF;
  const uint16_t* table = lut + (mode - 1) * kLutSize;

  BitStream st[kSubstreams];
  for (int k = 0; k < kSubstreams; ++k) {
    const uint8_t* s = bits + (bounds[k] - bounds[0]);
    st[k] = {s, bits + (bounds[k + 1] - bounds[0]), 0, 0, s};
  }
  alignas(64) uint8_t e[kBlock + 8], extra[kBlock + 8];
  bool bad = false;
  auto get = [&](int k, int idx) {
    BitStream& b = st[k];
    if (b.cnt < 24) {
      bad |= b.p > b.end + 8;  // already past the end: corrupt, stop reading
      if (!bad) b.refill();
    }
    const uint16_t entry = table[b.buf & (kLutSize - 1)];
    int l = entry >> 8;
    uint32_t v = sym_e[entry & 0xFF];
    if (v == 0xFFFF) {
      if ((entry & 0xFF) != kSymEsc) {
        bad = true;
        v = 0;
      } else {
        v = uint32_t(b.buf >> l) & ((1u << lay.exp_bits) - 1);
        l += lay.exp_bits;
      }
    }
    e[idx] = uint8_t(v);
    if constexpr (lay.extra_bits) {
      extra[idx] = uint8_t((b.buf >> l) & ((1u << lay.extra_bits) - 1));
      l += lay.extra_bits;
    }
    b.buf >>= l;
    b.cnt -= l;
  };
  const int q = substream_len(count);
  const int last = count - (kSubstreams - 1) * q;
  const int full = last < 0 ? 0 : last;
  for (int j = 0; j < full && !bad; ++j)
    for (int k = 0; k < kSubstreams; ++k) get(k, k * q + j);
  for (int k = 0; k < kSubstreams; ++k)
    for (int j = full; j < q && k * q + j < count; ++j) get(k, k * q + j);
  if (bad) return kErrBitstream;
  for (int k = 0; k < kSubstreams; ++k) {
    const uint64_t used = st[k].consumed_bits(), avail = uint64_t(st[k].end - st[k].start) * 8;
    if (st[k].cnt < 0 || used > avail) return kErrBitstream;
    const int pad = int(avail - used);
    if (pad >= 8 || (pad && (st[k].end[-1] >> (8 - pad)))) return kErrTrailing;
  }
  join_block<DT>(e, body, extra, count, out);
  return kOk;
}

}  // namespace zipccl
