#include "common.h"

#include <cmath>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "core/error.h"
#include "core/parse_number.h"
#include "distributed/launcher.h"
#include "trace/trace_reader.h"

namespace retrace::cli {

train::Config resolve_config(const std::string& path, std::vector<std::string> sets, int64_t steps,
                             const std::string& inject) {
  if (steps >= 0) sets.push_back("train.steps=" + std::to_string(steps));
  if (!inject.empty()) sets.push_back("faults.inject=\"" + inject + "\"");
  if (path.empty()) return train::parse_config("", "the built-in default config", sets);
  return train::load_config(path, sets);
}

void Progress::update(const std::string& what, uint64_t done, uint64_t total) {
  const auto now = std::chrono::steady_clock::now();
  if (what != what_) {
    clear();
    what_ = what;
    start_ = now;
    start_done_ = done;
    quarter_ = 0;
  }
  const double secs = std::chrono::duration<double>(now - start_).count();
  const double rate = secs > 0 ? static_cast<double>(done - start_done_) / secs : 0;
  const double eta = rate > 0 && total >= done ? static_cast<double>(total - done) / rate : 0;
  if (live_) {
    if (drawn_ && done < total && std::chrono::duration<double>(now - last_draw_).count() < 0.1) return;
    last_draw_ = now;
    std::printf("\r\033[K%s  %llu/%llu %s  %.1f/s  ETA %.0fs", what.c_str(), static_cast<ull>(done),
                static_cast<ull>(total), unit_, rate, eta);
    drawn_ = true;
    std::fflush(stdout);
    return;
  }
  const int quarter = total ? static_cast<int>(4 * done / total) : 4;
  if (quarter <= quarter_) return;
  quarter_ = quarter;
  std::printf("%s: %llu/%llu %s (%d%%), %.1f/s, ETA %.0fs\n", what.c_str(), static_cast<ull>(done),
              static_cast<ull>(total), unit_, 25 * quarter, rate, eta);
  std::fflush(stdout);
}

void Progress::clear() {
  if (live_ && drawn_) {
    std::printf("\r\033[K");
    std::fflush(stdout);
  }
  drawn_ = false;
}

run::RunCallbacks callbacks_for(const std::shared_ptr<StepPrinter>& p) {
  run::RunCallbacks cb;
  cb.on_step = [p](const records::StepRecord& r, uint64_t total) { p->step(r, total); };
  cb.on_eval = [p](const records::EvalRecord& e) { p->eval(e); };
  cb.on_message = [p](const std::string& m) { p->message(m); };
  return cb;
}

void print_summary(const run::RunSummary& s) {
  std::printf("%s %llu steps (%llu..%llu of %llu, %llu skipped) in %.2f s, %.1f steps/s; final loss %.6f",
              s.resumed_from.empty() ? "recorded" : "resumed and recorded", static_cast<ull>(s.steps),
              static_cast<ull>(s.first_step), static_cast<ull>(s.last_step), static_cast<ull>(s.total_steps),
              static_cast<ull>(s.skipped), s.wall_seconds, s.steps_per_second, s.final_loss);
  if (s.eval_perplexity > 0) std::printf("; val loss %.6f, perplexity %.4f", s.eval_loss, s.eval_perplexity);
  else if (s.test_accuracy >= 0) std::printf("; test accuracy %.4f", s.test_accuracy);
  std::printf("\nrun directory: %s  (trace %llu bytes, %.0f bytes/step, %llu checkpoints written)\n", s.run_dir.c_str(),
              static_cast<ull>(s.trace_bytes),
              s.last_step ? static_cast<double>(s.trace_bytes) / static_cast<double>(s.last_step) : 0.0,
              static_cast<ull>(s.checkpoints));
  if (s.interrupted)
    std::printf("interrupted after step %llu as if killed; continue with: retrace resume %s\n",
                static_cast<ull>(s.last_step), s.run_dir.c_str());
}

// Replaces the value of `flag` in argv (or appends it), for commands the launcher re-runs.
std::vector<std::string> with_flag(std::vector<std::string> argv, const std::string& flag, const std::string& value) {
  for (size_t i = 0; i + 1 < argv.size(); ++i)
    if (argv[i] == flag) {
      argv[i + 1] = value;
      return argv;
    }
  argv.push_back(flag);
  argv.push_back(value);
  return argv;
}

std::vector<std::string> without_flag(std::vector<std::string> argv, const std::string& flag) {
  std::vector<std::string> out;
  for (const auto& a : argv)
    if (a != flag) out.push_back(a);
  return out;
}

CLI::Validator step_range() { return CLI::Range(int64_t{1}, kMaxSteps, "STEP in [1, 10^12]"); }

CLI::Validator world_range() { return CLI::Range(int64_t{1}, int64_t{1} << 16, "RANKS in [1, 65536]"); }

CLI::Validator finite_at_least(double lo) {
  return CLI::Validator(
      [lo](std::string& text) -> std::string {
        double v = 0;
        // CLI11 has converted it already when this runs after the conversion; read it again so that
        // NaN and infinities, which pass a range check, are named here.
        if (!CLI::detail::lexical_cast(text, v) || !std::isfinite(v) || v < lo)
          return "value " + text + " is not a finite number >= " + CLI::detail::to_string(lo);
        return "";
      },
      "NUMBER >= " + CLI::detail::to_string(lo));
}

std::pair<uint64_t, uint64_t> parse_range(const std::string& spec) {
  if (spec.empty()) return {0, std::numeric_limits<uint64_t>::max()};
  // Step numbers read strictly (core/parse_number.h): std::stoull took "-1" as 2^64 - 1 and "5x" as 5.
  auto number = [&](const std::string& text) {
    const std::optional<uint64_t> v = parse_decimal_u64(text);
    RETRACE_CHECK(v.has_value(), ConfigError, "--steps expects A:B, A:, :B or N (step numbers), got '", spec, "'");
    return *v;
  };
  const auto colon = spec.find(':');
  if (colon == std::string::npos) {
    const uint64_t v = number(spec);
    return {v, v};
  }
  const std::string a = spec.substr(0, colon), b = spec.substr(colon + 1);
  return {a.empty() ? 0 : number(a), b.empty() ? std::numeric_limits<uint64_t>::max() : number(b)};
}

std::optional<train::Config> recorded_config(const std::string& run_or_trace) {
  namespace stdfs = std::filesystem;
  const std::string path = run::trace_of(run_or_trace);
  if (!stdfs::exists(path)) return std::nullopt;
  trace::TraceReader r = trace::TraceReader::open(path);
  return train::parse_config(r.header().config_toml, path + " (header)", {}, train::ConfigSource::kRecorded);
}

run::Sabotage sabotage_from_env() {
  const char* v = std::getenv("RETRACE_TEST_SABOTAGE");
  if (!v || !*v) return run::Sabotage::kNone;
  const std::string s = v;
  if (s == "rollback-newest-checkpoint") return run::Sabotage::kRollbackNewestCheckpoint;
  if (s == "rank1-rng-restore") return run::Sabotage::kRank1RngRestore;
  RETRACE_FAIL(ConfigError, "RETRACE_TEST_SABOTAGE=", s,
               " names no sabotage (rollback-newest-checkpoint, "
               "rank1-rng-restore); it is for retrace's own edge tests: unset it");
}

}  // namespace retrace::cli
