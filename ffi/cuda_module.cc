// Python module _zipccl_cuda: the CUDA FFI targets, for platform "CUDA", the
// sizes of their workspace results, and the codec's timing with CUDA events.
//
// Built by the host C++ compiler; the handlers live in zipccl_cuda.cu, which
// is linked in as an object. zipccl_jax/_ffi.py registers each capsule with
// jax.ffi.register_ffi_target(name, capsule, platform="CUDA").
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <stdexcept>
#include <string>

#include "xla/ffi/api/api.h"
#include "zipccl_cuda_host.h"
#include "zipccl_format.h"

namespace nb = nanobind;

XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclCompressCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclDecompressCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclDecompressAccumulateCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclStreamSizesCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclEncodeRowsCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclDecodeRowsCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclDecodeAccumulateRowsCuda);

namespace {

// Bytes of the workspace result XLA must allocate for `target` (its last result).
int64_t workspace_bytes(const std::string& target, int dtype, int64_t batch, int64_t n, int out_dtype) {
  if (dtype < zipccl::kBF16 || dtype > zipccl::kF32) throw std::invalid_argument("zipccl: bad dtype code");
  if (target == "zipccl_compress") return zipccl_cuda::CompressWorkspaceBytes(dtype, batch, n);
  if (target == "zipccl_decompress") return zipccl_cuda::DecompressWorkspaceBytes(dtype, batch, n);
  if (target == "zipccl_decompress_accumulate") return zipccl_cuda::AccumulateWorkspaceBytes(dtype, batch, n, out_dtype);
  throw std::invalid_argument("zipccl: no workspace for target " + target);
}

// The same for the collectives' row ops (zipccl_cuda_host.h, RowsWorkspaceBytes).
int64_t row_workspace_bytes(const std::string& target, int dtype, int64_t rows, int64_t size, int64_t unit,
                            int64_t leaves, int64_t part_rows) {
  if (dtype < zipccl::kBF16 || dtype > zipccl::kF32) throw std::invalid_argument("zipccl: bad dtype code");
  if (target != "zipccl_stream_sizes" && target != "zipccl_encode_rows" && target != "zipccl_encode_rows_raw" &&
      target != "zipccl_decode_rows" && target != "zipccl_decode_accumulate_rows")
    throw std::invalid_argument("zipccl: no row workspace for target " + target);
  return zipccl_cuda::RowsWorkspaceBytes(target, dtype, rows, size, unit, leaves, part_rows);
}

using HostBytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

nb::dict time_codec(int device, int dtype, HostBytes raw, int repeat) {
  if (dtype < zipccl::kBF16 || dtype > zipccl::kF32) throw std::invalid_argument("zipccl: bad dtype code");
  const int64_t n = int64_t(raw.shape(0)) / zipccl::layout_of(dtype).elem_bytes;
  zipccl_cuda::CodecTiming t;
  std::string error;
  {
    nb::gil_scoped_release release;
    error = zipccl_cuda::TimeCodec(device, dtype, raw.data(), n, repeat, &t);
  }
  if (!error.empty()) throw std::runtime_error(error);
  nb::dict d;
  d["compress_ms"] = t.compress_ms;
  d["decompress_ms"] = t.decompress_ms;
  d["copy_ms"] = t.copy_ms;
  d["compressed_bytes"] = t.compressed_bytes;
  d["round_trip"] = t.round_trip;
  d["elements"] = n;
  d["bytes"] = n * zipccl::layout_of(dtype).elem_bytes;
  d["repeat"] = repeat;
  return d;
}

}  // namespace

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
  // Targets whose handlers are declared kCmdBufferCompatible (zipccl_cuda.cu):
  // registered with that trait too, for jaxlibs that take it only from Python.
  m.attr("command_buffer_compatible") =
      nb::make_tuple("zipccl_compress", "zipccl_decompress", "zipccl_decompress_accumulate", "zipccl_stream_sizes",
                     "zipccl_encode_rows", "zipccl_decode_rows", "zipccl_decode_accumulate_rows");
  m.def("workspace_bytes", &workspace_bytes, nb::arg("target"), nb::arg("dtype"), nb::arg("batch"), nb::arg("n"),
        nb::arg("out_dtype") = 0);
  m.def("row_workspace_bytes", &row_workspace_bytes, nb::arg("target"), nb::arg("dtype"), nb::arg("rows"),
        nb::arg("size"), nb::arg("unit"), nb::arg("leaves"), nb::arg("part_rows"));
  m.def("time_codec", &time_codec, nb::arg("device"), nb::arg("dtype"), nb::arg("raw"), nb::arg("repeat"),
        "Times the CUDA codec with CUDA events on one stream of raw's elements: a dict of milliseconds per call "
        "(compress_ms, decompress_ms, copy_ms: a device-to-device cudaMemcpyAsync of the same bytes), "
        "compressed_bytes, round_trip (decoded to the input), elements, bytes (of raw input), repeat.");
}
