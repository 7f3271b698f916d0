// Runs the CUDA codec's handlers and kernels (ffi/zipccl_cuda.cu) on the
// host, for tests/test_cuda_emulation.py:
//   cuda_emulation SMS RESIDENT [INJECT] < requests > replies
// The file is compiled whole with tests/cuda_host_shim.h in place of the
// CUDA runtime, and the driver calls the real handlers (Compress, Decompress,
// DecompressAccumulate) with XLA FFI buffers over host memory and a scratch
// allocator that hands out exact-size blocks of garbage, so their argument
// checks, scratch sizing and kernel order run as written. The emulated device
// has SMS SMs (the handlers size their grids from it) and keeps RESIDENT CUDA
// blocks running at once; INJECT (default 0) picks a deliberately broken
// kernel variant (ZC_INJECTED in zipccl_cuda.cu) for the tests that must
// catch it.
//
// A request is seven little-endian int64 (op, dtype, n, a, b, c, d) and
// its input bytes:
//   op 0 compress:    a = batch, b = cap; input batch * n elements.
//                     Output: batch uint32 sizes, then the [batch, cap] payload.
//   op 1 decompress:  a = streams, b = cap; input the [streams, cap] payload.
//                     Output: streams * n elements.
//   op 2 accumulate:  a = batch, b = k, c = cap, d = output dtype; input the
//                     [batch, k, cap] payload. Output: batch * n sums.
// With ZIPCCL_EMU_COUNTS set, each kernel's counts (zc_emu::Counts) go to
// stderr at the end, one line each: name launches threads warp_ops barriers
// atomics.
//
// dtype is the format's code (1 bf16, 2 fp16, 3 fp32; any other: int32, which
// the handlers refuse). A reply is int64 length + the handler's error message
// ("" on success), then int64 length + the output bytes.
#include "cuda_host_shim.h"
//
#include "zipccl_cuda.cu"

#include <cstdio>
#include <cstdlib>
#include <utility>

namespace {

XLA_FFI_Error* Allocate(XLA_FFI_DeviceMemory_Allocate_Args* args) {
  // Exact size, so AddressSanitizer sees one byte past a scratch array, and
  // garbage, as cudaMalloc'd memory holds.
  if (posix_memalign(&args->data, args->alignment < sizeof(void*) ? sizeof(void*) : args->alignment, args->size))
    std::abort();
  std::memset(args->data, 0xA5, args->size);
  return nullptr;
}

XLA_FFI_Error* Free(XLA_FFI_DeviceMemory_Free_Args* args) {
  std::free(args->data);
  return nullptr;
}

// A handler's arguments: host buffers with their XLA_FFI_Buffer views.
struct HostBuffer {
  std::vector<uint8_t> bytes;
  std::vector<int64_t> dims;
  XLA_FFI_Buffer view;

  HostBuffer(ffi::DataType type, std::vector<int64_t> shape, std::vector<uint8_t> data)
      : bytes(std::move(data)), dims(std::move(shape)) {
    view = {XLA_FFI_Buffer_STRUCT_SIZE, nullptr, static_cast<XLA_FFI_DataType>(type), bytes.data(),
            int64_t(dims.size()), dims.data()};
  }
  // An output: elements of garbage, to be overwritten.
  HostBuffer(ffi::DataType type, std::vector<int64_t> shape)
      : HostBuffer(type, shape, std::vector<uint8_t>(size_t(Elements(shape) * ffi::ByteWidth(type)), 0xA5)) {}

  static int64_t Elements(const std::vector<int64_t>& shape) { return Product(shape, 0, shape.size()); }
};

ffi::DataType XlaType(int64_t code) {
  if (code == zc::kBF16) return ffi::DataType::BF16;
  if (code == zc::kF16) return ffi::DataType::F16;
  if (code == zc::kF32) return ffi::DataType::F32;
  return ffi::DataType::S32;
}

std::vector<uint8_t> Read(size_t bytes) {
  std::vector<uint8_t> v(bytes);
  if (bytes && std::fread(v.data(), 1, bytes, stdin) != bytes) {
    std::fprintf(stderr, "cuda_emulation: short request\n");
    std::exit(2);
  }
  return v;
}

void Write(const void* data, int64_t bytes) {
  std::fwrite(&bytes, sizeof(bytes), 1, stdout);
  if (bytes) std::fwrite(data, 1, size_t(bytes), stdout);
}

// Runs one request; returns the handler's error and sets *out.
ffi::Error Serve(const int64_t* req, std::vector<uint8_t>* out) {
  XLA_FFI_Api api{};
  api.XLA_FFI_DeviceMemory_Allocate = Allocate;
  api.XLA_FFI_DeviceMemory_Free = Free;
  ffi::DiagnosticEngine diagnostic;
  ffi::ScratchAllocator scratch = *ffi::CtxDecoding<ffi::ScratchAllocator>::Decode(&api, nullptr, diagnostic);
  const int64_t op = req[0], dtype = req[1], n = req[2], a = req[3], b = req[4], c = req[5];
  const ffi::DataType type = XlaType(dtype);
  const int64_t eb = int64_t(ffi::ByteWidth(type));
  cudaStream_t stream = nullptr;
  ffi::Error err = ffi::Error::Success();
  if (op == 0) {
    HostBuffer x(type, {a, n}, Read(size_t(a * n * eb)));
    HostBuffer payload(ffi::DataType::U8, {a, b}), sizes(ffi::DataType::U32, {a});
    err = Compress(stream, std::move(scratch), ffi::AnyBuffer(&x.view), ffi::Buffer<ffi::U8>(&payload.view),
                   ffi::Buffer<ffi::U32>(&sizes.view), n);
    *out = sizes.bytes;
    out->insert(out->end(), payload.bytes.begin(), payload.bytes.end());
  } else if (op == 1) {
    HostBuffer payload(ffi::DataType::U8, {a, b}, Read(size_t(a * b)));
    HostBuffer y(type, {a * n});
    err = Decompress(stream, std::move(scratch), ffi::Buffer<ffi::U8>(&payload.view), ffi::AnyBuffer(&y.view), n);
    *out = y.bytes;
  } else {
    HostBuffer payload(ffi::DataType::U8, {a, b, c}, Read(size_t(a * b * c)));
    HostBuffer y(XlaType(req[6]), {b > 0 ? a * n : 0});
    err = DecompressAccumulate(stream, std::move(scratch), ffi::Buffer<ffi::U8>(&payload.view),
                               ffi::AnyBuffer(&y.view), n, int32_t(dtype));
    *out = y.bytes;
  }
  return err;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: cuda_emulation SMS RESIDENT [INJECT] < requests > replies\n");
    return 2;
  }
  zc_emu::sms = std::atoi(argv[1]);
  zc_emu::resident = unsigned(std::atoi(argv[2]));
  zc_emu::inject = argc == 4 ? std::atoi(argv[3]) : 0;
  int64_t req[7];
  while (std::fread(req, sizeof(req), 1, stdin) == 1) {
    std::vector<uint8_t> out;
    const ffi::Error err = Serve(req, &out);
    Write(err.message().data(), int64_t(err.message().size()));
    Write(out.data(), int64_t(out.size()));
  }
  if (std::getenv("ZIPCCL_EMU_COUNTS"))
    for (const auto& [name, c] : zc_emu::counts)
      std::fprintf(stderr, "%s %llu %llu %llu %llu %llu\n", name.c_str(), (unsigned long long)c.launches,
                   (unsigned long long)c.threads, (unsigned long long)c.warp_ops, (unsigned long long)c.barriers,
                   (unsigned long long)c.atomics);
  return 0;
}
