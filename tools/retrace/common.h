// Pieces the commands share: the config a command line resolves, the step printer, the run
// summary, rank wiring, argv editing for the launcher, step ranges.
#pragma once

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "distributed/process_group.h"
#include "records/records.h"
#include "run/ranks.h"
#include "run/run.h"
#include "train/config.h"

namespace retrace::cli {

using run::join_ranks;

using ull = unsigned long long;

// The config of `retrace record`: path (empty: the built-in default) + --set + --steps + --inject.
train::Config resolve_config(const std::string& path, std::vector<std::string> sets, int64_t steps,
                             const std::string& inject = "");

// Prints one row per step when piped; a live progress line on a terminal (SKIP rows stay).
class StepPrinter {
 public:
  explicit StepPrinter(bool live) : live_(live), start_(std::chrono::steady_clock::now()) {}

  void step(const records::StepRecord& r, uint64_t total) {
    const bool skip = r.outcome == records::Outcome::kSkip;
    if (!live_ || skip) {
      clear();
      print_row(r);
    }
    if (live_) {
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      double rate = secs > 0 ? static_cast<double>(++done_) / secs : 0;
      double eta = rate > 0 ? static_cast<double>(total - r.step) / rate : 0;
      std::printf("\r\033[Kstep %llu/%llu  loss %.6f  %.1f steps/s  ETA %.0fs", static_cast<ull>(r.step),
                  static_cast<ull>(total), r.loss, rate, eta);
      std::fflush(stdout);
    }
  }
  void eval(const records::EvalRecord& e) {
    clear();
    if (e.language_model())
      std::printf("EVAL  step %6llu  epoch %llu  val loss %.6f  perplexity %.4f  (%llu tokens)\n",
                  static_cast<ull>(e.step), static_cast<ull>(e.epoch), e.loss, e.perplexity(),
                  static_cast<ull>(e.tokens));
    else
      std::printf("EVAL  step %6llu  epoch %llu  test loss %.6f  test accuracy %.4f\n", static_cast<ull>(e.step),
                  static_cast<ull>(e.epoch), e.loss, e.accuracy);
    std::fflush(stdout);
  }
  void message(const std::string& m) {
    clear();
    std::printf("%s\n", m.c_str());
    std::fflush(stdout);
  }
  void clear() {
    if (live_) std::printf("\r\033[K");
  }

 private:
  static void print_row(const records::StepRecord& r) {
    const bool skip = r.outcome == records::Outcome::kSkip;
    std::printf("%s  step %6llu  epoch %llu  batch %5llu  loss %.6f  grad %.4f -> %.4f  lr %.3e  scale %g%s%s\n",
                skip ? "SKIP" : "STEP", static_cast<ull>(r.step), static_cast<ull>(r.epoch),
                static_cast<ull>(r.batch_in_epoch), r.loss, r.grad_norm_pre, r.grad_norm_post, r.lr, r.loss_scale,
                skip ? "  reason " : "", skip ? r.skip_reason.c_str() : "");
    std::fflush(stdout);
  }
  bool live_;
  std::chrono::steady_clock::time_point start_;
  uint64_t done_ = 0;
};

// Progress of long work that is not a run's own step table (bisect's re-execution, golden check,
// memory): on a terminal one live line "WHAT  done/total  rate/s  ETA", redrawn at most 10 times
// a second; piped, a plain line at each quarter of the way, so logs stay short.
class Progress {
 public:
  Progress(bool live, const char* unit) : live_(live), unit_(unit) {}
  ~Progress() { clear(); }
  // `what` at `done` of `total`; a new `what` starts a new count.
  void update(const std::string& what, uint64_t done, uint64_t total);
  // Ends the live line (before other output); piped, nothing to do.
  void clear();

 private:
  bool live_;
  const char* unit_;
  std::string what_;
  std::chrono::steady_clock::time_point start_{}, last_draw_{};
  uint64_t start_done_ = 0;
  int quarter_ = 0;
  bool drawn_ = false;
};

run::RunCallbacks callbacks_for(const std::shared_ptr<StepPrinter>& p);
void print_summary(const run::RunSummary& s);
// Replaces the value of `flag` in argv (or appends it), for commands the launcher re-runs.
std::vector<std::string> with_flag(std::vector<std::string> argv, const std::string& flag, const std::string& value);
std::vector<std::string> without_flag(std::vector<std::string> argv, const std::string& flag);
// Validators of number flags: a value outside the range is exit 2 naming the flag and its range
// (CLI11 refuses a value that is not a number of the flag's type, also exit 2).
inline constexpr int64_t kMaxSteps = 1'000'000'000'000;  // train.steps' largest value
// A step number: [1, kMaxSteps].
CLI::Validator step_range();
// A world size: [1, 65536] (the manifest's limit, ckpt/manifest.h kMaxWorldSize).
CLI::Validator world_range();
// A finite number >= lo (no NaN, no infinity).
CLI::Validator finite_at_least(double lo);
// --steps A:B, A:, :B or N.
std::pair<uint64_t, uint64_t> parse_range(const std::string& spec);
// RETRACE_TEST_SABOTAGE, for the edge tests' negative controls only (run::Sabotage); ConfigError
// for a value that names no sabotage.
run::Sabotage sabotage_from_env();
// The config recorded in a run directory's (or a trace file's) header, when it can be read; a
// command that cannot read it reports that itself, with its own message.
std::optional<train::Config> recorded_config(const std::string& run_or_trace);

}  // namespace retrace::cli
