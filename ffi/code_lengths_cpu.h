// A group code's lengths on the CPU (FORMAT.md §4): zipccl_format.h's
// code_lengths, the same result, faster.
#pragma once

#include <cstdint>
#include <cstring>

#include "zipccl_format.h"  // kMaxCodeLen, flattening_shift

namespace zipccl {

// The n used symbols of counts (1 << kShift of them) as leaves count <<
// kShift | symbol, sorted by (count, symbol): in symbol order, then sorted by
// count, stably, a byte per pass (with two used symbols or more, the counts
// of a group, at most 2^16 elements, fit 16 bits).
template <int kShift>
inline void sort_leaves(const uint32_t* counts, uint32_t* leaf, int n) {
  uint32_t any = 0, m = 0, sorted[(1 << kShift) + 2];
  for (int s = 0; s < (1 << kShift); ++s) {  // branch-free: used and unused symbols interleave
    leaf[m] = counts[s] << kShift | uint32_t(s);
    m += counts[s] != 0;
    any |= counts[s];
  }
  for (int pass = 0; pass < 2 && (any >> (8 * pass)); ++pass) {
    const int shift = kShift + 8 * pass;
    uint16_t start[256] = {};
    for (int i = 0; i < n; ++i) ++start[(leaf[i] >> shift) & 0xFF];
    for (int v = 0, at = 0; v < 256; ++v) {
      const int c = start[v];
      start[v] = uint16_t(at), at += c;
    }
    for (int i = 0; i < n; ++i) sorted[start[(leaf[i] >> shift) & 0xFF]++] = leaf[i];
    std::memcpy(leaf, sorted, sizeof(uint32_t) * n);
  }
}

// code_lengths of zipccl_format.h over NSYM symbols (128 or 256), the same
// result, with a radix sort of the leaves and a branch-free merge.
template <int NSYM>
inline void fast_code_lengths(const uint32_t* counts, uint8_t* lens) {
  constexpr int kShift = NSYM == 256 ? 8 : 7;
  constexpr uint32_t kSym = NSYM - 1;
  static_assert(NSYM == 1 << kShift, "128 or 256 symbols");
  uint32_t leaf[NSYM + 2];  // count << kShift | symbol, ascending; then two past the end
  int n = 0;
  for (int s = 0; s < NSYM; ++s) n += counts[s] != 0;
  std::memset(lens, 0, NSYM);
  if (n == 1)
    for (int s = 0; s < NSYM; ++s) lens[s] = counts[s] != 0;
  if (n < 2) return;
  sort_leaves<kShift>(counts, leaf, n);
  // Past the end of either queue, weights read as more than any true weight.
  leaf[n] = leaf[n + 1] = ~0u;
  uint32_t node[NSYM + 1];        // weights of internal nodes in creation order
  uint8_t height[NSYM + 1] = {};  // of internal nodes: their deepest leaf's depth below them
  uint16_t parent[2 * NSYM + 1];  // of leaves 0..n-1, then of nodes n..; last: a dummy
  const int dummy = 2 * NSYM;
  for (;;) {
    int li = 0, ni = 0;
    for (int made = 0; made < n - 1; ++made) {  // two-queue Huffman, leaves first on ties
      node[made] = node[made + 1] = ~0u;
      // The two lightest fronts, branch-free (which queue wins is data).
      const uint32_t l0 = leaf[li] >> kShift, l1 = leaf[li + 1] >> kShift, n0 = node[ni], n1 = node[ni + 1];
      const bool a_leaf = l0 <= n0, b_leaf = a_leaf ? l1 <= n0 : l0 <= n1;
      const int leaves = a_leaf + b_leaf, nodes = 2 - leaves;
      const uint16_t p = uint16_t(n + made);
      parent[leaves > 0 ? li : dummy] = p;
      parent[leaves > 1 ? li + 1 : dummy] = p;
      parent[nodes > 0 ? n + ni : dummy] = p;
      parent[nodes > 1 ? n + ni + 1 : dummy] = p;
      const uint32_t b = b_leaf ? (a_leaf ? l1 : l0) : (a_leaf ? n0 : n1);
      node[made] = (a_leaf ? l0 : n0) + b;
      const uint32_t h0 = nodes > 0 ? height[ni] : 0, h1 = nodes > 1 ? height[ni + 1] : 0;
      height[made] = uint8_t((h0 > h1 ? h0 : h1) + 1);
      li += leaves, ni += nodes;
    }
    if (height[n - 2] <= kMaxCodeLen) break;  // the root's height: the longest code
    // Flatten, rounding up; many counts now tie, and ties order by symbol: the
    // leaves are rebuilt in symbol order and sorted by count, stably.
    const int k = flattening_shift(height[n - 2]);
    uint32_t flat[NSYM] = {};
    for (int i = 0; i < n; ++i) flat[leaf[i] & kSym] = ((leaf[i] >> kShift) + (1u << k) - 1) >> k;
    sort_leaves<kShift>(flat, leaf, n);
    leaf[n] = leaf[n + 1] = ~0u;
  }
  uint8_t depth[2 * NSYM];
  depth[2 * n - 2] = 0;
  for (int i = 2 * n - 3; i >= 0; --i) depth[i] = uint8_t(depth[parent[i]] + 1);
  for (int i = 0; i < n; ++i) lens[leaf[i] & kSym] = depth[i];
}

}  // namespace zipccl
