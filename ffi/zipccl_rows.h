// How the collectives' handlers cut a flat array into rows (one stream each)
// and put decoded rows back: shared by the CPU and CUDA handlers, mirrored by
// reference.row_order (the tests' oracle).
//
// A flat array of `size` elements is cut into k rows of m = ceil(size / k)
// elements; elements past `size` are zero padding (written as zeros into a
// stream, dropped when decoded). With unit == 0, row j is the contiguous
// [j m, (j + 1) m). With unit > 0 (zip_psum's interleaved chunks), row j
// holds the units j, j + k, j + 2k, ... of the largest prefix of the padded
// k m elements that is a multiple of k units, then its contiguous share of
// the rest. Each piece of a row is one run of consecutive source elements.
#pragma once

#include <cstdint>

#include "zipccl_format.h"  // ZC_HD

namespace zipccl {

struct RowLayout {
  int64_t size = 0;  // elements of the flat array
  int64_t rows = 0;  // k
  int64_t m = 0;     // elements per row
  int64_t unit = 0;  // 0: contiguous rows
  int64_t main = 0;  // per row: elements in the interleaved prefix (a multiple of unit)

  ZC_HD static RowLayout of(int64_t size, int64_t rows, int64_t unit) {
    RowLayout l;
    l.size = size;
    l.rows = rows;
    l.m = rows > 0 ? (size + rows - 1) / rows : 0;
    l.unit = unit > 0 ? unit : 0;
    l.main = l.unit ? l.m / l.unit * l.unit : 0;  // (k m) // (k unit) * (k unit) / k
    return l;
  }

  // Runs per row: one per unit of the interleaved prefix, then the rest.
  ZC_HD int64_t runs() const { return unit ? main / unit + 1 : 1; }

  // Run r of row j: its first element within the row, within the flat
  // array, and its length, clipped to the array (*count may be 0; the row's
  // elements from *row_at + *count to the run's end are padding).
  ZC_HD void run(int64_t j, int64_t r, int64_t* row_at, int64_t* src_at, int64_t* count) const {
    int64_t len;
    if (r < runs() - 1) {
      *row_at = r * unit;
      *src_at = (r * rows + j) * unit;
      len = unit;
    } else {
      *row_at = main;
      *src_at = rows * main + j * (m - main);
      len = m - main;
    }
    const int64_t left = size - *src_at;
    *count = left <= 0 ? 0 : left < len ? left : len;
  }

  // Row j is one run of m elements inside the array (no gather needed).
  ZC_HD bool contiguous(int64_t j) const {
    return (unit == 0 || main == 0) && (j + 1) * m <= size;
  }

  // The run length before clipping (for padding).
  ZC_HD int64_t run_length(int64_t r) const { return r < runs() - 1 ? unit : m - main; }

  // The inverse: where element src (< size) of the array sits, row *j at *i.
  ZC_HD void locate(int64_t src, int64_t* j, int64_t* i) const {
    if (src < rows * main) {  // the interleaved prefix: unit u = t rows + j
      const int64_t u = src / unit;
      *j = u % rows;
      *i = u / rows * unit + src % unit;
    } else {
      const int64_t rest = m - main, s = src - rows * main;
      *j = s / rest;
      *i = main + s % rest;
    }
  }
};

}  // namespace zipccl
