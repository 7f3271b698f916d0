// CPU codec: the XLA FFI handlers for platform "cpu".
//
// Handlers only unpack buffers and loop over batch items or rows; the stream
// coder of format version 6 (docs/FORMAT.md) is in codec6_cpu.h, its block
// coder in format6.h.
// The public ops (compress, decompress, decompress_accumulate) take batches
// of items at the worst-case capacity; the collectives' ops (stream_sizes,
// encode_rows, decode_rows, decode_accumulate_rows) cut one flat array into
// rows (zipccl_rows.h) and move them at a rung's capacity, one buffer per
// destination, so that no worst-case payload exists (docs/DESIGN.md, Memory).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "codec6_cpu.h"
#include "accumulate_cpu.h"
#include "zipccl_rows.h"
#include "xla/ffi/api/ffi.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#endif

namespace ffi = xla::ffi;

namespace {

using zipccl::DType;

// Maps an XLA element type to a format dtype code, or 0 if unsupported.
int dtype_code(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::BF16: return zipccl::kBF16;
    case ffi::DataType::F16: return zipccl::kF16;
    case ffi::DataType::F32: return zipccl::kF32;
    default: return 0;
  }
}

ffi::Error bad_dtype(ffi::DataType t) {
  return ffi::Error::InvalidArgument("zipccl: unsupported dtype (XLA element type " +
                                     std::to_string(static_cast<int>(t)) +
                                     "); supported: bfloat16, float16, float32");
}

ffi::Error corrupt(int64_t item, int status) {
  return ffi::Error(ffi::ErrorCode::kDataLoss, "zipccl: corrupt payload (stream " +
                                                   std::to_string(item) +
                                                   "): " + zipccl::error_message(status));
}

// XLA:CPU runs handlers with flush-to-zero and denormals-are-zero on; the
// accumulate must add subnormals exactly as numpy does (FORMAT.md §8), so it
// turns both off while it runs.
class ExactSubnormals {
 public:
#if defined(__x86_64__) || defined(_M_X64)
  ExactSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ & ~0x8040u); }
  ~ExactSubnormals() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#endif
};

// The payload's last dimension is the per-stream capacity; the rest are batch.
int64_t last_dim(ffi::Span<const int64_t> dims) { return dims.size() == 0 ? 0 : dims.back(); }

ffi::Error Compress(ffi::AnyBuffer x, ffi::Result<ffi::Buffer<ffi::U8>> payload,
                    ffi::Result<ffi::Buffer<ffi::U32>> sizes, int64_t item_elems) {
  const int dtype = dtype_code(x.element_type());
  if (!dtype) return bad_dtype(x.element_type());
  const int64_t cap = last_dim(payload->dimensions());
  const int64_t batch = sizes->element_count();
  if (item_elems < 0 || int64_t(x.element_count()) != batch * item_elems ||
      int64_t(payload->element_count()) != batch * cap ||
      cap < zipccl::max_stream_bytes(item_elems, dtype))
    return ffi::Error::InvalidArgument("zipccl: compress buffer shapes do not match item_elems");
  if (item_elems > zipccl::v6::max_elements(dtype))  // a stream's length is a uint32 (FORMAT.md §1)
    return ffi::Error::InvalidArgument("zipccl: a stream could exceed 4 GiB: compress fewer elements per item");
  const int64_t item_bytes = item_elems * zipccl::dtype_bytes(dtype);
  const auto* in = static_cast<const uint8_t*>(x.untyped_data());
  for (int64_t i = 0; i < batch; ++i) {
    sizes->typed_data()[i] = static_cast<uint32_t>(zipccl::v6::compress_stream(
        dtype, in + i * item_bytes, item_elems, payload->typed_data() + i * cap));
  }
  return ffi::Error::Success();
}

ffi::Error Decompress(ffi::Buffer<ffi::U8> payload, ffi::Result<ffi::AnyBuffer> out,
                      int64_t item_elems) {
  const int dtype = dtype_code(out->element_type());
  if (!dtype) return bad_dtype(out->element_type());
  const int64_t cap = last_dim(payload.dimensions());
  const int64_t batch = cap ? int64_t(payload.element_count()) / cap : 0;
  if (item_elems < 0 || int64_t(out->element_count()) != batch * item_elems)
    return ffi::Error::InvalidArgument("zipccl: decompress buffer shapes do not match item_elems");
  const int64_t item_bytes = item_elems * zipccl::dtype_bytes(dtype);
  auto* dst = static_cast<uint8_t*>(out->untyped_data());
  for (int64_t i = 0; i < batch; ++i) {
    const int status = zipccl::v6::decompress_stream(dtype, payload.typed_data() + i * cap, cap,
                                                 item_elems, dst + i * item_bytes);
    if (status != zipccl::kOk) return corrupt(i, status);
  }
  return ffi::Error::Success();
}

ffi::Error DecompressAccumulate(ffi::Buffer<ffi::U8> payload, ffi::Result<ffi::AnyBuffer> out,
                                int64_t item_elems, int32_t dtype) {
  const int out_dtype = dtype_code(out->element_type());
  if (!out_dtype) return bad_dtype(out->element_type());
  if (dtype < zipccl::kBF16 || dtype > zipccl::kF32 || (out_dtype != dtype && out_dtype != zipccl::kF32))
    return ffi::Error::InvalidArgument("zipccl: accumulate output must be the input dtype or float32");
  const auto dims = payload.dimensions();
  if (dims.size() < 2) return ffi::Error::InvalidArgument("zipccl: accumulate payload needs rank >= 2");
  const int64_t cap = dims[dims.size() - 1], k = dims[dims.size() - 2];
  const int64_t batch = (cap && k) ? int64_t(payload.element_count()) / (cap * k) : 0;
  if (item_elems < 0 || int64_t(out->element_count()) != batch * item_elems)
    return ffi::Error::InvalidArgument("zipccl: accumulate buffer shapes do not match item_elems");
  const int out_bytes = zipccl::dtype_bytes(out_dtype);
  auto* dst = static_cast<uint8_t*>(out->untyped_data());
  std::unique_ptr<float[]> acc(new float[size_t(item_elems > 0 ? item_elems : 1)]);
  const ExactSubnormals exact;
  for (int64_t i = 0; i < batch; ++i) {
    const int status = zipccl::v6::decompress_accumulate(dtype, payload.typed_data() + i * k * cap, cap, k,
                                                     item_elems, acc.get());
    if (status != zipccl::kOk) return corrupt(i, status);
    zipccl::round_elements(out_dtype, acc.get(), item_elems, dst + i * item_elems * out_bytes);
  }
  return ffi::Error::Success();
}

// ---- the collectives' row ops ----

// Uninitialised bytes for one call (a vector would zero, touching every
// page); glibc serves repeated sizes from its heap after the first call.
std::unique_ptr<uint8_t[]> scratch_bytes(int64_t bytes) {
  return std::unique_ptr<uint8_t[]>(new uint8_t[size_t(bytes > 0 ? bytes : 1)]);
}

// Writes the stream of the n elements at in to out[0, cap) (with the size
// pass's plan, if any) and zeros the rest of the row; returns its length, or
// -1 when it is longer than cap.
int64_t compress_bounded(int dtype, const uint8_t* in, int64_t n, uint8_t* out, int64_t cap, const uint8_t* plan) {
  const int64_t len = zipccl::v6::compress_stream(dtype, in, n, out, false, plan, cap);  // never past cap
  if (len < 0) return -1;
  std::memset(out + len, 0, size_t(cap - len));
  return len;
}

// The flat array the row ops cut: one or more buffers (a bucket's leaves)
// end to end, never joined in memory. Byte: const uint8_t or uint8_t.
template <typename Byte>
struct Leaves {
  std::vector<Byte*> data;
  std::vector<int64_t> end;  // cumulative element counts
  int es = 0;

  int64_t size() const { return end.empty() ? 0 : end.back(); }

  // Calls f(leaf bytes, offset within [0, count), elements) for the pieces
  // of elements [at, at + count), which lie within the array.
  template <typename F>
  void pieces(int64_t at, int64_t count, F f) const {
    size_t i = size_t(std::upper_bound(end.begin(), end.end(), at) - end.begin());
    for (int64_t done = 0; done < count; ++i) {
      const int64_t begin = i ? end[i - 1] : 0, take = std::min(count - done, end[i] - (at + done));
      f(data[i] + (at + done - begin) * es, done, take);
      done += take;
    }
  }

  // Elements [at, at + count) as one pointer when one leaf holds them all, else null.
  Byte* span(int64_t at, int64_t count) const {
    Byte* p = nullptr;
    int pieces_seen = 0;
    pieces(at, count, [&](Byte* q, int64_t, int64_t) { p = q, ++pieces_seen; });
    return pieces_seen == 1 ? p : nullptr;
  }
};

// The leaves of one dtype from the buffers a handler gets; a dtype error
// for any other, or for leaves that differ.
template <typename Byte, typename Get>
ffi::ErrorOr<Leaves<Byte>> leaves_of(size_t count, int* dtype, Get get) {
  Leaves<Byte> l;
  for (size_t i = 0; i < count; ++i) {
    auto b = get(i);
    if (b.has_error()) return ffi::Unexpected(b.error());
    const int d = dtype_code(b->element_type());
    if (!d) return ffi::Unexpected(bad_dtype(b->element_type()));
    if (i && d != *dtype) return ffi::Unexpected(ffi::Error::InvalidArgument("zipccl: the leaves differ in dtype"));
    *dtype = d;
    l.data.push_back(static_cast<Byte*>(b->untyped_data()));
    l.end.push_back(l.size() + int64_t(b->element_count()));
  }
  if (count == 0) return ffi::Unexpected(ffi::Error::InvalidArgument("zipccl: the row ops need an array"));
  l.es = zipccl::dtype_bytes(*dtype);
  return l;
}

// Row j's m elements, contiguous: in place when one leaf holds the row as
// one run, else gathered (padding zeroed) into buf.
const uint8_t* row_elements(const zipccl::RowLayout& l, int64_t j, const Leaves<const uint8_t>& x, uint8_t* buf) {
  if (l.contiguous(j))
    if (const uint8_t* p = x.span(j * l.m, l.m)) return p;
  const int es = x.es;
  for (int64_t r = 0; r < l.runs(); ++r) {
    int64_t at, src, count;
    l.run(j, r, &at, &src, &count);
    x.pieces(src, count, [&](const uint8_t* p, int64_t done, int64_t n) {
      std::memcpy(buf + (at + done) * es, p, size_t(n * es));
    });
    std::memset(buf + (at + count) * es, 0, size_t((l.run_length(r) - count) * es));
  }
  return buf;
}

// Puts row j's decoded m elements (at row) back where row_elements took them from.
void put_row(const zipccl::RowLayout& l, int64_t j, const uint8_t* row, const Leaves<uint8_t>& x) {
  const int es = x.es;
  for (int64_t r = 0; r < l.runs(); ++r) {
    int64_t at, src, count;
    l.run(j, r, &at, &src, &count);
    x.pieces(src, count, [&](uint8_t* p, int64_t done, int64_t n) {
      std::memcpy(p, row + (at + done) * es, size_t(n * es));
    });
  }
}

ffi::Error bad_rows(const std::string& what) { return ffi::Error::InvalidArgument("zipccl: " + what); }

ffi::Error check_stream_limit(int64_t m, int dtype) {
  if (m > zipccl::v6::max_elements(dtype))
    return bad_rows("a row's stream could exceed 4 GiB: use more rows");
  return ffi::Error::Success();
}

// Arguments [first, first + count) as leaves.
ffi::ErrorOr<Leaves<const uint8_t>> input_leaves(const ffi::RemainingArgs& args, size_t first, size_t count,
                                                 int* dtype) {
  return leaves_of<const uint8_t>(count, dtype, [&](size_t i) { return args.get<ffi::AnyBuffer>(first + i); });
}

// The row plans (uint8 [rows, plan_bytes(m)]) in buffer b, or an error.
ffi::ErrorOr<uint8_t*> plan_rows(const ffi::AnyBuffer& b, int64_t rows, int64_t m) {
  if (b.element_type() != ffi::DataType::U8 || int64_t(b.element_count()) != rows * zipccl::v6::plan_bytes(m))
    return ffi::Unexpected(bad_rows("the plans do not hold one plan per row"));
  return static_cast<uint8_t*>(b.untyped_data());
}

ffi::ErrorOr<Leaves<uint8_t>> output_leaves(const ffi::RemainingRets& rets, int* dtype) {
  return leaves_of<uint8_t>(rets.size(), dtype, [&](size_t i) -> ffi::ErrorOr<ffi::AnyBuffer> {
    auto r = rets.get<ffi::AnyBuffer>(i);
    if (r.has_error()) return ffi::Unexpected(r.error());
    return **r;
  });
}

// sizes[j] = the length of row j's stream (the size pass before the
// consensus); with a second result, the encoder's choices for each row
// (plans, uint8 [rows, plan_bytes(m)]), which encode_rows can code with.
ffi::Error StreamSizes(ffi::RemainingArgs args, ffi::RemainingRets outs, int64_t unit) {
  int dtype = 0;
  auto x = input_leaves(args, 0, args.size(), &dtype);
  if (x.has_error()) return x.error();
  auto sizes = outs.get<ffi::Buffer<ffi::U32>>(0);
  if (sizes.has_error()) return sizes.error();
  const auto l = zipccl::RowLayout::of(x->size(), int64_t((*sizes)->element_count()), unit);
  if (l.rows == 0) return bad_rows("stream_sizes needs at least one row");
  if (const auto e = check_stream_limit(l.m, dtype); e.failure()) return e;
  uint8_t* plans = nullptr;
  if (outs.size() > 1) {
    auto b = outs.get<ffi::AnyBuffer>(1);
    if (b.has_error()) return b.error();
    auto p = plan_rows(**b, l.rows, l.m);
    if (p.has_error()) return p.error();
    plans = *p;
  }
  const int64_t plan_bytes = zipccl::v6::plan_bytes(l.m);
  auto gathered = scratch_bytes(l.m * x->es);
  for (int64_t j = 0; j < l.rows; ++j)  // the codec's size-only analysis: no stream is written
    (*sizes)->typed_data()[j] = uint32_t(zipccl::v6::stream_bytes(dtype, row_elements(l, j, *x, gathered.get()), l.m,
                                                               plans ? plans + j * plan_bytes : nullptr));
  return ffi::Error::Success();
}

// The rows' streams at capacity cap (the outputs' last dimension), the
// outputs holding consecutive rows; raw: STORED_RAW streams (FORMAT.md §1),
// the uncompressed path through the same transfer. planned: the last
// argument is stream_sizes' plans of the same leaves.
ffi::Error EncodeRows(ffi::RemainingArgs args, ffi::RemainingRets outs, int64_t rows, int64_t unit, bool raw,
                      bool planned) {
  int dtype = 0;
  if (planned && args.size() < 2) return bad_rows("encode_rows with plans needs the leaves and the plans");
  auto x = input_leaves(args, 0, args.size() - (planned ? 1 : 0), &dtype);
  if (x.has_error()) return x.error();
  const auto l = zipccl::RowLayout::of(x->size(), rows, unit);
  if (const auto e = check_stream_limit(l.m, dtype); e.failure()) return e;
  const uint8_t* plans = nullptr;
  if (planned && !raw) {
    auto b = args.get<ffi::AnyBuffer>(args.size() - 1);
    if (b.has_error()) return b.error();
    auto p = plan_rows(*b, rows, l.m);
    if (p.has_error()) return p.error();
    for (int64_t j = 0; j < rows; ++j)
      if (!zipccl::v6::check_plan(dtype, *p + j * zipccl::v6::plan_bytes(l.m), l.m)) return bad_rows("corrupt row plan");
    plans = *p;
  }
  const int es = x->es;
  std::vector<ffi::Result<ffi::Buffer<ffi::U8>>> bufs;
  int64_t cap = -1, total = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    auto b = outs.get<ffi::Buffer<ffi::U8>>(i);
    if (b.has_error()) return b.error();
    const int64_t c = last_dim((*b)->dimensions());
    if (cap >= 0 && c != cap) return bad_rows("encode_rows outputs differ in capacity");
    cap = c;
    total += c ? int64_t((*b)->element_count()) / c : 0;
    bufs.push_back(*b);
  }
  if (total != rows || rows == 0) return bad_rows("encode_rows outputs do not hold the rows");
  if (raw && cap < zipccl::max_stream_bytes(l.m, dtype)) return bad_rows("encode_rows: raw streams need their full capacity");
  auto gathered = scratch_bytes(l.m * es);
  int64_t j = 0;
  for (auto& b : bufs) {
    for (uint8_t* row = b->typed_data(); row < b->typed_data() + b->element_count(); row += cap, ++j) {
      const uint8_t* elems = row_elements(l, j, *x, gathered.get());
      if (raw) {
        zipccl::v6::write_header(row, dtype, zipccl::kFlagStoredRaw, uint64_t(l.m));
        std::memcpy(row + zipccl::kHeaderBytes, elems, size_t(l.m * es));
        std::memset(row + zipccl::kHeaderBytes + l.m * es, 0, size_t(cap - zipccl::max_stream_bytes(l.m, dtype)));
      } else if (compress_bounded(dtype, elems, l.m, row, cap,
                                  plans ? plans + j * zipccl::v6::plan_bytes(l.m) : nullptr) < 0) {
        return ffi::Error::Internal("zipccl: row " + std::to_string(j) + "'s stream is longer than the capacity " +
                                    std::to_string(cap) + " its size pass agreed on");
      }
    }
  }
  return ffi::Error::Success();
}

// The received parts as one list of rows (each part [..., cap]).
struct Rows {
  std::vector<const uint8_t*> row;
  int64_t cap = 0;
};

ffi::ErrorOr<Rows> rows_of(ffi::RemainingArgs parts, size_t count) {
  Rows r;
  for (size_t i = 0; i < count; ++i) {
    auto b = parts.get<ffi::Buffer<ffi::U8>>(i);
    if (b.has_error()) return ffi::Unexpected(b.error());
    const int64_t c = last_dim(b->dimensions());
    if ((i && c != r.cap) || c <= 0) return ffi::Unexpected(bad_rows("received parts differ in capacity"));
    r.cap = c;
    for (int64_t at = 0; at < int64_t(b->element_count()); at += c) r.row.push_back(b->typed_data() + at);
  }
  return r;
}

// Decodes the parts' rows into the outs (the leaves of one flat array),
// each row where encode_rows took it from; padding is dropped.
ffi::Error DecodeRows(ffi::RemainingArgs parts, ffi::RemainingRets outs, int64_t unit) {
  int dtype = 0;
  auto x = output_leaves(outs, &dtype);
  if (x.has_error()) return x.error();
  auto rows = rows_of(parts, parts.size());
  if (rows.has_error()) return rows.error();
  const auto l = zipccl::RowLayout::of(x->size(), int64_t(rows->row.size()), unit);
  if (l.rows == 0) return bad_rows("decode_rows needs at least one row");
  auto row = scratch_bytes(l.m * x->es);
  for (int64_t j = 0; j < l.rows; ++j) {
    uint8_t* in_place = l.contiguous(j) ? x->span(j * l.m, l.m) : nullptr;
    uint8_t* to = in_place ? in_place : row.get();
    const int status = zipccl::v6::decompress_stream(dtype, rows->row[j], rows->cap, l.m, to);
    if (status != zipccl::kOk) return corrupt(j, status);
    if (!in_place) put_row(l, j, to, *x);
  }
  return ffi::Error::Success();
}

// Sums the parts' rows in row order in float32 (FORMAT.md §8) and rounds
// the sums once into the outs (float32 or the streams' dtype; the leaves of
// one flat array of the streams' length). local_leaves > 0: the arguments
// after the parts are an int32 row index and that many leaves holding that
// row's elements (this device's own data, all-gathered with the others):
// the row is summed from them instead of decoded (the same bits).
ffi::Error DecodeAccumulateRows(ffi::RemainingArgs args, ffi::RemainingRets outs, int32_t dtype,
                                int64_t local_leaves) {
  int out_dtype = 0;
  auto x = output_leaves(outs, &out_dtype);
  if (x.has_error()) return x.error();
  if (dtype < zipccl::kBF16 || dtype > zipccl::kF32 || (out_dtype != dtype && out_dtype != zipccl::kF32))
    return ffi::Error::InvalidArgument("zipccl: accumulate output must be the input dtype or float32");
  const size_t nparts = local_leaves > 0 ? args.size() - size_t(local_leaves) - 1 : args.size();
  if (local_leaves < 0 || (local_leaves > 0 && args.size() < size_t(local_leaves) + 2))
    return bad_rows("decode_accumulate_rows: bad local_leaves");
  auto rows = rows_of(args, nparts);
  if (rows.has_error()) return rows.error();
  const int64_t m = x->size();
  if (rows->row.empty()) return bad_rows("decode_accumulate_rows needs at least one row");
  const int es = zipccl::dtype_bytes(dtype);
  int64_t own = -1;
  Leaves<const uint8_t> local;
  if (local_leaves > 0) {
    auto index = args.get<ffi::Buffer<ffi::S32>>(nparts);
    if (index.has_error()) return index.error();
    int local_dtype = 0;
    auto l = input_leaves(args, nparts + 1, size_t(local_leaves), &local_dtype);
    if (l.has_error()) return l.error();
    if (index->element_count() != 1 || local_dtype != dtype || l->size() != m)
      return bad_rows("decode_accumulate_rows: the local row does not match the rows");
    own = index->typed_data()[0];
    if (own < 0 || own >= int64_t(rows->row.size())) return bad_rows("decode_accumulate_rows: local row index out of range");
    local = *l;
  }
  std::unique_ptr<float[]> acc(new float[size_t(m > 0 ? m : 1)]);
  const ExactSubnormals exact;
  int64_t failed = 0;
  const int status = zipccl::accumulate_tiled(
      dtype, int64_t(rows->row.size()), m, acc.get(),
      [&](int64_t j, int64_t begin, int64_t count, uint8_t* out) {
        if (j != own) return zipccl::v6::decompress_range(dtype, rows->row[size_t(j)], rows->cap, m, begin, count, out);
        local.pieces(begin, count, [&](const uint8_t* p, int64_t done, int64_t n) { std::memcpy(out + done * es, p, size_t(n * es)); });
        return int(zipccl::kOk);
      },
      &failed);
  if (status != zipccl::kOk) return corrupt(failed, status);
  x->pieces(0, m, [&](uint8_t* o, int64_t done, int64_t n) { zipccl::round_elements(out_dtype, acc.get() + done, n, o); });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclCompressCpu, Compress,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::Buffer<ffi::U32>>()
                                  .Attr<int64_t>("item_elems"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclDecompressCpu, Decompress,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("item_elems"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclDecompressAccumulateCpu, DecompressAccumulate,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("item_elems")
                                  .Attr<int32_t>("dtype"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclStreamSizesCpu, StreamSizes,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int64_t>("unit"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclEncodeRowsCpu, EncodeRows,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int64_t>("rows")
                                  .Attr<int64_t>("unit")
                                  .Attr<bool>("raw")
                                  .Attr<bool>("planned"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclDecodeRowsCpu, DecodeRows,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int64_t>("unit"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclDecodeAccumulateRowsCpu, DecodeAccumulateRows,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int32_t>("dtype")
                                  .Attr<int64_t>("local_leaves"));
