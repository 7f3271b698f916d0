// Runs the CUDA codec's handlers and kernels (ffi/zipccl_cuda.cu) on the
// host, for tests/test_cuda_emulation.py:
//   cuda_emulation SMS RESIDENT [INJECT [SMEM_BLOCK]] < requests > replies
// The file is compiled whole with tests/cuda_host_shim.h in place of the
// CUDA runtime, and the driver calls the real handlers (Compress, Decompress,
// DecompressAccumulate, the collectives' row ops) with XLA FFI buffers over host memory, garbage-filled
// as XLA's are, so their argument checks, workspace carving (each array
// followed by a gap ASan reports) and kernel order run as written; and the
// timing function the selftest calls. The emulated device
// has SMS SMs (the handlers size their grids from it) and keeps RESIDENT CUDA
// blocks running at once; INJECT (default 0) picks a deliberately broken
// kernel variant (ZC_INJECTED in zipccl_cuda.cu) for the tests that must
// catch it; SMEM_BLOCK (default an H100's 232,448) is the shared memory a
// CUDA block may have, which sets the reduce step's rows decoded at once.
//
// A request is eight little-endian int64 (op, dtype, n, a, b, c, d, short)
// and its input bytes; each handler gets a workspace of the bytes its
// *WorkspaceBytes function asks for, less `short`:
//   op 0 compress:    a = batch, b = cap; input batch * n elements.
//                     Output: batch uint32 sizes, then the [batch, cap] payload.
//   op 1 decompress:  a = streams, b = cap; input the [streams, cap] payload.
//                     Output: streams * n elements; status: streams words.
//   op 2 accumulate:  a = batch, b = k, c = cap, d = output dtype; input the
//                     [batch, k, cap] payload. Output: batch * n sums; status:
//                     batch * k words.
//   op 3 time codec:  a = repeat; input n elements (zipccl_cuda::TimeCodec).
//                     Output: compress, decompress and copy ms as 3 float64,
//                     compressed bytes and round_trip as 2 int64.
//   op 9 time rows:   a = repeat, b = rows; input n elements (zipccl_cuda::
//                     TimeRows). Output: size, encode and reduce ms as 3 float64,
//                     compressed bytes and decoded as 2 int64.
// The collectives' row ops (zipccl_rows.h): n elements in c leaves (leaf i
// holds elements [i n / c, (i + 1) n / c)) cut into a rows with b = unit; the
// row buffers (outputs or received parts) hold a / P rows each, P = d >> 32,
// of cap = d & 0xFFFFFFFF bytes:
//   op 4 stream_sizes: input n elements. Output: a uint32 sizes.
//   op 5 encode_rows, op 6 the same with raw: input n elements. Output: the
//                     buffers' bytes, a * cap in all.
//   op 10 encode_rows with its lengths result: as op 5; status: a uint32 lengths.
//   op 7 decode_rows: input the [a, cap] payload. Output: n elements;
//                     status: a words.
//   op 8 decode_accumulate_rows: n = elements per row, b = the output dtype
//                     (no unit); input the [a, cap] payload. Output: n sums;
//                     status: a words.
// With ZIPCCL_EMU_COUNTS set, each kernel's counts (zc_emu::Counts) go to
// stderr at the end, one line each: name launches threads warp_ops barriers
// atomics.
//
// dtype is the format's code (1 bf16, 2 fp16, 3 fp32; any other: int32, which
// the handlers refuse). A reply is four fields, each an int64 length and its
// bytes: the handler's error message ("" on success), the output, the status
// words (uint32), and the number of host synchronisations the request made
// (one int64: zc_emu::host_syncs).
#include "cuda_host_shim.h"
//
#include "zipccl_cuda.cu"

#include <cstdio>
#include <cstdlib>
#include <utility>

namespace {

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

uint8_t* Bytes(void* p) { return static_cast<uint8_t*>(p); }

// A workspace result of `bytes` (garbage, as XLA's buffers hold).
HostBuffer WorkspaceBuffer(int64_t bytes) { return HostBuffer(ffi::DataType::U8, {std::max<int64_t>(bytes, 0)}); }

// Variadic buffers, for RemainingArgs / RemainingRets; Finish() after the last Add.
struct BufferList {
  std::vector<HostBuffer> buffers;
  std::vector<void*> pointers;
  std::vector<int> types;  // XLA_FFI_ArgType_BUFFER == XLA_FFI_RetType_BUFFER == 1
  XLA_FFI_Args args{};
  XLA_FFI_Rets rets{};

  void Finish() {
    pointers.clear(), types.clear();
    for (auto& b : buffers) pointers.push_back(&b.view), types.push_back(1);
    args = {XLA_FFI_Args_STRUCT_SIZE, nullptr, int64_t(pointers.size()),
            reinterpret_cast<XLA_FFI_ArgType*>(types.data()), pointers.data()};
    rets = {XLA_FFI_Rets_STRUCT_SIZE, nullptr, int64_t(pointers.size()),
            reinterpret_cast<XLA_FFI_RetType*>(types.data()), pointers.data()};
  }
  // The bytes of buffers [first, last).
  std::vector<uint8_t> Bytes(size_t first, size_t last) const {
    std::vector<uint8_t> all;
    for (size_t i = first; i < last; ++i) all.insert(all.end(), buffers[i].bytes.begin(), buffers[i].bytes.end());
    return all;
  }
};

// n elements of `type` in `count` leaves (leaf i: elements [i n / count, (i + 1) n / count)), from data or garbage.
void AddLeaves(BufferList* l, ffi::DataType type, int64_t n, int64_t count, const std::vector<uint8_t>* data) {
  const int64_t eb = int64_t(ffi::ByteWidth(type));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t begin = i * n / count, end = (i + 1) * n / count;
    if (data) l->buffers.emplace_back(type, std::vector<int64_t>{end - begin},
                                      std::vector<uint8_t>(data->begin() + begin * eb, data->begin() + end * eb));
    else l->buffers.emplace_back(type, std::vector<int64_t>{end - begin});
  }
}

// `rows` rows of cap bytes in `count` buffers [rows / count, cap], from data or garbage.
void AddRowBuffers(BufferList* l, int64_t rows, int64_t cap, int64_t count, const std::vector<uint8_t>* data) {
  const int64_t each = rows / count;
  for (int64_t i = 0; i < count; ++i) {
    if (data) l->buffers.emplace_back(ffi::DataType::U8, std::vector<int64_t>{each, cap},
                                      std::vector<uint8_t>(data->begin() + i * each * cap,
                                                           data->begin() + (i + 1) * each * cap));
    else l->buffers.emplace_back(ffi::DataType::U8, std::vector<int64_t>{each, cap});
  }
}

// The collectives' row ops (requests 4-8).
ffi::Error ServeRows(const int64_t* req, std::vector<uint8_t>* out, std::vector<uint8_t>* status) {
  const int64_t op = req[0], dtype = req[1], n = req[2], a = req[3], b = req[4], c = req[5], shortfall = req[7];
  const int64_t cap = req[6] & 0xFFFFFFFF, parts = req[6] >> 32;
  const ffi::DataType type = XlaType(dtype);
  const int size_dtype = dtype >= zc::kBF16 && dtype <= zc::kF32 ? int(dtype) : zc::kF32;  // refused anyway
  const auto workspace = [&](const char* target, int64_t rows, int64_t size, int64_t unit, int64_t part_rows) {
    return zipccl_cuda::RowsWorkspaceBytes(target, size_dtype, rows, size, unit, c, part_rows) - shortfall;
  };
  cudaStream_t stream = nullptr;
  BufferList in, res;
  if (op == 4 || op == 5 || op == 6 || op == 10) {
    const auto data = Read(size_t(n * int64_t(ffi::ByteWidth(type))));
    AddLeaves(&in, type, n, c, &data);
    in.Finish();
    if (op == 4) {
      HostBuffer sizes(ffi::DataType::U32, {a});
      HostBuffer ws = WorkspaceBuffer(workspace("zipccl_stream_sizes", a, n, b, 0));
      const ffi::Error err = StreamSizes(stream, ffi::RemainingArgs(&in.args, 0), ffi::Buffer<ffi::U32>(&sizes.view),
                                         ffi::Buffer<ffi::U8>(&ws.view), b);
      *out = sizes.bytes;
      return err;
    }
    AddRowBuffers(&res, a, cap, parts, nullptr);
    if (op == 10) res.buffers.emplace_back(ffi::DataType::U32, std::vector<int64_t>{a});  // the lengths
    res.buffers.push_back(WorkspaceBuffer(workspace(op == 6 ? "zipccl_encode_rows_raw" : "zipccl_encode_rows", a, n, b, 0)));
    res.Finish();
    const ffi::Error err = EncodeRows(stream, ffi::RemainingArgs(&in.args, 0), ffi::RemainingRets(&res.rets, 0), a, b,
                                      op == 6);
    *out = res.Bytes(0, size_t(parts));
    if (op == 10) *status = res.buffers[size_t(parts)].bytes;
    return err;
  }
  const auto data = Read(size_t(a * cap));
  AddRowBuffers(&in, a, cap, parts, &data);
  in.Finish();
  const bool decode = op == 7;
  AddLeaves(&res, decode ? type : XlaType(b), n, c, nullptr);
  res.buffers.emplace_back(ffi::DataType::U32, std::vector<int64_t>{a});
  res.buffers.push_back(WorkspaceBuffer(decode ? workspace("zipccl_decode_rows", a, n, b, a / parts)
                                               : workspace("zipccl_decode_accumulate_rows", 1, n, 0, a)));
  res.Finish();
  const ffi::Error err = decode ? DecodeRows(stream, ffi::RemainingArgs(&in.args, 0), ffi::RemainingRets(&res.rets, 0), b)
                                : DecodeAccumulateRows(stream, ffi::RemainingArgs(&in.args, 0),
                                                       ffi::RemainingRets(&res.rets, 0), int32_t(dtype));
  *out = res.Bytes(0, size_t(c));
  *status = res.buffers[size_t(c)].bytes;
  return err;
}

// Runs one request; returns the handler's error and sets *out and *status.
ffi::Error Serve(const int64_t* req, std::vector<uint8_t>* out, std::vector<uint8_t>* status) {
  const int64_t op = req[0], dtype = req[1], n = req[2], a = req[3], b = req[4], c = req[5], shortfall = req[7];
  const ffi::DataType type = XlaType(dtype);
  const int64_t eb = int64_t(ffi::ByteWidth(type));
  const int size_dtype = dtype >= zc::kBF16 && dtype <= zc::kF32 ? int(dtype) : zc::kF32;  // refused anyway
  if (op == 9) {
    const std::vector<uint8_t> x = Read(size_t(n * eb));
    zipccl_cuda::RowsTiming t;
    const std::string message = zipccl_cuda::TimeRows(0, int(dtype), x.data(), n, b, int(a), &t);
    if (!message.empty()) return ffi::Error(ffi::ErrorCode::kInternal, message);
    const double ms[3] = {t.size_ms, t.encode_ms, t.reduce_ms};
    const int64_t ints[2] = {t.compressed_bytes, t.decoded};
    out->assign(Bytes((void*)ms), Bytes((void*)ms) + sizeof(ms));
    out->insert(out->end(), Bytes((void*)ints), Bytes((void*)ints) + sizeof(ints));
    return ffi::Error::Success();
  }
  if (op >= 4) return ServeRows(req, out, status);
  cudaStream_t stream = nullptr;
  ffi::Error err = ffi::Error::Success();
  if (op == 0) {
    HostBuffer x(type, {a, n}, Read(size_t(a * n * eb)));
    HostBuffer payload(ffi::DataType::U8, {a, b}), sizes(ffi::DataType::U32, {a});
    HostBuffer ws = WorkspaceBuffer(zipccl_cuda::CompressWorkspaceBytes(size_dtype, a, n) - shortfall);
    err = Compress(stream, ffi::AnyBuffer(&x.view), ffi::Buffer<ffi::U8>(&payload.view),
                   ffi::Buffer<ffi::U32>(&sizes.view), ffi::Buffer<ffi::U8>(&ws.view), n);
    *out = sizes.bytes;
    out->insert(out->end(), payload.bytes.begin(), payload.bytes.end());
  } else if (op == 1) {
    HostBuffer payload(ffi::DataType::U8, {a, b}, Read(size_t(a * b)));
    HostBuffer y(type, {a * n}), words(ffi::DataType::U32, {a});
    HostBuffer ws = WorkspaceBuffer(zipccl_cuda::DecompressWorkspaceBytes(size_dtype, a, n) - shortfall);
    err = Decompress(stream, ffi::Buffer<ffi::U8>(&payload.view), ffi::AnyBuffer(&y.view),
                     ffi::Buffer<ffi::U32>(&words.view), ffi::Buffer<ffi::U8>(&ws.view), n);
    *out = y.bytes;
    *status = words.bytes;
  } else if (op == 2) {
    HostBuffer payload(ffi::DataType::U8, {a, b, c}, Read(size_t(a * b * c)));
    HostBuffer y(XlaType(req[6]), {b > 0 ? a * n : 0}), words(ffi::DataType::U32, {a, b});
    HostBuffer ws = WorkspaceBuffer(zipccl_cuda::AccumulateWorkspaceBytes(size_dtype, a, b, n) - shortfall);
    err = DecompressAccumulate(stream, ffi::Buffer<ffi::U8>(&payload.view), ffi::AnyBuffer(&y.view),
                               ffi::Buffer<ffi::U32>(&words.view), ffi::Buffer<ffi::U8>(&ws.view), n, int32_t(dtype));
    *out = y.bytes;
    *status = words.bytes;
  } else {
    const std::vector<uint8_t> x = Read(size_t(n * eb));
    zipccl_cuda::CodecTiming t;
    const std::string message = zipccl_cuda::TimeCodec(0, int(dtype), x.data(), n, int(a), &t);
    if (!message.empty()) return ffi::Error(ffi::ErrorCode::kInternal, message);
    const double ms[3] = {t.compress_ms, t.decompress_ms, t.copy_ms};
    const int64_t ints[2] = {t.compressed_bytes, t.round_trip};
    out->assign(Bytes((void*)ms), Bytes((void*)ms) + sizeof(ms));
    out->insert(out->end(), Bytes((void*)ints), Bytes((void*)ints) + sizeof(ints));
  }
  return err;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 5) {
    std::fprintf(stderr, "usage: cuda_emulation SMS RESIDENT [INJECT [SMEM_BLOCK]] < requests > replies\n");
    return 2;
  }
  zc_emu::sms = std::atoi(argv[1]);
  zc_emu::resident = unsigned(std::atoi(argv[2]));
  zc_emu::inject = argc >= 4 ? std::atoi(argv[3]) : 0;
  if (argc == 5) zc_emu::smem_optin = size_t(std::atoll(argv[4]));  // a smaller GPU's (the reduce step's row warps)
  int64_t req[8];
  while (std::fread(req, sizeof(req), 1, stdin) == 1) {
    std::vector<uint8_t> out, status;
    zc_emu::host_syncs = 0;
    const ffi::Error err = Serve(req, &out, &status);
    const int64_t syncs = int64_t(zc_emu::host_syncs);
    Write(err.message().data(), int64_t(err.message().size()));
    Write(out.data(), int64_t(out.size()));
    Write(status.data(), int64_t(status.size()));
    Write(&syncs, sizeof(syncs));
  }
  if (std::getenv("ZIPCCL_EMU_COUNTS"))
    for (const auto& [name, c] : zc_emu::counts)
      std::fprintf(stderr, "%s %llu %llu %llu %llu %llu\n", name.c_str(), (unsigned long long)c.launches,
                   (unsigned long long)c.threads, (unsigned long long)c.warp_ops, (unsigned long long)c.barriers,
                   (unsigned long long)c.atomics);
  return 0;
}
