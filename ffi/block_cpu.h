// Fast CPU block coder: the same bytes as encode_block/decode_block of
// zipccl_format.h (tests assert it), restructured for one core:
// - one histogram pass per block gives both the block's emax and the counts
//   the group's code is built from (FORMAT.md §7);
// - each element's code, escape bits included, is one table lookup keyed by
//   (exponent, top bits), and decoding is one lookup per element;
// - the four sub-streams are coded in lockstep: four independent dependency
//   chains in flight.
#pragma once

#include <cstring>
#include <type_traits>

#include "zipccl_format.h"

namespace zipccl {

template <int DT>
struct Elem {
  static constexpr Layout lay = DT == kBF16 ? Layout{2, 8, 0, 6} : DT == kF16 ? Layout{2, 5, 1, 1} : Layout{4, 8, 2, 6};
  static constexpr int exp_shift = lay.elem_bytes * 8 - 1 - lay.exp_bits;
  static constexpr int keys = (1 << lay.exp_bits) << kTopBits;  // (e, t) pairs
  using U = std::conditional_t<lay.elem_bytes == 2, uint16_t, uint32_t>;

  static U load(const uint8_t* in, int i) {
    U x;
    std::memcpy(&x, in + i * sizeof(U), sizeof(U));
    return x;
  }
  // (e << 2) | t: the exponent and the two top mantissa bits, adjacent in x.
  static uint32_t key(U x) { return (uint32_t(x) >> (exp_shift - kTopBits)) & (keys - 1); }
  static uint32_t extra(U x) {
    if constexpr (DT == kBF16) return ((x & 0x1Fu) << 1) | (x >> 15);
    if constexpr (DT == kF16) return x >> 15;
    return (((x >> 16) & 0x1Fu) << 1) | (x >> 31);
  }
  // Element bits from (key, extra, raw bytes), the inverse of the above.
  static U join(uint32_t key, uint32_t extra, const uint8_t* raw) {
    if constexpr (DT == kBF16) return U(((extra & 1u) << 15) | (key << 5) | (extra >> 1));
    if constexpr (DT == kF16) return U((extra << 15) | (key << 8) | raw[0]);
    return ((extra & 1u) << 31) | (key << 21) | ((extra >> 1) << 16) | (uint32_t(raw[1]) << 8) | raw[0];
  }
};

inline uint64_t load_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Bit writer that stores 8 bytes at a time and advances by whole bytes
// (the buffer has 8 bytes of slack); values are at most 26 bits.
struct Writer {
  uint8_t* out;
  uint64_t acc;
  int nbits;
  void put(uint32_t value, int len) {
    acc |= uint64_t(value) << nbits;
    nbits += len;
    const uint64_t v = acc;
    std::memcpy(out, &v, 8);
    const int bytes = nbits >> 3;
    out += bytes;
    acc >>= bytes * 8;
    nbits &= 7;
  }
};

// Histogram of (e, t) keys of a block into hist[Elem::keys]; returns emax.
template <int DT>
uint32_t block_histogram(const uint8_t* in, int count, uint32_t* hist) {
  using E = Elem<DT>;
  uint32_t h2[2][E::keys] = {};
  int i = 0;
  for (; i + 2 <= count; i += 2) {
    ++h2[0][E::key(E::load(in, i))];
    ++h2[1][E::key(E::load(in, i + 1))];
  }
  if (i < count) ++h2[0][E::key(E::load(in, i))];
  uint32_t emax = 0;
  constexpr uint32_t all_ones = (1u << E::lay.exp_bits) - 1;
  for (int k = 0; k < E::keys; ++k) {
    hist[k] = h2[0][k] + h2[1][k];
    const uint32_t e = uint32_t(k) >> kTopBits;
    if (hist[k] && e < all_ones && e > emax) emax = e;
  }
  return emax;
}

// Adds a block's symbol counts under ref, from its key histogram.
template <int DT>
void add_counts(const uint32_t* hist, uint32_t ref, uint32_t* counts) {
  using E = Elem<DT>;
  constexpr uint32_t all_ones = (1u << E::lay.exp_bits) - 1;
  for (int k = 0; k < E::keys; ++k)
    if (hist[k]) counts[(class_of(uint32_t(k) >> kTopBits, ref, all_ones) << kTopBits) | (k & 3)] += hist[k];
}

// Packs the extra bits of count elements, 8 elements per 64-bit word.
template <int DT>
void pack_extras(const uint8_t* in, int count, uint8_t* area) {
  using E = Elem<DT>;
  constexpr int w = E::lay.extra_bits;
  for (int i = 0; i < count; i += 8) {
    uint64_t v = 0;
    const int m = count - i < 8 ? count - i : 8;
    for (int j = 0; j < m; ++j) v |= uint64_t(E::extra(E::load(in, i + j))) << (j * w);
    const int bytes = (m * w + 7) / 8;
    std::memcpy(area + (i / 8) * w, &v, size_t(bytes));
  }
}

template <int DT>
uint32_t unpack_extra(const uint8_t* area, int i) {
  constexpr int w = Elem<DT>::lay.extra_bits;
  const uint32_t bit = uint32_t(i) * w;
  uint32_t two = area[bit >> 3];
  if ((bit & 7) + w > 8) two |= uint32_t(area[(bit >> 3) + 1]) << 8;
  return (two >> (bit & 7)) & ((1u << w) - 1);
}

// Encodes one block (see encode_block); hist is its key histogram.
template <int DT>
uint32_t encode_block_fast(const uint8_t* in, int count, uint32_t ref, const uint32_t* hist, const uint8_t* lens,
                           const uint16_t* codes, uint8_t* body) {
  using E = Elem<DT>;
  constexpr Layout lay = E::lay;
  constexpr uint32_t all_ones = (1u << lay.exp_bits) - 1;
  // code[key]: the bits written for an (e, t) key, escape included; len[key] their count
  uint32_t code[E::keys];
  uint8_t len[E::keys];
  for (int k = 0; k < E::keys; ++k) {
    if (!hist[k]) continue;
    const uint32_t e = uint32_t(k) >> kTopBits;
    const int c = class_of(e, ref, all_ones), s = (c << kTopBits) | (k & 3);
    code[k] = codes[s] | (c == kClassEsc ? e << lens[s] : 0);
    len[k] = uint8_t(lens[s] + (c == kClassEsc ? lay.exp_bits : 0));
  }
  alignas(64) uint8_t streams[kSubstreams][kBlock / kSubstreams * 4 + 16];
  const int q = substream_len(count);
  Writer w[kSubstreams];
  for (int k = 0; k < kSubstreams; ++k) w[k] = {streams[k], 0, 0};
  auto put = [&](Writer& wr, int i) {
    const uint32_t key = E::key(E::load(in, i));
    wr.put(code[key], len[key]);
  };
  const int last = count - (kSubstreams - 1) * q;  // elements of the last sub-stream
  const int full = last < 0 ? 0 : last;
  Writer w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];  // four chains, in registers
  for (int j = 0; j < full; ++j) {
    put(w0, j);
    put(w1, q + j);
    put(w2, 2 * q + j);
    put(w3, 3 * q + j);
  }
  w[0] = w0, w[1] = w1, w[2] = w2, w[3] = w3;
  for (int k = 0; k < kSubstreams; ++k)
    for (int j = full; j < q && k * q + j < count; ++j) put(w[k], k * q + j);

  uint32_t stream_bytes[kSubstreams];
  const uint32_t sizes_at = uint32_t(count) * lay.raw_bytes + extra_area_bytes(count, lay);
  uint32_t coded = sizes_at + kSubstreamHeader;
  for (int k = 0; k < kSubstreams; ++k) {
    if (w[k].nbits) *w[k].out++ = uint8_t(w[k].acc);
    stream_bytes[k] = uint32_t(w[k].out - streams[k]);
    coded += stream_bytes[k];
  }
  const uint32_t raw_block = uint32_t(count) * lay.elem_bytes;
  if (coded >= raw_block) {
    std::memcpy(body, in, raw_block);
    return make_descriptor(raw_block, 0, 0);
  }
  for (int i = 0; i < count; ++i) {  // raw bytes: the low mantissa bytes, as they are
    if constexpr (lay.raw_bytes > 0) std::memcpy(body + i * lay.raw_bytes, in + i * lay.elem_bytes, lay.raw_bytes);
  }
  pack_extras<DT>(in, count, body + count * lay.raw_bytes);
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

// A sub-stream being read: bits are refilled 8 bytes at a time.
struct BitStream {
  const uint8_t* start;
  const uint8_t* end;  // one past the sub-stream's last byte
  const uint8_t* p;    // next byte to load
  uint64_t buf;
  int cnt;  // valid bits in buf
  void refill() {
    buf |= load_u64(p) << cnt;
    p += (63 - cnt) >> 3;
    cnt |= 56;
  }
  uint64_t consumed_bits() const { return uint64_t(p - start) * 8 - cnt; }
};

// Decodes one block (see decode_block). lut: its group's decode table.
template <int DT>
int decode_block_fast(const uint8_t* body, uint32_t desc, int count, const uint16_t* lut, uint8_t* out) {
  using E = Elem<DT>;
  constexpr Layout lay = E::lay;
  const uint32_t size = desc & 0xFFFFu, ref = (desc >> 16) & 0xFFu, mode = desc >> 24;
  if (mode == 0) {
    if (size != uint32_t(count) * lay.elem_bytes) return kErrBlockSize;
    std::memcpy(out, body, size);
    return kOk;
  }
  if (mode != 1) return kErrBlockMode;
  uint32_t bounds[kSubstreams + 1];
  const int status = locate_substreams(body, size, count, lay, bounds);
  if (status != kOk) return status;
  if (!lut) return kErrTable;

  // The bitstreams, copied so that 8-byte loads past a sub-stream stay in bounds.
  alignas(64) uint8_t bits[kBlock * 4 + 32];
  const uint32_t nbytes = size - bounds[0];
  std::memcpy(bits, body + bounds[0], nbytes);
  std::memset(bits + nbytes, 0, 32);
  // key_of[s]: the (e, t) key of symbol s; kEsc: read e from the stream; kBad: invalid.
  constexpr uint16_t kEsc = 0x8000, kBad = 0xFFFF;
  uint16_t key_of[kNumSyms];
  for (int s = 0; s < kNumSyms; ++s) {
    const int c = s >> kTopBits, t = s & 3;
    if (c == kClassEsc) key_of[s] = uint16_t(kEsc | t);
    else if (c == kClassZero) key_of[s] = uint16_t(t);
    else key_of[s] = uint32_t(c - 1) < ref ? uint16_t(((ref - (c - 1)) << kTopBits) | t) : kBad;
  }
  BitStream st[kSubstreams];
  for (int k = 0; k < kSubstreams; ++k) {
    const uint8_t* s = bits + (bounds[k] - bounds[0]);
    st[k] = {s, bits + (bounds[k + 1] - bounds[0]), s, 0, 0};
  }
  uint16_t keys[kBlock];  // typed, so stores cannot alias the readers' state
  bool bad = false;
  auto get = [&](BitStream& b, int i) {
    if (b.cnt < kMaxElementBits) {
      bad |= b.p > b.end + 8;  // already past the end: corrupt, stop reading
      if (!bad) b.refill();
    }
    const uint16_t entry = lut[b.buf & (kLutSize - 1)];
    bad |= !entry;  // a window that starts with no code
    int l = entry >> 8;
    uint32_t key = key_of[entry & 0xFF];
    if (key & kEsc) {
      bad |= key == kBad;
      key = ((uint32_t(b.buf >> l) & ((1u << lay.exp_bits) - 1)) << kTopBits) | (key & 3);
      l += lay.exp_bits;
    }
    keys[i] = uint16_t(key);
    b.buf >>= l;
    b.cnt -= l;
  };
  const int q = substream_len(count);
  const int last = count - (kSubstreams - 1) * q;
  const int full = last < 0 ? 0 : last;
  BitStream s0 = st[0], s1 = st[1], s2 = st[2], s3 = st[3];  // four chains, in registers
  for (int j = 0; j < full && !bad; ++j) {
    get(s0, j);
    get(s1, q + j);
    get(s2, 2 * q + j);
    get(s3, 3 * q + j);
  }
  st[0] = s0, st[1] = s1, st[2] = s2, st[3] = s3;
  for (int k = 0; k < kSubstreams && !bad; ++k)
    for (int j = full; j < q && k * q + j < count; ++j) get(st[k], k * q + j);
  if (bad) return kErrBitstream;
  for (int k = 0; k < kSubstreams; ++k) {
    const uint64_t used = st[k].consumed_bits(), avail = uint64_t(st[k].end - st[k].start) * 8;
    if (st[k].cnt < 0 || used > avail) return kErrBitstream;
    const int pad = int(avail - used);
    if (pad >= 8 || (pad && (st[k].end[-1] >> (8 - pad)))) return kErrTrailing;
  }
  const uint8_t* extras = body + count * lay.raw_bytes;
  for (int i = 0; i < count; ++i) {
    const typename E::U x = E::join(keys[i], unpack_extra<DT>(extras, i), body + i * lay.raw_bytes);
    std::memcpy(out + i * sizeof(x), &x, sizeof(x));
  }
  return kOk;
}

}  // namespace zipccl
