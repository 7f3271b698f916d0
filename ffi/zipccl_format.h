// The zipccl byte format (docs/FORMAT.md), shared by the CPU and CUDA codecs.
//
// Everything here is a plain function of its arguments and compiles for host
// and device, so the C++ and CUDA codecs run the same block coder and cannot
// drift apart. The numpy reference (zipccl_jax/reference.py) follows FORMAT.md
// line by line and tests assert byte identity against both.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define ZC_HD __host__ __device__ inline
#else
#define ZC_HD inline
#endif

namespace zipccl {

constexpr uint8_t kMagic[4] = {'Z', 'C', 'C', 'L'};
constexpr int kVersion = 1;
constexpr int kHeaderBytes = 16;
constexpr int kBlockLog2 = 12;
constexpr int kBlock = 1 << kBlockLog2;  // elements per block
constexpr int kFlagStoredRaw = 1;        // header flags: whole stream is raw

constexpr int kNumSyms = 32;
constexpr int kSymZero = 0;  // exponent field == 0 (zero or subnormal)
constexpr int kSymEsc = 31;  // followed by the raw exponent field
constexpr int kMaxDelta = 29;  // symbols 1..30 code d = ref - e in 0..29
constexpr int kNumTables = 8;
constexpr int kMaxCodeLen = 12;
constexpr int kLutSize = 1 << kMaxCodeLen;
constexpr int kRefCandidates = 6;  // encoder tries ref = emax, emax-1, ...
constexpr int kSubstreams = 4;     // independent bitstreams per coded block

// Code lengths of the static exponent codes (symbol order as above), fitted
// offline to Gaussian, Laplace, Student-t, uniform, log-normal and sparse
// tensors. Each is a complete prefix code (Kraft sum exactly 1).
#define ZC_CODE_LENGTHS                                                                          \
  {{12, 5, 2, 2, 2, 3, 5, 5, 6, 8, 8, 9, 10, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, \
    12, 12, 12, 12, 12, 12},                                                                     \
   {12, 8, 4, 3, 2, 2, 3, 4, 4, 5, 7, 7, 8, 9, 10, 11, 11, 12, 12, 12, 12, 12, 12, 12, 12, 12,   \
    12, 12, 12, 12, 12, 12},                                                                     \
   {12, 8, 5, 4, 3, 3, 3, 3, 3, 3, 4, 5, 5, 6, 8, 9, 10, 10, 12, 12, 12, 12, 12, 12, 12, 12, 12, \
    12, 12, 12, 12, 11},                                                                         \
   {1, 6, 3, 3, 3, 4, 6, 6, 8, 8, 9, 10, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, \
    12, 12, 12, 12, 12, 12},                                                                     \
   {3, 5, 2, 2, 3, 3, 5, 5, 6, 8, 8, 9, 10, 11, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12,  \
    12, 12, 12, 12, 12, 12},                                                                     \
   {12, 10, 1, 2, 3, 4, 5, 6, 8, 8, 10, 11, 11, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12,  \
    12, 12, 12, 12, 12, 12, 12},                                                                 \
   {12, 10, 9, 8, 7, 6, 5, 4, 4, 3, 3, 3, 3, 3, 4, 4, 5, 6, 7, 8, 9, 12, 12, 12, 12, 12, 12, 12, \
    12, 12, 12, 12},                                                                             \
   {12, 9, 7, 5, 3, 2, 2, 3, 3, 5, 5, 7, 8, 8, 10, 11, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12,   \
    12, 12, 12, 12, 12, 11}}

// Error codes of the decoder; messages live in error_message().
enum Status : int {
  kOk = 0,
  kErrTruncated = 1,
  kErrMagic = 2,
  kErrVersion = 3,
  kErrDType = 4,
  kErrCount = 5,
  kErrFlags = 6,
  kErrBlockMode = 7,
  kErrBlockSize = 8,
  kErrBitstream = 9,
  kErrTrailing = 10,
  kErrCapacity = 11,
};

inline const char* error_message(int status) {
  switch (status) {
    case kErrTruncated: return "truncated payload (shorter than its header says)";
    case kErrMagic: return "bad magic (not a zipccl payload)";
    case kErrVersion: return "unsupported format version or block size";
    case kErrDType: return "payload dtype does not match the requested dtype";
    case kErrCount: return "payload element count does not match the requested shape";
    case kErrFlags: return "unknown header flags";
    case kErrBlockMode: return "corrupt block descriptor (bad mode)";
    case kErrBlockSize: return "corrupt block descriptor (bad body size)";
    case kErrBitstream: return "corrupt block bitstream";
    case kErrTrailing: return "corrupt block bitstream (unused or nonzero padding bits)";
    case kErrCapacity: return "output buffer too small";
    default: return "ok";
  }
}

// Dtype codes stored in byte 5 of the header.
enum DType : int { kBF16 = 1, kF16 = 2, kF32 = 3 };

// How an element splits into the coded exponent field, raw bytes stored
// as-is, and extra raw bits written after the exponent code in the bitstream.
struct Layout {
  int elem_bytes;  // 2 or 4
  int exp_bits;    // width of the exponent field (8 or 5)
  int raw_bytes;   // raw bytes per element in a coded block
  int extra_bits;  // raw bits per element in the bitstream
};

ZC_HD Layout layout_of(int dtype) {
  if (dtype == kBF16) return {2, 8, 1, 0};
  if (dtype == kF16) return {2, 5, 1, 3};
  return {4, 8, 3, 0};
}

// Splits element bits x into (exponent e, raw bytes, extra bits).
ZC_HD uint32_t split_element(int dtype, uint32_t x, uint8_t* raw, uint32_t* extra) {
  if (dtype == kBF16) {
    raw[0] = static_cast<uint8_t>(((x & 0x7Fu) << 1) | (x >> 15));
    *extra = 0;
    return (x >> 7) & 0xFFu;
  }
  if (dtype == kF16) {
    raw[0] = static_cast<uint8_t>(x & 0xFFu);
    *extra = ((x >> 15) << 2) | ((x >> 8) & 3u);
    return (x >> 10) & 0x1Fu;
  }
  raw[0] = static_cast<uint8_t>(x & 0xFFu);
  raw[1] = static_cast<uint8_t>((x >> 8) & 0xFFu);
  raw[2] = static_cast<uint8_t>((((x >> 16) & 0x7Fu) << 1) | (x >> 31));
  *extra = 0;
  return (x >> 23) & 0xFFu;
}

ZC_HD uint32_t join_element(int dtype, uint32_t e, const uint8_t* raw, uint32_t extra) {
  if (dtype == kBF16) return (uint32_t(raw[0] & 1u) << 15) | (e << 7) | (raw[0] >> 1);
  if (dtype == kF16) return ((extra >> 2) << 15) | (e << 10) | ((extra & 3u) << 8) | raw[0];
  return (uint32_t(raw[2] & 1u) << 31) | (e << 23) | (uint32_t(raw[2] >> 1) << 16) |
         (uint32_t(raw[1]) << 8) | raw[0];
}

// Symbol of exponent e relative to reference ref (FORMAT.md, "Symbols").
ZC_HD int symbol_of(uint32_t e, uint32_t ref, uint32_t exp_all_ones) {
  if (e == 0) return kSymZero;
  if (e == exp_all_ones || e > ref || ref - e > uint32_t(kMaxDelta)) return kSymEsc;
  return int(ref - e) + 1;
}

// Block descriptor: bits 0..15 body bytes, 16..23 reference exponent,
// 24..31 mode (0 raw, 1 + table index).
ZC_HD uint32_t make_descriptor(uint32_t body_bytes, uint32_t ref, uint32_t mode) {
  return body_bytes | (ref << 16) | (mode << 24);
}

ZC_HD int64_t num_blocks(int64_t n) { return (n + kBlock - 1) >> kBlockLog2; }

// The most bytes a stream of n elements can take: raw plus the header.
ZC_HD int64_t max_stream_bytes(int64_t n, int dtype) {
  return kHeaderBytes + n * layout_of(dtype).elem_bytes;
}

// Canonical codes of a table, bit-reversed so the decoder peeks LSB first:
// codes[s] = reversed code, lens[s] = length.
ZC_HD void canonical_codes(const uint8_t* lens, uint16_t* codes) {
  uint32_t code = 0;
  for (int len = 1; len <= kMaxCodeLen; ++len) {
    for (int s = 0; s < kNumSyms; ++s) {
      if (lens[s] != len) continue;
      uint32_t rev = 0;
      for (int b = 0; b < len; ++b) rev |= ((code >> b) & 1u) << (len - 1 - b);
      codes[s] = static_cast<uint16_t>(rev);
      ++code;
    }
    code <<= 1;
  }
}

// Decode table: lut[peek of kMaxCodeLen bits] = symbol | (length << 8).
ZC_HD void build_lut(const uint8_t* lens, uint16_t* lut) {
  uint16_t codes[kNumSyms];
  canonical_codes(lens, codes);
  for (int s = 0; s < kNumSyms; ++s) {
    const int len = lens[s];
    for (uint32_t fill = 0; fill < (1u << (kMaxCodeLen - len)); ++fill) {
      lut[codes[s] | (fill << len)] = static_cast<uint16_t>(s | (len << 8));
    }
  }
}

ZC_HD uint32_t load_element(const uint8_t* p, int elem_bytes) {
  uint32_t x = p[0] | (uint32_t(p[1]) << 8);
  if (elem_bytes == 4) x |= (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
  return x;
}

ZC_HD void store_element(uint8_t* p, uint32_t x, int elem_bytes) {
  p[0] = uint8_t(x);
  p[1] = uint8_t(x >> 8);
  if (elem_bytes == 4) {
    p[2] = uint8_t(x >> 16);
    p[3] = uint8_t(x >> 24);
  }
}

// Chooses (ref, table) with the fewest bits for a block whose exponent
// histogram is hist (FORMAT.md §7); ties go to the larger ref, then the lower
// table. Only the exponents present are visited.
ZC_HD void choose_code(const uint32_t* hist, Layout lay, const uint8_t (*lens)[kNumSyms], uint32_t* ref_out,
                       int* table_out) {
  const uint32_t all_ones = (1u << lay.exp_bits) - 1;
  uint8_t present[256];
  int npresent = 0;
  uint32_t emax = 0;
  for (uint32_t e = 0; e <= all_ones; ++e) {
    if (!hist[e]) continue;
    present[npresent++] = uint8_t(e);
    if (e >= 1 && e < all_ones) emax = e;
  }
  uint64_t best = ~uint64_t(0);
  for (int k = 0; k < kRefCandidates && int(emax) - k >= 0; ++k) {
    const uint32_t ref = emax - k;
    for (int t = 0; t < kNumTables; ++t) {
      uint64_t bits = 0;
      for (int j = 0; j < npresent; ++j) {
        const int s = symbol_of(present[j], ref, all_ones);
        bits += uint64_t(hist[present[j]]) * (lens[t][s] + (s == kSymEsc ? lay.exp_bits : 0));
      }
      if (bits < best) {
        best = bits;
        *ref_out = ref;
        *table_out = t;
      }
    }
  }
}

// Appends bits LSB first: stream bit k is bit (k % 8) of byte k / 8.
struct BitWriter {
  uint8_t* out;
  uint64_t acc;
  int nbits;
  ZC_HD void put(uint32_t value, int len) {
    acc |= uint64_t(value) << nbits;
    nbits += len;
    while (nbits >= 8) {
      *out++ = uint8_t(acc);
      acc >>= 8;
      nbits -= 8;
    }
  }
  ZC_HD void flush() {
    if (nbits > 0) *out++ = uint8_t(acc);
  }
};

// Sub-stream k of a block holds elements [k * q, min(count, (k + 1) * q)).
ZC_HD int substream_len(int count) { return (count + kSubstreams - 1) / kSubstreams; }

// Bits element x costs in the bitstream under (ref, table).
ZC_HD int element_bits(uint32_t e, uint32_t ref, Layout lay, const uint8_t* lens) {
  const int s = symbol_of(e, ref, (1u << lay.exp_bits) - 1);
  return lens[s] + (s == kSymEsc ? lay.exp_bits : 0) + lay.extra_bits;
}

ZC_HD uint32_t exponent_of(uint32_t x, Layout lay) {
  return (x >> (lay.elem_bytes * 8 - 1 - lay.exp_bits)) & ((1u << lay.exp_bits) - 1);
}

// Encodes one block of count elements (bytes at in) into body; body has room
// for count * elem_bytes bytes. Returns its descriptor.
ZC_HD uint32_t encode_block(int dtype, const uint8_t* in, int count, const uint8_t (*lens)[kNumSyms],
                            const uint16_t (*codes)[kNumSyms], uint8_t* body) {
  const Layout lay = layout_of(dtype);
  const uint32_t all_ones = (1u << lay.exp_bits) - 1;
  uint32_t hist[256] = {0};
  for (int i = 0; i < count; ++i) ++hist[exponent_of(load_element(in + i * lay.elem_bytes, lay.elem_bytes), lay)];
  uint32_t ref = 0;
  int table = 0;
  choose_code(hist, lay, lens, &ref, &table);
  // Exact size: raw bytes, sub-stream lengths, each sub-stream padded to a byte.
  const int q = substream_len(count);
  uint32_t stream_bytes[kSubstreams] = {0};
  uint32_t coded_bytes = uint32_t(count) * lay.raw_bytes + 2 * (kSubstreams - 1);
  for (int k = 0; k < kSubstreams; ++k) {
    uint32_t bits = 0;
    for (int i = k * q; i < count && i < (k + 1) * q; ++i)
      bits += element_bits(exponent_of(load_element(in + i * lay.elem_bytes, lay.elem_bytes), lay), ref, lay,
                           lens[table]);
    stream_bytes[k] = (bits + 7) / 8;
    coded_bytes += stream_bytes[k];
  }
  const uint32_t raw_block_bytes = uint32_t(count) * lay.elem_bytes;
  if (coded_bytes >= raw_block_bytes) {
    for (uint32_t i = 0; i < raw_block_bytes; ++i) body[i] = in[i];
    return make_descriptor(raw_block_bytes, 0, 0);
  }
  uint8_t* lengths = body + count * lay.raw_bytes;
  for (int k = 0; k + 1 < kSubstreams; ++k) {
    lengths[2 * k] = uint8_t(stream_bytes[k]);
    lengths[2 * k + 1] = uint8_t(stream_bytes[k] >> 8);
  }
  BitWriter w{lengths + 2 * (kSubstreams - 1), 0, 0};
  for (int k = 0; k < kSubstreams; ++k) {
    for (int i = k * q; i < count && i < (k + 1) * q; ++i) {
      const uint32_t x = load_element(in + i * lay.elem_bytes, lay.elem_bytes);
      uint32_t extra;
      const uint32_t e = split_element(dtype, x, body + i * lay.raw_bytes, &extra);
      const int s = symbol_of(e, ref, all_ones);
      w.put(codes[table][s], lens[table][s]);
      if (s == kSymEsc) w.put(e, lay.exp_bits);
      if (lay.extra_bits) w.put(extra, lay.extra_bits);
    }
    w.flush();
    w.acc = 0;
    w.nbits = 0;
  }
  return make_descriptor(coded_bytes, ref, uint32_t(table + 1));
}

// Reads bits LSB first from [p, p + nbytes), never past the end.
struct BitReader {
  const uint8_t* p;
  uint32_t nbytes;
  uint32_t pos;  // bit position
  ZC_HD uint32_t peek(int len) const {
    uint32_t v = 0;
    const uint32_t byte = pos >> 3;
    for (uint32_t i = 0; i < 3; ++i)
      if (byte + i < nbytes) v |= uint32_t(p[byte + i]) << (8 * i);
    return (v >> (pos & 7)) & ((1u << len) - 1);
  }
  ZC_HD bool skip(int len) {
    pos += len;
    return pos <= nbytes * 8;
  }
  // A sub-stream must end in its last byte, padded with zero bits.
  ZC_HD bool finished() const {
    return (pos + 7) / 8 == nbytes && !((pos & 7) && (p[nbytes - 1] >> (pos & 7)));
  }
};

// Checks a coded block's layout; *streams receives its sub-stream offsets
// (kSubstreams + 1 of them, relative to body). Returns a Status.
ZC_HD int locate_substreams(const uint8_t* body, uint32_t size, int count, Layout lay, uint32_t* streams) {
  const uint32_t raw_total = uint32_t(count) * lay.raw_bytes;
  if (size <= raw_total + 2 * (kSubstreams - 1) || size >= uint32_t(count) * lay.elem_bytes)
    return kErrBlockSize;
  streams[0] = raw_total + 2 * (kSubstreams - 1);
  for (int k = 0; k + 1 < kSubstreams; ++k) {
    streams[k + 1] = streams[k] + (body[raw_total + 2 * k] | (uint32_t(body[raw_total + 2 * k + 1]) << 8));
    if (streams[k + 1] > size) return kErrBlockSize;
  }
  streams[kSubstreams] = size;
  return kOk;
}

// Decodes one block body into count elements at out. lut holds kNumTables
// decode tables of kLutSize entries. Returns a Status.
ZC_HD int decode_block(int dtype, const uint8_t* body, uint32_t desc, int count, const uint16_t* lut,
                       uint8_t* out) {
  const Layout lay = layout_of(dtype);
  const uint32_t size = desc & 0xFFFFu, ref = (desc >> 16) & 0xFFu, mode = desc >> 24;
  if (mode == 0) {
    if (size != uint32_t(count) * lay.elem_bytes) return kErrBlockSize;
    for (uint32_t i = 0; i < size; ++i) out[i] = body[i];
    return kOk;
  }
  if (mode > kNumTables) return kErrBlockMode;
  uint32_t streams[kSubstreams + 1];
  const int status = locate_substreams(body, size, count, lay, streams);
  if (status != kOk) return status;
  const uint16_t* table = lut + (mode - 1) * kLutSize;
  const int q = substream_len(count);
  for (int k = 0; k < kSubstreams; ++k) {
    BitReader r{body + streams[k], streams[k + 1] - streams[k], 0};
    for (int i = k * q; i < count && i < (k + 1) * q; ++i) {
      const uint16_t entry = table[r.peek(kMaxCodeLen)];
      const int s = entry & 0xFF;
      if (!r.skip(entry >> 8)) return kErrBitstream;
      uint32_t e = 0;
      if (s == kSymEsc) {
        e = r.peek(lay.exp_bits);
        if (!r.skip(lay.exp_bits)) return kErrBitstream;
      } else if (s != kSymZero) {
        if (uint32_t(s - 1) >= ref) return kErrBitstream;  // would give e == 0
        e = ref - uint32_t(s - 1);
      }
      uint32_t extra = 0;
      if (lay.extra_bits) {
        extra = r.peek(lay.extra_bits);
        if (!r.skip(lay.extra_bits)) return kErrBitstream;
      }
      store_element(out + i * lay.elem_bytes, join_element(dtype, e, body + i * lay.raw_bytes, extra),
                    lay.elem_bytes);
    }
    if (!r.finished()) return kErrTrailing;
  }
  return kOk;
}

// Header fields (FORMAT.md, "Stream header").
ZC_HD void write_header(uint8_t* out, int dtype, int flags, uint64_t n) {
  for (int i = 0; i < 4; ++i) out[i] = kMagic[i];
  out[4] = kVersion;
  out[5] = uint8_t(dtype);
  out[6] = uint8_t(flags);
  out[7] = kBlockLog2;
  for (int i = 0; i < 8; ++i) out[8 + i] = uint8_t(n >> (8 * i));
}

// Validates a header against the expected dtype and count; *flags receives
// the flags byte.
ZC_HD int check_header(const uint8_t* in, uint64_t size, int dtype, uint64_t n, int* flags) {
  if (size < uint64_t(kHeaderBytes)) return kErrTruncated;
  for (int i = 0; i < 4; ++i)
    if (in[i] != kMagic[i]) return kErrMagic;
  if (in[4] != kVersion || in[7] != kBlockLog2) return kErrVersion;
  if (in[5] != dtype) return kErrDType;
  uint64_t count = 0;
  for (int i = 0; i < 8; ++i) count |= uint64_t(in[8 + i]) << (8 * i);
  if (count != n) return kErrCount;
  if (in[6] & ~kFlagStoredRaw) return kErrFlags;
  *flags = in[6];
  return kOk;
}

ZC_HD uint32_t load_u32(const uint8_t* p) {
  return p[0] | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

ZC_HD void store_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}

// Float conversions for the accumulate step, bit-exact with numpy/ml_dtypes
// (round to nearest even; NaN handling as documented in FORMAT.md §8).
ZC_HD float bits_to_f32(uint32_t u) {
  union { uint32_t u; float f; } v{u};
  return v.f;
}

ZC_HD uint32_t f32_to_bits(float f) {
  union { float f; uint32_t u; } v{f};
  return v.u;
}

ZC_HD float bf16_to_f32(uint32_t h) { return bits_to_f32(h << 16); }

ZC_HD uint32_t f32_to_bf16(float f) {
  const uint32_t u = f32_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return ((u >> 16) & 0x8000u) | 0x7FC0u;
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

ZC_HD float f16_to_f32(uint32_t h) {
  const uint32_t sign = (h >> 15) << 31, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) {
    const float mag = float(m) * 5.9604644775390625e-08f;  // m * 2^-24, exact
    return bits_to_f32(sign | f32_to_bits(mag));
  }
  if (e == 31) return bits_to_f32(sign | 0x7F800000u | (m << 13));
  return bits_to_f32(sign | ((e + 112) << 23) | (m << 13));
}

ZC_HD uint32_t f32_to_f16(float f) {
  const uint32_t u = f32_to_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) {
    const uint32_t m = (a & 0x7FFFFFu) >> 13;
    return sign | 0x7C00u | (m ? m : 1u);
  }
  if (a >= 0x47800000u) return sign | 0x7C00u;
  if (a < 0x38800000u) {  // below the smallest normal half
    const uint32_t e = a >> 23;
    if (e < 102) return sign;
    const uint32_t mant = (a & 0x7FFFFFu) | 0x800000u, shift = 126 - e;
    const uint32_t half = 1u << (shift - 1), rem = mant & ((1u << shift) - 1);
    uint32_t m = mant >> shift;
    if (rem > half || (rem == half && (m & 1u))) ++m;
    return sign | m;
  }
  uint32_t h = (a >> 13) - (112u << 10);
  const uint32_t rem = a & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return sign | h;
}

ZC_HD float element_to_f32(int dtype, uint32_t x) {
  if (dtype == kBF16) return bf16_to_f32(x);
  if (dtype == kF16) return f16_to_f32(x);
  return bits_to_f32(x);
}

ZC_HD uint32_t f32_to_element(int dtype, float f) {
  if (dtype == kBF16) return f32_to_bf16(f);
  if (dtype == kF16) return f32_to_f16(f);
  return f32_to_bits(f);
}

}  // namespace zipccl
