// The GEMMs of a training step, one shape at a time: portable numerics version 2's path
// (kernels::gemm, BLIS with its own threads, small-matrix path off) at 1 and 2 threads against the
// pinned profile's OpenBLAS at 2 threads (and 1), for the shapes of the MLP's and the char GPT's
// forward and backward. Alternating rounds (A B A B), the median of each with its range, in
// microseconds per call, and the whole step's GEMM time per path. Prints figures, gates nothing.
//
//   build/gemm_bench [--rounds 7] [--model mlp|gpt|all]
//
// OpenBLAS is opened at run time from libblas.so.3 (tools/setup.sh points it at OpenBLAS) with
// local scope, as the kernels open BLIS: the two never share symbols.
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "tools/bench/bench_stats.h"

namespace {

using retrace::bench::Clock;
using retrace::bench::ms_since;
using retrace::bench::spread;

struct Shape {
  const char* what;
  int64_t m, n, k;
  bool a_cols;  // A read by columns (a weight gradient's dY^T)
  bool b_cols;  // B read by columns (a forward's W^T)
};

// The MLP (784-512-256-10, batch 128) and the char GPT (d 128, 4x MLP, batch x context 2048,
// vocabulary 65): forward y = x W^T, input gradient dX = dY W, weight gradient dW = dY^T X.
std::vector<Shape> shapes(const std::string& model) {
  std::vector<Shape> s;
  auto linear = [&](const char* name, int64_t rows, int64_t in, int64_t out, bool input_grad) {
    s.push_back({name, rows, out, in, false, true});
    if (input_grad) s.push_back({name, rows, in, out, false, false});
    s.push_back({name, out, in, rows, true, false});
  };
  if (model == "mlp" || model == "all") {
    linear("mlp.0", 128, 784, 512, false);
    linear("mlp.1", 128, 512, 256, true);
    linear("mlp.2", 128, 256, 10, true);
  }
  if (model == "gpt" || model == "all") {
    linear("gpt.qkv", 2048, 128, 384, true);
    linear("gpt.proj", 2048, 128, 128, true);
    linear("gpt.fc", 2048, 128, 512, true);
    linear("gpt.fc_out", 2048, 512, 128, true);
    linear("gpt.head", 2048, 128, 65, true);
  }
  return s;
}

using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                            int);
using SetThreads = void (*)(int);

struct OpenBlas {
  CblasSgemm sgemm = nullptr;
  SetThreads set_threads = nullptr;
};

OpenBlas open_openblas() {
  OpenBlas o;
  void* h = dlopen("libblas.so.3", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return o;
  o.sgemm = reinterpret_cast<CblasSgemm>(dlsym(h, "cblas_sgemm"));
  o.set_threads = reinterpret_cast<SetThreads>(dlsym(h, "openblas_set_num_threads"));
  if (o.set_threads == nullptr) o.sgemm = nullptr;
  return o;
}

std::vector<float> values(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  for (auto& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(seed >> 9) * 0x1p-23f - 1.0f;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 7;
  std::string model = "all";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--model") == 0) model = argv[i + 1];
  }
  const OpenBlas ob = open_openblas();
  std::printf("GEMM: %s; OpenBLAS %s\n", retrace::kernels::gemm_library().describe().c_str(),
              ob.sgemm ? "from libblas.so.3" : "not found (libblas.so.3 is not OpenBLAS)");
  std::printf("%-12s %5s %5s %5s  %-22s %-22s %-22s %-22s\n", "layer", "m", "n", "k", "BLIS 1 thread us",
              "BLIS 2 threads us", "OpenBLAS 1 us", "OpenBLAS 2 us");
  double total[4] = {0, 0, 0, 0};
  for (const Shape& s : shapes(model)) {
    const std::vector<float> a = values(static_cast<size_t>(s.m * s.k), 1),
                             b = values(static_cast<size_t>(s.k * s.n), 2);
    std::vector<float> c(static_cast<size_t>(s.m * s.n));
    const int64_t rsa = s.a_cols ? 1 : s.k, csa = s.a_cols ? s.m : 1;
    const int64_t rsb = s.b_cols ? 1 : s.n, csb = s.b_cols ? s.k : 1;
    auto blis = [&](int t) {
      retrace::kernels::gemm(s.m, s.n, s.k, a.data(), rsa, csa, b.data(), rsb, csb, c.data(), s.n, 1, false, t);
    };
    auto openblas = [&](int t) {
      ob.set_threads(t);
      // Row-major C = op(A) op(B): 101 = CblasRowMajor, 111 = no transpose, 112 = transpose.
      ob.sgemm(101, s.a_cols ? 112 : 111, s.b_cols ? 112 : 111, static_cast<int>(s.m), static_cast<int>(s.n),
               static_cast<int>(s.k), 1.0f, a.data(), static_cast<int>(s.a_cols ? s.m : s.k), b.data(),
               static_cast<int>(s.b_cols ? s.k : s.n), 0.0f, c.data(), static_cast<int>(s.n));
    };
    std::vector<double> t[4];
    const int reps = std::max<int>(1, static_cast<int>(2e7 / static_cast<double>(s.m * s.n * s.k)));
    for (int r = 0; r < rounds + 1; ++r)
      for (int path = 0; path < 4; ++path) {
        if (path >= 2 && !ob.sgemm) continue;
        const auto start = Clock::now();
        for (int i = 0; i < reps; ++i) path < 2 ? blis(path + 1) : openblas(path - 1);
        if (r > 0) t[path].push_back(1000.0 * ms_since(start) / reps);  // round 0 warms up
      }
    std::printf("%-12s %5lld %5lld %5lld ", s.what, static_cast<long long>(s.m), static_cast<long long>(s.n),
                static_cast<long long>(s.k));
    for (int path = 0; path < 4; ++path) {
      if (t[path].empty()) {
        std::printf(" %-22s", "-");
        continue;
      }
      const auto sp = spread(t[path]);
      total[path] += sp.median;
      char cell[64];
      std::snprintf(cell, sizeof cell, "%.1f [%.1f, %.1f]", sp.median, sp.lo, sp.hi);
      std::printf(" %-22s", cell);
    }
    std::printf("\n");
  }
  std::printf("sum of medians, us: BLIS 1 thread %.0f, BLIS 2 threads %.0f, OpenBLAS 1 %.0f, OpenBLAS 2 %.0f\n",
              total[0], total[1], total[2], total[3]);
  if (total[3] > 0) std::printf("BLIS 2 threads / OpenBLAS 2 threads: %.3f\n", total[1] / total[3]);
  return 0;
}
