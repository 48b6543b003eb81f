// Benchmark: the cost of recording. Runs the default config for a fixed number of steps with the
// trace off and with the trace and per-step digests on, alternating A B A B in one process, and
// prints median steps per second of each, the paired ratios and their spread, and trace bytes per
// step. Prints figures only: it never fails on speed.
//
//   build/record_bench [--steps N] [--rounds R] [--set key=value]...
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "train/config.h"
#include "run/run.h"
#include "train/environment.h"

using namespace retrace;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 400, rounds = 5;
  std::vector<std::string> sets;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) steps = std::stoll(argv[++i]);
    else if (a == "--rounds" && i + 1 < argc) rounds = std::stoll(argv[++i]);
    else if (a == "--set" && i + 1 < argc) sets.push_back(argv[++i]);
    else {
      std::fprintf(stderr, "usage: record_bench [--steps N] [--rounds R] [--set key=value]...\n");
      return 2;
    }
  }
  try {
    const std::string dir = (std::filesystem::temp_directory_path() / "retrace-record-bench").string();
    auto run_once = [&](bool traced, run::RunSummary* out) {
      std::vector<std::string> s = sets;
      s.push_back("train.steps=" + std::to_string(steps));
      s.push_back("train.eval_each_epoch=false");
      s.push_back(std::string("trace.enabled=") + (traced ? "true" : "false"));
      s.push_back(std::string("trace.digests=") + (traced ? "true" : "false"));
      train::Config c = train::parse_config("", "record_bench", s);
      run::RecordOptions o;
      o.out_dir = dir;
      o.force = true;
      *out = run::record(train::resolve_here(c), o, {});
    };
    run::RunSummary warm;
    run_once(false, &warm);  // warm-up: page in the data set, BLAS thread pool
    std::vector<double> off, on, ratios;
    double bytes_per_step = 0, trace_ms = 0, step_ms = 0;
    for (int64_t r = 0; r < rounds; ++r) {
      run::RunSummary a, b;
      run_once(false, &a);
      run_once(true, &b);
      off.push_back(a.steps_per_second);
      on.push_back(b.steps_per_second);
      ratios.push_back(b.steps_per_second / a.steps_per_second);
      bytes_per_step = static_cast<double>(b.trace_bytes) / static_cast<double>(b.steps);
      trace_ms += b.trace_ms / static_cast<double>(b.steps);
      step_ms += 1000.0 / b.steps_per_second;
      std::printf("round %lld: untraced %.1f steps/s, traced %.1f steps/s, ratio %.3f\n", static_cast<long long>(r + 1),
                  a.steps_per_second, b.steps_per_second, ratios.back());
    }
    std::printf("\nsteps per run %lld, rounds %lld (A = trace off, B = trace + digests on)\n",
                static_cast<long long>(steps), static_cast<long long>(rounds));
    std::printf("median steps/s: untraced %.1f, traced %.1f\n", median(off), median(on));
    std::printf("traced/untraced speed ratio: median %.3f, min %.3f, max %.3f  (trace cost %.1f %%)\n", median(ratios),
                *std::min_element(ratios.begin(), ratios.end()), *std::max_element(ratios.begin(), ratios.end()),
                100.0 * (1.0 - median(ratios)));
    std::printf("in-step recording time (digests + frame write): %.3f ms of %.3f ms per step (%.1f %%)\n",
                trace_ms / rounds, step_ms / rounds, 100.0 * trace_ms / step_ms);
    std::printf("trace bytes per step: %.0f\n", bytes_per_step);
    std::filesystem::remove_all(dir);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "record_bench: %s\n", e.what());
    return static_cast<int>(e.exit_code());
  }
}
