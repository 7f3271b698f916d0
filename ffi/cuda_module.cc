// Python module _zipccl_cuda: the CUDA FFI targets, for platform "CUDA".
//
// Built by the host C++ compiler; the handlers live in zipccl_cuda.cu, which
// is linked in as an object. zipccl_jax/_ffi.py registers each capsule with
// jax.ffi.register_ffi_target(name, capsule, platform="CUDA").
#include <nanobind/nanobind.h>

#include "xla/ffi/api/api.h"

namespace nb = nanobind;

XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclCompressCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclDecompressCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclDecompressAccumulateCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclStreamSizesCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclEncodeRowsCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclDecodeRowsCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclDecodeAccumulateRowsCuda);

NB_MODULE(_zipccl_cuda, m) {
  m.def("registrations", []() {
    nb::dict d;
    d["zipccl_compress"] = nb::capsule(reinterpret_cast<void*>(ZipcclCompressCuda));
    d["zipccl_decompress"] = nb::capsule(reinterpret_cast<void*>(ZipcclDecompressCuda));
    d["zipccl_decompress_accumulate"] =
        nb::capsule(reinterpret_cast<void*>(ZipcclDecompressAccumulateCuda));
    d["zipccl_stream_sizes"] = nb::capsule(reinterpret_cast<void*>(ZipcclStreamSizesCuda));
    d["zipccl_encode_rows"] = nb::capsule(reinterpret_cast<void*>(ZipcclEncodeRowsCuda));
    d["zipccl_decode_rows"] = nb::capsule(reinterpret_cast<void*>(ZipcclDecodeRowsCuda));
    d["zipccl_decode_accumulate_rows"] = nb::capsule(reinterpret_cast<void*>(ZipcclDecodeAccumulateRowsCuda));
    return d;
  });
}
