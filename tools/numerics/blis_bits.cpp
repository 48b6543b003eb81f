// Bits and speed of Debian's BLIS 0.9 sgemm on this machine (issue 51, docs/plans/owned-numerics.md,
// gate 2.5): for four shapes (M, K, N), one single-threaded call against the same call on 2, 3 and 4
// BLIS threads, against row tiles (6, 64, 96 rows) and column tiles (16, 256) of single-threaded
// calls, against A stored transposed, and against row tiles taken by two threads of our own; then
// the median of 5 times of one call at 1 and 2 BLIS threads and of the two-thread row tiles.
// "=" means the same bits as the one call, "DIFF" other bits. Not built by CMake (BLIS is not yet a
// dependency); by hand:
//
//   apt-get install libblis-pthread-dev   (libblis-dev alone pulls the OpenMP flavour)
//   g++ -O2 -std=c++17 -I/usr/include/x86_64-linux-gnu tools/numerics/blis_bits.cpp -o /tmp/blis_bits \
//       /usr/lib/x86_64-linux-gnu/blis-pthread/libblis.so.4 -lpthread
//   /tmp/blis_bits; NOSUP=1 /tmp/blis_bits     (NOSUP: every call with BLIS's small-matrix path off)
#include <blis.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>
#include <algorithm>
#include <atomic>
#include <cstdlib>

struct Shape {
  dim_t m, k, n;
};

// C[m x n] = A[m x k] B[k x n], row-major; rows [r0, r1) and cols [c0, c1) of C.
void gemm(const float* a, const float* b, float* c, dim_t m, dim_t k, dim_t n, dim_t r0, dim_t r1, dim_t c0, dim_t c1,
          dim_t nt, bool a_trans_stored = false) {
  float one = 1.f, zero = 0.f;
  rntm_t rntm = BLIS_RNTM_INITIALIZER;
  bli_rntm_set_num_threads(nt, &rntm);
  if (std::getenv("NOSUP")) bli_rntm_disable_l3_sup(&rntm);
  if (!a_trans_stored)
    bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, r1 - r0, c1 - c0, k, &one, const_cast<float*>(a) + r0 * k, k, 1,
                 const_cast<float*>(b) + c0, n, 1, &zero, c + r0 * n + c0, n, 1, nullptr, &rntm);
  else  // a holds A^T (k x m): element (i, p) at a[p * m + i]
    bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, r1 - r0, c1 - c0, k, &one, const_cast<float*>(a) + r0, 1, m,
                 const_cast<float*>(b) + c0, n, 1, &zero, c + r0 * n + c0, n, 1, nullptr, &rntm);
}

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

template <typename F>
double median_ms(F f) {
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    auto s = std::chrono::steady_clock::now();
    f();
    t.push_back(ms_since(s));
  }
  std::sort(t.begin(), t.end());
  return t[2];
}

int main() {
  std::printf("ids: haswell %d skx %d zen %d\n", (int)BLIS_ARCH_HASWELL, (int)BLIS_ARCH_SKX, (int)BLIS_ARCH_ZEN);
  std::printf("BLIS %s, arch %s\n", bli_info_get_version_str(), bli_arch_string(bli_arch_query_id()));
  for (Shape s : {Shape{128, 784, 512}, Shape{1024, 768, 3072}, Shape{1000, 3072, 768}, Shape{37, 129, 77}}) {
    std::mt19937 g(1);
    // Uniform in [-1, 1) from the generator's raw bits (the standard's distributions are
    // implementation-defined).
    auto d = [](std::mt19937& r) { return static_cast<float>(r() >> 8) * 0x1p-23f - 1.0f; };
    std::vector<float> a(s.m * s.k), at(s.m * s.k), b(s.k * s.n);
    for (auto& x : a) x = d(g);
    for (auto& x : b) x = d(g);
    for (dim_t i = 0; i < s.m; ++i)
      for (dim_t p = 0; p < s.k; ++p) at[p * s.m + i] = a[i * s.k + p];
    std::vector<float> ref(s.m * s.n), c(s.m * s.n);
    gemm(a.data(), b.data(), ref.data(), s.m, s.k, s.n, 0, s.m, 0, s.n, 1);
    auto same = [&] { return std::memcmp(ref.data(), c.data(), c.size() * 4) == 0; };
    std::printf("(%ld, %ld, %ld):", (long)s.m, (long)s.k, (long)s.n);
    for (dim_t nt : {2, 3, 4}) {
      gemm(a.data(), b.data(), c.data(), s.m, s.k, s.n, 0, s.m, 0, s.n, nt);
      std::printf(" nt%ld %s", (long)nt, same() ? "=" : "DIFF");
    }
    for (dim_t rt : {6, 64, 96}) {
      for (dim_t r = 0; r < s.m; r += rt)
        gemm(a.data(), b.data(), c.data(), s.m, s.k, s.n, r, std::min(s.m, r + rt), 0, s.n, 1);
      std::printf(" rows%ld %s", (long)rt, same() ? "=" : "DIFF");
    }
    for (dim_t ct : {16, 256}) {
      for (dim_t q = 0; q < s.n; q += ct)
        gemm(a.data(), b.data(), c.data(), s.m, s.k, s.n, 0, s.m, q, std::min(s.n, q + ct), 1);
      std::printf(" cols%ld %s", (long)ct, same() ? "=" : "DIFF");
    }
    gemm(at.data(), b.data(), c.data(), s.m, s.k, s.n, 0, s.m, 0, s.n, 1, true);
    std::printf(" A^T-stored %s", same() ? "=" : "DIFF");
    // Speed: one call at 1 and 2 BLIS threads; row tiles of 96 over 2 of our threads.
    const double t1 = median_ms([&] { gemm(a.data(), b.data(), c.data(), s.m, s.k, s.n, 0, s.m, 0, s.n, 1); });
    const double t2 = median_ms([&] { gemm(a.data(), b.data(), c.data(), s.m, s.k, s.n, 0, s.m, 0, s.n, 2); });
    const double tp = median_ms([&] {
      const dim_t rt = 96, tiles = (s.m + rt - 1) / rt;
      std::atomic<dim_t> next{0};
      auto work = [&] {
        for (dim_t t = next++; t < tiles; t = next++)
          gemm(a.data(), b.data(), c.data(), s.m, s.k, s.n, t * rt, std::min(s.m, (t + 1) * rt), 0, s.n, 1);
      };
      std::thread h(work);
      work();
      h.join();
    });
    std::printf(" pool2 %s | ms: 1 thread %.2f, BLIS 2 threads %.2f, 2 lanes x row tiles %.2f\n", same() ? "=" : "DIFF",
                t1, t2, tp);
  }
}
