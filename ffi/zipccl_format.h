// What every part of the codec shares (docs/FORMAT.md): the header's
// constants, dtype codes, statuses and their messages, elements, the prefix
// codes (deterministic Huffman lengths limited to 12 bits, canonical codes,
// decode tables, bit readers and writers) and the float32 arithmetic of the
// reduce step. Plain functions of their arguments for host and device;
// format6.h builds the format on them, and the numpy reference
// (zipccl_jax/reference.py, prefix_codes.py) follows the same document.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define ZC_HD __host__ __device__ inline
#else
#define ZC_HD inline
#endif

namespace zipccl {

constexpr int kHeaderBytes = 16;
constexpr int kBlockLog2 = 12;
constexpr int kBlock = 1 << kBlockLog2;  // elements per block
constexpr int kGroupBlocks = 16;         // blocks that may share a group's code
constexpr int kFlagStoredRaw = 1;        // header flags: the whole stream is raw
constexpr int kWidthShort = 5;           // §3: widths 5..11 take a 3-bit field, others 3 + 5 bits
constexpr int kMaxWidth = 20;            // §3: the widest lane length deviation
constexpr int kMaxCodeLen = 12;
constexpr int kLutSize = 1 << kMaxCodeLen;
constexpr int kMaxSyms = 256;  // the largest alphabet, for array sizes

// Error codes of the decoder; messages live in error_message().
enum Status : int {
  kOk = 0,
  kErrTruncated = 1,
  kErrMagic = 2,
  kErrVersion = 3,
  kErrDType = 4,
  kErrCount = 5,
  kErrFlags = 6,
  // 7, 8, 11, 12: version 5's statuses; the numbers stay unused, so status words keep their meaning
  kErrBitstream = 9,
  kErrTrailing = 10,
  kErrDescriptor = 13,  // a block descriptor's fields or offsets (format6.h)
  kErrGroupTable = 14,  // a group table
  kErrBody = 15,        // a coded body's width field or lane lengths
  kErrLast = kErrBody,  // every status is in [kOk, kErrLast]
};

inline const char* error_message(int status) {
  switch (status) {
    case kErrTruncated: return "truncated payload (shorter than its header says)";
    case kErrMagic: return "bad magic (not a zipccl payload)";
    case kErrVersion: return "unsupported format version or block size";
    case kErrDType: return "payload dtype does not match the requested dtype";
    case kErrCount: return "payload element count does not match the requested shape";
    case kErrFlags: return "unknown header flags";
    case kErrBitstream: return "corrupt block bitstream";
    case kErrTrailing: return "corrupt block bitstream (unused or nonzero padding bits)";
    case kErrDescriptor: return "corrupt block descriptor (reserved bits, a field out of range, or its offsets)";
    case kErrGroupTable: return "corrupt group table (a code length over 12, or not a prefix code)";
    case kErrBody: return "corrupt block body (bad body size, width or lane lengths)";
    default: return "ok";
  }
}

// Dtype codes stored in byte 5 of the header, and their element bytes.
enum DType : int { kBF16 = 1, kF16 = 2, kF32 = 3 };
ZC_HD constexpr int dtype_bytes(int dtype) { return dtype == kF32 ? 4 : 2; }

ZC_HD int64_t num_blocks(int64_t n) { return (n + kBlock - 1) >> kBlockLog2; }
ZC_HD int64_t num_groups(int64_t nb) { return (nb + kGroupBlocks - 1) / kGroupBlocks; }

// §1: the most bytes a stream of n elements can take: raw plus the header.
ZC_HD int64_t max_stream_bytes(int64_t n, int dtype) { return kHeaderBytes + n * dtype_bytes(dtype); }

ZC_HD uint32_t load_element(const uint8_t* p, int elem_bytes) {
  uint32_t x = p[0] | (uint32_t(p[1]) << 8);
  if (elem_bytes == 4) x |= (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
  return x;
}

ZC_HD void store_element(uint8_t* p, uint32_t x, int elem_bytes) {
#ifdef __CUDA_ARCH__  // one store where the element is aligned (always, in the CUDA codec's outputs)
  if (reinterpret_cast<uintptr_t>(p) % elem_bytes == 0) {
    if (elem_bytes == 4) *reinterpret_cast<uint32_t*>(p) = x;
    else *reinterpret_cast<uint16_t*>(p) = uint16_t(x);
    return;
  }
#endif
  p[0] = uint8_t(x);
  p[1] = uint8_t(x >> 8);
  if (elem_bytes == 4) {
    p[2] = uint8_t(x >> 16);
    p[3] = uint8_t(x >> 24);
  }
}

// §6 step 4, after sorting: the two-queue Huffman code lengths of the n
// used symbols leaf[0..n) sorted by (count, symbol), into lens (zeroed by the
// caller). weight, parent and depth hold 2 * n - 1 entries; the CUDA codec
// passes shared memory, so they are arguments.
ZC_HD void huffman_tree_lengths(const uint32_t* counts, const uint8_t* leaf, int n, uint8_t* lens,
                                uint32_t* weight, uint16_t* parent, uint8_t* depth) {
  if (n == 1) lens[leaf[0]] = 1;
  if (n < 2) return;
  for (int i = 0; i < n; ++i) weight[i] = counts[leaf[i]];
  int li = 0, ni = n, total = n;
  while (total < 2 * n - 1) {
    int pick[2];
    for (int k = 0; k < 2; ++k)
      pick[k] = (li < n && (ni >= total || weight[li] <= weight[ni])) ? li++ : ni++;
    parent[pick[0]] = parent[pick[1]] = uint16_t(total);
    weight[total++] = weight[pick[0]] + weight[pick[1]];
  }
  depth[total - 1] = 0;
  for (int node = total - 2; node >= 0; --node) depth[node] = uint8_t(depth[parent[node]] + 1);
  for (int i = 0; i < n; ++i) lens[leaf[i]] = depth[i];
}

// §6 step 4: deterministic two-queue Huffman code lengths (unlimited) of
// an alphabet of nsym symbols.
ZC_HD void huffman_lengths(const uint32_t* counts, uint8_t* lens, int nsym) {
  uint8_t leaf[kMaxSyms];  // used symbols sorted by (count, symbol)
  uint32_t weight[2 * kMaxSyms];
  uint16_t parent[2 * kMaxSyms];
  uint8_t depth[2 * kMaxSyms];
  int n = 0;
  for (int s = 0; s < nsym; ++s) {
    lens[s] = 0;
    if (!counts[s]) continue;
    int j = n++;
    for (; j > 0 && counts[leaf[j - 1]] > counts[s]; --j) leaf[j] = leaf[j - 1];
    leaf[j] = uint8_t(s);
  }
  huffman_tree_lengths(counts, leaf, n, lens, weight, parent, depth);
}

// §6: how far a code whose longest length is `longest` (over 12) flattens
// its counts: they are divided by 2^k, rounded up.
ZC_HD int flattening_shift(int longest) { return longest - kMaxCodeLen < 16 ? longest - kMaxCodeLen : 16; }

// §6: Huffman lengths, flattening the counts until no code is over 12 bits.
ZC_HD void code_lengths(const uint32_t* counts_in, uint8_t* lens, int nsym) {
  uint32_t counts[kMaxSyms];
  for (int s = 0; s < nsym; ++s) counts[s] = counts_in[s];
  for (;;) {
    huffman_lengths(counts, lens, nsym);
    int longest = 0;
    for (int s = 0; s < nsym; ++s) longest = lens[s] > longest ? lens[s] : longest;
    if (longest <= kMaxCodeLen) return;
    const int k = flattening_shift(longest);
    for (int s = 0; s < nsym; ++s) counts[s] = counts[s] ? (counts[s] + (1u << k) - 1) >> k : 0;
  }
}

// The low len bits of v in reverse order.
ZC_HD uint32_t reverse_bits(uint32_t v, int len) {
  uint32_t rev = 0;
  for (int b = 0; b < len; ++b) rev |= ((v >> b) & 1u) << (len - 1 - b);
  return rev;
}

// §4: canonical codes, bit-reversed so the decoder peeks LSB first.
ZC_HD void canonical_codes(const uint8_t* lens, uint16_t* codes, int nsym) {
  uint32_t count[kMaxCodeLen + 1] = {}, next[kMaxCodeLen + 1] = {};  // codes of each length; the next one's
  for (int s = 0; s < nsym; ++s)
    if (lens[s] && lens[s] <= kMaxCodeLen) ++count[lens[s]];
  for (int len = 1; len <= kMaxCodeLen; ++len) next[len] = (next[len - 1] + count[len - 1]) << 1;
  for (int s = 0; s < nsym; ++s)
    if (lens[s] && lens[s] <= kMaxCodeLen) codes[s] = uint16_t(reverse_bits(next[lens[s]]++, lens[s]));
}

// Decode table: lut[12-bit window] = symbol | (length << 8); 0 = no code.
// (Symbol 0 with length 0 is no code: every coded symbol has a length.)
ZC_HD void build_lut(const uint8_t* lens, uint16_t* lut, int nsym) {
  uint16_t codes[kMaxSyms];
  canonical_codes(lens, codes, nsym);
  for (int w = 0; w < kLutSize; ++w) lut[w] = 0;
  for (int s = 0; s < nsym; ++s) {
    const int len = lens[s];
    if (!len) continue;
    for (uint32_t fill = 0; fill < (1u << (kMaxCodeLen - len)); ++fill)
      lut[codes[s] | (fill << len)] = uint16_t(s | (len << 8));
  }
}

// §3: appends bits LSB first: stream bit k is bit (k % 8) of byte k / 8.
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
    acc = 0;
    nbits = 0;
  }
};

// §3: reads bits LSB first from bit pos of p up to bit end, never past byte
// nbytes of p; bits at or past end read as 0.
struct BitReader {
  const uint8_t* p;
  uint32_t nbytes;
  uint32_t pos;  // bit position
  uint32_t end;  // the bit the stream ends at
  ZC_HD uint32_t peek(int len) const {
    uint32_t v = 0;
    const uint32_t byte = pos >> 3;  // len <= 20: four bytes hold it after a shift of up to 7
    for (uint32_t i = 0; i < 4; ++i)
      if (byte + i < nbytes) v |= uint32_t(p[byte + i]) << (8 * i);
    v >>= pos & 7;
    const uint32_t left = end - pos;  // end >= pos
    if (left < 25) v &= (1u << left) - 1;
    return v & ((1u << len) - 1);
  }
  ZC_HD bool skip(int len) {
    if (uint32_t(len) > end - pos) return false;
    pos += len;
    return true;
  }
  ZC_HD bool take(int len, uint32_t* v) {
    *v = peek(len);
    return skip(len);
  }
};

// FORMAT.md §3: the bits of a body's width field, and writing one.
ZC_HD int width_field_bits(int w) { return (w >= kWidthShort && w < kWidthShort + 7) ? 3 : 8; }

template <typename Writer>
ZC_HD void put_width(int w, Writer& out) {
  if (width_field_bits(w) == 3) out.put(uint32_t(w - kWidthShort), 3);
  else out.put(7u | uint32_t(w) << 3, 8);
}

// ---------------------------------------------------------------- conversions

ZC_HD float bits_to_f32(uint32_t u) {
  union { uint32_t u; float f; } v{u};
  return v.f;
}

ZC_HD uint32_t f32_to_bits(float f) {
  union { float f; uint32_t u; } v{f};
  return v.u;
}

// §7: a + b in float32 by the format's rule, the same on every platform:
// the IEEE sum rounded to nearest even, subnormals exact, except that a NaN
// result is a's NaN if a is one, else b's, quieted (bit 22 set), and the NaN
// of an invalid sum (inf + -inf) is 0xFFC00000 -- x86 SSE's rules, which
// numpy's float32 add follows there. ZC_FADD is the platform's add: a CUDA
// device's returns the canonical NaN 0x7FFFFFFF for every NaN, so the rule
// is applied here rather than left to the hardware. Branch-free, so the CPU's
// loops over it vectorise.
#if defined(__CUDA_ARCH__)
#define ZC_FADD(a, b) __fadd_rn(a, b)
#elif defined(ZC_HOST_FADD)  // the host emulation of the CUDA codec: the GPU's add
#define ZC_FADD(a, b) ZC_HOST_FADD(a, b)
#else
#define ZC_FADD(a, b) ((a) + (b))
#endif
constexpr uint32_t kQuietBit = 0x00400000u, kInvalidSumNaN = 0xFFC00000u;

ZC_HD bool is_nan_f32_bits(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }

ZC_HD float add_f32(float a, float b) {
  const uint32_t ua = f32_to_bits(a), ub = f32_to_bits(b), us = f32_to_bits(ZC_FADD(a, b));
  const uint32_t nan = is_nan_f32_bits(ua) ? ua | kQuietBit : is_nan_f32_bits(ub) ? ub | kQuietBit : kInvalidSumNaN;
  return bits_to_f32(is_nan_f32_bits(us) ? nan : us);
}

ZC_HD float bf16_to_f32(uint32_t h) { return bits_to_f32(h << 16); }

ZC_HD uint32_t f32_to_bf16(float f) {
  const uint32_t u = f32_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return ((u >> 16) & 0x8000u) | 0x7FC0u;
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

// Exact (subnormals, NaN payloads); without branches, so that loops of it vectorise.
ZC_HD float f16_to_f32(uint32_t h) {
  const uint32_t sign = (h >> 15) << 31, mag = h & 0x7FFFu;
  const uint32_t wide = (mag << 13) + (mag >= 0x7C00u ? 0x70000000u : 0x38000000u);  // exponent + 112, Inf / NaN 255
  const float sub = float(mag) * 5.9604644775390625e-08f;  // a subnormal or zero: mag * 2^-24, exact
  return bits_to_f32(sign | (mag < 0x400u ? f32_to_bits(sub) : wide));
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
