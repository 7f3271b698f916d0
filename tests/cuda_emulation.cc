// Runs the CUDA codec's handlers and kernels (ffi/zipccl_cuda.cu) on the
// host, for tests/test_cuda_emulation.py:
//   cuda_emulation SMS RESIDENT [INJECT] < requests > replies
// The file is compiled whole with tests/cuda_host_shim.h in place of the
// CUDA runtime, and the driver calls the real handlers (Compress, Decompress,
// DecompressAccumulate, and the collectives' row ops) with XLA FFI buffers
// over host memory and a scratch
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
// The collectives' row ops (zipccl_rows.h): n elements in c leaves (leaf i
// holds elements [i n / c, (i + 1) n / c)) cut into a rows with b = unit; the
// row buffers (outputs or received parts) hold a / P rows each, P = d >> 32,
// of cap = d & 0xFFFFFFFF bytes:
//   op 3 stream_sizes: input n elements. Output: a uint32 sizes.
//   op 4 encode_rows, op 5 the same with raw: input n elements. Output: the
//                     buffers' bytes, a * cap in all.
//   op 6 decode_rows: input the [a, cap] payload. Output: n elements.
//   op 7 decode_accumulate_rows: n = elements per row, b = the output dtype
//                     (no unit); input the [a, cap] payload. Output: n sums.
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

// Variadic buffers of one kind, for RemainingArgs / RemainingRets.
struct BufferList {
  std::vector<HostBuffer> buffers;
  std::vector<void*> pointers;
  std::vector<int> types;  // XLA_FFI_ArgType_BUFFER == XLA_FFI_RetType_BUFFER == 1
  XLA_FFI_Args args{};
  XLA_FFI_Rets rets{};

  void Finish() {
    for (auto& b : buffers) pointers.push_back(&b.view), types.push_back(1);
    args = {XLA_FFI_Args_STRUCT_SIZE, nullptr, int64_t(pointers.size()),
            reinterpret_cast<XLA_FFI_ArgType*>(types.data()), pointers.data()};
    rets = {XLA_FFI_Rets_STRUCT_SIZE, nullptr, int64_t(pointers.size()),
            reinterpret_cast<XLA_FFI_RetType*>(types.data()), pointers.data()};
  }
  std::vector<uint8_t> Bytes() const {
    std::vector<uint8_t> all;
    for (const auto& b : buffers) all.insert(all.end(), b.bytes.begin(), b.bytes.end());
    return all;
  }
};

// n elements of `type` in `count` leaves (leaf i: elements [i n / count, (i + 1) n / count)), from data or garbage.
BufferList LeafBuffers(ffi::DataType type, int64_t n, int64_t count, const std::vector<uint8_t>* data) {
  BufferList l;
  const int64_t eb = int64_t(ffi::ByteWidth(type));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t begin = i * n / count, end = (i + 1) * n / count;
    if (data) l.buffers.emplace_back(type, std::vector<int64_t>{end - begin},
                                     std::vector<uint8_t>(data->begin() + begin * eb, data->begin() + end * eb));
    else l.buffers.emplace_back(type, std::vector<int64_t>{end - begin});
  }
  l.Finish();
  return l;
}

// `rows` rows of cap bytes in `count` buffers [rows / count, cap], from data or garbage.
BufferList RowBufferList(int64_t rows, int64_t cap, int64_t count, const std::vector<uint8_t>* data) {
  BufferList l;
  const int64_t each = rows / count;
  for (int64_t i = 0; i < count; ++i) {
    if (data) l.buffers.emplace_back(ffi::DataType::U8, std::vector<int64_t>{each, cap},
                                     std::vector<uint8_t>(data->begin() + i * each * cap,
                                                          data->begin() + (i + 1) * each * cap));
    else l.buffers.emplace_back(ffi::DataType::U8, std::vector<int64_t>{each, cap});
  }
  l.Finish();
  return l;
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
  } else if (op >= 3) {
    const int64_t d = req[6], cap = d & 0xFFFFFFFF, parts = d >> 32;
    if (op == 3) {
      const auto data = Read(size_t(n * eb));
      BufferList x = LeafBuffers(type, n, c, &data);
      HostBuffer sizes(ffi::DataType::U32, {a});
      err = StreamSizes(stream, std::move(scratch), ffi::RemainingArgs(&x.args, 0), ffi::Buffer<ffi::U32>(&sizes.view), b);
      *out = sizes.bytes;
    } else if (op == 4 || op == 5) {
      const auto data = Read(size_t(n * eb));
      BufferList x = LeafBuffers(type, n, c, &data), outs = RowBufferList(a, cap, parts, nullptr);
      err = EncodeRows(stream, std::move(scratch), ffi::RemainingArgs(&x.args, 0), ffi::RemainingRets(&outs.rets, 0), a,
                       b, op == 5);
      *out = outs.Bytes();
    } else if (op == 6) {
      const auto data = Read(size_t(a * cap));
      BufferList in = RowBufferList(a, cap, parts, &data), y = LeafBuffers(type, n, c, nullptr);
      err = DecodeRows(stream, std::move(scratch), ffi::RemainingArgs(&in.args, 0), ffi::RemainingRets(&y.rets, 0), b);
      *out = y.Bytes();
    } else {
      const auto data = Read(size_t(a * cap));
      BufferList in = RowBufferList(a, cap, parts, &data), y = LeafBuffers(XlaType(b), n, c, nullptr);
      err = DecodeAccumulateRows(stream, std::move(scratch), ffi::RemainingArgs(&in.args, 0),
                                 ffi::RemainingRets(&y.rets, 0), int32_t(dtype));
      *out = y.Bytes();
    }
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
