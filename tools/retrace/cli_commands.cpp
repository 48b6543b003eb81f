#include "cli_commands.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <cstdio>
#include <iostream>
#include <limits>
#include <memory>

#include "ckpt/strict_json.h"
#include "ckpt/verify.h"
#include "core/error.h"
#include "dist/launcher.h"
#include "dist/process_group.h"
#include "core/file_util.h"
#include "replay/accum_grid.h"
#include "replay/bisect.h"
#include "replay/diff.h"
#include "replay/golden.h"
#include "replay/html_report.h"
#include "replay/replay.h"
#include "replay/resume_check.h"
#include "trace/inspect.h"
#include "trace/trace_reader.h"
#include "model/memory_plan.h"
#include "train/config.h"
#include "run/memory_report.h"
#include "run/run.h"

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

std::vector<std::string> golden_sets(const GoldenArgs& g) {
  std::vector<std::string> sets = g.sets;
  if (!g.inject.empty()) sets.push_back("faults.inject=\"" + g.inject + "\"");
  return sets;
}

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
                static_cast<ull>(r.batch_in_epoch), r.loss, r.grad_norm_pre, r.grad_norm_post, r.lr,
                r.loss_scale, skip ? "  reason " : "", skip ? r.skip_reason.c_str() : "");
    std::fflush(stdout);
  }
  bool live_;
  std::chrono::steady_clock::time_point start_;
  uint64_t done_ = 0;
};

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
  if (s.test_accuracy >= 0) std::printf("; test accuracy %.4f", s.test_accuracy);
  std::printf("\nrun directory: %s  (trace %llu bytes, %.0f bytes/step, %llu checkpoints written)\n",
              s.run_dir.c_str(), static_cast<ull>(s.trace_bytes),
              s.last_step ? static_cast<double>(s.trace_bytes) / static_cast<double>(s.last_step) : 0.0,
              static_cast<ull>(s.checkpoints));
  if (s.interrupted)
    std::printf("interrupted after step %llu as if killed; continue with: retrace resume %s\n",
                static_cast<ull>(s.last_step), s.run_dir.c_str());
}

// This process's rank when the rendezvous variables are set (a launcher started it), else nullopt.
std::unique_ptr<dist::ProcessGroup> join_ranks(const train::Config& config, int64_t world_flag) {
  auto env = dist::env_from_environment();
  if (!env) return nullptr;
  RETRACE_CHECK(world_flag <= 1 || static_cast<uint32_t>(world_flag) == env->world_size, ConfigError,
                "--world-size ", world_flag, " but WORLD_SIZE=", env->world_size, " in the environment");
  if (env->world_size == 1) return nullptr;
  return std::make_unique<dist::ProcessGroup>(
      *env, std::chrono::milliseconds(static_cast<int64_t>(config.runtime.collective_timeout_s * 1000)),
      config.runtime.device == "cuda");
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

void print_resume_check(const replay::CompareReport& rep, bool verified) {
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
  std::printf("%s\n", verified ? "RESUME VERIFIED" : "RESUME FAILED");
}

// --world-size N --verify-resume: three launches (uninterrupted, interrupted, resumed), then compare.
int verify_resume_launched(const RecordArgs& a, const std::vector<std::string>& argv, uint64_t interrupt_at) {
  fs::make_writable_dir(a.out);
  const std::string un = (std::filesystem::path(a.out) / "uninterrupted").string();
  const std::string re = (std::filesystem::path(a.out) / "resumed").string();
  // The two runs go into scratch directories: replaced only when retrace made them (or --force).
  std::vector<std::string> base = without_flag(argv, "--verify-resume");
  if (!a.force) base.push_back("--scratch");
  std::vector<std::string> first = with_flag(base, "--out", un);
  for (size_t i = 0; i < first.size(); ++i)  // the uninterrupted run neither stops nor saves at K
    if ((first[i] == "--interrupt-at" || first[i] == "--checkpoint-at") && i + 1 < first.size()) {
      first.erase(first.begin() + static_cast<long>(i), first.begin() + static_cast<long>(i) + 2);
      --i;
    }
  std::printf("== uninterrupted %u-rank run -> %s\n", static_cast<unsigned>(a.world_size), un.c_str());
  if (int rc = dist::launch_local(static_cast<uint32_t>(a.world_size), first)) return rc;
  std::vector<std::string> second = with_flag(with_flag(base, "--out", re), "--interrupt-at", std::to_string(interrupt_at));
  std::printf("== %u-rank run interrupted after step %llu -> %s\n", static_cast<unsigned>(a.world_size),
              static_cast<ull>(interrupt_at), re.c_str());
  if (int rc = dist::launch_local(static_cast<uint32_t>(a.world_size), second)) return rc;
  std::printf("== resume %s on %u ranks\n", re.c_str(), static_cast<unsigned>(a.world_size));
  if (int rc = dist::launch_local(static_cast<uint32_t>(a.world_size),
                                  {"resume", re, "--plain", "--world-size", std::to_string(a.world_size)}))
    return rc;
  auto sa = trace::TraceReader::open(run::trace_path(un)).steps();
  auto sb = trace::TraceReader::open(run::trace_path(re)).steps();
  replay::CompareReport rep = replay::compare_steps(sa, sb, replay::CompareMode::kBitwise);
  const bool ok = rep.only_in_a == 0 && rep.only_in_b == 0 && rep.compared > 0 && rep.max_loss_diff < 1e-4;
  print_resume_check(rep, ok);
  return ok ? 0 : static_cast<int>(ExitCode::kVerificationFailed);
}

int run_record(const RecordArgs& a, const std::vector<std::string>& argv) {
  train::Config config = resolve_config(a.config_path, a.sets, a.steps, a.inject);
  if (a.print_config) {
    std::printf("%s", train::to_toml(config).c_str());
    return 0;
  }
  if (!a.accum_grid.empty()) {
    auto rows = replay::accum_grid(config, a.accum_grid, a.out);
    std::printf("accumulation grid: effective batch %lld, %llu steps each (runs in %s/accum-N)\n",
                static_cast<long long>(config.data.batch_size * config.train.accum_steps),
                static_cast<ull>(rows.front().compared), a.out.c_str());
    std::printf("%6s %8s %12s %22s %14s %12s %14s\n", "accum", "micro", "final loss", "max |loss - accum 1|",
                "ms / step", "x accum 1", "peak RSS MiB");
    for (const auto& r : rows)
      std::printf("%6lld %8lld %12.6f %22.3g %14.2f %12.2f %14.1f\n", static_cast<long long>(r.accum_steps),
                  static_cast<long long>(r.micro_batch), r.final_loss, r.max_loss_diff, r.median_step_ms,
                  r.median_step_ms / rows.front().median_step_ms, r.peak_rss_mib);
    if (config.model.dropout > 0)
      std::printf("note: model.dropout = %g draws its masks per micro-batch, so the settings see different masks and "
                  "their curves differ by more than rounding; --set model.dropout=0 compares the arithmetic alone\n",
                  config.model.dropout);
    return 0;
  }
  uint64_t interrupt_at = static_cast<uint64_t>(std::max<int64_t>(0, a.interrupt_at));
  if (a.verify_resume && interrupt_at == 0 && !a.checkpoint_at.empty())
    interrupt_at = static_cast<uint64_t>(a.checkpoint_at.front());
  std::unique_ptr<dist::ProcessGroup> pg = join_ranks(config, a.world_size);
  if (!pg && a.world_size > 1) {
    if (a.verify_resume) {
      RETRACE_CHECK(interrupt_at > 0, ConfigError, "--verify-resume needs --interrupt-at STEP or --checkpoint-at STEP");
      return verify_resume_launched(a, argv, interrupt_at);
    }
    return dist::launch_local(static_cast<uint32_t>(a.world_size), argv);  // ranks print plain rows: a pipe
  }
  const bool quiet = pg && pg->rank() != 0;
  auto printer = std::make_shared<StepPrinter>(!a.plain && !pg && isatty(STDOUT_FILENO));
  if (a.verify_resume) {
    RETRACE_CHECK(interrupt_at > 0, ConfigError, "--verify-resume needs --interrupt-at STEP or --checkpoint-at STEP");
    replay::ResumeCheck r = replay::check_resume(config, a.out, interrupt_at, callbacks_for(printer), a.force);
    printer->clear();
    print_resume_check(r.bitwise, r.verified);
    return r.verified ? 0 : static_cast<int>(ExitCode::kVerificationFailed);
  }
  run::RecordOptions opts;
  opts.out_dir = a.out;
  opts.force = a.force;
  opts.scratch = a.scratch;
  opts.control.interrupt_at = static_cast<uint64_t>(std::max<int64_t>(0, a.interrupt_at));
  for (int64_t s : a.checkpoint_at) {
    RETRACE_CHECK(s > 0, ConfigError, "--checkpoint-at expects step numbers >= 1, got ", s);
    opts.control.checkpoint_at.insert(static_cast<uint64_t>(s));
  }
  opts.process_group = pg.get();
  run::RunSummary s = run::record(config, opts, quiet ? run::RunCallbacks{} : callbacks_for(printer));
  printer->clear();
  if (!quiet) print_summary(s);
  return 0;
}

int run_resume(const ResumeArgs& a, const std::vector<std::string>& argv) {
  train::Config config;
  std::unique_ptr<dist::ProcessGroup> pg = join_ranks(config, a.world_size);
  if (!pg && a.world_size > 1) return dist::launch_local(static_cast<uint32_t>(a.world_size), argv);
  const bool quiet = pg && pg->rank() != 0;
  auto printer = std::make_shared<StepPrinter>(!a.plain && !pg && isatty(STDOUT_FILENO));
  run::LoopControl control;
  control.interrupt_at = static_cast<uint64_t>(std::max<int64_t>(0, a.interrupt_at));
  run::RunSummary s = run::resume(a.run, control, quiet ? run::RunCallbacks{} : callbacks_for(printer), pg.get());
  printer->clear();
  if (!quiet) print_summary(s);
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
    std::cout << ckpt::json_text(j, 2) << "\n";
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

void print_diff_context(const char* label, const std::optional<records::StepRecord>& r) {
  if (!r) return;
  std::printf("  %-9s step %llu epoch %llu batch %llu: loss %.9g  grad %.6g -> %.6g  lr %.6g  scale %g  %s%s%s\n",
              label, static_cast<ull>(r->step), static_cast<ull>(r->epoch), static_cast<ull>(r->batch_in_epoch),
              r->loss, r->grad_norm_pre, r->grad_norm_post, r->lr, r->loss_scale,
              r->outcome == records::Outcome::kStep ? "STEP" : "SKIP", r->skip_reason.empty() ? "" : " ",
              r->skip_reason.c_str());
}

int run_replay(const ReplayArgs& a) {
  RETRACE_CHECK(!(a.bitwise && a.tolerance >= 0), ConfigError, "choose one of --bitwise and --tolerance");
  replay::ReplayOptions o;
  if (a.from_checkpoint >= 0) o.from_checkpoint = static_cast<uint64_t>(a.from_checkpoint);
  auto [first, last] = parse_range(a.steps);
  o.first = first;
  o.last = last;
  if (a.tolerance >= 0) o.tolerance = a.tolerance;
  o.bitwise = a.bitwise;
  o.scratch_dir = a.out;
  o.force = a.force;
  auto printer = std::make_shared<StepPrinter>(!a.plain && isatty(STDOUT_FILENO));
  run::RunCallbacks cb = callbacks_for(printer);
  if (a.quiet) cb = {};
  replay::ReplayResult r = replay::replay_run(a.run, o, cb);
  printer->clear();
  std::printf("\nreplay of %s in %s\n", r.recorded_trace.c_str(), r.replay_dir.c_str());
  if (r.mode == replay::CompareMode::kBitwise) {
    std::printf("comparison: bitwise (environment fingerprints %s)\n",
                r.fingerprint_diffs.empty() ? "equal" : "differ, --bitwise forced");
  } else {
    std::string diffs;
    for (const auto& d : r.fingerprint_diffs) diffs += (diffs.empty() ? "" : ", ") + d;
    std::printf("comparison: NOT bitwise, loss tolerance %g (%s)\n", r.tolerance,
                diffs.empty() ? "--tolerance given" : ("fingerprint fields differ: " + diffs).c_str());
  }
  std::printf("%llu steps compared; max loss difference %.3g\n", static_cast<ull>(r.report.compared),
              r.report.max_loss_diff);
  if (r.verified()) {
    std::printf("REPLAY VERIFIED\n");
    return 0;
  }
  if (r.report.first_diff) {
    const auto& d = *r.report.first_diff;
    std::printf("REPLAY DIVERGED at step %llu, field %s: recorded %s, replayed %s\n", static_cast<ull>(d.step),
                d.field.c_str(), d.a.c_str(), d.b.c_str());
    print_diff_context("recorded", r.recorded_at_diff);
    print_diff_context("replayed", r.replayed_at_diff);
  } else {
    std::printf("REPLAY INCOMPLETE: %llu recorded steps were not replayed\n", static_cast<ull>(r.report.only_in_a));
  }
  return static_cast<int>(ExitCode::kVerificationFailed);
}

int run_diff(const DiffArgs& a) {
  trace::TraceReader ra = trace::TraceReader::open(a.a);
  trace::TraceReader rb = trace::TraceReader::open(a.b);
  replay::DiffReport rep = replay::diff_traces(ra, rb);
  if (a.json) std::cout << ckpt::json_text(replay::to_json(rep), 2) << "\n";
  else std::cout << replay::render_text(rep);
  if (!a.html.empty()) {
    fs::write_file_atomic(a.html, replay::render_html(rep, ra, rb, a.a, a.b));
    if (!a.json) std::printf("HTML report: %s\n", a.html.c_str());
  }
  return rep.identical() ? 0 : static_cast<int>(ExitCode::kVerificationFailed);
}

int run_golden_check(const GoldenArgs& a) {
  std::vector<std::string> names = a.names.empty() ? replay::list_goldens(a.dir) : a.names;
  RETRACE_CHECK(!names.empty(), IoError, "no golden traces in ", a.dir);
  const std::vector<std::string> sets = golden_sets(a);
  const std::string scratch = a.scratch.empty()
                                  ? (std::filesystem::temp_directory_path() / "retrace-golden-check").string()
                                  : a.scratch;
  int failed = 0;
  std::vector<records::KeyValue> printed_numerics;
  for (const auto& n : names) {
    replay::GoldenResult r = replay::check_golden(a.dir, n, sets, scratch, {});
    const auto& rep = r.report;
    if (r.numerics != printed_numerics) {  // once, and again whenever a golden runs under others
      std::string line;
      for (const auto& kv : r.numerics)
        if (kv.key != "blas") line += (line.empty() ? "" : " ") + kv.key + "=" + kv.value;
      std::printf("numerics fingerprint: %s\n", line.c_str());
      printed_numerics = r.numerics;
    }
    char mode[128];
    if (r.mode == replay::CompareMode::kBitwise)
      std::snprintf(mode, sizeof mode, "bitwise");
    else
      std::snprintf(mode, sizeof mode, "tolerance %g for %llu steps, then %g %%", r.tolerance.abs,
                    static_cast<ull>(r.tolerance.horizon), r.tolerance.late_rel * 100);
    std::printf("golden %-22s %s  %s, %llu steps compared, max loss difference %.3g", n.c_str(),
                r.passed ? "PASS" : "FAIL", mode, static_cast<ull>(rep.compared), rep.max_loss_diff);
    if (!r.fingerprint_diffs.empty()) {
      std::string d;
      for (const auto& k : r.fingerprint_diffs) d += (d.empty() ? "" : ", ") + k;
      std::printf(" (not bitwise: numerics fields differ: %s)", d.c_str());
    }
    std::printf("\n");
    if (!r.passed) {
      ++failed;
      if (rep.first_diff)
        std::printf("  first divergent step %llu, field %s: golden %s, now %s\n", static_cast<ull>(rep.first_diff->step),
                    rep.first_diff->field.c_str(), rep.first_diff->a.c_str(), rep.first_diff->b.c_str());
      if (rep.only_in_a || rep.only_in_b)
        std::printf("  %llu steps only in the golden trace, %llu only in the new run\n", static_cast<ull>(rep.only_in_a),
                    static_cast<ull>(rep.only_in_b));
      std::printf("  new run kept in %s; if the change is intended: retrace golden update %s --reason \"...\"\n",
                  r.scratch_dir.c_str(), n.c_str());
    }
  }
  std::printf("golden: %zu passed, %d failed\n", names.size() - failed, failed);
  return failed ? static_cast<int>(ExitCode::kVerificationFailed) : 0;
}

int run_bisect(const BisectArgs& a) {
  auto printer = std::make_shared<StepPrinter>(false);
  run::RunCallbacks cb;
  cb.on_message = [printer](const std::string& m) { printer->message(m); };
  replay::BisectReport r = replay::bisect_runs(a.a, a.b, cb);
  if (a.json) {
    nlohmann::json j = {{"diverged", r.diverged}, {"common_steps", r.common_steps}, {"search_probes", r.search_probes},
                        {"step", r.step}, {"rank", r.rank ? static_cast<int64_t>(*r.rank) : -1}, {"module", r.module},
                        {"module_type", r.module_type}, {"phase", r.phase}, {"what", r.what}, {"op", r.op},
                        {"detail", r.detail}, {"replay_start_a", r.replay_start_a}, {"replay_start_b", r.replay_start_b},
                        {"notes", r.notes}, {"summary", r.summary()}};
    std::cout << ckpt::json_text(j, 2) << "\n";
  } else {
    for (const auto& n : r.notes) std::printf("note: %s\n", n.c_str());
    if (r.diverged)
      std::printf("re-executed from step %llu (run A) and %llu (run B)\n", static_cast<ull>(r.replay_start_a),
                  static_cast<ull>(r.replay_start_b));
    std::printf("%s\n", r.summary().c_str());
    if (!r.detail.empty()) std::printf("  %s\n", r.detail.c_str());
  }
  return r.diverged ? static_cast<int>(ExitCode::kVerificationFailed) : 0;
}

double gb(double bytes) { return bytes / 1e9; }

int run_memory(const MemoryArgs& a) {
  train::Config c = train::load_config(a.config_path, a.sets);
  std::vector<run::PolicyMeasurement> plan =
      run::plan_memory(c, a.world_size, a.rounds, a.steps);
  const auto& e0 = plan.front().estimate;
  std::printf("memory plan: %s, gpt d_model %lld, %lld layers, %lld heads, batch %lld, context %lld, %s\n",
              a.config_path.c_str(), static_cast<long long>(c.model.d_model), static_cast<long long>(c.model.n_layers),
              static_cast<long long>(c.model.n_heads), static_cast<long long>(c.data.batch_size),
              static_cast<long long>(c.data.context), c.amp.mode == "off" ? "float32" : c.amp.mode.c_str());
  std::printf("parameters %lld: weights %.1f MB, gradients %.1f MB, AdamW state %.1f MB; ZeRO-1 optimizer "
              "bytes per rank at world size %lld: %.1f MB (12 P / N)\n",
              static_cast<long long>(e0.params), e0.param_bytes / 1e6, e0.grad_bytes / 1e6, e0.optimizer_bytes / 1e6,
              static_cast<long long>(a.world_size), e0.zero1_optimizer_bytes_per_rank / 1e6);
  std::printf("activation estimate 12*B*L*d per layer: %.1f MB per layer\n\n", e0.activation_bytes_per_layer / 1e6);
  std::printf("%-12s %16s %12s %12s %14s %12s\n", "policy", "activations MB", "x none", "step ms", "x none (time)",
              "growth MiB");
  const auto& base = plan.front();
  for (const auto& m : plan) {
    std::printf("%-12s %16.1f %12.2f", m.name.c_str(), m.estimate.activation_bytes_total / 1e6,
                m.estimate.activation_bytes_total / base.estimate.activation_bytes_total);
    if (m.measured)
      std::printf(" %12.1f %14.2f %12.1f (x%.2f)", m.step_ms, m.step_ms / base.step_ms, m.rss_growth_mib,
                  base.rss_growth_mib > 0 ? m.rss_growth_mib / base.rss_growth_mib : 0.0);
    std::printf("\n");
  }
  if (plan.front().measured)
    std::printf("(measured: median of %d rounds, fresh process per policy and round, %d timed steps each after a "
                "warm-up; growth = rise of peak RSS over the steps)\n", a.rounds, a.steps);
  model::MemoryEstimate fn = model::estimate_memory(1, 1, 8192, 8192, 64, 64, 2, "none", 4, 1);
  std::printf("\nfield-notes example (d = 8192, L = 8192, B = 1, 64 layers, BF16): %.2f GB per layer, %.1f GB for "
              "64 layers\n", gb(fn.activation_bytes_per_layer), gb(fn.activation_bytes_total));
  return 0;
}

int run_golden_update(const GoldenArgs& a) {
  RETRACE_CHECK(a.names.size() == 1, ConfigError, "golden update takes exactly one NAME");
  replay::update_golden(a.dir, a.names[0], a.reason, golden_sets(a), a.interrupt_at, {});
  std::printf("golden %s regenerated in %s/%s\n", a.names[0].c_str(), a.dir.c_str(), a.names[0].c_str());
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
  rec->add_flag("--scratch", r.scratch,
                "the run directory is a scratch directory: replace it only if retrace made it as one (it holds "
                ".retrace-scratch), never anything else");
  rec->add_option("--inject", r.inject,
                  "faults: KIND@STEP[:ARG],... with KIND nan-loss, inf-grad[:PARAM], spike[:FACTOR], crash, "
                  "perturb-param:PARAM (sets faults.inject; recorded and replayed)");
  rec->add_flag("--plain", r.plain, "print one row per step even on a terminal");
  rec->add_flag("--print-config", r.print_config, "print the resolved config and exit");
  rec->add_option("--interrupt-at", r.interrupt_at,
                  "stop right after this step and its checkpoint, as if killed (resume with `retrace resume`)");
  rec->add_option("--checkpoint-at", r.checkpoint_at, "also checkpoint after these steps (repeatable)");
  rec->add_option("--accum-grid", r.accum_grid,
                  "train the same effective batch with each number of micro-batches (e.g. 1,2,4,8,16) and "
                  "print final loss, max loss difference, time per step and peak memory")
      ->delimiter(',');
  rec->add_option("--world-size", r.world_size,
                  "data parallelism: start N rank processes on loopback (Gloo), or check WORLD_SIZE when a "
                  "launcher set RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT");
  rec->add_flag("--verify-resume", r.verify_resume,
                "with --interrupt-at: run uninterrupted (OUT/uninterrupted) and interrupted then resumed "
                "(OUT/resumed), compare, print RESUME VERIFIED");
  rec->footer("Examples:\n  retrace record --steps 20\n"
              "  retrace record --config configs/fashion-mlp.toml --set optim.name=sgd --set optim.lr=0.05 --out run-sgd\n"
              "  retrace record --total-steps 24 --interrupt-at 10 --out run24 && retrace resume run24\n"
              "  retrace record --total-steps 24 --interrupt-at 10 --verify-resume --out check24\n"
              "  retrace record --steps 20 --inject nan-loss@5,inf-grad@9 --set amp.mode=bf16 --set amp.scaler=on\n"
              "  retrace record --world-size 4 --total-steps 20 --checkpoint-at 10 --verify-resume --out dp4\n"
              "  retrace record --accum-grid 1,2,4,8,16 --steps 200 --out grid\n\nConfig keys:\n" +
              train::describe_keys());

  auto* res = app.add_subcommand("resume", "continue a run from its newest checkpoint that verifies");
  res->add_option("run", args.resume.run, "run directory")->required();
  res->add_flag("--plain", args.resume.plain, "print one row per step even on a terminal");
  res->add_option("--interrupt-at", args.resume.interrupt_at, "stop after this step and its checkpoint");
  res->add_option("--world-size", args.resume.world_size, "data parallelism: ranks to resume on (as recorded)");
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

  auto& rp = args.replay;
  auto* rep = app.add_subcommand("replay", "re-execute a recorded run and compare every step with the trace");
  rep->add_option("run", rp.run, "run directory or its trace.rtrace")->required();
  rep->add_option("--from-checkpoint", rp.from_checkpoint, "start from the run's checkpoint of this step");
  rep->add_option("--steps", rp.steps, "compare (and run up to the end of) step range A:B");
  rep->add_option("--tolerance", rp.tolerance, "compare losses within this tolerance instead of bitwise");
  rep->add_flag("--bitwise", rp.bitwise, "compare bitwise even when the environments differ");
  rep->add_option("--out", rp.out, "scratch run directory for the replay (default RUN/replay); replaced only if "
                  "retrace made it, or with --force");
  rep->add_flag("--force", rp.force, "replace --out even if retrace did not make it");
  rep->add_flag("--plain", rp.plain, "print one row per step even on a terminal");
  rep->add_flag("--quiet", rp.quiet, "print only the verdict");
  rep->footer("Exit 0 with REPLAY VERIFIED, 1 with the first step and field that differ.\nExamples:\n"
              "  retrace replay run\n  retrace replay run --from-checkpoint 200 --steps 201:300\n");

  auto* dif = app.add_subcommand("diff", "compare two traces step by step (any configs or machines)");
  dif->add_option("a", args.diff.a, "first trace")->required();
  dif->add_option("b", args.diff.b, "second trace")->required();
  dif->add_option("--html", args.diff.html, "also write a self-contained HTML report with loss and grad-norm curves");
  dif->add_flag("--json", args.diff.json, "JSON output");
  dif->footer("Exit 0 when identical, 1 when they differ.\nExample:\n  retrace diff runA/trace.rtrace runB/trace.rtrace --html report.html");

  auto* bis = app.add_subcommand("bisect", "find where two runs diverge: step, rank, module, phase, op");
  bis->add_option("a", args.bisect.a, "first run directory")->required();
  bis->add_option("b", args.bisect.b, "second run directory")->required();
  bis->add_flag("--json", args.bisect.json, "JSON output");
  bis->footer("Exit 0 when the runs do not diverge, 1 with the first divergence.\nExample:\n"
              "  retrace record --steps 80 --out a && retrace record --steps 80 --out b --inject perturb-param@57:layers.0.weight\n"
              "  retrace bisect a b");

  auto& mem = args.memory;
  auto* memc = app.add_subcommand("memory", "memory plan of a GPT config under each activation-checkpoint policy");
  memc->add_option("--config", mem.config_path, "GPT config (default configs/char-gpt.toml)");
  memc->add_option("--set", mem.sets, "config overrides");
  memc->add_option("--world-size", mem.world_size, "world size for the ZeRO-1 figure (default 8)");
  memc->add_option("--rounds", mem.rounds, "measurement rounds (0: estimate only; default 2)");
  memc->add_option("--steps", mem.steps, "timed steps per measurement (default 3)");
  memc->footer("Example:\n  retrace memory --config configs/char-gpt.toml\n  retrace memory --rounds 0");

  auto& g = args.golden;
  auto* gold = app.add_subcommand("golden", "golden-trace regression: check or update golden/NAME");
  gold->require_subcommand(1);
  auto* gc = gold->add_subcommand("check", "re-run golden traces and compare (bitwise when fingerprints match)");
  gc->add_option("names", g.names, "golden names (default: all)");
  gc->add_option("--dir", g.dir, "golden directory (default: golden)");
  gc->add_option("--set", g.sets, "change the re-run (to see the check fail), e.g. --set optim.lr=0.002");
  gc->add_option("--inject", g.inject, "inject faults into the re-run, e.g. perturb-param@57:layers.0.weight");
  gc->add_option("--scratch", g.scratch, "where the re-runs go (default: a temporary directory)");
  gc->footer("Example:\n  retrace golden check\n  retrace golden check fashion-mlp-100 --inject perturb-param@57:layers.0.weight");
  auto* gu = gold->add_subcommand("update", "regenerate one golden trace and record why");
  gu->add_option("names", g.names, "golden name")->required();
  gu->add_option("--reason", g.reason, "why the golden trace changes (required)")->required();
  gu->add_option("--dir", g.dir, "golden directory (default: golden)");
  gu->add_option("--set", g.sets, "config overrides (for a new golden, on top of the built-in config)");
  gu->add_option("--inject", g.inject, "faults to record in the golden run");
  gu->add_option("--interrupt-at", g.interrupt_at, "record interrupted at this step, then resumed");
  gu->footer("Example:\n  retrace golden update fashion-mlp-100 --reason \"schedule now decays to 5 %\"");
}

namespace {
train::Numerics numerics_of(const train::Config& c) { return train::parse_numerics(c.runtime.numerics); }

// The config recorded in a run directory's (or a trace file's) header, when it can be read; a
// command that cannot read it reports that itself, with its own message.
std::optional<train::Config> recorded_config(const std::string& run_or_trace) {
  namespace stdfs = std::filesystem;
  const std::string path = run::trace_of(run_or_trace);
  if (!stdfs::exists(path)) return std::nullopt;
  trace::TraceReader r = trace::TraceReader::open(path);
  return train::parse_config(r.header().config_toml, path + " (header)", {}, train::ConfigSource::kRecorded);
}
}  // namespace

std::optional<train::Numerics> numerics_for(CLI::App& app, const CliArgs& args) {
  namespace stdfs = std::filesystem;
  if (app.got_subcommand("record")) {
    const RecordArgs& a = args.record;
    if (a.print_config) return std::nullopt;
    return numerics_of(resolve_config(a.config_path, a.sets, a.steps, a.inject));
  }
  if (app.got_subcommand("resume")) {
    const std::string cfg = run::config_path(args.resume.run);
    if (!stdfs::exists(cfg)) return std::nullopt;
    return numerics_of(train::load_config(cfg, {}, train::ConfigSource::kRecorded));
  }
  if (app.got_subcommand("replay")) {
    auto c = recorded_config(args.replay.run);
    return c ? std::optional(numerics_of(*c)) : std::nullopt;
  }
  if (app.got_subcommand("bisect")) {
    // Bisection re-executes both runs in this process; runs of another profile are refused there.
    auto c = recorded_config(args.bisect.a);
    return c ? std::optional(numerics_of(*c)) : std::nullopt;
  }
  if (app.got_subcommand("memory")) return numerics_of(train::load_config(args.memory.config_path, args.memory.sets));
  if (app.got_subcommand("golden")) {
    const GoldenArgs& g = args.golden;
    CLI::App* gold = app.get_subcommand("golden");
    const std::vector<std::string> sets = golden_sets(g);
    if (gold->got_subcommand("update")) {
      if (g.names.size() != 1) return std::nullopt;
      const stdfs::path cfg = run::config_path((stdfs::path(g.dir) / g.names[0]).string());
      return numerics_of(stdfs::exists(cfg) ? train::load_config(cfg.string(), sets, train::ConfigSource::kRecorded)
                                            : train::parse_config("", "built-in default", sets));
    }
    std::optional<train::Numerics> n;
    std::string first;
    std::error_code ec;
    if (!stdfs::is_directory(g.dir, ec)) return std::nullopt;
    for (const auto& name : g.names.empty() ? replay::list_goldens(g.dir) : g.names) {
      const stdfs::path cfg = run::config_path((stdfs::path(g.dir) / name).string());
      if (!stdfs::exists(cfg)) continue;
      const train::Numerics here = numerics_of(train::load_config(cfg.string(), sets, train::ConfigSource::kRecorded));
      RETRACE_CHECK(!n || *n == here, ConfigError, "golden ", first, " runs with runtime.numerics = \"",
                    train::numerics_name(*n), "\" and golden ", name, " with \"", train::numerics_name(here),
                    "\"; one process runs one profile: check them in separate commands (retrace golden check ",
                    first, ", then retrace golden check ", name, ")");
      if (!n) first = name;
      n = here;
    }
    return n;
  }
  return std::nullopt;
}

int run_selected(CLI::App& app, const CliArgs& args, const std::vector<std::string>& argv) {
  if (app.got_subcommand("record")) return run_record(args.record, argv);
  if (app.got_subcommand("resume")) return run_resume(args.resume, argv);
  if (app.got_subcommand("inspect")) return run_inspect(args.inspect);
  if (app.got_subcommand("verify")) return run_verify(args.verify);
  if (app.got_subcommand("replay")) return run_replay(args.replay);
  if (app.got_subcommand("diff")) return run_diff(args.diff);
  if (app.got_subcommand("bisect")) return run_bisect(args.bisect);
  if (app.got_subcommand("memory")) return run_memory(args.memory);
  if (app.got_subcommand("golden")) {
    CLI::App* g = app.get_subcommand("golden");
    if (g->got_subcommand("check")) return run_golden_check(args.golden);
    if (g->got_subcommand("update")) return run_golden_update(args.golden);
  }
  RETRACE_FAIL(ConfigError, "no command given; see retrace --help");
}

}  // namespace retrace::cli
