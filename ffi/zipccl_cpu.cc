// CPU codec: the XLA FFI handlers for platform "cpu".
//
// Handlers only unpack buffers and loop over batch items; the stream coder is
// in codec_cpu.h and the block coder in the shared zipccl_format.h.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "codec_cpu.h"
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
  const int64_t item_bytes = item_elems * zipccl::layout_of(dtype).elem_bytes;
  const auto* in = static_cast<const uint8_t*>(x.untyped_data());
  for (int64_t i = 0; i < batch; ++i) {
    sizes->typed_data()[i] = static_cast<uint32_t>(zipccl::compress_stream(
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
  const int64_t item_bytes = item_elems * zipccl::layout_of(dtype).elem_bytes;
  auto* dst = static_cast<uint8_t*>(out->untyped_data());
  for (int64_t i = 0; i < batch; ++i) {
    const int status = zipccl::decompress_stream(dtype, payload.typed_data() + i * cap, cap,
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
  const int out_bytes = zipccl::layout_of(out_dtype).elem_bytes;
  auto* dst = static_cast<uint8_t*>(out->untyped_data());
  std::vector<float> acc(item_elems);
  const ExactSubnormals exact;
  for (int64_t i = 0; i < batch; ++i) {
    const int status = zipccl::decompress_accumulate(dtype, payload.typed_data() + i * k * cap, cap, k,
                                                     item_elems, acc.data());
    if (status != zipccl::kOk) return corrupt(i, status);
    uint8_t* o = dst + i * item_elems * out_bytes;
    for (int64_t j = 0; j < item_elems; ++j)
      zipccl::store_element(o + j * out_bytes, zipccl::f32_to_element(out_dtype, acc[j]), out_bytes);
  }
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
