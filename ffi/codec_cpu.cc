#include "codec_cpu.h"

#include "block_cpu.h"

#include <cstring>
#include <vector>

namespace zipccl {
namespace {

constexpr uint8_t kLens[kNumTables][kNumSyms] = ZC_CODE_LENGTHS;

// Encode codes and decode tables, built once from the code lengths.
struct Tables {
  uint16_t codes[kNumTables][kNumSyms];
  uint16_t lut[kNumTables * kLutSize];
  Tables() {
    for (int t = 0; t < kNumTables; ++t) {
      canonical_codes(kLens[t], codes[t]);
      build_lut(kLens[t], lut + t * kLutSize);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

uint32_t encode(int dtype, const uint8_t* in, int count, uint8_t* body, bool generic) {
  const Tables& tab = tables();
  if (generic) return encode_block(dtype, in, count, kLens, tab.codes, body);
  if (dtype == kBF16) return encode_block_fast<kBF16>(in, count, kLens, tab.codes, body);
  if (dtype == kF16) return encode_block_fast<kF16>(in, count, kLens, tab.codes, body);
  return encode_block_fast<kF32>(in, count, kLens, tab.codes, body);
}

int decode(int dtype, const uint8_t* body, uint32_t desc, int count, uint8_t* out, bool generic) {
  const uint16_t* lut = tables().lut;
  if (generic) return decode_block(dtype, body, desc, count, lut, out);
  if (dtype == kBF16) return decode_block_fast<kBF16>(body, desc, count, lut, out);
  if (dtype == kF16) return decode_block_fast<kF16>(body, desc, count, lut, out);
  return decode_block_fast<kF32>(body, desc, count, lut, out);
}

int64_t store_raw(int dtype, const uint8_t* in, int64_t n, uint8_t* out) {
  write_header(out, dtype, kFlagStoredRaw, uint64_t(n));
  const int64_t bytes = n * layout_of(dtype).elem_bytes;
  std::memcpy(out + kHeaderBytes, in, size_t(bytes));
  return kHeaderBytes + bytes;
}

}  // namespace

int64_t compress_stream(int dtype, const uint8_t* in, int64_t n, uint8_t* out, bool generic) {
  const int es = layout_of(dtype).elem_bytes;
  const int64_t nb = num_blocks(n), raw_bytes = n * es;
  const int64_t limit = kHeaderBytes + raw_bytes;  // a coded stream must end before this
  int64_t pos = kHeaderBytes + 4 * nb;
  uint8_t scratch[kBlock * 4];
  for (int64_t b = 0; b < nb && pos < limit; ++b) {
    const int count = int(n - b * kBlock < kBlock ? n - b * kBlock : kBlock);
    const bool room = pos + int64_t(count) * es <= limit;
    uint8_t* body = room ? out + pos : scratch;
    const uint32_t desc = encode(dtype, in + b * kBlock * es, count, body, generic);
    const int64_t body_bytes = desc & 0xFFFFu;
    if (!room && pos + body_bytes <= limit) std::memcpy(out + pos, scratch, size_t(body_bytes));
    store_u32(out + kHeaderBytes + 4 * b, desc);
    pos += body_bytes;
  }
  if (pos >= limit) return store_raw(dtype, in, n, out);
  write_header(out, dtype, 0, uint64_t(n));
  return pos;
}

int decompress_stream(int dtype, const uint8_t* in, int64_t size, int64_t n, uint8_t* out, bool generic) {
  int flags = 0;
  int status = check_header(in, uint64_t(size), dtype, uint64_t(n), &flags);
  if (status != kOk) return status;
  const int es = layout_of(dtype).elem_bytes;
  if (flags & kFlagStoredRaw) {
    if (size - kHeaderBytes < n * es) return kErrTruncated;
    std::memcpy(out, in + kHeaderBytes, size_t(n * es));
    return kOk;
  }
  const int64_t nb = num_blocks(n);
  if ((size - kHeaderBytes) / 4 < nb) return kErrTruncated;
  int64_t pos = kHeaderBytes + 4 * nb;
  for (int64_t b = 0; b < nb; ++b) {
    const int count = int(n - b * kBlock < kBlock ? n - b * kBlock : kBlock);
    const uint32_t desc = load_u32(in + kHeaderBytes + 4 * b);
    const int64_t body_bytes = desc & 0xFFFFu;
    if (body_bytes > size - pos) return kErrTruncated;
    status = decode(dtype, in + pos, desc, count, out + b * kBlock * es, generic);
    if (status != kOk) return status;
    pos += body_bytes;
  }
  return kOk;
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
