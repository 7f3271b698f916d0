#include "codec_cpu.h"

#include <cstring>
#include <vector>

#include "block_cpu.h"

namespace zipccl {
namespace {

// The coding state of one group of blocks (FORMAT.md §7 steps 1-2).
struct GroupCode {
  uint32_t refs[kGroupBlocks];
  uint8_t lens[kNumSyms];
  uint16_t codes[kNumSyms];
};

// Chooses refs and code for blocks [b0, b1); the fast path also keeps each
// block's key histogram in hists for the encoder.
template <int DT>
void choose_group_fast(const uint8_t* in, int64_t n, int64_t b0, int64_t b1, uint32_t* hists, GroupCode* g) {
  using E = Elem<DT>;
  uint32_t emax[kGroupBlocks], gmax = 0;
  for (int64_t b = b0; b < b1; ++b) {
    emax[b - b0] = block_histogram<DT>(in + b * kBlock * E::lay.elem_bytes, block_count(n, b), hists + (b - b0) * E::keys);
    gmax = emax[b - b0] > gmax ? emax[b - b0] : gmax;
  }
  uint32_t counts[2][kNumSyms] = {};
  uint8_t lens[2][kNumSyms];
  for (int64_t b = b0; b < b1; ++b) {
    add_counts<DT>(hists + (b - b0) * E::keys, gmax, counts[0]);
    add_counts<DT>(hists + (b - b0) * E::keys, emax[b - b0], counts[1]);
  }
  code_lengths(counts[0], lens[0]);
  code_lengths(counts[1], lens[1]);
  const bool own = code_cost(counts[1], lens[1], E::lay.exp_bits) < code_cost(counts[0], lens[0], E::lay.exp_bits);
  for (int64_t b = b0; b < b1; ++b) g->refs[b - b0] = own ? emax[b - b0] : gmax;
  std::memcpy(g->lens, lens[own], kNumSyms);
  canonical_codes(g->lens, g->codes);
}

// The same choice with the shared (CUDA) functions of zipccl_format.h.
void choose_group_generic(int dtype, const uint8_t* in, int64_t n, int64_t b0, int64_t b1, GroupCode* g) {
  const int es = layout_of(dtype).elem_bytes;
  uint32_t emax[kGroupBlocks], gmax = 0;
  for (int64_t b = b0; b < b1; ++b) {
    emax[b - b0] = block_emax(dtype, in + b * kBlock * es, block_count(n, b));
    gmax = emax[b - b0] > gmax ? emax[b - b0] : gmax;
  }
  uint32_t counts[2][kNumSyms] = {};
  uint8_t lens[2][kNumSyms];
  for (int64_t b = b0; b < b1; ++b) {
    add_symbol_counts(dtype, in + b * kBlock * es, block_count(n, b), gmax, counts[0]);
    add_symbol_counts(dtype, in + b * kBlock * es, block_count(n, b), emax[b - b0], counts[1]);
  }
  code_lengths(counts[0], lens[0]);
  code_lengths(counts[1], lens[1]);
  const int exp_bits = layout_of(dtype).exp_bits;
  const bool own = code_cost(counts[1], lens[1], exp_bits) < code_cost(counts[0], lens[0], exp_bits);
  for (int64_t b = b0; b < b1; ++b) g->refs[b - b0] = own ? emax[b - b0] : gmax;
  std::memcpy(g->lens, lens[own], kNumSyms);
  canonical_codes(g->lens, g->codes);
}

int64_t store_raw(int dtype, const uint8_t* in, int64_t n, uint8_t* out) {
  write_header(out, dtype, kFlagStoredRaw, uint64_t(n));
  const int64_t bytes = n * layout_of(dtype).elem_bytes;
  std::memcpy(out + kHeaderBytes, in, size_t(bytes));
  return kHeaderBytes + bytes;
}

template <int DT>
int64_t compress_typed(const uint8_t* in, int64_t n, uint8_t* out, bool generic) {
  constexpr int es = Elem<DT>::lay.elem_bytes;
  const int64_t nb = num_blocks(n), limit = kHeaderBytes + n * es;  // a coded stream ends before limit
  int64_t pos = bodies_offset(n);
  std::vector<uint32_t> hists(size_t(kGroupBlocks) * Elem<DT>::keys);
  uint8_t scratch[kBlock * 4];
  GroupCode g;
  for (int64_t b0 = 0; b0 < nb && pos < limit; b0 += kGroupBlocks) {
    const int64_t b1 = b0 + kGroupBlocks < nb ? b0 + kGroupBlocks : nb;
    if (generic) choose_group_generic(DT, in, n, b0, b1, &g);
    else choose_group_fast<DT>(in, n, b0, b1, hists.data(), &g);
    pack_table(g.lens, out + kHeaderBytes + 4 * nb + kTableBytes * (b0 / kGroupBlocks));
    for (int64_t b = b0; b < b1 && pos < limit; ++b) {
      const int count = block_count(n, b);
      const bool room = pos + int64_t(count) * es <= limit;
      uint8_t* body = room ? out + pos : scratch;
      const uint8_t* src = in + b * kBlock * es;
      const uint32_t desc = generic ? encode_block(DT, src, count, g.refs[b - b0], g.lens, g.codes, body)
                                    : encode_block_fast<DT>(src, count, g.refs[b - b0],
                                                            hists.data() + (b - b0) * Elem<DT>::keys, g.lens, g.codes, body);
      const int64_t body_bytes = desc & 0xFFFFu;
      if (!room && pos + body_bytes <= limit) std::memcpy(out + pos, scratch, size_t(body_bytes));
      store_u32(out + kHeaderBytes + 4 * b, desc);
      pos += body_bytes;
    }
  }
  if (pos >= limit) return store_raw(DT, in, n, out);
  write_header(out, DT, 0, uint64_t(n));
  return pos;
}

template <int DT>
int decompress_typed(const uint8_t* in, int64_t size, int64_t n, uint8_t* out, bool generic) {
  constexpr int es = Elem<DT>::lay.elem_bytes;
  const int64_t nb = num_blocks(n);
  int64_t pos = bodies_offset(n);
  if (size < pos) return kErrTruncated;
  std::vector<uint16_t> lut(kLutSize);
  for (int64_t b = 0; b < nb; ++b) {
    const uint16_t* group_lut = nullptr;  // built when a coded block of the group needs it
    if (b % kGroupBlocks == 0) lut[0] = 0xFFFF;  // marks "not built yet"
    const uint32_t desc = load_u32(in + kHeaderBytes + 4 * b);
    if ((desc >> 24) == 1) {
      if (lut[0] == 0xFFFF) {
        uint8_t lens[kNumSyms];
        if (unpack_table(in + kHeaderBytes + 4 * nb + kTableBytes * (b / kGroupBlocks), lens) != kOk) return kErrTable;
        build_lut(lens, lut.data());
      }
      group_lut = lut.data();
    }
    const int64_t body_bytes = desc & 0xFFFFu;
    if (body_bytes > size - pos) return kErrTruncated;
    const int count = block_count(n, b);
    const int status = generic ? decode_block(DT, in + pos, desc, count, group_lut, out + b * kBlock * es)
                               : decode_block_fast<DT>(in + pos, desc, count, group_lut, out + b * kBlock * es);
    if (status != kOk) return status;
    pos += body_bytes;
  }
  return kOk;
}

}  // namespace

int64_t compress_stream(int dtype, const uint8_t* in, int64_t n, uint8_t* out, bool generic) {
  if (dtype == kBF16) return compress_typed<kBF16>(in, n, out, generic);
  if (dtype == kF16) return compress_typed<kF16>(in, n, out, generic);
  return compress_typed<kF32>(in, n, out, generic);
}

int decompress_stream(int dtype, const uint8_t* in, int64_t size, int64_t n, uint8_t* out, bool generic) {
  int flags = 0;
  const int status = check_header(in, uint64_t(size), dtype, uint64_t(n), &flags);
  if (status != kOk) return status;
  if (flags & kFlagStoredRaw) {
    const int64_t bytes = n * layout_of(dtype).elem_bytes;
    if (size - kHeaderBytes < bytes) return kErrTruncated;
    std::memcpy(out, in + kHeaderBytes, size_t(bytes));
    return kOk;
  }
  if (dtype == kBF16) return decompress_typed<kBF16>(in, size, n, out, generic);
  if (dtype == kF16) return decompress_typed<kF16>(in, size, n, out, generic);
  return decompress_typed<kF32>(in, size, n, out, generic);
}

int decompress_accumulate(int dtype, const uint8_t* in, int64_t cap, int64_t k, int64_t n, float* acc) {
  const int es = layout_of(dtype).elem_bytes;
  std::vector<uint8_t> chunk(size_t(n * es));
  for (int64_t c = 0; c < k; ++c) {
    const int status = decompress_stream(dtype, in + c * cap, cap, n, chunk.data());
    if (status != kOk) return status;
    for (int64_t j = 0; j < n; ++j) {
      const float v = element_to_f32(dtype, load_element(chunk.data() + j * es, es));
      acc[j] = c == 0 ? v : acc[j] + v;
    }
  }
  return kOk;
}

}  // namespace zipccl
