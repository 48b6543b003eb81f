#include "cli_commands.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <limits>
#include <memory>

#include "ckpt/verify.h"
#include "core/error.h"
#include "replay/resume_check.h"
#include "trace/inspect.h"
#include "trace/trace_reader.h"
#include "train/config.h"
#include "train/run.h"

namespace retrace::cli {
namespace {

using ull = unsigned long long;

train::Config resolve_config(const std::string& path, std::vector<std::string> sets, int64_t steps,
                             const std::string& inject = "") {
  if (steps >= 0) sets.push_back("train.steps=" + std::to_string(steps));
  if (!inject.empty()) sets.push_back("faults.inject=\"" + inject + "\"");
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
  void eval(const trace::EvalRecord& e) {
    clear();
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
  static void print_row(const trace::StepRecord& r) {
    const bool skip = r.outcome == trace::Outcome::kSkip;
    std::printf("%s  step %6llu  epoch %llu  batch %5llu  loss %.6f  grad %.4f -> %.4f  lr %.3e  scale %g%s%s\n",
                skip ? "SKIP" : "STEP", static_cast<ull>(r.step), static_cast<ull>(r.epoch),
                static_cast<ull>(r.batch_in_epoch), r.loss, r.grad_norm_pre, r.grad_norm_post, r.lr,
                r.loss_scale, skip ? "  reason " : "", skip ? r.skip_reason.c_str() : "");
    std::fflush(stdout);
  }
  bool live_;
  std::chrono::steady_clock::time_point start_;
  uint64_t done_ = 0;
};

train::RunCallbacks callbacks_for(const std::shared_ptr<StepPrinter>& p) {
  train::RunCallbacks cb;
  cb.on_step = [p](const trace::StepRecord& r, uint64_t total) { p->step(r, total); };
  cb.on_eval = [p](const trace::EvalRecord& e) { p->eval(e); };
  cb.on_message = [p](const std::string& m) { p->message(m); };
  return cb;
}

void print_summary(const train::RunSummary& s) {
  std::printf("%s %llu steps (%llu..%llu of %llu, %llu skipped) in %.2f s, %.1f steps/s; final loss %.6f",
              s.resumed_from.empty() ? "recorded" : "resumed and recorded", static_cast<ull>(s.steps),
              static_cast<ull>(s.first_step), static_cast<ull>(s.last_step), static_cast<ull>(s.total_steps),
              static_cast<ull>(s.skipped), s.wall_seconds, s.steps_per_second, s.final_loss);
  if (s.test_accuracy >= 0) std::printf("; test accuracy %.4f", s.test_accuracy);
  std::printf("\nrun directory: %s  (trace %llu bytes, %.0f bytes/step, %llu checkpoints written)\n",
              s.run_dir.c_str(), static_cast<ull>(s.trace_bytes),
              s.last_step ? static_cast<double>(s.trace_bytes) / static_cast<double>(s.last_step) : 0.0,
              static_cast<ull>(s.checkpoints));
  if (s.interrupted)
    std::printf("interrupted after step %llu as if killed; continue with: retrace resume %s\n",
                static_cast<ull>(s.last_step), s.run_dir.c_str());
}

int run_record(const RecordArgs& a) {
  train::Config config = resolve_config(a.config_path, a.sets, a.steps, a.inject);
  if (a.print_config) {
    std::printf("%s", train::to_toml(config).c_str());
    return 0;
  }
  auto printer = std::make_shared<StepPrinter>(!a.plain && isatty(STDOUT_FILENO));
  if (a.verify_resume) {
    RETRACE_CHECK(a.interrupt_at > 0, ConfigError, "--verify-resume needs --interrupt-at STEP");
    replay::ResumeCheck r = replay::check_resume(config, a.out, static_cast<uint64_t>(a.interrupt_at),
                                                 callbacks_for(printer));
    printer->clear();
    const auto& rep = r.bitwise;
    std::printf("\nresume check: %llu steps compared (%llu only uninterrupted, %llu only resumed)\n",
                static_cast<ull>(rep.compared), static_cast<ull>(rep.only_in_a), static_cast<ull>(rep.only_in_b));
    std::printf("max loss difference: %.3g (step %llu); final loss difference %.3g\n", rep.max_loss_diff,
                static_cast<ull>(rep.max_loss_diff_step), rep.final_loss_diff);
    if (rep.first_diff)
      std::printf("bitwise: no; first difference at step %llu, field %s: %s vs %s\n",
                  static_cast<ull>(rep.first_diff->step), rep.first_diff->field.c_str(), rep.first_diff->a.c_str(),
                  rep.first_diff->b.c_str());
    else
      std::printf("bitwise: yes (every field and digest equal, including the hash chain)\n");
    std::printf("%s\n", r.verified ? "RESUME VERIFIED" : "RESUME FAILED");
    return r.verified ? 0 : static_cast<int>(ExitCode::kVerificationFailed);
  }
  train::RecordOptions opts;
  opts.out_dir = a.out;
  opts.force = a.force;
  opts.control.interrupt_at = static_cast<uint64_t>(std::max<int64_t>(0, a.interrupt_at));
  for (int64_t s : a.checkpoint_at) {
    RETRACE_CHECK(s > 0, ConfigError, "--checkpoint-at expects step numbers >= 1, got ", s);
    opts.control.checkpoint_at.insert(static_cast<uint64_t>(s));
  }
  train::RunSummary s = train::record(config, opts, callbacks_for(printer));
  printer->clear();
  print_summary(s);
  return 0;
}

int run_resume(const ResumeArgs& a) {
  auto printer = std::make_shared<StepPrinter>(!a.plain && isatty(STDOUT_FILENO));
  train::LoopControl control;
  control.interrupt_at = static_cast<uint64_t>(std::max<int64_t>(0, a.interrupt_at));
  train::RunSummary s = train::resume(a.run, control, callbacks_for(printer));
  printer->clear();
  print_summary(s);
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
    RETRACE_FAIL(ConfigError, "--steps expects A:B, A:, :B or N (step numbers), got '", spec, "'");
  }
}

int run_inspect(const InspectArgs& a) {
  RETRACE_CHECK(!(a.json && a.csv), ConfigError, "choose one of --json and --csv");
  auto [first, last] = parse_range(a.steps);
  trace::TraceReader reader = trace::TraceReader::open(a.trace);
  if (auto w = reader.tail_warning()) std::cerr << "warning: " << *w << "\n";
  trace::InspectFormat fmt = a.json  ? trace::InspectFormat::kJson
                             : a.csv ? trace::InspectFormat::kCsv
                                     : trace::InspectFormat::kTable;
  trace::print_inspect(reader, fmt, first, last, std::cout);
  return 0;
}

int run_verify(const VerifyArgs& a) {
  std::optional<uint32_t> world;
  if (a.world_size > 0) world = static_cast<uint32_t>(a.world_size);
  if (a.json) {
    nlohmann::json j = ckpt::verify_report_json(a.dir, world);
    std::cout << j.dump(2) << "\n";
    return j.value("ok", false) ? 0 : static_cast<int>(ExitCode::kCorrupt);
  }
  ckpt::Manifest m = ckpt::verify_checkpoint(a.dir, world);  // throws with the exact phrase
  std::printf("checkpoint %s: step %llu, world size %u, schema %s, %zu shard(s), sha256 verified\n",
              a.dir.c_str(), static_cast<ull>(m.step), m.world_size, m.schema.c_str(), m.shards.size());
  for (const auto& s : m.shards)
    std::printf("  rank %u  %s  %llu bytes  sha256 %s\n", s.rank, s.file.c_str(), static_cast<ull>(s.size),
                s.sha256.c_str());
  std::printf("VERIFIED\n");
  return 0;
}

}  // namespace

void register_commands(CLI::App& app, CliArgs& args) {
  auto& r = args.record;
  auto* rec = app.add_subcommand("record", "train a run and record every step to a trace");
  rec->add_option("--config", r.config_path,
                  "TOML config (default: the built-in fashion-mlp config, same as configs/fashion-mlp.toml)");
  rec->add_option("--set", r.sets, "override a config key, e.g. --set optim.lr=0.01 (repeatable)");
  rec->add_option("--out", r.out, "run directory (default: run)");
  rec->add_option("--steps,--total-steps", r.steps, "optimizer steps to train (sets train.steps)");
  rec->add_flag("--force", r.force, "replace an existing run directory");
  rec->add_option("--inject", r.inject,
                  "faults: KIND@STEP[:ARG],... with KIND nan-loss, inf-grad[:PARAM], spike[:FACTOR], crash, "
                  "perturb-param:PARAM (sets faults.inject; recorded and replayed)");
  rec->add_flag("--plain", r.plain, "print one row per step even on a terminal");
  rec->add_flag("--print-config", r.print_config, "print the resolved config and exit");
  rec->add_option("--interrupt-at", r.interrupt_at,
                  "stop right after this step and its checkpoint, as if killed (resume with `retrace resume`)");
  rec->add_option("--checkpoint-at", r.checkpoint_at, "also checkpoint after these steps (repeatable)");
  rec->add_flag("--verify-resume", r.verify_resume,
                "with --interrupt-at: run uninterrupted (OUT/uninterrupted) and interrupted then resumed "
                "(OUT/resumed), compare, print RESUME VERIFIED");
  rec->footer("Examples:\n  retrace record --steps 20\n"
              "  retrace record --config configs/fashion-mlp.toml --set optim.name=sgd --set optim.lr=0.05 --out run-sgd\n"
              "  retrace record --total-steps 24 --interrupt-at 10 --out run24 && retrace resume run24\n"
              "  retrace record --total-steps 24 --interrupt-at 10 --verify-resume --out check24\n"
              "  retrace record --steps 20 --inject nan-loss@5,inf-grad@9 --set amp.mode=bf16 --set amp.scaler=on\n\nConfig keys:\n" +
              train::describe_keys());

  auto* res = app.add_subcommand("resume", "continue a run from its newest checkpoint that verifies");
  res->add_option("run", args.resume.run, "run directory")->required();
  res->add_flag("--plain", args.resume.plain, "print one row per step even on a terminal");
  res->add_option("--interrupt-at", args.resume.interrupt_at, "stop after this step and its checkpoint");
  res->footer("Example:\n  retrace record --total-steps 24 --interrupt-at 10 --out run24\n  retrace resume run24");

  auto* ins = app.add_subcommand("inspect", "print a trace's header and step table");
  ins->add_option("trace", args.inspect.trace, "trace file (run/trace.rtrace)")->required();
  ins->add_flag("--json", args.inspect.json, "JSON output");
  ins->add_flag("--csv", args.inspect.csv, "CSV output (one row per step)");
  ins->add_option("--steps", args.inspect.steps, "step range A:B (inclusive)");
  ins->footer("Examples:\n  retrace inspect run/trace.rtrace --steps 1:20\n  retrace inspect run/trace.rtrace --csv > steps.csv");

  auto* ver = app.add_subcommand("verify", "verify a checkpoint directory without loading it");
  ver->add_option("dir", args.verify.dir, "checkpoint directory (run/checkpoints/step-00000010)")->required();
  ver->add_flag("--json", args.verify.json, "JSON report (exit 3 when not ok)");
  ver->add_option("--world-size", args.verify.world_size, "expected world size");
  ver->footer("Example:\n  retrace verify run/checkpoints/step-00000010 --json");
}

int run_selected(CLI::App& app, const CliArgs& args) {
  if (app.got_subcommand("record")) return run_record(args.record);
  if (app.got_subcommand("resume")) return run_resume(args.resume);
  if (app.got_subcommand("inspect")) return run_inspect(args.inspect);
  if (app.got_subcommand("verify")) return run_verify(args.verify);
  RETRACE_FAIL(ConfigError, "no command given; see retrace --help");
}

}  // namespace retrace::cli
