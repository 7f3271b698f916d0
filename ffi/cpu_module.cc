// Python module _zipccl_cpu: the CPU FFI targets, plus the stream coder on
// numpy buffers (for benchmarks on reused buffers and byte-identity tests).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include <stdexcept>
#include <vector>
#include <string>

#include "codec6_cpu.h"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;

XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclCompressCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclDecompressCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclDecompressAccumulateCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclStreamSizesCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclEncodeRowsCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclDecodeRowsCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclDecodeAccumulateRowsCpu);

namespace {

using Bytes = nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using ConstBytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

template <typename A>
int64_t element_count(const A& raw, int dtype) {
  if (dtype < zipccl::kBF16 || dtype > zipccl::kF32) throw std::invalid_argument("zipccl: bad dtype code");
  return int64_t(raw.shape(0)) / zipccl::dtype_bytes(dtype);
}

// Streams hold at most max_elements (a uint32 length, FORMAT.md §1): longer arrays are split.
int64_t check_elements(int64_t n, int dtype) {
  if (n > zipccl::v6::max_elements(dtype))
    throw std::invalid_argument("zipccl: " + std::to_string(n) + " elements are over the " +
                                std::to_string(zipccl::v6::max_elements(dtype)) +
                                " one stream holds (its length is a uint32): split them into streams");
  return n;
}

// Compresses the elements whose bytes are in `raw` into `out`; returns the
// length. With a plan from stream_bytes of the same elements, skips the choices.
int64_t compress_into(ConstBytes raw, int dtype, Bytes out, bool generic, std::optional<ConstBytes> plan) {
  const int64_t n = check_elements(element_count(raw, dtype), dtype);
  if (int64_t(out.shape(0)) < zipccl::max_stream_bytes(n, dtype))
    throw std::invalid_argument("zipccl: output buffer smaller than max_stream_bytes");
  if (plan && (int64_t(plan->shape(0)) < zipccl::v6::plan_bytes(n) || !zipccl::v6::check_plan(dtype, plan->data(), n)))
    throw std::invalid_argument("zipccl: plan too small or corrupt");
  nb::gil_scoped_release release;
  return zipccl::v6::compress_stream(dtype, raw.data(), n, out.data(), generic, plan ? plan->data() : nullptr);
}

// The length compress_into would return, without coding; with plan
// (plan_bytes(n) bytes), the encoder's choices for compress_into.
int64_t stream_bytes(ConstBytes raw, int dtype, std::optional<Bytes> plan, bool generic) {
  const int64_t n = check_elements(element_count(raw, dtype), dtype);
  if (plan && int64_t(plan->shape(0)) < zipccl::v6::plan_bytes(n)) throw std::invalid_argument("zipccl: plan too small");
  nb::gil_scoped_release release;
  return zipccl::v6::stream_bytes(dtype, raw.data(), n, plan ? plan->data() : nullptr, generic);
}

void check_status(int status) {
  if (status != zipccl::kOk)
    throw std::invalid_argument(std::string("zipccl: corrupt payload: ") + zipccl::error_message(status));
}

// Decodes `payload` into `raw` (whose size gives the element count).
void decompress_into(ConstBytes payload, int dtype, Bytes raw, bool generic) {
  const int64_t n = element_count(raw, dtype);
  int status;
  {
    nb::gil_scoped_release release;
    status = zipccl::v6::decompress_stream(dtype, payload.data(), int64_t(payload.shape(0)), n, raw.data(), generic);
  }
  check_status(status);
}

// Decodes rows [k, cap] of streams of n elements each and returns their float32 sum in row
// order (the reduce step's arithmetic, FORMAT.md §7).
nb::ndarray<nb::numpy, float, nb::ndim<1>> decompress_accumulate(
    nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> rows, int dtype, int64_t n) {
  if (dtype < zipccl::kBF16 || dtype > zipccl::kF32 || n < 0) throw std::invalid_argument("zipccl: bad dtype code or count");
  float* acc = new float[size_t(n > 0 ? n : 1)]();
  nb::capsule owner(acc, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  int status;
  {
    nb::gil_scoped_release release;
    status = zipccl::v6::decompress_accumulate(dtype, rows.data(), int64_t(rows.shape(1)), int64_t(rows.shape(0)), n, acc);
  }
  check_status(status);
  return nb::ndarray<nb::numpy, float, nb::ndim<1>>(acc, {size_t(n)}, owner);
}

// A group code's lengths from its symbol counts (FORMAT.md §4; for tests against the reference).
std::vector<int> code_lengths(const std::vector<uint32_t>& counts) {
  const int nsym = int(counts.size());
  if (nsym != zipccl::v6::kNumSyms) throw std::invalid_argument("zipccl: need 256 counts");
  uint8_t lens[zipccl::kMaxSyms];
  zipccl::code_lengths(counts.data(), lens, nsym);
  return std::vector<int>(lens, lens + nsym);
}

}  // namespace

NB_MODULE(_zipccl_cpu, m) {
  m.def("registrations", []() {
    nb::dict d;
    d["zipccl_compress"] = nb::capsule(reinterpret_cast<void*>(ZipcclCompressCpu));
    d["zipccl_decompress"] = nb::capsule(reinterpret_cast<void*>(ZipcclDecompressCpu));
    d["zipccl_decompress_accumulate"] = nb::capsule(reinterpret_cast<void*>(ZipcclDecompressAccumulateCpu));
    d["zipccl_stream_sizes"] = nb::capsule(reinterpret_cast<void*>(ZipcclStreamSizesCpu));
    d["zipccl_encode_rows"] = nb::capsule(reinterpret_cast<void*>(ZipcclEncodeRowsCpu));
    d["zipccl_decode_rows"] = nb::capsule(reinterpret_cast<void*>(ZipcclDecodeRowsCpu));
    d["zipccl_decode_accumulate_rows"] = nb::capsule(reinterpret_cast<void*>(ZipcclDecodeAccumulateRowsCpu));
    return d;
  });
  m.def("compress_into", &compress_into, nb::arg("raw"), nb::arg("dtype"), nb::arg("out"), nb::arg("generic") = false,
        nb::arg("plan") = nb::none());
  m.def("plan_bytes", &zipccl::v6::plan_bytes);
  m.def("max_elements", &zipccl::v6::max_elements);
  m.def("stream_bytes", &stream_bytes, nb::arg("raw"), nb::arg("dtype"), nb::arg("plan") = nb::none(),
        nb::arg("generic") = false);
  m.def("decompress_into", &decompress_into, nb::arg("payload"), nb::arg("dtype"), nb::arg("raw"), nb::arg("generic") = false);
  m.def("decompress_accumulate", &decompress_accumulate, nb::arg("rows"), nb::arg("dtype"), nb::arg("n"));
  m.def("generic_fallbacks", &zipccl::v6::generic_fallbacks,
        "Blocks the fast decoders handed to the generic one on this thread so far (0 for valid streams).");
  m.def("code_lengths", &code_lengths);
  // The decoder's message for a status code: the CUDA handlers return codes, Python words the error.
  m.def("error_message", [](int status) { return zipccl::error_message(status); });
}
