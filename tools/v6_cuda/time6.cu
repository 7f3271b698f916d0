// Times the version-6 CUDA codec (ffi/cuda6_codec.cuh) on one GPU, round trip checked bit for bit:
//   time6 bf16|fp16|fp32 gaussian|relu|file N [REPS] [FILE]
// FILE: raw elements of the dtype, repeated to N. Prints the ratio, and per call the compress and
// decompress time (CUDA events, REPS calls each after a warm-up) and GB/s of uncompressed bytes.
// With ROWS=K in the environment, also the reduce step (Accumulate) of the N elements cut into K
// rows (a psum bucket's), compressed as one batch: per call its time and GB/s of row bytes, the
// sums checked bit for bit against the host's rank-ordered float32 sum.
// Builds for the host emulation too (-DZIPCCL_HOST_EMULATION, tests/cuda_host_shim.h): a smoke test.
#ifdef ZIPCCL_HOST_EMULATION
#include "../../tests/cuda_host_shim.h"
#else
#include <cuda_runtime.h>
#endif
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../../ffi/cuda6_codec.cuh"

namespace {

namespace c6 = zipccl::cuda6;

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
uint16_t ToBf16(float f) {  // round to nearest even (finite inputs)
  const uint32_t x = Bits(f);
  return uint16_t((x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}
uint16_t ToF16(float f) {  // round to nearest even (finite inputs)
  const uint32_t x = Bits(f), sign = (x >> 16) & 0x8000, m = x & 0x7FFFFF;
  const int e = int((x >> 23) & 255) - 127 + 15;
  if (e >= 31) return uint16_t(sign | 0x7C00);
  uint32_t full = m | 0x800000, shift = e > 0 ? 13 : uint32_t(14 - e);
  if (shift > 24) return uint16_t(sign);
  uint32_t r = full >> shift, rem = full & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (e > 0) r = uint32_t(e) << 10 | (r & 0x3FF);
  if (rem > half || (rem == half && (r & 1))) ++r;
  return uint16_t(sign | r);
}

// The reduce step of x cut into k rows of m = n / k elements: compressed as one batch, summed by
// Accumulate `reps` times between CUDA events, checked against the host's sum (FORMAT.md §7).
bool TimeSum(int dtype, const std::vector<uint8_t>& x, int64_t k, int reps, const void* dx, const c6::Tables* tables,
             int sms, cudaStream_t stream, const std::string& dt) {
  const int eb = zipccl::v6::layout_of(dtype).elem_bytes;
  const int64_t m = k > 0 ? int64_t(x.size()) / eb / k : 0;
  if (m < 1) return false;
  const int64_t pitch = int64_t(zipccl::kHeaderBytes) + m * eb;
  int device = 0, smem_block = 0, smem_sm = 0;
  Check(cudaGetDevice(&device), "device");
  Check(cudaDeviceGetAttribute(&smem_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "smem");
  Check(cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device), "smem");
  void *payload, *ws, *ptrs, *sums, *verdicts, *codes;
  Check(cudaMalloc(&payload, size_t(k * pitch)), "malloc");
  Check(cudaMalloc(&ws, c6::CompressWorkspaceBytes(m, k)), "malloc");
  Check(cudaMalloc(&ptrs, size_t(k) * sizeof(void*)), "malloc");
  Check(cudaMalloc(&sums, size_t(m * eb)), "malloc");
  Check(cudaMalloc(&verdicts, size_t(k) * 8), "malloc");
  Check(cudaMalloc(&codes, size_t(std::max<int64_t>(1, c6::CodeCacheBytes(dtype, 1, k, m)))), "malloc");  // more than 8
  std::vector<const uint8_t*> host_ptrs(static_cast<size_t>(k));
  for (int64_t r = 0; r < k; ++r) host_ptrs[size_t(r)] = static_cast<uint8_t*>(payload) + r * pitch;
  Check(cudaMemcpyAsync(ptrs, host_ptrs.data(), size_t(k) * sizeof(void*), cudaMemcpyHostToDevice, stream), "copy");
  c6::Workspace w;
  c6::CarveWorkspace(ws, m, k, &w);
  c6::CompressBatch(dtype, dx, m, k, static_cast<uint8_t*>(payload), pitch, nullptr, nullptr, w, tables, true, stream);
  const auto* rows = static_cast<const uint8_t* const*>(ptrs);
  auto* v = static_cast<unsigned long long*>(verdicts);
  auto sum = [&] {
    Check(cudaMemsetAsync(verdicts, 0xFF, size_t(k) * 8, stream), "memset");
    Check(c6::Accumulate(dtype, rows, pitch, k, m, 1, codes, dtype, sums, v, tables, sms,
                         smem_block, smem_sm, stream),
          "accumulate");
  };
  sum();
  std::vector<uint8_t> got(static_cast<size_t>(m * eb));
  std::vector<unsigned long long> words(static_cast<size_t>(k));
  Check(cudaMemcpyAsync(got.data(), sums, got.size(), cudaMemcpyDeviceToHost, stream), "copy");
  Check(cudaMemcpyAsync(words.data(), verdicts, size_t(k) * 8, cudaMemcpyDeviceToHost, stream), "copy");
  Check(cudaStreamSynchronize(stream), "sync");
  bool exact = true;
  for (unsigned long long word : words) exact = exact && word == c6::kNoError;
  for (int64_t i = 0; exact && i < m; ++i) {  // the rank-ordered float32 sum, rounded once
    float acc = 0;
    for (int64_t r = 0; r < k; ++r) {
      const float f = zipccl::element_to_f32(dtype, zipccl::load_element(&x[size_t((r * m + i) * eb)], eb));
      acc = r == 0 ? f : zipccl::add_f32(acc, f);
    }
    exact = zipccl::f32_to_element(dtype, acc) == zipccl::load_element(&got[size_t(i * eb)], eb);
  }
  cudaEvent_t e0, e1;
  Check(cudaEventCreate(&e0), "event");
  Check(cudaEventCreate(&e1), "event");
  Check(cudaEventRecord(e0, stream), "record");
  for (int r = 0; r < reps; ++r) sum();
  Check(cudaEventRecord(e1, stream), "record");
  Check(cudaEventSynchronize(e1), "sync");
  Check(cudaGetLastError(), "kernels");
  float ms = 0;
  Check(cudaEventElapsedTime(&ms, e0, e1), "time");
  ms /= reps;
  std::printf("%s sum of %lld rows of %lld: %.4f ms %.1f GB/s of row bytes %s\n", dt.c_str(), (long long)k,
              (long long)m, ms, double(k * m * eb) / 1e9 / (ms / 1e3), exact ? "bit-exact" : "MISMATCH");
  for (void* p : {payload, ws, ptrs, sums, verdicts, codes}) cudaFree(p);
  return exact;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: time6 bf16|fp16|fp32 gaussian|relu|file N [REPS] [FILE]\n");
    return 2;
  }
  const std::string dt = argv[1], kind = argv[2];
  const int dtype = dt == "bf16" ? zipccl::kBF16 : dt == "fp16" ? zipccl::kF16 : zipccl::kF32;
  const int64_t n = std::atoll(argv[3]);
  const int reps = argc > 4 ? std::atoi(argv[4]) : 20, eb = zipccl::v6::layout_of(dtype).elem_bytes;
  if (n < 1 || reps < 1) return 2;
  std::vector<uint8_t> x(size_t(n) * eb);
  if (kind == "file") {
    FILE* f = argc > 5 ? std::fopen(argv[5], "rb") : nullptr;
    if (!f) return 2;
    std::vector<uint8_t> data;
    for (int c; (c = std::fgetc(f)) != EOF;) data.push_back(uint8_t(c));
    std::fclose(f);
    if (data.size() < size_t(eb)) return 2;
    for (size_t i = 0; i < x.size(); ++i) x[i] = data[i % (data.size() / eb * eb)];
  } else {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (int64_t i = 0; i < n; ++i) {
      float v = normal(rng);
      if (kind == "relu") v = v > 0 ? v : 0.f;
      const uint32_t b = dtype == zipccl::kBF16 ? ToBf16(v) : dtype == zipccl::kF16 ? ToF16(v) : Bits(v);
      std::memcpy(&x[size_t(i) * eb], &b, size_t(eb));
    }
  }
  int sms = 0, device = 0;
  Check(cudaGetDevice(&device), "device");
  Check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SMs");
  static c6::Tables host_tables;
  c6::BuildTables(&host_tables);
  void *dx, *dy, *ws, *dt_tables, *word;
  uint8_t* dout;
  const size_t cap = size_t(zipccl::kHeaderBytes) + x.size();
  Check(cudaMalloc(&dx, x.size()), "malloc");
  Check(cudaMalloc(&dy, x.size()), "malloc");
  Check(cudaMalloc(reinterpret_cast<void**>(&dout), cap), "malloc");
  Check(cudaMalloc(&ws, c6::CompressWorkspaceBytes(n)), "malloc");
  Check(cudaMalloc(&dt_tables, sizeof(c6::Tables)), "malloc");
  Check(cudaMalloc(&word, 16), "malloc");
  cudaStream_t stream;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  Check(cudaMemcpyAsync(dx, x.data(), x.size(), cudaMemcpyHostToDevice, stream), "copy");
  Check(cudaMemcpyAsync(dt_tables, &host_tables, sizeof(c6::Tables), cudaMemcpyHostToDevice, stream), "copy");
  auto* len = static_cast<unsigned long long*>(word);
  auto* verdict = len + 1;
  const auto* tables = static_cast<const c6::Tables*>(dt_tables);
  c6::Compress(dtype, dx, n, dout, len, ws, tables, stream);
  unsigned long long stream_bytes = 0, status = 0;
  Check(cudaMemcpyAsync(&stream_bytes, len, 8, cudaMemcpyDeviceToHost, stream), "copy");
  Check(cudaStreamSynchronize(stream), "sync");
  c6::Decompress(dtype, dout, int64_t(stream_bytes), n, dy, verdict, tables, sms, stream);
  std::vector<uint8_t> y(x.size());
  Check(cudaMemcpyAsync(&status, verdict, 8, cudaMemcpyDeviceToHost, stream), "copy");
  Check(cudaMemcpyAsync(y.data(), dy, y.size(), cudaMemcpyDeviceToHost, stream), "copy");
  Check(cudaStreamSynchronize(stream), "sync");
  const bool exact = status == c6::kNoError && y == x;
  cudaEvent_t e0, e1, e2;
  Check(cudaEventCreate(&e0), "event");
  Check(cudaEventCreate(&e1), "event");
  Check(cudaEventCreate(&e2), "event");
  Check(cudaEventRecord(e0, stream), "record");
  for (int r = 0; r < reps; ++r) c6::Compress(dtype, dx, n, dout, len, ws, tables, stream);
  Check(cudaEventRecord(e1, stream), "record");
  for (int r = 0; r < reps; ++r) c6::Decompress(dtype, dout, int64_t(stream_bytes), n, dy, verdict, tables, sms, stream);
  Check(cudaEventRecord(e2, stream), "record");
  Check(cudaEventSynchronize(e2), "sync");
  Check(cudaGetLastError(), "kernels");
  float cms = 0, dms = 0;
  Check(cudaEventElapsedTime(&cms, e0, e1), "time");
  Check(cudaEventElapsedTime(&dms, e1, e2), "time");
  cms /= reps, dms /= reps;
  const double gb = double(x.size()) / 1e9;
  std::printf("%s %s n=%lld ratio %.4f compress %.4f ms %.1f GB/s decompress %.4f ms %.1f GB/s %s\n", dt.c_str(),
              kind.c_str(), (long long)n, double(x.size()) / double(stream_bytes), cms, gb / (cms / 1e3), dms,
              gb / (dms / 1e3), exact ? "bit-exact" : "MISMATCH");
  const char* rows = std::getenv("ROWS");
  const bool summed = !rows || TimeSum(dtype, x, std::atoll(rows), reps, dx, tables, sms, stream, dt);
  return exact && summed ? 0 : 1;
}
