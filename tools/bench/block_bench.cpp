// Benchmark: the char GPT's transformer blocks on their training path (fused attention weights
// and GELU, model/fused.h; scale, mask and residual sums in place) at one lane (B) and at two
// lanes (C, model/lanes.h), against the same blocks with every op plain and out of place (A, the
// path both replaced, kept as BlockImpl::forward_out_of_place), in one process with the run's own
// threads and BLAS (configs/char-gpt.toml's shapes and dropout). Each round times the forward and
// backward of all n_layers blocks on a [batch, context, d_model] input, the three paths in an
// order that rotates from round to round (A B C, B C A, C A B, ...). Prints B/A, C/A and C/B per
// round with their median, min and max, and whether the three paths' outputs and input gradients
// have the same bits. Prints figures only: it never fails on speed.
//
//   build/block_bench [--rounds R] [--iters N] [--set key=value]...   (from the repository root)
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "bench_stats.h"
#include "core/error.h"
#include "model/gpt.h"
#include "model/lanes.h"
#include "train/config.h"
#include "train/environment.h"
#include "train/numerics.h"

using namespace retrace;
using bench::Clock;
using bench::ms_since;

namespace {

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.numel() * a.element_size()) == 0;
}

struct Pass {
  torch::Tensor out, input_grad;
};

Pass run(std::vector<model::Block>& blocks, const torch::Tensor& x, const torch::Tensor& upstream, bool in_place) {
  {  // both paths draw the same dropout keys
    at::Generator g = at::globalContext().defaultGenerator(c10::Device(c10::kCPU));
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_current_seed(5);
  }
  torch::Tensor in = x.clone().requires_grad_(true);
  torch::Tensor h = in;
  for (auto& b : blocks) h = in_place ? b->forward(h) : b->forward_out_of_place(h);
  h.backward(upstream);
  return {h.detach(), in.grad()};
}

}  // namespace

int main(int argc, char** argv) try {
  train::prepare_process(train::Numerics::kPortable, argv);  // re-executes with the portable pins
  int64_t rounds = 8, iters = 5;
  std::vector<std::string> sets;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) rounds = std::stoll(argv[++i]);
    else if (a == "--iters" && i + 1 < argc) iters = std::stoll(argv[++i]);
    else if (a == "--set" && i + 1 < argc) sets.emplace_back(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: block_bench [--rounds R] [--iters N] [--set key=value]...\n"
                   "(run from the repository root: the shapes are configs/char-gpt.toml's)\n");
      return 2;
    }
  }
  RETRACE_CHECK(rounds >= 1 && iters >= 1, ConfigError, "block_bench: --rounds and --iters need values >= 1");
  // The plain path and the training path give the same bits under portable version 1, whose block
  // this measures (ATen's kernels on both paths); version 2 replaces them with retrace's own.
  sets.insert(sets.begin(), "runtime.numerics_version=1");
  train::Config c = train::load_config("configs/char-gpt.toml", sets);
  train::resolve_threads(c.runtime);
  train::apply_environment(c.runtime);
  train::adopt_thread_settings();
  const auto& m = c.model;
  torch::manual_seed(c.seed);
  std::vector<model::Block> blocks;
  for (int64_t i = 0; i < m.n_layers; ++i)
    blocks.emplace_back(m.d_model, m.n_heads, m.dropout, m.dropout_impl, m.gelu_impl, m.attention_matmul);
  torch::Tensor x = torch::randn({c.data.batch_size, c.data.context, m.d_model});
  torch::Tensor upstream = torch::randn_like(x);
  std::printf("== block_bench: %lld blocks of d_model %lld, %lld heads, dropout %g; input [%lld, %lld, %lld]; %s\n",
              static_cast<long long>(m.n_layers), static_cast<long long>(m.d_model), static_cast<long long>(m.n_heads),
              m.dropout, static_cast<long long>(c.data.batch_size), static_cast<long long>(c.data.context),
              static_cast<long long>(m.d_model), train::numerics_summary(c.runtime).c_str());

  // Path k: 0 plain out of place, 1 training path at one lane, 2 at two lanes.
  auto run_path = [&](int k) {
    model::set_lanes(k == 2 ? 2 : 1);
    return run(blocks, x, upstream, k != 0);
  };
  Pass a = run_path(0), b = run_path(1), c2 = run_path(2);
  const bool equal = same_bits(a.out, b.out) && same_bits(a.input_grad, b.input_grad) && same_bits(a.out, c2.out) &&
                     same_bits(a.input_grad, c2.input_grad);
  std::printf("   bits: output and input gradient %s\n", equal ? "equal on all three paths (bitwise)" : "DIFFER");

  std::vector<double> ba, ca, cb;
  for (int64_t r = 0; r < rounds; ++r) {
    double ms[3] = {0, 0, 0};
    for (int j = 0; j < 3; ++j) {
      const int k = static_cast<int>((r + j) % 3);
      const auto t = Clock::now();
      for (int64_t i = 0; i < iters; ++i) run_path(k);
      ms[k] = ms_since(t) / static_cast<double>(iters);
    }
    ba.push_back(ms[1] / ms[0]);
    ca.push_back(ms[2] / ms[0]);
    cb.push_back(ms[2] / ms[1]);
    std::printf(
        "   round %lld: A plain %8.2f ms  B fused, 1 lane %8.2f ms  C fused, 2 lanes %8.2f ms  B/A %.3f  C/A %.3f  C/B "
        "%.3f\n",
        static_cast<long long>(r + 1), ms[0], ms[1], ms[2], ba.back(), ca.back(), cb.back());
  }
  for (auto [name, v] : {std::pair<const char*, std::vector<double>*>{"B/A (fused 1 lane / plain)", &ba},
                         {"C/A (fused 2 lanes / plain)", &ca},
                         {"C/B (2 lanes / 1 lane)", &cb}}) {
    const bench::Spread s = bench::spread(*v);
    std::printf("block forward + backward, %s: median %.3f [min %.3f, max %.3f] over %lld rounds\n", name, s.median,
                s.lo, s.hi, static_cast<long long>(rounds));
  }
  return equal ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "block_bench: %s\n", e.what());
  return 2;
}
