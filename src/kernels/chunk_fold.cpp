#include "kernels/chunk_fold.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace retrace::kernels {
namespace {

constexpr int64_t kRows = kFoldTileRows;
constexpr int64_t kCols = kFoldTileCols;

// One 6 x 16 tile of C (leading dimension ldc) from A's packed panel pa[p * 6 + row] and B's
// pb[p * 16 + col]: 12 accumulators of 8 floats per chunk, as BLIS's micro-kernel holds them, and
// the tile of C in 12 more registers across the chunks.
__attribute__((target("avx2,fma"))) void tile(int64_t m, int64_t r, const float* pa, const float* pb, float* c,
                                              int64_t ldc, bool fresh) {
  __m256 c0[kRows], c1[kRows];
  for (int64_t ii = 0; ii < kRows; ++ii) {
    c0[ii] = fresh ? _mm256_setzero_ps() : _mm256_loadu_ps(c + ii * ldc);
    c1[ii] = fresh ? _mm256_setzero_ps() : _mm256_loadu_ps(c + ii * ldc + 8);
  }
  for (int64_t p0 = 0; p0 < m; p0 += r) {
    __m256 s0[kRows], s1[kRows];
    for (int64_t ii = 0; ii < kRows; ++ii) s0[ii] = s1[ii] = _mm256_setzero_ps();
    for (int64_t p = p0; p < p0 + r; ++p) {
      const __m256 b0 = _mm256_loadu_ps(pb + p * kCols);
      const __m256 b1 = _mm256_loadu_ps(pb + p * kCols + 8);
      for (int64_t ii = 0; ii < kRows; ++ii) {
        const __m256 av = _mm256_broadcast_ss(pa + p * kRows + ii);
        s0[ii] = _mm256_fmadd_ps(av, b0, s0[ii]);
        s1[ii] = _mm256_fmadd_ps(av, b1, s1[ii]);
      }
    }
    const bool first = fresh && p0 == 0;
    for (int64_t ii = 0; ii < kRows; ++ii) {
      c0[ii] = first ? s0[ii] : _mm256_add_ps(c0[ii], s0[ii]);
      c1[ii] = first ? s1[ii] : _mm256_add_ps(c1[ii], s1[ii]);
    }
  }
  for (int64_t ii = 0; ii < kRows; ++ii) {
    _mm256_storeu_ps(c + ii * ldc, c0[ii]);
    _mm256_storeu_ps(c + ii * ldc + 8, c1[ii]);
  }
}

}  // namespace

bool chunk_fold_supported() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

int64_t packed_b_panels(int64_t k) { return (k + kCols - 1) / kCols; }
int64_t packed_b_floats(int64_t m, int64_t k) { return packed_b_panels(k) * m * kCols; }

void pack_b(int64_t m, int64_t k, const float* b, float* packed, int64_t q0, int64_t q1) {
  for (int64_t q = q0; q < q1; ++q) {
    const int64_t cols = std::min(kCols, k - q * kCols);
    for (int64_t p = 0; p < m; ++p) {
      float* out = packed + (q * m + p) * kCols;
      std::memcpy(out, b + p * k + q * kCols, static_cast<size_t>(cols) * sizeof(float));
      std::fill(out + cols, out + kCols, 0.0f);
    }
  }
}

void fold_chunk_products(int64_t i0, int64_t i1, int64_t m, int64_t n, int64_t k, int64_t r, const float* a,
                         const float* packed_b, float* c, bool fresh) {
  std::vector<float> pa(static_cast<size_t>(m * kRows));
  float edge[kRows * kCols];
  for (int64_t i = i0; i < i1; i += kRows) {
    const int64_t rows = std::min(kRows, i1 - i);
    // A's panel: rows [i, i + rows) of C are columns of A; zeros past them.
    for (int64_t p = 0; p < m; ++p)
      for (int64_t ii = 0; ii < kRows; ++ii) pa[p * kRows + ii] = ii < rows ? a[p * n + i + ii] : 0.0f;
    for (int64_t j = 0; j < k; j += kCols) {
      const int64_t cols = std::min(kCols, k - j);
      const float* pb = packed_b + (j / kCols) * m * kCols;
      if (rows == kRows && cols == kCols) {
        tile(m, r, pa.data(), pb, c + i * k + j, k, fresh);
        continue;
      }
      // An edge tile: computed whole on a copy (zeros outside C), only C's own elements kept.
      std::fill(edge, edge + kRows * kCols, 0.0f);
      for (int64_t ii = 0; ii < rows; ++ii)
        for (int64_t jj = 0; jj < cols; ++jj) edge[ii * kCols + jj] = fresh ? 0.0f : c[(i + ii) * k + j + jj];
      tile(m, r, pa.data(), pb, edge, kCols, fresh);
      for (int64_t ii = 0; ii < rows; ++ii)
        for (int64_t jj = 0; jj < cols; ++jj) c[(i + ii) * k + j + jj] = edge[ii * kCols + jj];
    }
  }
}

}  // namespace retrace::kernels
