// What the CUDA codec (format version 6) offers the host besides its XLA FFI handlers: the size
// of each handler's workspace result (zipccl_jax/ops.py asks XLA for exactly
// that many bytes) and the codec's timing with CUDA events (python -m
// zipccl_jax selftest). Plain C++, for cuda_module.cc and tests/cuda_emulation.cc;
// defined in zipccl_cuda.cu. dtype codes are the format's (1 bf16, 2 fp16, 3 fp32).
#pragma once

#include <cstdint>
#include <string>

namespace zipccl_cuda {

// Bytes of the workspace (last) result of zipccl_compress over `batch` items,
// zipccl_decompress over `streams` streams, and zipccl_decompress_accumulate
// over `batch` items of k rows each, of n elements.
int64_t CompressWorkspaceBytes(int dtype, int64_t batch, int64_t n);
int64_t DecompressWorkspaceBytes(int dtype, int64_t streams, int64_t n);
int64_t AccumulateWorkspaceBytes(int dtype, int64_t batch, int64_t k, int64_t n);

// The same for the collectives' row ops (zipccl_rows.h): op is the target
// ("zipccl_encode_rows_raw" for encode_rows with raw), `rows` rows of a flat
// array of `size` elements in `leaves` leaves, interleaved by `unit`;
// part_rows: the most rows of one received part (decode_rows; its workspace
// depends on `rows` alone since format version 6). For decode_accumulate_rows,
// rows = 1, size = the elements summed and part_rows the rows summed.
int64_t RowsWorkspaceBytes(const std::string& op, int dtype, int64_t rows, int64_t size, int64_t unit, int64_t leaves,
                           int64_t part_rows);

// What TimeCodec measured: GPU time per call between CUDA events (the mean over
// `repeat` back-to-back calls), and whether the one stream decoded to its input.
struct CodecTiming {
  double compress_ms = 0, decompress_ms = 0, copy_ms = 0;
  int64_t compressed_bytes = 0;
  bool round_trip = false;
};

// On CUDA device `device`, in device buffers of its own: compresses the n
// elements at host_input as one stream `repeat` times, decompresses it
// `repeat` times, and copies the input device to device (cudaMemcpyAsync)
// `repeat` times, each run between two CUDA events on one stream after a
// warm-up call. Returns "" or what failed.
std::string TimeCodec(int device, int dtype, const void* host_input, int64_t n, int repeat, CodecTiming* timing);

// What TimeRows measured: GPU milliseconds per call between CUDA events of
// a psum bucket's row ops -- the size pass alone (stream_sizes' kernels: the
// streams' lengths, nothing written), its rows compressed (one Compress of the
// rows as a batch: the size pass and the encode of the collectives) and their reduce
// step (the rows decoded and summed in order: DecompressAccumulate) -- the
// rows' compressed bytes, and whether every row decoded.
struct RowsTiming {
  double size_ms = 0, encode_ms = 0, reduce_ms = 0;
  int64_t compressed_bytes = 0;
  bool decoded = false;
};

// On CUDA device `device`, in device buffers of its own: the n elements at
// host_input cut into `rows` rows (n a multiple of rows), timed as above,
// `repeat` calls each after a warm-up. Returns "" or what failed.
std::string TimeRows(int device, int dtype, const void* host_input, int64_t n, int64_t rows, int repeat,
                     RowsTiming* timing);

}  // namespace zipccl_cuda
