#include "cli_commands.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <memory>

#include "core/error.h"
#include "trace/inspect.h"
#include "trace/trace_reader.h"
#include "train/config.h"
#include "train/run.h"

namespace retrace::cli {
namespace {

struct RecordArgs {
  std::string config_path;
  std::vector<std::string> sets;
  std::string out = "run";
  int64_t steps = -1;
  bool force = false;
  bool plain = false;
  bool print_config = false;
};

struct InspectArgs {
  std::string trace;
  bool json = false;
  bool csv = false;
  std::string steps;
};

RecordArgs g_record;   // owned by main's lifetime; CLI11 binds options to these
InspectArgs g_inspect;

train::Config resolve_config(const std::string& path, std::vector<std::string> sets, int64_t steps) {
  if (steps >= 0) sets.push_back("train.steps=" + std::to_string(steps));
  if (path.empty()) return train::parse_config("", "the built-in default config", sets);
  return train::load_config(path, sets);
}

// Prints one row per step when piped; a live progress line on a terminal (SKIP rows stay).
class StepPrinter {
 public:
  explicit StepPrinter(bool live) : live_(live), start_(std::chrono::steady_clock::now()) {}

  void step(const trace::StepRecord& r, uint64_t total) {
    const bool skip = r.outcome == trace::Outcome::kSkip;
    if (!live_ || skip) {
      if (live_) std::printf("\r\033[K");
      print_row(r);
    }
    if (live_) {
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      double rate = secs > 0 ? static_cast<double>(++done_) / secs : 0;
      double eta = rate > 0 ? static_cast<double>(total - r.step) / rate : 0;
      std::printf("\r\033[Kstep %llu/%llu  loss %.6f  %.1f steps/s  ETA %.0fs",
                  static_cast<unsigned long long>(r.step), static_cast<unsigned long long>(total),
                  r.loss, rate, eta);
      std::fflush(stdout);
    }
  }
  void eval(const trace::EvalRecord& e) {
    if (live_) std::printf("\r\033[K");
    std::printf("EVAL  step %6llu  epoch %llu  test loss %.6f  test accuracy %.4f\n",
                static_cast<unsigned long long>(e.step), static_cast<unsigned long long>(e.epoch),
                e.loss, e.accuracy);
    std::fflush(stdout);
  }
  void finish() {
    if (live_) std::printf("\r\033[K");
  }

 private:
  static void print_row(const trace::StepRecord& r) {
    const bool skip = r.outcome == trace::Outcome::kSkip;
    std::printf("%s  step %6llu  epoch %llu  batch %5llu  loss %.6f  grad %.4f -> %.4f  lr %.3e  scale %g%s%s\n",
                skip ? "SKIP" : "STEP", static_cast<unsigned long long>(r.step),
                static_cast<unsigned long long>(r.epoch), static_cast<unsigned long long>(r.batch_in_epoch),
                r.loss, r.grad_norm_pre, r.grad_norm_post, r.lr, r.loss_scale,
                skip ? "  reason " : "", skip ? r.skip_reason.c_str() : "");
    std::fflush(stdout);
  }
  bool live_;
  std::chrono::steady_clock::time_point start_;
  uint64_t done_ = 0;
};

int run_record() {
  train::Config config = resolve_config(g_record.config_path, g_record.sets, g_record.steps);
  if (g_record.print_config) {
    std::printf("%s", train::to_toml(config).c_str());
    return 0;
  }
  train::RecordOptions opts;
  opts.out_dir = g_record.out;
  opts.force = g_record.force;
  auto printer = std::make_shared<StepPrinter>(!g_record.plain && isatty(STDOUT_FILENO));
  train::RunCallbacks cb;
  cb.on_step = [printer](const trace::StepRecord& r, uint64_t total) { printer->step(r, total); };
  cb.on_eval = [printer](const trace::EvalRecord& e) { printer->eval(e); };
  cb.on_message = [](const std::string& m) { std::printf("%s\n", m.c_str()); };
  train::RunSummary s = train::record(config, opts, cb);
  printer->finish();
  std::printf("recorded %llu steps (%llu skipped) in %.2f s, %.1f steps/s; final loss %.6f",
              static_cast<unsigned long long>(s.steps), static_cast<unsigned long long>(s.skipped),
              s.wall_seconds, s.steps_per_second, s.final_loss);
  if (s.test_accuracy >= 0) std::printf("; test accuracy %.4f", s.test_accuracy);
  std::printf("\nrun directory: %s  (trace %llu bytes, %.0f bytes/step)\n", s.run_dir.c_str(),
              static_cast<unsigned long long>(s.trace_bytes),
              s.steps ? static_cast<double>(s.trace_bytes) / static_cast<double>(s.steps) : 0.0);
  return 0;
}

std::pair<uint64_t, uint64_t> parse_range(const std::string& spec) {
  if (spec.empty()) return {0, std::numeric_limits<uint64_t>::max()};
  auto colon = spec.find(':');
  try {
    if (colon == std::string::npos) {
      uint64_t v = std::stoull(spec);
      return {v, v};
    }
    std::string a = spec.substr(0, colon), b = spec.substr(colon + 1);
    return {a.empty() ? 0 : std::stoull(a), b.empty() ? std::numeric_limits<uint64_t>::max() : std::stoull(b)};
  } catch (const std::exception&) {
    RETRACE_FAIL(ConfigError, "--steps expects A:B, A: , :B or N (step numbers), got '", spec, "'");
  }
}

int run_inspect() {
  RETRACE_CHECK(!(g_inspect.json && g_inspect.csv), ConfigError, "choose one of --json and --csv");
  auto [first, last] = parse_range(g_inspect.steps);
  trace::TraceReader reader = trace::TraceReader::open(g_inspect.trace);
  if (auto w = reader.tail_warning()) std::cerr << "warning: " << *w << "\n";
  trace::InspectFormat fmt = g_inspect.json  ? trace::InspectFormat::kJson
                             : g_inspect.csv ? trace::InspectFormat::kCsv
                                             : trace::InspectFormat::kTable;
  trace::print_inspect(reader, fmt, first, last, std::cout);
  return 0;
}

}  // namespace

void register_commands(CLI::App& app) {
  auto* rec = app.add_subcommand("record", "train a run and record every step to a trace");
  rec->add_option("--config", g_record.config_path, "TOML config (default: the built-in fashion-mlp config, "
                                                    "same as configs/fashion-mlp.toml)");
  rec->add_option("--set", g_record.sets, "override a config key, e.g. --set optim.lr=0.01 (repeatable)");
  rec->add_option("--out", g_record.out, "run directory (default: run)");
  rec->add_option("--steps", g_record.steps, "optimizer steps to train (sets train.steps)");
  rec->add_flag("--force", g_record.force, "replace an existing run directory");
  rec->add_flag("--plain", g_record.plain, "print one row per step even on a terminal");
  rec->add_flag("--print-config", g_record.print_config, "print the resolved config and exit");
  rec->footer("Example:\n  retrace record --steps 20\n  retrace record --config configs/fashion-mlp.toml "
              "--set optim.name=sgd --set optim.lr=0.05 --out run-sgd\n\nConfig keys:\n" +
              train::describe_keys());

  auto* ins = app.add_subcommand("inspect", "print a trace's header and step table");
  ins->add_option("trace", g_inspect.trace, "trace file (run/trace.rtrace)")->required();
  ins->add_flag("--json", g_inspect.json, "JSON output");
  ins->add_flag("--csv", g_inspect.csv, "CSV output (one row per step)");
  ins->add_option("--steps", g_inspect.steps, "step range A:B (inclusive)");
  ins->footer("Example:\n  retrace inspect run/trace.rtrace --steps 1:20\n  retrace inspect run/trace.rtrace --csv > steps.csv");
}

int run_selected(CLI::App& app) {
  if (app.got_subcommand("record")) return run_record();
  if (app.got_subcommand("inspect")) return run_inspect();
  RETRACE_FAIL(ConfigError, "no command given; see retrace --help");
}

}  // namespace retrace::cli
