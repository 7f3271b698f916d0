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
// rows: the rows summed per item (zipccl_decompress_accumulate).
int64_t workspace_bytes(const std::string& target, int dtype, int64_t batch, int64_t n, int64_t rows) {
  if (dtype < zipccl::kBF16 || dtype > zipccl::kF32) throw std::invalid_argument("zipccl: bad dtype code");
  if (target == "zipccl_compress") return zipccl_cuda::CompressWorkspaceBytes(dtype, batch, n);
  if (target == "zipccl_decompress") return zipccl_cuda::DecompressWorkspaceBytes(dtype, batch, n);
  if (target == "zipccl_decompress_accumulate") return zipccl_cuda::AccumulateWorkspaceBytes(dtype, batch, rows, n);
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

// Runs timer(n, &timing) on raw's n elements without the GIL; raises what it reports.
template <typename Timing, typename Timer>
Timing RunTimer(int dtype, HostBytes raw, int64_t* n, Timer timer) {
  if (dtype < zipccl::kBF16 || dtype > zipccl::kF32) throw std::invalid_argument("zipccl: bad dtype code");
  *n = int64_t(raw.shape(0)) / zipccl::dtype_bytes(dtype);
  Timing t;
  std::string error;
  {
    nb::gil_scoped_release release;
    error = timer(*n, &t);
  }
  if (!error.empty()) throw std::runtime_error(error);
  return t;
}

// What every timer's result holds besides its times.
nb::dict TimerResult(int dtype, int64_t n, int repeat, int64_t compressed_bytes) {
  nb::dict d;
  d["compressed_bytes"] = compressed_bytes;
  d["elements"] = n;
  d["bytes"] = n * zipccl::dtype_bytes(dtype);
  d["repeat"] = repeat;
  return d;
}

nb::dict time_codec(int device, int dtype, HostBytes raw, int repeat) {
  int64_t n;
  const auto t = RunTimer<zipccl_cuda::CodecTiming>(dtype, raw, &n, [&](int64_t n, zipccl_cuda::CodecTiming* t) {
    return zipccl_cuda::TimeCodec(device, dtype, raw.data(), n, repeat, t);
  });
  nb::dict d = TimerResult(dtype, n, repeat, t.compressed_bytes);
  d["compress_ms"] = t.compress_ms;
  d["decompress_ms"] = t.decompress_ms;
  d["copy_ms"] = t.copy_ms;
  d["round_trip"] = t.round_trip;
  return d;
}

nb::dict time_rows(int device, int dtype, HostBytes raw, int64_t rows, int repeat) {
  int64_t n;
  const auto t = RunTimer<zipccl_cuda::RowsTiming>(dtype, raw, &n, [&](int64_t n, zipccl_cuda::RowsTiming* t) {
    return zipccl_cuda::TimeRows(device, dtype, raw.data(), n, rows, repeat, t);
  });
  nb::dict d = TimerResult(dtype, n, repeat, t.compressed_bytes);
  d["size_ms"] = t.size_ms;
  d["encode_ms"] = t.encode_ms;
  d["reduce_ms"] = t.reduce_ms;
  d["decoded"] = t.decoded;
  d["rows"] = rows;
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
        nb::arg("rows") = 1);
  m.def("row_workspace_bytes", &row_workspace_bytes, nb::arg("target"), nb::arg("dtype"), nb::arg("rows"),
        nb::arg("size"), nb::arg("unit"), nb::arg("leaves"), nb::arg("part_rows"));
  m.def("time_rows", &time_rows, nb::arg("device"), nb::arg("dtype"), nb::arg("raw"), nb::arg("rows"),
        nb::arg("repeat"),
        "Times a psum bucket's row ops with CUDA events: raw's elements cut into `rows` rows, their lengths alone "
        "(size_ms: the size pass), compressed as a batch (encode_ms) and decoded and summed in order (reduce_ms), milliseconds per call; compressed_bytes of the "
        "rows, decoded (every row's status word 0), elements, rows, bytes (of raw input), repeat.");
  m.def("time_codec", &time_codec, nb::arg("device"), nb::arg("dtype"), nb::arg("raw"), nb::arg("repeat"),
        "Times the CUDA codec with CUDA events on one stream of raw's elements: a dict of milliseconds per call "
        "(compress_ms, decompress_ms, copy_ms: a device-to-device cudaMemcpyAsync of the same bytes), "
        "compressed_bytes, round_trip (decoded to the input), elements, bytes (of raw input), repeat.");
}
