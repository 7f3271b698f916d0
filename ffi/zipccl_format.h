// The zipccl byte format (docs/FORMAT.md), shared by the CPU and CUDA codecs.
//
// Everything here is a plain function of its arguments and compiles for host
// and device, so the C++ and CUDA codecs run the same coder and cannot drift
// apart. The numpy reference (zipccl_jax/reference.py) follows FORMAT.md
// section by section; tests assert byte identity against both. Section
// numbers below refer to FORMAT.md. Version 5 is the one version written and
// read.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define ZC_HD __host__ __device__ inline
#else
#define ZC_HD inline
#endif

namespace zipccl {

constexpr int kVersion = 5;  // the one version written and read (§1)
constexpr int kHeaderBytes = 16;
constexpr int kBlockLog2 = 12;
constexpr int kBlock = 1 << kBlockLog2;  // elements per block
constexpr int kGroupBlocks = 16;         // blocks sharing one code table
constexpr int kFlagStoredRaw = 1;        // header flags: whole stream is raw
constexpr int kDescBytes = 2;            // §2: body_bytes (u16)
constexpr int kWidthShort = 5;           // §2: widths 5..11 take a 3-bit field, others 3 + 5 bits
constexpr int kRecordBytes = 3;          // §1: a group's mask (u8), table_bytes (u16)
constexpr int kMaskSign = 4;             // group mask bit 2: the symbols carry the sign (§4.1)
constexpr int kMaskZeros = 8;            // group mask bit 3: exact zeros are implied (§4.2)
constexpr int kMaskOwnRefs = 16;         // group mask bit 4: each block has its own ref (§5.5)
constexpr int kMaxWidth = 20;            // §2: the widest lane length deviation

constexpr int kNumClasses = 32;
constexpr int kClassZero = 0;  // exponent field == 0 (zero or subnormal)
constexpr int kClassEsc = 31;  // followed by the raw exponent field
constexpr int kMaxDelta = 29;  // classes 1..30 code d = ref - e in 0..29
constexpr int kTopBits = 2;    // top mantissa bits coded with the class
constexpr int kNumSyms = kNumClasses << kTopBits;  // 128; 256 in a sign-coded group (§4.1)
constexpr int kSignBit = 7;                        // §4.1: the sign's bit in a symbol
constexpr int kMaxCodeLen = 12;
constexpr int kLutSize = 1 << kMaxCodeLen;
constexpr int kLanes = 16;      // §2: a coded block's sub-streams; lane k holds elements k, k + 16, ...
constexpr int kPlaneSyms = 256;                   // §5.4: the alphabet of a raw byte plane
constexpr int kMaxPlanes = 2;                     // raw bytes per element, at most
constexpr int kPlaneSampleStride = 8;             // §7 step 3: the pre-check samples every 8th element
constexpr int kMaxSyms = 256;                     // the larger alphabets, for array sizes
// §5.3: a stored length takes at most 8 bits, a half's class count 5; a group's table area, at most
constexpr int kMaxTableBytes = kGroupBlocks + (8 * (kMaxSyms + kMaxPlanes * kPlaneSyms) + 2 * 5 + 7) / 8;

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
  kErrTable = 11,
  kErrPlanes = 12,  // a group mask bit the stream's version and dtype do not have
  kErrDescriptor = 13,  // version 6 (format6.h): a block descriptor's fields or offsets
  kErrGroupTable = 14,  // version 6: a group table
  kErrBody = 15,        // version 6: a coded body's width field or lane lengths
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
    case kErrBlockMode: return "corrupt block descriptor (bad mode)";
    case kErrBlockSize: return "corrupt block descriptor (bad body size)";
    case kErrBitstream: return "corrupt block bitstream";
    case kErrTrailing: return "corrupt block bitstream (unused or nonzero padding bits)";
    case kErrTable: return "corrupt code table";
    case kErrPlanes: return "corrupt group mask";
    case kErrDescriptor: return "corrupt block descriptor (reserved bits, a field out of range, or its offsets)";
    case kErrGroupTable: return "corrupt group table (a code length over 12, or not a prefix code)";
    case kErrBody: return "corrupt block body (bad body size, width or lane lengths)";
    default: return "ok";
  }
}

// Dtype codes stored in byte 5 of the header.
enum DType : int { kBF16 = 1, kF16 = 2, kF32 = 3 };

// §3: how an element splits into the coded fields, raw bytes stored as they
// are, and extra raw bits.
struct Layout {
  int elem_bytes;  // 2 or 4
  int exp_bits;    // width of the exponent field (8 or 5)
  int raw_bytes;   // raw bytes per element
  int extra_bits;  // raw bits per element in the packed extra area
};

ZC_HD constexpr Layout layout_of(int dtype) {
  if (dtype == kBF16) return {2, 8, 0, 6};
  if (dtype == kF16) return {2, 5, 1, 1};
  return {4, 8, 2, 6};
}

// §3: splits element bits x into (exponent e, top mantissa bits t, raw bytes,
// extra bits); returns e.
ZC_HD uint32_t split_element(int dtype, uint32_t x, uint32_t* t, uint8_t* raw, uint32_t* extra) {
  if (dtype == kBF16) {
    *t = (x >> 5) & 3u;
    *extra = ((x & 0x1Fu) << 1) | (x >> 15);
    return (x >> 7) & 0xFFu;
  }
  if (dtype == kF16) {
    *t = (x >> 8) & 3u;
    raw[0] = uint8_t(x);
    *extra = x >> 15;
    return (x >> 10) & 0x1Fu;
  }
  *t = (x >> 21) & 3u;
  raw[0] = uint8_t(x);
  raw[1] = uint8_t(x >> 8);
  *extra = (((x >> 16) & 0x1Fu) << 1) | (x >> 31);
  return (x >> 23) & 0xFFu;
}

ZC_HD uint32_t join_element(int dtype, uint32_t e, uint32_t t, const uint8_t* raw, uint32_t extra) {
  if (dtype == kBF16) return ((extra & 1u) << 15) | (e << 7) | (t << 5) | (extra >> 1);
  if (dtype == kF16) return (extra << 15) | (e << 10) | (t << 8) | raw[0];
  return ((extra & 1u) << 31) | (e << 23) | (t << 21) | ((extra >> 1) << 16) | (uint32_t(raw[1]) << 8) |
         raw[0];
}

ZC_HD uint32_t exponent_of(uint32_t x, Layout lay) {
  return (x >> (lay.elem_bytes * 8 - 1 - lay.exp_bits)) & ((1u << lay.exp_bits) - 1);
}

ZC_HD uint32_t top_bits_of(uint32_t x, Layout lay) {
  return (x >> (lay.elem_bytes * 8 - 1 - lay.exp_bits - kTopBits)) & ((1u << kTopBits) - 1);
}

// The sign bit of element bits x.
ZC_HD uint32_t sign_of(uint32_t x, Layout lay) { return x >> (lay.elem_bytes * 8 - 1); }

// §4: the class of exponent e relative to ref.
ZC_HD int class_of(uint32_t e, uint32_t ref, uint32_t all_ones) {
  if (e == 0) return kClassZero;
  if (e == all_ones || e > ref || ref - e > uint32_t(kMaxDelta)) return kClassEsc;
  return int(ref - e) + 1;
}

// §4.2: whether element x is an implied zero of a ZEROS group: every bit but
// (with a coded sign) the sign is 0.
ZC_HD bool implied_zero(uint32_t x, Layout lay, bool sign_coded) {
  const uint32_t all = lay.elem_bytes == 2 ? 0xFFFFu : 0xFFFFFFFFu;
  return (x & (sign_coded ? all >> 1 : all)) == 0;
}

// §4-4.2: the symbol of element bits x under ref and a group's mask.
ZC_HD int symbol_of_element(uint32_t x, Layout lay, uint32_t ref, int mask) {
  const bool sc = mask & kMaskSign;
  const uint32_t e = exponent_of(x, lay), t = top_bits_of(x, lay);
  int c = class_of(e, ref, (1u << lay.exp_bits) - 1);
  if ((mask & kMaskZeros) && e == 0 && t == 0 && !implied_zero(x, lay, sc)) c = kClassEsc;  // §4.2
  return (sc ? int(sign_of(x, lay)) << kSignBit : 0) | (c << kTopBits) | int(t);
}

ZC_HD bool escapes(int sym) { return ((sym >> kTopBits) & (kNumClasses - 1)) == kClassEsc; }

ZC_HD int64_t num_blocks(int64_t n) { return (n + kBlock - 1) >> kBlockLog2; }
ZC_HD int64_t num_groups(int64_t nb) { return (nb + kGroupBlocks - 1) / kGroupBlocks; }
ZC_HD int block_count(int64_t n, int64_t b) { return int(n - b * kBlock < kBlock ? n - b * kBlock : kBlock); }
ZC_HD int group_block_count(int64_t nb, int64_t g) {
  return int(nb - g * kGroupBlocks < kGroupBlocks ? nb - g * kGroupBlocks : kGroupBlocks);
}

// §1: where a coded stream's group records and bodies start.
ZC_HD int64_t records_offset(int64_t nb) { return kHeaderBytes + int64_t(kDescBytes) * nb; }
ZC_HD int64_t bodies_offset(int64_t nb) { return records_offset(nb) + int64_t(kRecordBytes) * num_groups(nb); }

// §1: the most bytes a stream of n elements can take: raw plus the header.
ZC_HD int64_t max_stream_bytes(int64_t n, int dtype) { return kHeaderBytes + n * layout_of(dtype).elem_bytes; }

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

ZC_HD uint32_t load_u32(const uint8_t* p) {
  return p[0] | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

ZC_HD void store_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}

// §2: block b's descriptor (its body_bytes) in stream `in`, and writing one.
ZC_HD uint32_t load_descriptor(const uint8_t* in, int64_t b) {
  const uint8_t* p = in + kHeaderBytes + int64_t(kDescBytes) * b;
  return p[0] | (uint32_t(p[1]) << 8);
}
ZC_HD void store_descriptor(uint8_t* p, uint32_t body_bytes) {
  for (int i = 0; i < kDescBytes; ++i) p[i] = uint8_t(body_bytes >> (8 * i));
}

// §7 step 1: the largest exponent field with 1 <= e < ALL_ONES, or 0.
ZC_HD uint32_t block_emax(int dtype, const uint8_t* in, int count) {
  const Layout lay = layout_of(dtype);
  const uint32_t all_ones = (1u << lay.exp_bits) - 1;
  uint32_t emax = 0;
  for (int i = 0; i < count; ++i) {
    const uint32_t e = exponent_of(load_element(in + i * lay.elem_bytes, lay.elem_bytes), lay);
    if (e < all_ones && e > emax) emax = e;
  }
  return emax;
}

// §7 step 2: a group's candidate codes, in the order they are tried:
// c = 2 * sign_coded + own (own: each block's ref is its own emax, else the
// group's largest), then the same four with implied zeros (c + 4).
constexpr int kCandidates = 8;

ZC_HD int candidate_mask(int c) {
  return ((c & 2) ? kMaskSign : 0) | ((c & 4) ? kMaskZeros : 0) | ((c & 1) ? kMaskOwnRefs : 0);
}

// A group's mask without its plane bits: how it codes symbols (§4).
ZC_HD int symbol_mask(int mask) { return mask & (kMaskSign | kMaskZeros); }

// The symbols of a group with this mask.
ZC_HD int num_symbols(int mask) { return (mask & kMaskSign) ? 2 * kNumSyms : kNumSyms; }

// §7 step 2: adds the symbol counts of a block under ref to counts, and
// returns how many of its elements are implied zeros.
ZC_HD int add_symbol_counts(int dtype, const uint8_t* in, int count, uint32_t ref, int mask, uint32_t* counts) {
  const Layout lay = layout_of(dtype);
  int implied = 0;
  for (int i = 0; i < count; ++i) {
    const uint32_t x = load_element(in + i * lay.elem_bytes, lay.elem_bytes);
    ++counts[symbol_of_element(x, lay, ref, mask)];
    implied += (mask & kMaskZeros) && implied_zero(x, lay, mask & kMaskSign);
  }
  return implied;
}

// §5.1 step 1, after sorting: the two-queue Huffman code lengths of the n
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

// §5.1 step 1: deterministic two-queue Huffman code lengths (unlimited) of
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

// §5.1: how far a code whose longest length is `longest` (over 12) flattens
// its counts: they are divided by 2^k, rounded up.
ZC_HD int flattening_shift(int longest) { return longest - kMaxCodeLen < 16 ? longest - kMaxCodeLen : 16; }

// §5.1: Huffman lengths, flattening the counts until no code is over 12 bits.
ZC_HD void code_lengths(const uint32_t* counts_in, uint8_t* lens, int nsym = kNumSyms) {
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

// §5.3: the length predicted for symbol s from the lengths before it.
ZC_HD int length_prediction(const uint8_t* lens, int s) {
  if (s % 4) return lens[s - 1];
  if (s % 128) return lens[s - 4];
  return s ? lens[s - 128] : 0;
}

// §5.3: the length a "jump" entry stands for after prediction p.
ZC_HD int jump_length(int p) { return p ? 0 : kMaxCodeLen; }

// §5.3: the stored entry of symbol s: its bits (first read in bit 0) | their count << 8.
ZC_HD uint32_t length_entry(const uint8_t* lens, int s) {
  const int p = length_prediction(lens, s), d = int(lens[s]) - p;
  if (d == 0) return 0u | 1u << 8;
  if (d == 1) return 1u | 2u << 8;
  if (d == -1) return 3u | 3u << 8;
  if (lens[s] == jump_length(p)) return 7u | 4u << 8;
  return (15u | uint32_t(lens[s]) << 4) | 8u << 8;
}

// §5.3: the classes a symbol code stores in half h (symbols 128 h ..): one
// past the last of classes 0..30 with a code (0 if none); class ESC is always stored.
ZC_HD int stored_classes(const uint8_t* lens, int h) {
  for (int c = kNumClasses - 2; c >= 0; --c) {
    const uint8_t* p = lens + h * kNumSyms + (c << kTopBits);
    if (p[0] | p[1] | p[2] | p[3]) return c + 1;
  }
  return 0;
}

// §5.3: whether symbol s of a symbol code is stored, given its half's class count k.
ZC_HD bool class_stored(int s, int k) {
  const int c = (s % kNumSyms) >> kTopBits;
  return c < k || c == kClassEsc;
}

// §5.3: the bits of a code's stored lengths (symbols: a symbol code, whose
// halves start with their class counts; else a byte-plane code).
ZC_HD uint32_t entry_bits(const uint8_t* lens, int from, int to) {
  uint32_t bits = 0;
  for (int s = from; s < to; ++s) bits += length_entry(lens, s) >> 8;
  return bits;
}
ZC_HD uint32_t table_bits(const uint8_t* lens, int nsym, bool symbols) {
  if (!symbols) return entry_bits(lens, 0, nsym);
  uint32_t bits = 0;
  for (int base = 0; base < nsym; base += kNumSyms) {  // a half: its class count, its stored classes, ESC
    const int k = stored_classes(lens, base / kNumSyms);
    bits += 5 + entry_bits(lens, base, base + (k << kTopBits)) +
            entry_bits(lens, base + (kClassEsc << kTopBits), base + kNumSyms);
  }
  return bits;
}

// §7 steps 2-3: a code's stored lengths alone, in bytes.
ZC_HD uint32_t table_bytes(const uint8_t* lens, int nsym, bool symbols) {
  return (table_bits(lens, nsym, symbols) + 7) / 8;
}

// §7 step 2: the bits a group costs under code lengths lens: codes, escaped
// exponents, the stored lengths and the stored bits of m stored elements.
ZC_HD uint64_t code_cost(const uint32_t* counts, const uint8_t* lens, int mask, Layout lay, int64_t m) {
  const int nsym = num_symbols(mask);
  uint64_t bits = 8 * uint64_t(table_bytes(lens, nsym, true));
  for (int s = 0; s < nsym; ++s) bits += uint64_t(counts[s]) * (lens[s] + (escapes(s) ? lay.exp_bits : 0));
  const int stored_bits = 8 * lay.raw_bytes + lay.extra_bits - ((mask & kMaskSign) ? 1 : 0);
  return bits + uint64_t(m) * uint64_t(stored_bits);
}

// §7 step 2: whether zero-mode candidate c of a group of count elements, m of
// them stored, is skipped (its implied zeros cannot save 1/16 bit per element).
ZC_HD bool zero_candidate_skipped(int c, Layout lay, int64_t count, int64_t m) {
  const int stored_bits = 8 * lay.raw_bytes + lay.extra_bits - ((c & 2) ? 1 : 0);
  return 16 * uint64_t(count - m) * uint64_t(stored_bits) <= uint64_t(count);
}

// §7 step 2: the candidate a group of count elements takes, from each one's
// cost (~0 for a skipped candidate): the first of least cost among 0-3, or
// the first of least cost among 4-7 if it saves more than count / 16 bits.
ZC_HD int best_candidate(const uint64_t* cost, int64_t count) {
  int best = 0, zero = 4;
  for (int c = 1; c < 4; ++c) best = cost[c] < cost[best] ? c : best;
  for (int c = 5; c < kCandidates; ++c) zero = cost[c] < cost[zero] ? c : zero;
  const bool pays = cost[zero] < cost[best] && 16 * (cost[best] - cost[zero]) > uint64_t(count);
  return pays ? zero : best;
}

// §5.2: canonical codes, bit-reversed so the decoder peeks LSB first.
ZC_HD void canonical_codes(const uint8_t* lens, uint16_t* codes, int nsym = kNumSyms) {
  uint32_t code = 0;
  for (int len = 1; len <= kMaxCodeLen; ++len) {
    for (int s = 0; s < nsym; ++s) {
      if (lens[s] != len) continue;
      uint32_t rev = 0;
      for (int b = 0; b < len; ++b) rev |= ((code >> b) & 1u) << (len - 1 - b);
      codes[s] = uint16_t(rev);
      ++code;
    }
    code <<= 1;
  }
}

// §5.3: a code needs a symbol and a Kraft sum of at most 1.
ZC_HD int check_code(const uint8_t* lens, int nsym) {
  uint32_t kraft = 0;  // in units of 2^-12
  for (int s = 0; s < nsym; ++s)
    if (lens[s]) kraft += 1u << (kMaxCodeLen - lens[s]);
  return (kraft == 0 || kraft > uint32_t(kLutSize)) ? kErrTable : kOk;
}

// Decode table: lut[12-bit window] = symbol | (length << 8); 0 = no code.
// (Symbol 0 with length 0 is no code: every coded symbol has a length.)
ZC_HD void build_lut(const uint8_t* lens, uint16_t* lut, int nsym = kNumSyms) {
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

// §6: appends bits LSB first: stream bit k is bit (k % 8) of byte k / 8.
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

// §6: reads bits LSB first from bit pos of p up to bit end, never past byte
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

// §5.3, §5.5: reads the stored lengths of a code of nsym symbols (symbols:
// a symbol code). Returns a Status.
ZC_HD int read_lengths(BitReader& r, uint8_t* lens, int nsym, bool symbols) {
  int k = kNumClasses;
  for (int s = 0; s < nsym; ++s) {
    if (symbols && s % kNumSyms == 0) {
      uint32_t classes;
      if (!r.take(5, &classes)) return kErrTable;
      k = int(classes);
    }
    if (symbols && !class_stored(s, k)) {
      lens[s] = 0;
      continue;
    }
    const int p = length_prediction(lens, s);
    uint32_t bit, v = uint32_t(p);
    if (!r.take(1, &bit)) return kErrTable;
    if (bit) {
      if (!r.take(1, &bit)) return kErrTable;
      if (!bit) v = p + 1;
      else {
        if (!r.take(1, &bit)) return kErrTable;
        if (!bit) v = uint32_t(p - 1);  // p == 0: wraps, rejected below
        else {
          if (!r.take(1, &bit)) return kErrTable;
          if (!bit) v = uint32_t(jump_length(p));
          else if (!r.take(4, &v)) return kErrTable;
        }
      }
    }
    if (v > uint32_t(kMaxCodeLen)) return kErrTable;
    lens[s] = uint8_t(v);
  }
  return check_code(lens, nsym);
}

// §5.3: writes a code's stored lengths (symbols: a symbol code).
template <typename Writer>
ZC_HD void write_lengths(const uint8_t* lens, int nsym, bool symbols, Writer& w) {
  int k = kNumClasses;
  for (int s = 0; s < nsym; ++s) {
    if (symbols && s % kNumSyms == 0) {
      k = stored_classes(lens, s / kNumSyms);
      w.put(uint32_t(k), 5);
    }
    if (symbols && !class_stored(s, k)) continue;
    const uint32_t entry = length_entry(lens, s);
    w.put(entry & 0xFFu, int(entry >> 8));
  }
}

// A group's codes (§5): its mask and symbol code, and the codes of its coded
// byte planes (bit p < 2 of mask). The encoder fills lens and codes, the
// decoder luts, of the coded planes only.
struct PlaneCodes {
  int mask;
  const uint8_t* lens[kMaxPlanes];
  const uint16_t* codes[kMaxPlanes];
  const uint16_t* luts[kMaxPlanes];
};

ZC_HD int popcount2(int mask) { return (mask & 1) + ((mask >> 1) & 1); }

// What a group's mask says about its elements' stored bits (§3, §6).
struct GroupLayout {
  Layout lay;
  int mask;
  int stored_planes;  // raw bytes stored per element
  int extra_bits;     // stored extra bits per element
};

ZC_HD GroupLayout group_layout(int dtype, int mask) {
  const Layout lay = layout_of(dtype);
  return {lay, mask, lay.raw_bytes - popcount2(mask & 3), lay.extra_bits - ((mask & kMaskSign) ? 1 : 0)};
}

// §2: the bits of a body's width field, and the bits an encoder puts
// before lane 0 (the field and the 15 length deviations).
ZC_HD int width_field_bits(int w) { return (w >= kWidthShort && w < kWidthShort + 7) ? 3 : 8; }
ZC_HD int head_bits(int width) { return (kLanes - 1) * width + width_field_bits(width); }

// §2: writes a body's width field.
template <typename Writer>
ZC_HD void put_width(int w, Writer& out) {
  if (width_field_bits(w) == 3) out.put(uint32_t(w - kWidthShort), 3);
  else out.put(7u | uint32_t(w) << 3, 8);
}

// §2: the base the lane lengths of a coded block are stored relative to,
// with `head` bits before lane 0.
ZC_HD uint32_t length_base(uint32_t body_bytes, uint32_t head) {
  const int64_t bits = 8 * int64_t(body_bytes) - head;
  return bits > 0 ? uint32_t(bits / kLanes) : 0;
}

// §7 step 4: the narrowest width w for lanes of bits[0..15]; devs receives
// dev_0..dev_14 and *body_bytes the body's size. Returns w.
ZC_HD int choose_width(const uint32_t* bits, int32_t* devs, uint32_t* body_bytes) {
  uint32_t all = 0;
  for (int k = 0; k < kLanes; ++k) all += bits[k];
  for (int w = 1;; ++w) {
    *body_bytes = (head_bits(w) + all + 7) / 8;
    const int32_t base = int32_t(length_base(*body_bytes, head_bits(w))), lim = 1 << (w - 1);
    bool fit = true;
    for (int k = 0; k < kLanes - 1; ++k) {
      devs[k] = int32_t(bits[k]) - base;
      fit = fit && devs[k] >= -lim && devs[k] < lim;
    }
    if (fit || w == kMaxWidth) return w;  // |dev| < 2^15: w == kMaxWidth always fits
  }
}

// §7 step 3: the bits plane p of count elements (bytes at in) takes under its
// own Huffman code, over the stored elements of a group with this mask, every
// stride-th of them; lens receives the code and *used the number of bytes counted.
ZC_HD uint64_t plane_code_bits(const uint8_t* in, int64_t count, int64_t stride, int p, Layout lay, int mask,
                               uint8_t* lens, int64_t* used) {
  uint32_t counts[kPlaneSyms] = {};
  const bool zeros = mask & kMaskZeros;
  for (int64_t i = 0, j = 0; i < count; ++i) {
    if (zeros && implied_zero(load_element(in + i * lay.elem_bytes, lay.elem_bytes), lay, mask & kMaskSign)) continue;
    if (j++ % stride == 0) ++counts[in[i * lay.elem_bytes + p]];
  }
  *used = 0;
  for (int v = 0; v < kPlaneSyms; ++v) *used += counts[v];
  code_lengths(counts, lens, kPlaneSyms);
  uint64_t bits = 0;
  for (int v = 0; v < kPlaneSyms; ++v) bits += uint64_t(counts[v]) * lens[v];
  return bits;
}

// §7 step 3: whether a sample of ns bytes coded in `bits` saves at least 1/16
// bit per byte (a plane that does not stays stored without a full count).
ZC_HD bool plane_sample_pays(uint64_t bits, int64_t ns) { return 16 * (8 * uint64_t(ns) - bits) >= uint64_t(ns); }

// §7 step 3: whether a plane of m stored bytes, coded in `bits` by code lens, is coded.
ZC_HD bool plane_pays(uint64_t bits, const uint8_t* lens, int64_t m) {
  return bits + 8 * uint64_t(table_bytes(lens, kPlaneSyms, false)) < 8 * uint64_t(m);
}

// §7 step 3: which raw byte planes a group of count elements (bytes at in,
// symbols under mask) codes; lens[p] receives plane p's code lengths.
// Returns the plane bits of the mask.
ZC_HD int choose_planes(int dtype, const uint8_t* in, int64_t count, int mask, uint8_t (*lens)[kPlaneSyms]) {
  const Layout lay = layout_of(dtype);
  int planes = 0;
  for (int p = 0; p < lay.raw_bytes; ++p) {
    int64_t ns, m;
    const uint64_t sample = plane_code_bits(in, count, kPlaneSampleStride, p, lay, mask, lens[p], &ns);  // sets ns
    if (!plane_sample_pays(sample, ns)) continue;
    const uint64_t bits = plane_code_bits(in, count, 1, p, lay, mask, lens[p], &m);  // sets m
    if (plane_pays(bits, lens[p], m)) planes |= 1 << p;
  }
  return planes;
}

// §2, §7 step 3: whether element x stores bits (it is no implied zero of a ZEROS group).
ZC_HD bool stores_bits(uint32_t x, Layout lay, int mask) {
  return !(mask & kMaskZeros) || !implied_zero(x, lay, mask & kMaskSign);
}

// §6: the bits element x takes in its lane: its symbol's code, an escape's
// exponent, and unless it is an implied zero its stored extra value and
// each byte plane's code or raw byte.
ZC_HD uint32_t element_bits(int dtype, uint32_t x, uint32_t ref, const uint8_t* lens, const PlaneCodes& pc) {
  const GroupLayout gl = group_layout(dtype, pc.mask);
  const int s = symbol_of_element(x, gl.lay, ref, pc.mask);
  uint32_t bits = lens[s] + (escapes(s) ? gl.lay.exp_bits : 0);
  if ((pc.mask & kMaskZeros) && implied_zero(x, gl.lay, pc.mask & kMaskSign)) return bits;
  bits += gl.extra_bits;
  for (int p = 0; p < gl.lay.raw_bytes; ++p) bits += ((pc.mask >> p) & 1) ? pc.lens[p][(x >> (8 * p)) & 0xFFu] : 8;
  return bits;
}

// §6: puts element x's fields (element_bits of them) to w.
template <typename Writer>
ZC_HD void put_element(int dtype, uint32_t x, uint32_t ref, const uint8_t* lens, const uint16_t* codes,
                       const PlaneCodes& pc, Writer& w) {
  const GroupLayout gl = group_layout(dtype, pc.mask);
  const int s = symbol_of_element(x, gl.lay, ref, pc.mask);
  w.put(codes[s], lens[s]);
  if (escapes(s)) w.put(exponent_of(x, gl.lay), gl.lay.exp_bits);
  if ((pc.mask & kMaskZeros) && implied_zero(x, gl.lay, pc.mask & kMaskSign)) return;
  uint32_t t, extra;
  uint8_t raw[kMaxPlanes];
  split_element(dtype, x, &t, raw, &extra);
  w.put(extra >> ((pc.mask & kMaskSign) ? 1 : 0), gl.extra_bits);
  for (int p = 0; p < gl.lay.raw_bytes; ++p) {
    if ((pc.mask >> p) & 1) w.put(pc.codes[p][raw[p]], pc.lens[p][raw[p]]);
    else w.put(raw[p], 8);
  }
}

// §7 step 4: encodes one block of count elements (bytes at in) with its ref
// and its group's codes into body, which has room for count * elem_bytes
// bytes. Returns the body's bytes (its descriptor): count * elem_bytes for a
// raw block.
ZC_HD uint32_t encode_block(int dtype, const uint8_t* in, int count, uint32_t ref, const uint8_t* lens,
                            const uint16_t* codes, uint8_t* body, const PlaneCodes& pc) {
  const int eb = layout_of(dtype).elem_bytes;
  uint32_t bits[kLanes] = {};
  for (int i = 0; i < count; ++i)  // the exact size first: never write past body
    bits[i % kLanes] += element_bits(dtype, load_element(in + i * eb, eb), ref, lens, pc);
  int32_t devs[kLanes - 1];
  uint32_t coded;
  const int width = choose_width(bits, devs, &coded);
  const uint32_t raw_block = uint32_t(count) * eb;
  if (coded >= raw_block) {
    for (uint32_t i = 0; i < raw_block; ++i) body[i] = in[i];
    return raw_block;
  }
  BitWriter w{body, 0, 0};
  put_width(width, w);
  for (int k = 0; k + 1 < kLanes; ++k) w.put(uint32_t(devs[k]) & ((1u << width) - 1), width);
  for (int k = 0; k < kLanes; ++k)
    for (int i = k; i < count; i += kLanes) put_element(dtype, load_element(in + i * eb, eb), ref, lens, codes, pc, w);
  w.flush();
  return coded;
}

// §2: where the lanes of a coded block (body of size bytes) start:
// starts[k] in bits from the body's start, starts[16] = the body's end.
// Returns a Status.
ZC_HD int locate_lanes(const uint8_t* body, uint32_t size, uint32_t* starts) {
  const uint32_t end = 8 * size;
  BitReader r{body, size, 0, end};
  uint32_t f;
  if (!r.take(3, &f)) return kErrBlockSize;
  int width = int(f) + kWidthShort;
  if (f == 7) {
    if (!r.take(5, &f)) return kErrBlockSize;
    if (f < 1 || f > uint32_t(kMaxWidth)) return kErrBlockMode;
    width = int(f);
  }
  const uint32_t head = r.pos + uint32_t((kLanes - 1) * width);
  if (head > end) return kErrBlockSize;
  const uint32_t base = length_base(size, head);
  starts[0] = head;
  for (int k = 0; k + 1 < kLanes; ++k) {
    uint32_t v;
    r.take(width, &v);
    const int64_t len = int64_t(base) + (int64_t(v) - ((v >> (width - 1)) ? (int64_t(1) << width) : 0));
    if (len < 0 || starts[k] + len > end) return kErrBlockSize;
    starts[k + 1] = starts[k] + uint32_t(len);
  }
  starts[kLanes] = end;
  return kOk;
}

// Whether a decoded symbol of a group with this mask is an implied zero (§4.2).
ZC_HD bool implied_symbol(int sym, int mask) { return (mask & kMaskZeros) && (sym & (kNumSyms - 1)) == 0; }

// §4, §6: decodes the next element of lane r of a coded block into dst.
// Returns a Status. Reader: BitReader, or any reader with its peek, skip and
// take (the CUDA codec's reads aligned words).
template <typename Reader>
ZC_HD int decode_element(int dtype, const GroupLayout& gl, uint32_t ref, const uint16_t* lut, const PlaneCodes& pc,
                         Reader& r, uint8_t* dst) {
  const Layout lay = gl.lay;
  const uint16_t entry = lut[r.peek(kMaxCodeLen)];
  if (!(entry >> 8) || !r.skip(entry >> 8)) return kErrBitstream;
  const int s = entry & 0xFF, c = (s >> kTopBits) & (kNumClasses - 1);
  uint32_t e = 0;
  if (c == kClassEsc) {
    if (!r.take(lay.exp_bits, &e)) return kErrBitstream;
  } else if (c != kClassZero) {
    if (uint32_t(c - 1) >= ref) return kErrBitstream;  // would give e == 0
    e = ref - uint32_t(c - 1);
  }
  if (implied_symbol(s, pc.mask)) {  // §4.2: nothing else is stored
    store_element(dst, uint32_t(s >> kSignBit) << (8 * lay.elem_bytes - 1), lay.elem_bytes);
    return kOk;
  }
  uint32_t extra;
  if (!r.take(gl.extra_bits, &extra)) return kErrBitstream;
  uint8_t raw[kMaxPlanes] = {};
  for (int p = 0; p < lay.raw_bytes; ++p) {
    uint32_t byte;
    if ((pc.mask >> p) & 1) {
      const uint16_t coded = pc.luts[p][r.peek(kMaxCodeLen)];
      if (!(coded >> 8) || !r.skip(coded >> 8)) return kErrBitstream;
      byte = coded & 0xFFu;
    } else if (!r.take(8, &byte)) {
      return kErrBitstream;
    }
    raw[p] = uint8_t(byte);
  }
  extra = (pc.mask & kMaskSign) ? (extra << 1 | uint32_t(s >> kSignBit)) : extra;
  store_element(dst, join_element(dtype, e, uint32_t(s) & 3u, raw, extra), lay.elem_bytes);
  return kOk;
}

// §2, §6: how lane k of a block must end, once decoded to bit pos: at the
// next lane's start; the last lane in the body's last byte (starts[16] is its
// end), padded with zero bits. Returns a Status.
ZC_HD int lane_end_status(const uint8_t* body, int k, uint32_t pos, const uint32_t* starts) {
  if (k + 1 < kLanes) return pos == starts[k + 1] ? kOk : kErrTrailing;
  if ((pos + 7) / 8 != starts[kLanes] / 8) return kErrTrailing;
  return ((pos & 7) && (body[pos / 8] >> (pos & 7))) ? kErrTrailing : kOk;
}

// §6: decodes lane k of a coded block (body of size bytes, count elements,
// starts from locate_lanes) into out, and checks its end. Returns a Status.
ZC_HD int decode_lane(int dtype, const uint8_t* body, uint32_t size, int count, int k, const uint32_t* starts,
                      uint32_t ref, const uint16_t* lut, const PlaneCodes& pc, uint8_t* out) {
  const GroupLayout gl = group_layout(dtype, pc.mask);
  BitReader r{body, size, starts[k], starts[k + 1]};
  for (int i = k; i < count; i += kLanes) {
    const int status = decode_element(dtype, gl, ref, lut, pc, r, out + i * gl.lay.elem_bytes);
    if (status != kOk) return status;
  }
  return lane_end_status(body, k, r.pos, starts);
}

// Decodes one coded block (body of size bytes, count elements) of a group
// with codes pc and symbol decode table lut into out, lane by lane: the first
// lane that fails gives the Status.
ZC_HD int decode_coded_block(int dtype, const uint8_t* body, uint32_t size, int count, uint32_t ref,
                             const uint16_t* lut, const PlaneCodes& pc, uint8_t* out) {
  uint32_t starts[kLanes + 1];
  int status = locate_lanes(body, size, starts);
  for (int k = 0; k < kLanes && status == kOk; ++k)
    status = decode_lane(dtype, body, size, count, k, starts, ref, lut, pc, out);
  return status;
}

// §5.5: the refs of a group of nblocks blocks with this mask: one, or one per block.
ZC_HD int num_refs(int mask, int nblocks) { return (mask & kMaskOwnRefs) ? nblocks : 1; }

// §5.5: reads and checks a group's table area (bytes at `at`, `bytes` long):
// refs (num_refs of them), the symbol code's lengths, each coded plane's.
// Returns a Status.
ZC_HD int read_table_area(const uint8_t* at, uint32_t bytes, int mask, int nblocks, uint8_t* refs,
                          uint8_t* sym_lens, uint8_t (*plane_lens)[kPlaneSyms]) {
  const int nrefs = num_refs(mask, nblocks);
  if (bytes < uint32_t(nrefs)) return kErrTable;
  for (int i = 0; i < nrefs; ++i) refs[i] = at[i];
  BitReader r{at + nrefs, bytes - nrefs, 0, 8 * (bytes - nrefs)};
  int status = read_lengths(r, sym_lens, num_symbols(mask), true);
  for (int p = 0; p < kMaxPlanes && status == kOk; ++p)
    if ((mask >> p) & 1) status = read_lengths(r, plane_lens[p], kPlaneSyms, false);
  if (status != kOk) return status;
  const uint32_t used = (r.pos + 7) / 8;  // the area ends in the last byte, padded with zero bits
  if (used != r.nbytes || ((r.pos & 7) && (r.p[used - 1] >> (r.pos & 7)))) return kErrTable;
  return kOk;
}

// §5.5: writes a group's table area to out; returns its bytes.
ZC_HD uint32_t write_table_area(const uint8_t* refs, int nrefs, const uint8_t* sym_lens, int mask,
                                const uint8_t (*plane_lens)[kPlaneSyms], uint8_t* out) {
  for (int i = 0; i < nrefs; ++i) out[i] = refs[i];
  BitWriter w{out + nrefs, 0, 0};
  write_lengths(sym_lens, num_symbols(mask), true, w);
  for (int p = 0; p < kMaxPlanes; ++p)
    if ((mask >> p) & 1) write_lengths(plane_lens[p], kPlaneSyms, false, w);
  w.flush();
  return uint32_t(w.out - out);
}

// Header fields (FORMAT.md, "Stream header").
ZC_HD void write_header(uint8_t* out, int dtype, int flags, uint64_t n) {
  for (int i = 0; i < 4; ++i) out[i] = uint8_t("ZCCL"[i]);
  out[4] = kVersion;
  out[5] = uint8_t(dtype);
  out[6] = uint8_t(flags);
  out[7] = kBlockLog2;
  for (int i = 0; i < 8; ++i) out[8 + i] = uint8_t(n >> (8 * i));
}

// Validates a header against the expected dtype and count; *flags receives
// its flags, *mask_bits the bits a group mask may have. Returns a Status.
ZC_HD int check_header(const uint8_t* in, uint64_t size, int dtype, uint64_t n, int* flags, int* mask_bits) {
  if (size < uint64_t(kHeaderBytes)) return kErrTruncated;
  for (int i = 0; i < 4; ++i)
    if (in[i] != uint8_t("ZCCL"[i])) return kErrMagic;
  if (in[4] != kVersion || in[7] != kBlockLog2) return kErrVersion;
  if (in[5] != dtype) return kErrDType;
  uint64_t count = 0;
  for (int i = 0; i < 8; ++i) count |= uint64_t(in[8 + i]) << (8 * i);
  if (count != n) return kErrCount;
  *flags = in[6];
  *mask_bits = ((1 << layout_of(dtype).raw_bytes) - 1) | kMaskSign | kMaskZeros | kMaskOwnRefs;
  return (in[6] & ~kFlagStoredRaw) ? kErrFlags : kOk;
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

// §8: a + b in float32 by the format's rule, the same on every platform:
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
