// tools/v6_proto: the second block kind (docs/FORMAT.md, "A second block kind, measured"): a group of
// kGroupBlocks blocks carries its own code (a length-limited Huffman code of the group's symbol
// counts) as member 8, which its blocks may take (combo 16 = member 8, no flip) where it is smaller.
// Included by v6_proto.cu after Symbol(). The stream gains kGroupTableBytes per group: each symbol's
// code length in 4 bits (0: absent).
#pragma once

constexpr int kGroupBlocks = 16, kGroupTableBytes = 128, kGroupMember = kMembers;  // member 8

struct GroupSmem {
  uint32_t hist[256], weight[256], work[256];
  uint8_t sorted[256], length[256];
  uint32_t qref[kGroupBlocks];
  unsigned present;
};

// Moffat and Katajainen's in-place minimum-redundancy lengths of a[0..n) (ascending weights, n >= 2):
// a[i] becomes the code length of the i-th.
__device__ inline void InPlaceLengths(uint32_t* a, int n) {
  a[0] += a[1];
  int root = 0, leaf = 2;
  for (int next = 1; next < n - 1; ++next) {
    if (leaf >= n || a[root] < a[leaf]) a[next] = a[root], a[root++] = uint32_t(next);
    else a[next] = a[leaf++];
    if (leaf >= n || (root < next && a[root] < a[leaf])) a[next] += a[root], a[root++] = uint32_t(next);
    else a[next] += a[leaf++];
  }
  a[n - 2] = 0;
  for (int next = n - 3; next >= 0; --next) a[next] = a[a[next]] + 1;
  int avail = 1, used = 0, depth = 0, next = n - 1;
  root = n - 2;
  while (avail > 0) {
    while (root >= 0 && int(a[root]) == depth) ++used, --root;
    while (avail > used) a[next--] = uint32_t(depth), --avail;
    avail = 2 * used, ++depth, used = 0;
  }
}

// One CTA (256 threads) per group: each block's q_ref (to qrefs), the group's symbol histogram, its
// code lengths (flattened until none exceeds kMaxLen) into the stream's group table.
__global__ void __launch_bounds__(256) GroupKernel(const uint16_t* x, int64_t n, uint32_t* qrefs, uint8_t* tables) {
  ZC_SHARED(GroupSmem, s);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t g = blockIdx.x, nb = (n + kBlock - 1) / kBlock;
  auto count_of = [&](int64_t b) { return int(Min<int64_t>(kBlock, Max<int64_t>(0, n - b * kBlock))); };
  for (int i = 2 * warp; i < 2 * warp + 2; ++i) {  // warp w: the group's blocks 2w and 2w + 1
    const int64_t b = g * kGroupBlocks + i;
    const int count = count_of(b);
    uint32_t qm = 0;
    for (int j = lane; j < count; j += 32) {
      const uint32_t q = (uint32_t(x[b * kBlock + j]) >> 5) & 0x3FF;
      qm = Max(qm, q - 4 < 1016 ? q : 0u);
    }
    for (int o = 16; o; o >>= 1) qm = Max(qm, __shfl_xor_sync(0xFFFFFFFFu, qm, o));
    if (lane == 0) {
      s.qref[i] = qm;
      if (b < nb) qrefs[b] = qm;
    }
  }
  s.hist[tid] = 0;
  if (tid == 0) s.present = 0;
  __syncthreads();
  for (int i = 0; i < kGroupBlocks; ++i) {
    const int64_t b = g * kGroupBlocks + i;
    for (int j = tid, count = count_of(b); j < count; j += 256) {
      uint32_t f;
      atomicAdd(&s.hist[Symbol(x[b * kBlock + j], s.qref[i], &f)], 1u);
    }
  }
  __syncthreads();
  // the present symbols in ascending (count, symbol): thread t ranks symbol t
  const uint32_t c = s.hist[tid];
  uint32_t rank = 0;
  for (int u = 0; u < 256; ++u) {
    const uint32_t cu = s.hist[u];
    rank += cu != 0 && (cu < c || (cu == c && u < tid));
  }
  if (c) s.sorted[rank] = uint8_t(tid), s.weight[rank] = c, atomicAdd(&s.present, 1u);
  s.length[tid] = 0;
  __syncthreads();
  if (tid == 0) {
    const int np = int(s.present);
    if (np == 1) s.length[s.sorted[0]] = 1;
    for (bool fits = np < 2; !fits;) {
      for (int i = 0; i < np; ++i) s.work[i] = s.weight[i];
      InPlaceLengths(s.work, np);
      fits = s.work[0] <= uint32_t(kMaxLen);  // the rarest symbol has the longest code
      for (int i = 0; i < np; ++i) s.weight[i] = (s.weight[i] + 1) >> 1;  // flatten, the order kept
      if (fits)
        for (int i = 0; i < np; ++i) s.length[s.sorted[i]] = uint8_t(s.work[i]);
    }
  }
  __syncthreads();
  if (tid < kGroupTableBytes)
    tables[g * kGroupTableBytes + tid] = uint8_t(s.length[2 * tid] | s.length[2 * tid + 1] << 4);
}

// The canonical code of a group table (`len`: this thread's symbol's length, thread t = symbol t, 256
// threads), as BuildTables makes the family's: codes in (length, symbol) order. Gives this symbol's
// code and fills first / count / base / order (shared, for the decoder's long codes) of the member.
struct CanonicalScratch {
  uint32_t per_warp[8][kMaxLen + 1];
};
__device__ inline uint32_t CanonicalCode(uint32_t len, CanonicalScratch& sc, uint16_t* first, uint16_t* count,
                                         uint16_t* base, uint8_t* order) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  uint32_t rank = 0;
  for (int l = 1; l <= kMaxLen; ++l) {  // the same-length symbols below this one, in this warp
    const unsigned m = __ballot_sync(0xFFFFFFFFu, len == uint32_t(l));
    if (len == uint32_t(l)) rank = __popc(m & ((1u << lane) - 1));
    if (lane == 0) sc.per_warp[warp][l] = __popc(m);
  }
  __syncthreads();
  if (tid == 0) {
    uint32_t code = 0, idx = 0;
    for (int l = 1; l <= kMaxLen; ++l) {
      uint32_t total = 0;
      for (int w = 0; w < 8; ++w) total += sc.per_warp[w][l];
      first[l] = uint16_t(code), count[l] = uint16_t(total), base[l] = uint16_t(idx);
      code = (code + total) << 1, idx += total;
    }
  }
  __syncthreads();
  uint32_t code = 0;
  if (len) {
    for (int w = 0; w < warp; ++w) rank += sc.per_warp[w][len];
    code = first[len] + rank;
    order[base[len] + rank] = uint8_t(tid);
  }
  __syncthreads();
  return code;
}

// Member 8's decode table from its canonical code: entry i is the symbol whose code begins with the
// kPeek bits i, or kSlowBit for the prefix of a longer code (256 threads, 2^kPeek entries).
__device__ inline void FillDecodeTable(uint32_t* dec, const uint16_t* first, const uint16_t* count,
                                       const uint16_t* base,
                                       const uint8_t* order) {
  for (int i = threadIdx.x; i < 1 << kPeek; i += 256) {
    uint32_t e = kSlowBit;
    for (int l = 1; l <= kPeek; ++l) {
      const uint32_t c = uint32_t(i >> (kPeek - l)) - first[l];
      if (c < count[l]) {
        e = DecodeEntry(order[base[l] + c], uint32_t(l));
        break;
      }
    }
    dec[i] = e;
  }
}
