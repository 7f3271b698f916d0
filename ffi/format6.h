// Format version 6 (docs/FORMAT.md), shared by the CPU and CUDA codecs.
//
// Plain functions of their arguments that compile for host and device; the
// prefix-code helpers (code_lengths, canonical_codes, build_lut, BitReader,
// BitWriter) and the statuses are zipccl_format.h's.
// The numpy reference (zipccl_jax/reference.py) follows FORMAT.md section
// by section; section numbers below are FORMAT.md's. The generic coder here
// is the specification in C++: the fast CPU coder (codec6_cpu.cc) and the
// CUDA kernels are tested byte for byte against it and the reference.
#pragma once

#include <cstdint>

#include "zipccl_format.h"

namespace zipccl {
namespace v6 {

constexpr int kVersion = 6;
constexpr int kLanes = 32;        // §3: value i of a block is in lane i % 32
constexpr int kDescBytes = 8;     // §2: a u64 per block
constexpr int kTableBytes = 122;  // §4: a group's code, 244 nibbles
constexpr int kGroupCode = 15;    // §2: the code field of a block coded with its group's code
constexpr int kMembers = 4;       // §5: the family's codes
constexpr int kClassZero = 0, kMaxD = 119, kClassEsc = 121;  // §1: classes 1..120 are d = 0..119
constexpr int kNumSyms = 256;     // a symbol is sign << 7 | class; classes 122..127 have no code
constexpr int kSignSym = 128;     // a symbol's sign bit
constexpr int kMaxRecord = kTableBytes + kBlock * 4;  // a record's most bytes: a table and a raw fp32 body

// §5: the family's code lengths of symbols 0..255 (0: no code), as
// reference.FAMILY_HEX (tests/test_codec_cpu.py checks they agree).
#define ZC6_FAMILY_LENGTHS { \
  {1,10,9,8,7,6,5,6,5,5,5,5,5,5,5,6,6,6,6,6,7,7,7,7,7,7,8,8,8,8,9,9,9,9,10,11,10,10,10,11,11,11,11,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,0,0,0,0,0,0,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,11,0,0,0,0,0,0}, \
  {12,1,3,2,4,8,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,0,0,0,0,0,0,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,11,0,0,0,0,0,0}, \
  {12,10,9,8,7,6,6,6,6,6,6,6,6,6,6,6,6,6,6,6,6,6,6,7,7,7,7,7,7,7,8,8,8,8,9,9,9,9,9,10,10,10,10,11,11,11,11,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,0,0,0,0,0,0,11,12,12,12,12,12,12,12,12,12,11,11,10,10,10,9,6,4,4,5,4,4,4,5,5,5,6,6,6,7,7,7,7,8,8,8,8,8,9,9,9,9,9,9,10,10,10,10,10,10,10,11,10,10,11,11,11,11,11,11,11,11,11,12,12,11,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,11,0,0,0,0,0,0}, \
  {12,9,8,8,7,6,6,5,5,5,5,5,5,5,5,5,6,6,6,6,6,7,7,7,7,8,8,8,8,9,9,9,9,10,10,10,11,10,11,11,12,11,11,11,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,0,0,0,0,0,0,12,9,8,8,7,6,6,5,5,5,5,5,5,5,5,5,5,6,6,6,6,7,7,7,7,7,8,8,8,9,9,9,9,9,10,10,10,10,11,11,11,11,11,11,11,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,12,0,0,0,0,0,0} }
constexpr uint8_t kFamily[kMembers][kNumSyms] = ZC6_FAMILY_LENGTHS;

// §1: an element is sign | q (q_bits) | low (low_bits).
struct Layout {
  int elem_bytes, q_bits, low_bits;
  uint32_t q_max;  // q of the all-ones exponent (Inf, NaN)
};

ZC_HD constexpr Layout layout_of(int dtype) {
  if (dtype == kBF16) return {2, 10, 5, 1020};
  if (dtype == kF16) return {2, 7, 8, 124};
  return {4, 10, 21, 1020};
}

ZC_HD uint32_t q_of(uint32_t x, Layout lay) { return (x >> lay.low_bits) & ((1u << lay.q_bits) - 1); }
ZC_HD uint32_t low_of(uint32_t x, Layout lay) { return x & ((1u << lay.low_bits) - 1); }
ZC_HD uint32_t sign_of(uint32_t x, Layout lay) { return x >> (8 * lay.elem_bytes - 1); }
ZC_HD bool normal_q(uint32_t q, Layout lay) { return q - 4u < lay.q_max - 4u; }  // 4 <= q < q_max
ZC_HD int class_of_symbol(int sym) { return sym & (kSignSym - 1); }

// §1: element x's symbol against ref.
ZC_HD int symbol_of(uint32_t x, Layout lay, uint32_t ref) {
  const uint32_t q = q_of(x, lay);
  int cls = kClassEsc;
  if (q == 0 && low_of(x, lay) == 0) cls = kClassZero;
  else if (normal_q(q, lay) && q <= ref && ref - q <= uint32_t(kMaxD)) cls = int(ref - q) + 1;
  return int(sign_of(x, lay) << 7) | cls;
}

// §3: the bits a value of this symbol stores beside its code.
ZC_HD int fixed_bits(int sym, Layout lay) {
  const int cls = class_of_symbol(sym);
  return cls == kClassZero ? 0 : cls == kClassEsc ? lay.q_bits + lay.low_bits : lay.low_bits;
}

// §6 step 1: a block's own ref, the largest normal q of its count elements (0 if none).
ZC_HD uint32_t block_ref(const uint8_t* in, int count, Layout lay) {
  uint32_t ref = 0;
  for (int i = 0; i < count; ++i) {
    const uint32_t q = q_of(load_element(in + i * lay.elem_bytes, lay.elem_bytes), lay);
    if (normal_q(q, lay) && q > ref) ref = q;
  }
  return ref;
}

// §6 step 4: the symbol a value of symbol sym at its block's ref has at a ref
// `shift` higher (its class moves by shift; past d = 119 it escapes).
ZC_HD int shifted_symbol(int sym, uint32_t shift) {
  const int cls = class_of_symbol(sym);
  if (cls == kClassZero || cls == kClassEsc) return sym;
  const uint32_t moved = uint32_t(cls) + shift;
  return (sym & kSignSym) | int(moved <= uint32_t(kMaxD + 1) ? moved : uint32_t(kClassEsc));
}

// §2: a block's descriptor.
struct Desc {
  uint32_t end, ref, code, flip, raw, table, reserved;
};

ZC_HD uint64_t load_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

ZC_HD int64_t data_offset(int64_t nb) { return kHeaderBytes + int64_t(kDescBytes) * nb; }

ZC_HD Desc read_desc(const uint8_t* stream, int64_t b) {
  const uint64_t v = load_u64(stream + kHeaderBytes + kDescBytes * b);
  return {uint32_t(v), uint32_t(v >> 32) & 0x3FFu, uint32_t(v >> 42) & 15u, uint32_t(v >> 46) & 1u,
          uint32_t(v >> 47) & 1u, uint32_t(v >> 48) & 1u, uint32_t(v >> 49)};
}

ZC_HD void store_desc(uint8_t* p, uint32_t end, uint32_t ref, int code, int flip, bool raw, bool table) {
  const uint64_t v = uint64_t(end) | uint64_t(ref) << 32 | uint64_t(code) << 42 | uint64_t(flip) << 46 |
                     uint64_t(raw) << 47 | uint64_t(table) << 48;
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}

// §2, §5: the code lengths of a block's code: family member `code` or the
// group's (code 15), read with the sign inverted if flip. family: kFamily, or
// the device's copy of it.
ZC_HD void block_lengths(int code, int flip, const uint8_t* group, const uint8_t (*family)[kNumSyms], uint8_t* lens) {
  const uint8_t* src = code == kGroupCode ? group : family[code];
  for (int s = 0; s < kNumSyms; ++s) lens[s] = src[s ^ (flip ? kSignSym : 0)];
}

// §4: a group's code as 122 bytes (valid symbols in order, two a byte, the first low).
ZC_HD void pack_table(const uint8_t* lens, uint8_t* out) {
  int j = 0;
  for (int s = 0; s < kNumSyms; ++s) {
    if (class_of_symbol(s) > kClassEsc) continue;
    if (j % 2 == 0) out[j / 2] = uint8_t(lens[s]);
    else out[j / 2] |= uint8_t(lens[s] << 4);
    ++j;
  }
}

// §4: reads and checks a group table. Returns a Status.
ZC_HD int unpack_table(const uint8_t* in, uint8_t* lens) {
  int j = 0;
  uint32_t kraft = 0, longest = 0;
  for (int s = 0; s < kNumSyms; ++s) {
    lens[s] = 0;
    if (class_of_symbol(s) > kClassEsc) continue;
    lens[s] = uint8_t((in[j / 2] >> (4 * (j % 2))) & 15);
    ++j;
    longest = lens[s] > longest ? lens[s] : longest;
    if (lens[s] && lens[s] <= kMaxCodeLen) kraft += 1u << (kMaxCodeLen - lens[s]);
  }
  return (longest > uint32_t(kMaxCodeLen) || kraft == 0 || kraft > uint32_t(kLutSize)) ? kErrGroupTable : kOk;
}

// §3: the bits before lane 0 (the width field and 31 deviations), and the
// base lane lengths are stored relative to, for a body of size bytes.
ZC_HD int head_bits(int width) { return (kLanes - 1) * width + width_field_bits(width); }
ZC_HD uint32_t length_base(uint32_t size, uint32_t head) {
  const int64_t bits = 8 * int64_t(size) - head;
  return bits > 0 ? uint32_t(bits / kLanes) : 0;
}

// §6 step 3: the narrowest width for lanes of bits[0..31]; devs receives
// dev_0..dev_30 and *size the body's bytes. Returns the width.
ZC_HD int choose_width(const uint32_t* bits, int32_t* devs, uint32_t* size) {
  uint64_t all = 0;
  for (int k = 0; k < kLanes; ++k) all += bits[k];
  for (int w = 1;; ++w) {
    *size = uint32_t((head_bits(w) + all + 7) / 8);
    const int32_t base = int32_t(length_base(*size, uint32_t(head_bits(w)))), lim = 1 << (w - 1);
    bool fit = true;
    for (int k = 0; k < kLanes - 1; ++k) {
      devs[k] = int32_t(bits[k]) - base;
      fit = fit && devs[k] >= -lim && devs[k] < lim;
    }
    if (fit || w == kMaxWidth) return w;  // a lane of a block holds < 2^13 bits: 20 bits always fit
  }
}

// §3: where the lanes of a coded body (size bytes) start: starts[k] in bits,
// starts[32] = the body's end. Returns a Status.
ZC_HD int locate_lanes(const uint8_t* body, uint32_t size, uint32_t* starts) {
  const uint32_t end = 8 * size;
  BitReader r{body, size, 0, end};
  uint32_t f;
  if (!r.take(3, &f)) return kErrBody;
  int width = int(f) + kWidthShort;
  if (f == 7) {
    if (!r.take(5, &f)) return kErrBody;
    if (f < 1 || f > uint32_t(kMaxWidth)) return kErrBody;
    width = int(f);
  }
  const uint32_t head = r.pos + uint32_t((kLanes - 1) * width);
  const uint32_t base = length_base(size, head);
  int64_t at = head;
  bool ok = head <= end;
  starts[0] = head;
  for (int k = 0; k + 1 < kLanes; ++k) {
    uint32_t v;
    r.take(width, &v);  // past the end reads 0; then head > end fails below
    const int64_t len = int64_t(base) + (int64_t(v) - ((v >> (width - 1)) ? (int64_t(1) << width) : 0));
    ok = ok && len >= 0;
    at += len;
    ok = ok && at <= end;
    starts[k + 1] = ok ? uint32_t(at) : end;
  }
  starts[kLanes] = end;
  return ok ? kOk : kErrBody;
}

// §3: the bits element x takes in its lane under code lens (0 = no code:
// the caller never asks).
ZC_HD uint32_t element_bits(uint32_t x, Layout lay, uint32_t ref, const uint8_t* lens) {
  const int s = symbol_of(x, lay, ref);
  return lens[s] + uint32_t(fixed_bits(s, lay));
}

// §3: puts element x's code, an escape's q and its low bits to w.
template <typename Writer>
ZC_HD void put_element(uint32_t x, Layout lay, uint32_t ref, const uint8_t* lens, const uint16_t* codes, Writer& w) {
  const int s = symbol_of(x, lay, ref), cls = class_of_symbol(s);
  w.put(codes[s], lens[s]);
  if (cls == kClassEsc) w.put(q_of(x, lay), lay.q_bits);
  if (cls != kClassZero) w.put(low_of(x, lay), lay.low_bits);
}

// §3: the lanes' bits of a block of count elements (bytes at in) under code
// lens at ref; returns false if some element's symbol has no code.
ZC_HD bool lane_bits(const uint8_t* in, int count, Layout lay, uint32_t ref, const uint8_t* lens, uint32_t* bits) {
  for (int k = 0; k < kLanes; ++k) bits[k] = 0;
  bool coded = true;
  for (int i = 0; i < count; ++i) {
    const uint32_t x = load_element(in + i * lay.elem_bytes, lay.elem_bytes);
    coded = coded && lens[symbol_of(x, lay, ref)];
    bits[i % kLanes] += element_bits(x, lay, ref, lens);
  }
  return coded;
}

// §3: a coded body's bytes under code lens at ref (the largest uint32_t if
// some element has no code).
ZC_HD uint32_t body_size(const uint8_t* in, int count, Layout lay, uint32_t ref, const uint8_t* lens) {
  uint32_t bits[kLanes], size;
  int32_t devs[kLanes - 1];
  if (!lane_bits(in, count, lay, ref, lens, bits)) return 0xFFFFFFFFu;
  choose_width(bits, devs, &size);
  return size;
}

// §3: writes a block's coded body (body_size bytes) to body.
ZC_HD uint32_t encode_body(const uint8_t* in, int count, Layout lay, uint32_t ref, const uint8_t* lens,
                           const uint16_t* codes, uint8_t* body) {
  uint32_t bits[kLanes], size;
  int32_t devs[kLanes - 1];
  lane_bits(in, count, lay, ref, lens, bits);
  const int width = choose_width(bits, devs, &size);
  BitWriter w{body, 0, 0};
  put_width(width, w);
  for (int k = 0; k + 1 < kLanes; ++k) w.put(uint32_t(devs[k]) & ((1u << width) - 1), width);
  for (int k = 0; k < kLanes; ++k)
    for (int i = k; i < count; i += kLanes) put_element(load_element(in + i * lay.elem_bytes, lay.elem_bytes), lay, ref, lens, codes, w);
  w.flush();
  return size;
}

// §3: decodes the next element of a lane into *x. Returns a Status.
template <typename Reader>
ZC_HD int decode_element(Layout lay, uint32_t ref, const uint16_t* lut, Reader& r, uint32_t* x) {
  const uint16_t entry = lut[r.peek(kMaxCodeLen)];
  if (!(entry >> 8) || !r.skip(entry >> 8)) return kErrBitstream;
  const int s = entry & 0xFF, cls = class_of_symbol(s);
  uint32_t q = 0, low = 0;
  if (cls == kClassEsc) {
    if (!r.take(lay.q_bits, &q)) return kErrBitstream;
  } else if (cls != kClassZero) {
    q = ref - uint32_t(cls - 1);
    if (!normal_q(q, lay)) return kErrBitstream;
  }
  if (cls != kClassZero && !r.take(lay.low_bits, &low)) return kErrBitstream;
  *x = uint32_t(s >> 7) << (8 * lay.elem_bytes - 1) | q << lay.low_bits | low;
  return kOk;
}

// §3: how lane k must end once decoded to bit pos: at the next lane's start;
// the last lane in the body's last byte, padded with zero bits. Returns a Status.
ZC_HD int lane_end_status(const uint8_t* body, int k, uint32_t pos, const uint32_t* starts) {
  if (k + 1 < kLanes) return pos == starts[k + 1] ? kOk : kErrTrailing;
  if ((pos + 7) / 8 != starts[kLanes] / 8) return kErrTrailing;
  return ((pos & 7) && (body[pos / 8] >> (pos & 7))) ? kErrTrailing : kOk;
}

// §3: decodes a coded body (size bytes, count elements) with decode table lut
// (build_lut of the block's lengths) into out, lane by lane: the first lane
// that fails gives the Status.
ZC_HD int decode_body(const uint8_t* body, uint32_t size, int count, Layout lay, uint32_t ref, const uint16_t* lut,
                      uint8_t* out) {
  uint32_t starts[kLanes + 1];
  const int status = locate_lanes(body, size, starts);
  if (status != kOk) return status;
  for (int k = 0; k < kLanes; ++k) {
    BitReader r{body, size, starts[k], starts[k + 1]};
    for (int i = k; i < count; i += kLanes) {
      uint32_t x;
      const int st = decode_element(lay, ref, lut, r, &x);
      if (st != kOk) return st;
      store_element(out + i * lay.elem_bytes, x, lay.elem_bytes);
    }
    const int st = lane_end_status(body, k, r.pos, starts);
    if (st != kOk) return st;
  }
  return kOk;
}

// §2: what block b of a stream (size bytes, nb blocks, count elements in the
// block) is, from its own descriptor, the one before it and, for code 15, its
// group's first block's: where its body is, and how to decode it.
struct BlockPlan {
  uint32_t start, end;  // the body, in bytes from the data area
  uint32_t table_at;    // code 15: the group table, in bytes from the data area
  Desc d;
};

// §2: where the table of the group whose first block is `first` lies (bytes from the data area,
// *at): false unless that block's descriptor holds one within the stream (the group's first block
// is checked on its own; here only that its table is in the buffer).
ZC_HD bool group_table_at(const uint8_t* stream, int64_t size, int64_t nb, int64_t first, uint32_t* at) {
  const Desc fd = read_desc(stream, first);
  *at = first ? read_desc(stream, first - 1).end : 0;
  return fd.table && *at <= fd.end && fd.end - *at >= uint32_t(kTableBytes) && data_offset(nb) + fd.end <= size;
}

// §2: checks block b's descriptors, in the reference's order. Returns a Status.
ZC_HD int plan_block(const uint8_t* stream, int64_t size, int64_t nb, int64_t b, int count, Layout lay, BlockPlan* p) {
  const int64_t data_at = data_offset(nb);
  const Desc d = read_desc(stream, b);
  uint32_t start = b ? read_desc(stream, b - 1).end : 0;
  p->d = d;
  if (d.reserved || d.ref >= (1u << lay.q_bits) || (d.table && b % kGroupBlocks)) return kErrDescriptor;
  if (data_at + d.end > size) return kErrTruncated;
  if (start > d.end) return kErrDescriptor;
  if (d.table) {
    if (d.end - start < uint32_t(kTableBytes)) return kErrDescriptor;
    start += kTableBytes;
  }
  p->start = start;
  p->end = d.end;
  const uint32_t raw_bytes = uint32_t(count) * uint32_t(lay.elem_bytes);
  if (d.raw) return (d.ref || d.code || d.flip || d.end - start != raw_bytes) ? kErrDescriptor : kOk;
  if (d.end - start >= raw_bytes) return kErrDescriptor;
  if (d.code == kGroupCode)
    return group_table_at(stream, size, nb, b - b % kGroupBlocks, &p->table_at) ? kOk : kErrDescriptor;
  return d.code < uint32_t(kMembers) ? kOk : kErrDescriptor;
}

// §1: the header against the expected dtype and count. Returns a Status; *flags its flags.
ZC_HD int check_header(const uint8_t* in, int64_t size, int dtype, int64_t n, int* flags) {
  if (size < kHeaderBytes) return kErrTruncated;
  if (in[0] != 'Z' || in[1] != 'C' || in[2] != 'C' || in[3] != 'L') return kErrMagic;
  if (in[4] != kVersion || in[7] != kBlockLog2) return kErrVersion;
  if (in[5] != dtype) return kErrDType;
  if (int64_t(load_u64(in + 8)) != n) return kErrCount;
  if (in[6] & ~kFlagStoredRaw) return kErrFlags;
  *flags = in[6];
  return kOk;
}

ZC_HD void write_header(uint8_t* out, int dtype, int flags, int64_t n) {
  const uint8_t head[8] = {'Z', 'C', 'C', 'L', uint8_t(kVersion), uint8_t(dtype), uint8_t(flags), uint8_t(kBlockLog2)};
  for (int i = 0; i < 8; ++i) out[i] = head[i];
  for (int i = 0; i < 8; ++i) out[8 + i] = uint8_t(uint64_t(n) >> (8 * i));
}

}  // namespace v6
}  // namespace zipccl
