// Runs the version-6 CUDA kernels (ffi/cuda6_codec.cuh) on the host, for
// tests/test_cuda6_emulation.py:
//   cuda6_emulation SMS RESIDENT < requests > replies
// tests/cuda_host_shim.h stands in for the CUDA runtime: every CUDA thread a
// std::thread, RESIDENT CUDA blocks of a launch at once, SMS the device's SMs
// (the decoder sizes its grid from them). Device memory is host memory filled
// with garbage, each input and output its own allocation of exactly its size,
// so AddressSanitizer reports any access outside them.
//
// A request: three little-endian int64 (op, dtype, n), an int64 byte count and
// that many input bytes. dtype: 1 bf16, 2 fp16, 3 fp32.
//   op 0 compress:   input n elements. Reply: the stream (int64 length, bytes).
//   op 1 decompress: input a stream. Reply: the verdict word (uint64: ~0 if it
//                    decoded), then the n elements (int64 length, bytes).
// Every request is checked to make no host synchronisation.
#include "cuda_host_shim.h"
//
#include "cuda6_codec.cuh"

#include <cstdio>
#include <vector>

namespace {

namespace c6 = zipccl::cuda6;

bool ReadAll(void* p, size_t n) { return std::fread(p, 1, n, stdin) == n; }
void WriteAll(const void* p, size_t n) {
  if (n) std::fwrite(p, 1, n, stdout);
}
void WriteField(const std::vector<uint8_t>& v) {
  const int64_t n = int64_t(v.size());
  WriteAll(&n, 8);
  WriteAll(v.data(), v.size());
}

// A device allocation of exactly `bytes` (garbage-filled, as cudaMalloc's in the shim).
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) std::abort();
  }
  ~DeviceBuffer() { cudaFree(p); }
  uint8_t* bytes() const { return static_cast<uint8_t*>(p); }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: cuda6_emulation SMS RESIDENT < requests > replies\n");
    return 2;
  }
  zc_emu::sms = std::atoi(argv[1]);
  zc_emu::resident = unsigned(std::atoi(argv[2]));
  static c6::Tables tables;  // "device" memory is host memory
  c6::BuildTables(&tables);
  int64_t head[4];
  while (ReadAll(head, sizeof(head))) {
    const int64_t op = head[0], dtype = head[1], n = head[2], size = head[3];
    const int eb = zipccl::v6::layout_of(int(dtype)).elem_bytes;
    DeviceBuffer in{size_t(size)};
    if (!ReadAll(in.p, size_t(size))) return 2;
    const uint64_t syncs = zc_emu::host_syncs;
    if (op == 0) {
      DeviceBuffer out(size_t(zipccl::kHeaderBytes + n * eb)), ws(c6::CompressWorkspaceBytes(n)), len(8);
      c6::Compress(int(dtype), in.p, n, out.bytes(), reinterpret_cast<unsigned long long*>(len.p), ws.p, &tables, nullptr);
      const uint64_t got = *reinterpret_cast<unsigned long long*>(len.p);
      if (got > uint64_t(16 + n * eb)) return 4;
      WriteField(std::vector<uint8_t>(out.bytes(), out.bytes() + got));
    } else {
      DeviceBuffer y(size_t(n * eb)), verdict(8);
      c6::Decompress(int(dtype), in.bytes(), size, n, y.p, reinterpret_cast<unsigned long long*>(verdict.p), &tables,
                     zc_emu::sms, nullptr);
      WriteAll(verdict.p, 8);
      WriteField(std::vector<uint8_t>(y.bytes(), y.bytes() + n * eb));
    }
    if (zc_emu::host_syncs != syncs) return 5;  // a call waited for the device
    std::fflush(stdout);
  }
  return 0;
}
