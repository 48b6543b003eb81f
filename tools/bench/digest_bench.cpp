// Benchmark: what the per-step digests cost. Trains the default config (or --set overrides) in
// one process and, in every round, times a block of steps without digests, then each digest of the
// step's state on its own (parameters, optimizer state, RNG, policy state), alternating the blocks
// A B A B. Prints the share of the step each digest takes, as the median of the rounds with their
// range. Prints figures only: it never fails on speed.
//
//   build/digest_bench [--rounds R] [--steps N] [--set key=value]...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor_digest.h"
#include "train/config.h"
#include "train/environment.h"
#include "train/numerics.h"
#include "train/optimizer.h"
#include "train/registry.h"
#include "train/trainer.h"

using namespace retrace;
using Clock = std::chrono::steady_clock;

namespace {
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }
struct Spread {
  double median, lo, hi;
};
Spread spread(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return {n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v.front(), v.back()};
}
}  // namespace

int main(int argc, char** argv) {
  train::prepare_process(train::Numerics::kPortable, argv);  // the default profile (--set may change it: the bench then measures native)
  int64_t rounds = 9, steps = 40;
  std::vector<std::string> sets;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) rounds = std::stoll(argv[++i]);
    else if (a == "--steps" && i + 1 < argc) steps = std::stoll(argv[++i]);
    else if (a == "--set" && i + 1 < argc) sets.push_back(argv[++i]);
    else {
      std::fprintf(stderr, "usage: digest_bench [--rounds R] [--steps N] [--set key=value]...\n");
      return 2;
    }
  }
  try {
    sets.push_back("train.steps=100000");
    train::Config config = train::parse_config("", "digest_bench", sets);
    train::resolve_threads(config.runtime);
    train::apply_environment(config.runtime);
    const train::Registry& registry = train::builtin_registry();
    data::Dataset data = registry.load_data(config);
    train::Trainer trainer(config, data, registry);
    for (int i = 0; i < 20; ++i) trainer.run_step(false);  // warm-up: BLAS threads, allocator
    const char* names[] = {"parameters", "optimizer", "rng", "policy state", "all", "all, xxh3 bytes"};
    std::vector<double> share[6];
    Digest128 sink;
    for (int64_t r = 0; r < rounds; ++r) {
      auto t = Clock::now();
      for (int64_t i = 0; i < steps; ++i) trainer.run_step(false);
      const double step_ms = ms_since(t) / static_cast<double>(steps);
      double ms[4];
      const int reps = 20;
      t = Clock::now();
      for (int i = 0; i < reps; ++i) sink.lo ^= trainer.param_digest().lo;
      ms[0] = ms_since(t) / reps;
      t = Clock::now();
      for (int i = 0; i < reps; ++i) sink.lo ^= trainer.optimizer_digest().lo;
      ms[1] = ms_since(t) / reps;
      t = Clock::now();
      for (int i = 0; i < reps; ++i) sink.lo ^= trainer.rng_digest().lo;
      ms[2] = ms_since(t) / reps;
      t = Clock::now();
      for (int i = 0; i < reps; ++i) sink.lo ^= trainer.policy_digest().lo;
      ms[3] = ms_since(t) / reps;
      // B of the pair: parameters and optimizer digested as digest_version 1 did (xxh3 of the bytes).
      t = Clock::now();
      for (int i = 0; i < reps; ++i) {
        sink.lo ^= digest_named(trainer.model_state(), DigestKind::kXxh3).lo;
        sink.lo ^= digest_named(trainer.optimizer_state(), DigestKind::kXxh3).lo;
      }
      const double xxh3_ms = ms_since(t) / reps + ms[2] + ms[3];
      for (int k = 0; k < 4; ++k) share[k].push_back(100.0 * ms[k] / step_ms);
      share[4].push_back(100.0 * (ms[0] + ms[1] + ms[2] + ms[3]) / step_ms);
      share[5].push_back(100.0 * xxh3_ms / step_ms);
      std::printf("round %lld: step %.3f ms; digests %.4f %.4f %.4f %.4f ms\n", static_cast<long long>(r + 1),
                  step_ms, ms[0], ms[1], ms[2], ms[3]);
    }
    std::printf("share of the step (median [min, max] over %lld rounds):\n", static_cast<long long>(rounds));
    for (int k = 0; k < 6; ++k) {
      const Spread s = spread(share[k]);
      std::printf("  %-16s %.2f %% [%.2f, %.2f]\n", names[k], s.median, s.lo, s.hi);
    }
    std::printf("(digest %016llx)\n", static_cast<unsigned long long>(sink.lo));
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "digest_bench: %s\n", e.what());
    return 1;
  }
}
