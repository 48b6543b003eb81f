// Benchmark: what the per-step digests cost. Trains the default config (or --set overrides) twice
// in one process, at trace.digest_version 1 and 2, alternating blocks of steps A B A B, and prints
// the share of the step the digests take in each, as the median of the rounds with their range.
// First, the digest kernels alone on 16M floats (64 MB), A B C D E each round: lane_sums (version
// 2), the position-mixed sum's C++ loop and its torch-ops path on the CPU with version 3's mix and
// with version 4's (digest.h, tensor_digest.h; the slice-additive digest sharded state needs), in
// ns per element and GB/s.
// Prints figures only: it never fails on speed.
//
//   build/digest_bench [--rounds R] [--steps N] [--kernels-only] [--set key=value]...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_stats.h"
#include "core/digest.h"
#include "core/error.h"
#include "core/tensor_digest.h"
#include "train/config.h"
#include "train/environment.h"
#include "train/numerics.h"
#include "train/optimizer.h"
#include "train/registry.h"
#include "train/trainer.h"

using namespace retrace;
using bench::Clock;
using bench::ms_since;
using bench::Spread;
using bench::spread;

namespace {

void kernel_rates(int64_t rounds) {
  const int64_t n = int64_t{1} << 24;
  torch::manual_seed(1);
  const torch::Tensor t = torch::randn({n});
  const void* p = t.data_ptr();
  uint64_t sink = 0;
  std::vector<double> lanes, loop, ops, loop4, ops4;
  for (int64_t r = 0; r < std::max<int64_t>(rounds, 3); ++r) {
    auto c = Clock::now();
    uint64_t out[16];
    lane_sums(p, static_cast<size_t>(n) * 4, out);
    lanes.push_back(ms_since(c));
    sink += out[0];
    c = Clock::now();
    sink += mixed_sum(p, 4, static_cast<uint64_t>(n), 0);
    loop.push_back(ms_since(c));
    c = Clock::now();
    sink += mixed_sum_on_device(t, 0);
    ops.push_back(ms_since(c));
    c = Clock::now();
    sink += mixed_sum(p, 4, static_cast<uint64_t>(n), 0, Mix::kHalves);
    loop4.push_back(ms_since(c));
    c = Clock::now();
    sink += mixed_sum_on_device(t, 0, Mix::kHalves);
    ops4.push_back(ms_since(c));
  }
  const double elems = static_cast<double>(n);
  auto row = [&](const char* what, const std::vector<double>& ms) {
    const Spread s = spread(ms);
    std::printf("  %-44s %6.2f ns/element [%.2f, %.2f]  %5.2f GB/s\n", what, s.median * 1e6 / elems, s.lo * 1e6 / elems,
                s.hi * 1e6 / elems, 4 * elems / (s.median * 1e6));
  };
  std::printf(
      "digest kernels on %lld floats (median [min, max] over %zu rounds, A B C D E, A B C D E; checksum %llx):\n",
      static_cast<long long>(n), lanes.size(), static_cast<unsigned long long>(sink));
  row("lane_sums (trace.digest_version 2)", lanes);
  // From the L1 cache, as the fused AdamW's pass sums its 1024-float chunks: one chunk, again and again.
  std::vector<double> hot3, hot4;
  const int64_t chunk = 1024, repeats = n / chunk;
  for (int64_t r = 0; r < std::max<int64_t>(rounds, 3); ++r) {
    auto c = Clock::now();
    for (int64_t k = 0; k < repeats; ++k) sink += mixed_sum(p, 4, chunk, static_cast<uint64_t>(k) * chunk);
    hot3.push_back(ms_since(c));
    c = Clock::now();
    for (int64_t k = 0; k < repeats; ++k)
      sink += mixed_sum(p, 4, chunk, static_cast<uint64_t>(k) * chunk, Mix::kHalves);
    hot4.push_back(ms_since(c));
  }
  row("mixed_sum of a 4 KB chunk in L1 (version 3)", hot3);
  row("mixed_sum of a 4 KB chunk in L1 (version 4)", hot4);
  row("mixed_sum, C++ loop (version 3)", loop);
  row("mixed_sum_on_device, torch int64 ops (CPU, v3)", ops);
  row("mixed_sum, C++ loop (version 4)", loop4);
  row("mixed_sum_on_device, torch int64 ops (CPU, v4)", ops4);
}

}  // namespace

int main(int argc, char** argv) {
  train::prepare_process(train::Numerics::kPortable,
                         argv);  // the default profile (--set may change it: the bench then measures native)
  int64_t rounds = 9, steps = 40;
  std::vector<std::string> sets;
  bool kernels_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) rounds = std::stoll(argv[++i]);
    else if (a == "--kernels-only") kernels_only = true;
    else if (a == "--steps" && i + 1 < argc) steps = std::stoll(argv[++i]);
    else if (a == "--set" && i + 1 < argc) sets.push_back(argv[++i]);
    else {
      std::fprintf(stderr, "usage: digest_bench [--rounds R] [--steps N] [--kernels-only] [--set key=value]...\n");
      return 2;
    }
  }
  try {
    kernel_rates(rounds);
    if (kernels_only) return 0;
    // A and B: the same config at trace.digest_version 1 (xxh3 of the bytes, optimizer every
    // step here too) and 2 (lane checksums plus the state digest). Each step's digests are timed
    // where the trace takes them, right after the step (Timings::trace_ms of run_step; the frame
    // write is not in it here), on the state the step just wrote.
    auto config_for = [&](int version, bool digests = true) {
      std::vector<std::string> s = sets;
      s.push_back(std::string("trace.digests=") + (digests ? "true" : "false"));
      s.push_back("train.steps=100000");
      s.push_back("trace.optimizer_digest_every=1");
      s.push_back("trace.digest_version=" + std::to_string(version));
      train::Config c = train::parse_config("", "digest_bench", s);
      train::resolve_threads(c.runtime);
      return c;
    };
    const train::Config c1 = config_for(1), c2 = config_for(2), c0 = config_for(2, false);
    train::apply_environment(c1.runtime);
    const train::Registry& registry = train::builtin_registry();
    data::Dataset data = registry.load_data(c1);
    // t0: no digests at all (nor the fused AdamW's sums): the step they are the cost over.
    train::Trainer t1(c1, data, registry), t2(c2, data, registry), t0(c0, data, registry);
    for (int i = 0; i < 20; ++i) t1.run_step(false), t2.run_step(false), t0.run_step(false);  // warm-up
    std::vector<double> share1, share2, ratio, whole, optim;
    for (int64_t r = 0; r < rounds; ++r) {
      double pct[2];
      train::Trainer* ts[2] = {&t1, &t2};
      double plain_ms = 0, v2_ms = 0, plain_opt = 0, v2_opt = 0;
      for (int64_t i = 0; i < steps; ++i) {
        auto t = Clock::now();
        plain_opt += t0.run_step(false).timings.optimizer_ms;
        plain_ms += ms_since(t);
      }
      for (int k = 0; k < 2; ++k) {
        double digest_ms = 0, step_ms = 0;
        for (int64_t i = 0; i < steps; ++i) {
          const auto t = Clock::now();
          const records::StepRecord rec = ts[k]->run_step(true);
          step_ms += ms_since(t);
          digest_ms += rec.timings.trace_ms;
          if (k == 1) v2_opt += rec.timings.optimizer_ms;
        }
        pct[k] = 100.0 * digest_ms / (step_ms - digest_ms);
        if (k == 1) v2_ms = step_ms;
      }
      whole.push_back(v2_ms / plain_ms);
      optim.push_back(v2_opt / plain_opt);
      share1.push_back(pct[0]);
      share2.push_back(pct[1]);
      ratio.push_back(pct[1] / pct[0]);
      std::printf("round %lld: digests %.2f %% of the step at version 1, %.2f %% at version 2\n",
                  static_cast<long long>(r + 1), pct[0], pct[1]);
    }
    const Spread a = spread(share1), b = spread(share2), q = spread(ratio), w = spread(whole), o = spread(optim);
    std::printf("digests' share of the step (median [min, max] over %lld rounds of %lld steps, A B A B):\n",
                static_cast<long long>(rounds), static_cast<long long>(steps));
    std::printf("  version 1 (xxh3 of parameters, optimizer, rank 0's RNG)  %.2f %% [%.2f, %.2f]\n", a.median, a.lo,
                a.hi);
    std::printf("  version 2 (lane sums, + state and every rank's RNG)      %.2f %% [%.2f, %.2f]\n", b.median, b.lo,
                b.hi);
    std::printf("  version 2 / version 1                                   %.2f [%.2f, %.2f]\n", q.median, q.lo, q.hi);
    std::printf("step time with version 2 digests / without any (the fused AdamW's sums included): %.3f [%.3f, %.3f]\n",
                w.median, w.lo, w.hi);
    std::printf("optimizer phase with the fused AdamW's sums / without: %.3f [%.3f, %.3f]\n", o.median, o.lo, o.hi);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "digest_bench: %s\n", e.what());
    return 1;
  }
}
