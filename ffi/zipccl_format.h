// The zipccl byte format (docs/FORMAT.md), shared by the CPU and CUDA codecs.
//
// Everything here is a plain function of its arguments and compiles for host
// and device, so the C++ and CUDA codecs run the same coder and cannot drift
// apart. The numpy reference (zipccl_jax/reference.py) follows FORMAT.md
// section by section; tests assert byte identity against both. Section
// numbers below refer to FORMAT.md.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define ZC_HD __host__ __device__ inline
#else
#define ZC_HD inline
#endif

namespace zipccl {

constexpr int kVersion = 2;  // written; version 1 streams are still read (§1)
constexpr int kHeaderBytes = 16;
constexpr int kBlockLog2 = 12;
constexpr int kBlock = 1 << kBlockLog2;  // elements per block
constexpr int kGroupBlocks = 16;         // blocks sharing one code table
constexpr int kFlagStoredRaw = 1;        // header flags: whole stream is raw
constexpr int kFlagMasks = 2;            // header flags: one mask byte per group (BYTE_CODES in version 1)
constexpr int kMaskSign = 4;             // group mask bit 2: the symbols carry the sign (§4.1, version 2)

constexpr int kNumClasses = 32;
constexpr int kClassZero = 0;  // exponent field == 0 (zero or subnormal)
constexpr int kClassEsc = 31;  // followed by the raw exponent field
constexpr int kMaxDelta = 29;  // classes 1..30 code d = ref - e in 0..29
constexpr int kSignMaxDelta = 13;  // §4.1: sign-coded classes 1..14 code d in 0..13, with the sign in bit 4
constexpr int kTopBits = 2;    // top mantissa bits coded with the class
constexpr int kNumSyms = kNumClasses << kTopBits;
constexpr int kTableBytes = kNumSyms / 2;  // 4-bit lengths
constexpr int kMaxCodeLen = 12;
constexpr int kLutSize = 1 << kMaxCodeLen;
constexpr int kSubstreams = 4;  // independent bitstreams per coded block
constexpr int kSubstreamHeader = 2 * (kSubstreams - 1);
constexpr int kMaxElementBits = kMaxCodeLen + 9;  // a code, an escaped exponent and sign (no byte codes)
constexpr int kPlaneSyms = 256;                   // §5.4: the alphabet of a raw byte plane
constexpr int kPlaneTableBytes = kPlaneSyms / 2;
constexpr int kMaxPlanes = 2;                     // raw bytes per element, at most
constexpr int kPlaneSampleStride = 8;             // §7 step 3: the pre-check samples every 8th element
constexpr int kMaxSyms = kPlaneSyms;              // the larger alphabet, for array sizes

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
  kErrLast = kErrPlanes,  // every status is in [kOk, kErrLast]
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
    default: return "ok";
  }
}

// Dtype codes stored in byte 5 of the header.
enum DType : int { kBF16 = 1, kF16 = 2, kF32 = 3 };

// §3: how an element splits into the coded fields, raw bytes stored as they
// are, and extra raw bits written after the element's code.
struct Layout {
  int elem_bytes;  // 2 or 4
  int exp_bits;    // width of the exponent field (8 or 5)
  int raw_bytes;   // raw bytes per element in a coded block
  int extra_bits;  // raw bits per element in the packed extra area
};

// §2: bytes of a coded block's extra area.
ZC_HD uint32_t extra_area_bytes(int count, Layout lay) { return (uint32_t(count) * lay.extra_bits + 7) / 8; }

ZC_HD Layout layout_of(int dtype) {
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

// §4: the class of exponent e relative to ref, or with sign_coded (§4.1)
// that of sign s.
ZC_HD int class_of(uint32_t e, uint32_t ref, uint32_t all_ones, bool sign_coded = false, uint32_t s = 0) {
  int c = kClassZero;
  if (e != 0) {
    if (e == all_ones || e > ref || ref - e > uint32_t(sign_coded ? kSignMaxDelta : kMaxDelta)) return kClassEsc;
    c = int(ref - e) + 1;
  }
  return sign_coded ? c | int(s << 4) : c;
}

// The sign bit of element bits x.
ZC_HD uint32_t sign_of(uint32_t x, Layout lay) { return x >> (lay.elem_bytes * 8 - 1); }

// §4-4.1: the symbol of element bits x under ref.
ZC_HD int symbol_of_element(uint32_t x, Layout lay, uint32_t ref, bool sign_coded) {
  const int c = class_of(exponent_of(x, lay), ref, (1u << lay.exp_bits) - 1, sign_coded, sign_of(x, lay));
  return (c << kTopBits) | int(top_bits_of(x, lay));
}

// §2: bits 0..15 body bytes, 16..23 ref, 24..31 mode (0 raw, 1 coded).
ZC_HD uint32_t make_descriptor(uint32_t body_bytes, uint32_t ref, uint32_t mode) {
  return body_bytes | (ref << 16) | (mode << 24);
}

ZC_HD int64_t num_blocks(int64_t n) { return (n + kBlock - 1) >> kBlockLog2; }
ZC_HD int64_t num_groups(int64_t nb) { return (nb + kGroupBlocks - 1) / kGroupBlocks; }
ZC_HD int block_count(int64_t n, int64_t b) { return int(n - b * kBlock < kBlock ? n - b * kBlock : kBlock); }

// §1: offset of the first group's tables in a coded stream (after the
// descriptors and, with kFlagMasks, one mask byte per group).
ZC_HD int64_t tables_offset(int64_t nb, int flags) {
  return kHeaderBytes + 4 * nb + ((flags & kFlagMasks) ? num_groups(nb) : 0);
}

ZC_HD int popcount2(int mask) { return (mask & 1) + ((mask >> 1) & 1); }

// §5.4: bytes of a group's tables: its symbol table, then one per coded plane.
ZC_HD int64_t group_table_bytes(int mask) { return kTableBytes + int64_t(kPlaneTableBytes) * popcount2(mask); }

// §1: the most bytes a stream of n elements can take: raw plus the header.
ZC_HD int64_t max_stream_bytes(int64_t n, int dtype) { return kHeaderBytes + n * layout_of(dtype).elem_bytes; }

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

ZC_HD uint32_t load_u32(const uint8_t* p) {
  return p[0] | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

ZC_HD void store_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
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
// group's largest).
constexpr int kCandidates = 4;

// §7 step 2: adds the symbol counts of a block under ref to counts[kNumSyms].
ZC_HD void add_symbol_counts(int dtype, const uint8_t* in, int count, uint32_t ref, bool sign_coded,
                             uint32_t* counts) {
  const Layout lay = layout_of(dtype);
  for (int i = 0; i < count; ++i)
    ++counts[symbol_of_element(load_element(in + i * lay.elem_bytes, lay.elem_bytes), lay, ref, sign_coded)];
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

// §5.1: Huffman lengths, flattening the counts until no code is over 12 bits.
ZC_HD void code_lengths(const uint32_t* counts_in, uint8_t* lens, int nsym = kNumSyms) {
  uint32_t counts[kMaxSyms];
  for (int s = 0; s < nsym; ++s) counts[s] = counts_in[s];
  for (;;) {
    huffman_lengths(counts, lens, nsym);
    int longest = 0;
    for (int s = 0; s < nsym; ++s) longest = lens[s] > longest ? lens[s] : longest;
    if (longest <= kMaxCodeLen) return;
    for (int s = 0; s < nsym; ++s) counts[s] = counts[s] ? (counts[s] + 1) >> 1 : 0;
  }
}

// §7 step 2: the bits a group costs under code lengths lens: codes, escaped
// exponents (and signs, if coded), raw signs (if not).
ZC_HD uint64_t code_cost(const uint32_t* counts, const uint8_t* lens, int exp_bits, bool sign_coded) {
  uint64_t bits = 0;
  for (int s = 0; s < kNumSyms; ++s)
    bits += uint64_t(counts[s]) * (lens[s] + ((s >> kTopBits) == kClassEsc ? exp_bits + sign_coded : 0) + !sign_coded);
  return bits;
}

// §7 step 2: the candidate a group takes, from each one's symbol counts and
// code lengths: the first of the cheapest.
ZC_HD int best_candidate(const uint32_t (*counts)[kNumSyms], const uint8_t (*lens)[kNumSyms], int exp_bits) {
  int best = 0;
  uint64_t best_cost = code_cost(counts[0], lens[0], exp_bits, false);
  for (int c = 1; c < kCandidates; ++c) {
    const uint64_t cost = code_cost(counts[c], lens[c], exp_bits, c >= 2);
    if (cost < best_cost) best = c, best_cost = cost;
  }
  return best;
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

// §5.3: stored table <-> lengths; unpack_table validates.
ZC_HD void pack_table(const uint8_t* lens, uint8_t* table, int nsym = kNumSyms) {
  for (int j = 0; j < nsym / 2; ++j) table[j] = uint8_t(lens[2 * j] | (lens[2 * j + 1] << 4));
}

ZC_HD int unpack_table(const uint8_t* table, uint8_t* lens, int nsym = kNumSyms) {
  uint32_t kraft = 0;  // in units of 2^-12
  for (int j = 0; j < nsym / 2; ++j) {
    lens[2 * j] = table[j] & 15;
    lens[2 * j + 1] = table[j] >> 4;
  }
  for (int s = 0; s < nsym; ++s) {
    if (lens[s] > kMaxCodeLen) return kErrTable;
    if (lens[s]) kraft += 1u << (kMaxCodeLen - lens[s]);
  }
  return (kraft == 0 || kraft > uint32_t(kLutSize)) ? kErrTable : kOk;
}

// Decode table: lut[12-bit window] = symbol | (length << 8); 0 = no code.
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

// §2: sub-stream k of a block holds elements [k * q, min(count, (k + 1) * q)).
ZC_HD int substream_len(int count) { return (count + kSubstreams - 1) / kSubstreams; }

// A group's mask (§1) and the codes of its raw byte planes (§5.4). Bit p < 2
// of mask: plane p (raw byte p of every element) is Huffman coded in the
// sub-streams rather than stored in the raw area; bit 2 (kMaskSign): the
// symbols carry the sign (§4.1). The encoder fills lens and codes, the
// decoder luts, of the coded planes only.
struct PlaneCodes {
  int mask;
  const uint8_t* lens[kMaxPlanes];
  const uint16_t* codes[kMaxPlanes];
  const uint16_t* luts[kMaxPlanes];
};

// A group's layout under its mask: raw_bytes counts only the planes stored
// raw, extra_bits loses the sign when it is coded (it is bit 0 of extra, §3).
ZC_HD Layout group_layout(Layout lay, int mask) {
  lay.raw_bytes -= popcount2(mask);
  lay.extra_bits -= (mask & kMaskSign) ? 1 : 0;
  return lay;
}

// §7 step 3: the bits plane p of the elements i = 0, stride, 2 stride, ... <
// count (bytes at in) takes under its own Huffman code; lens receives the code.
ZC_HD uint64_t plane_code_bits(const uint8_t* in, int64_t count, int64_t stride, int p, Layout lay, uint8_t* lens) {
  uint32_t counts[kPlaneSyms] = {};
  for (int64_t i = 0; i < count; i += stride) ++counts[in[i * lay.elem_bytes + p]];
  code_lengths(counts, lens, kPlaneSyms);
  uint64_t bits = 0;
  for (int v = 0; v < kPlaneSyms; ++v) bits += uint64_t(counts[v]) * lens[v];
  return bits;
}

// §7 step 3: whether a sample of ns bytes coded in `bits` saves at least 1/16
// bit per byte (a plane that does not is left raw without a full count).
ZC_HD bool plane_sample_pays(uint64_t bits, int64_t ns) { return 16 * (8 * uint64_t(ns) - bits) >= uint64_t(ns); }

// §7 step 3: which raw byte planes a group of count elements (bytes at in)
// codes; lens[p] receives plane p's code lengths. Returns the mask.
ZC_HD int choose_planes(int dtype, const uint8_t* in, int64_t count, uint8_t (*lens)[kPlaneSyms]) {
  const Layout lay = layout_of(dtype);
  int mask = 0;
  for (int p = 0; p < lay.raw_bytes; ++p) {
    const int64_t ns = (count + kPlaneSampleStride - 1) / kPlaneSampleStride;
    if (!plane_sample_pays(plane_code_bits(in, count, kPlaneSampleStride, p, lay, lens[p]), ns)) continue;
    if (plane_code_bits(in, count, 1, p, lay, lens[p]) + 8 * kPlaneTableBytes < 8 * uint64_t(count)) mask |= 1 << p;
  }
  return mask;
}

// Bits one element costs in its sub-stream.
ZC_HD uint32_t element_bits(int dtype, uint32_t x, uint32_t ref, const uint8_t* lens, const PlaneCodes& pc) {
  const Layout lay = layout_of(dtype);
  const bool sign_coded = pc.mask & kMaskSign;
  const int s = symbol_of_element(x, lay, ref, sign_coded);
  uint32_t bits = lens[s] + ((s >> kTopBits) == kClassEsc ? lay.exp_bits + sign_coded : 0);
  for (int p = 0; p < lay.raw_bytes; ++p)
    if ((pc.mask >> p) & 1) bits += pc.lens[p][(x >> (8 * p)) & 0xFFu];
  return bits;
}

// §7 step 4: puts the bits element x takes in its sub-stream (element_bits
// of them) to w: its symbol's code, the escaped exponent (and sign), the codes
// of its coded planes. Its raw bytes and extra bits go to their own areas.
template <typename Writer>
ZC_HD void put_element(int dtype, uint32_t x, uint32_t ref, const uint8_t* lens, const uint16_t* codes,
                       const PlaneCodes& pc, Writer& w) {
  const Layout lay = layout_of(dtype);
  const bool sign_coded = pc.mask & kMaskSign;
  uint32_t t, extra;
  uint8_t raw[kMaxPlanes];
  const uint32_t e = split_element(dtype, x, &t, raw, &extra);
  const int s = symbol_of_element(x, lay, ref, sign_coded);
  w.put(codes[s], lens[s]);
  if ((s >> kTopBits) == kClassEsc) w.put(e | (sign_coded ? (extra & 1) << lay.exp_bits : 0), lay.exp_bits + sign_coded);
  for (int p = 0; p < lay.raw_bytes; ++p)
    if ((pc.mask >> p) & 1) w.put(pc.codes[p][raw[p]], pc.lens[p][raw[p]]);
}

// §7 step 4: encodes one block of count elements (bytes at in) with its ref
// and its group's codes into body, which has room for count * elem_bytes
// bytes. Returns the block's descriptor.
ZC_HD uint32_t encode_block(int dtype, const uint8_t* in, int count, uint32_t ref, const uint8_t* lens,
                            const uint16_t* codes, uint8_t* body, const PlaneCodes& pc = PlaneCodes{}) {
  const Layout lay = layout_of(dtype), st = group_layout(lay, pc.mask);
  const bool sign_coded = pc.mask & kMaskSign;
  const int q = substream_len(count);
  uint32_t stream_bytes[kSubstreams];
  const uint32_t sizes_at = uint32_t(count) * st.raw_bytes + extra_area_bytes(count, st);
  uint32_t coded = sizes_at + kSubstreamHeader;
  for (int k = 0; k < kSubstreams; ++k) {  // exact size first: never write past body
    uint32_t bits = 0;
    for (int i = k * q; i < count && i < (k + 1) * q; ++i)
      bits += element_bits(dtype, load_element(in + i * lay.elem_bytes, lay.elem_bytes), ref, lens, pc);
    stream_bytes[k] = (bits + 7) / 8;
    coded += stream_bytes[k];
  }
  const uint32_t raw_block = uint32_t(count) * lay.elem_bytes;
  if (coded >= raw_block) {
    for (uint32_t i = 0; i < raw_block; ++i) body[i] = in[i];
    return make_descriptor(raw_block, 0, 0);
  }
  uint8_t* sizes = body + sizes_at;
  for (int k = 0; k + 1 < kSubstreams; ++k) {
    sizes[2 * k] = uint8_t(stream_bytes[k]);
    sizes[2 * k + 1] = uint8_t(stream_bytes[k] >> 8);
  }
  BitWriter extras{body + count * st.raw_bytes, 0, 0};
  BitWriter w{sizes + kSubstreamHeader, 0, 0};
  for (int k = 0; k < kSubstreams; ++k) {
    for (int i = k * q; i < count && i < (k + 1) * q; ++i) {
      const uint32_t x = load_element(in + i * lay.elem_bytes, lay.elem_bytes);
      put_element(dtype, x, ref, lens, codes, pc, w);
      uint32_t t, extra;
      uint8_t raw[kMaxPlanes];
      split_element(dtype, x, &t, raw, &extra);
      for (int p = 0, j = 0; p < lay.raw_bytes; ++p)
        if (!((pc.mask >> p) & 1)) body[i * st.raw_bytes + j++] = raw[p];
      extras.put(extra >> sign_coded, st.extra_bits);
    }
    w.flush();
  }
  extras.flush();
  return make_descriptor(coded, ref, 1);
}

// §6: reads bits LSB first from [p, p + nbytes), never past the end.
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
  ZC_HD bool finished() const { return (pos + 7) / 8 == nbytes && !((pos & 7) && (p[nbytes - 1] >> (pos & 7))); }
};

// §2: checks a coded block's layout; bounds[k] receives where sub-stream k
// starts (bounds[kSubstreams] = size), relative to body. Also checks the
// extra area's padding bits. Returns a Status.
ZC_HD int locate_substreams(const uint8_t* body, uint32_t size, int count, Layout lay, uint32_t* bounds) {
  const uint32_t sizes_at = uint32_t(count) * lay.raw_bytes + extra_area_bytes(count, lay);
  if (size <= sizes_at + kSubstreamHeader || size >= uint32_t(count) * lay.elem_bytes) return kErrBlockSize;
  const uint32_t used_bits = uint32_t(count) * lay.extra_bits;
  if ((used_bits & 7) && (body[sizes_at - 1] >> (used_bits & 7))) return kErrTrailing;
  bounds[0] = sizes_at + kSubstreamHeader;
  for (int k = 0; k + 1 < kSubstreams; ++k) {
    bounds[k + 1] = bounds[k] + (body[sizes_at + 2 * k] | (uint32_t(body[sizes_at + 2 * k + 1]) << 8));
    if (bounds[k + 1] > size) return kErrBlockSize;
  }
  bounds[kSubstreams] = size;
  return kOk;
}

// The extra value of element i of a coded block (§2: packed LSB first).
ZC_HD uint32_t load_extra(const uint8_t* area, int i, Layout lay) {
  if (!lay.extra_bits) return 0;  // float16 with a coded sign has no extra area
  const uint32_t bit = uint32_t(i) * lay.extra_bits;
  const uint32_t two = area[bit >> 3] | (((bit & 7) + lay.extra_bits > 8) ? uint32_t(area[(bit >> 3) + 1]) << 8 : 0u);
  return (two >> (bit & 7)) & ((1u << lay.extra_bits) - 1);
}

// §6: decodes element i of a coded block of count elements (body: the
// block's body) from its sub-stream r into dst; lut and pc.luts: the group's
// decode tables. Returns a Status.
ZC_HD int decode_element(int dtype, const uint8_t* body, int count, int i, uint32_t ref, const uint16_t* lut,
                         const PlaneCodes& pc, BitReader& r, uint8_t* dst) {
  const Layout lay = layout_of(dtype), st = group_layout(lay, pc.mask);
  const bool sign_coded = pc.mask & kMaskSign;
  const uint16_t entry = lut[r.peek(kMaxCodeLen)];
  if (!entry || !r.skip(entry >> 8)) return kErrBitstream;
  int c = (entry & 0xFF) >> kTopBits;
  uint32_t e = 0, sign = 0;
  if (c == kClassEsc) {  // the exponent, then the sign if coded
    e = r.peek(lay.exp_bits + sign_coded);
    if (!r.skip(lay.exp_bits + sign_coded)) return kErrBitstream;
    sign = e >> lay.exp_bits;
    e &= (1u << lay.exp_bits) - 1;
  } else {
    if (sign_coded) {
      sign = uint32_t(c) >> 4;
      c &= 15;
      if (c == 15) return kErrBitstream;  // §4.1: no sign-coded class
    }
    if (c != kClassZero) {
      if (uint32_t(c - 1) >= ref) return kErrBitstream;  // would give e == 0
      e = ref - uint32_t(c - 1);
    }
  }
  uint8_t raw[kMaxPlanes];
  for (int p = 0, j = 0; p < lay.raw_bytes; ++p) {
    if (!((pc.mask >> p) & 1)) {
      raw[p] = body[i * st.raw_bytes + j++];
      continue;
    }
    const uint16_t byte = pc.luts[p][r.peek(kMaxCodeLen)];
    if (!byte || !r.skip(byte >> 8)) return kErrBitstream;
    raw[p] = uint8_t(byte);
  }
  const uint32_t extra = load_extra(body + count * st.raw_bytes, i, st) << sign_coded | sign;
  store_element(dst, join_element(dtype, e, entry & ((1u << kTopBits) - 1), raw, extra), lay.elem_bytes);
  return kOk;
}

// §2: decodes sub-stream k of a coded block (body, count elements, its
// sub-stream bounds from locate_substreams) into out. Returns a Status.
ZC_HD int decode_substream(int dtype, const uint8_t* body, int count, int k, const uint32_t* bounds, uint32_t ref,
                           const uint16_t* lut, const PlaneCodes& pc, uint8_t* out) {
  const int q = substream_len(count);
  BitReader r{body + bounds[k], bounds[k + 1] - bounds[k], 0};
  for (int i = k * q; i < count && i < (k + 1) * q; ++i) {
    const int status = decode_element(dtype, body, count, i, ref, lut, pc, r, out + i * layout_of(dtype).elem_bytes);
    if (status != kOk) return status;
  }
  return r.finished() ? kOk : kErrTrailing;
}

// Decodes one block body into count elements at out; lut is the decode
// table of the block's group (null if the group's table is invalid, which
// only matters to coded blocks), pc.luts its plane tables. Returns a Status.
ZC_HD int decode_block(int dtype, const uint8_t* body, uint32_t desc, int count, const uint16_t* lut,
                       uint8_t* out, const PlaneCodes& pc = PlaneCodes{}) {
  const Layout lay = layout_of(dtype), st = group_layout(lay, pc.mask);
  const uint32_t size = desc & 0xFFFFu, ref = (desc >> 16) & 0xFFu, mode = desc >> 24;
  if (mode == 0) {
    if (size != uint32_t(count) * lay.elem_bytes) return kErrBlockSize;
    for (uint32_t i = 0; i < size; ++i) out[i] = body[i];
    return kOk;
  }
  if (mode != 1) return kErrBlockMode;
  uint32_t bounds[kSubstreams + 1];
  int status = locate_substreams(body, size, count, st, bounds);
  if (status != kOk) return status;
  if (!lut) return kErrTable;
  for (int k = 0; k < kSubstreams && status == kOk; ++k)
    status = decode_substream(dtype, body, count, k, bounds, ref, lut, pc, out);
  return status;
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
// the flags byte, *mask_bits the bits a group mask may have.
ZC_HD int check_header(const uint8_t* in, uint64_t size, int dtype, uint64_t n, int* flags, int* mask_bits) {
  if (size < uint64_t(kHeaderBytes)) return kErrTruncated;
  for (int i = 0; i < 4; ++i)
    if (in[i] != uint8_t("ZCCL"[i])) return kErrMagic;
  if (in[4] < 1 || in[4] > kVersion || in[7] != kBlockLog2) return kErrVersion;
  if (in[5] != dtype) return kErrDType;
  uint64_t count = 0;
  for (int i = 0; i < 8; ++i) count |= uint64_t(in[8 + i]) << (8 * i);
  if (count != n) return kErrCount;
  // A group mask may have a bit per raw byte plane and, from version 2, the sign bit.
  *mask_bits = ((1 << layout_of(dtype).raw_bytes) - 1) | (in[4] >= 2 ? kMaskSign : 0);
  const int f = in[6];  // masks need a bit to carry, and make no sense in a raw stream
  if ((f & ~(kFlagStoredRaw | kFlagMasks)) || ((f & kFlagMasks) && (!*mask_bits || (f & kFlagStoredRaw))))
    return kErrFlags;
  *flags = in[6];
  return kOk;
}

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
