#include "cli.h"

#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "common.h"
#include "core/error.h"
#include "core/file_util.h"
#include "distributed/launcher.h"
#include "replay/accum_grid.h"
#include "replay/compare.h"
#include "replay/resume_check.h"
#include "trace/tensorboard.h"
#include "trace/trace_reader.h"
#include "train/environment.h"
#include "train/registry.h"

namespace retrace::cli {
namespace {

void print_resume_check(const replay::ResumeCheck& r) {
  const replay::CompareReport& rep = r.bitwise;
  std::printf("\nresume check: %llu steps compared (%llu only uninterrupted, %llu only resumed)\n",
              static_cast<ull>(rep.compared), static_cast<ull>(rep.only_in_a), static_cast<ull>(rep.only_in_b));
  std::printf("max loss difference: %.3g (step %llu); final loss difference %.3g\n", rep.max_loss_diff,
              static_cast<ull>(rep.max_loss_diff_step), rep.final_loss_diff);
  if (r.resharded && r.invariant && !rep.first_diff)
    std::printf(
        "bitwise: yes (resharded: every layout-free field and digest equal: losses, norms, parameters, "
        "optimizer, RNG and state; batch sizes, sample digests and per-rank digests follow the layout)\n");
  else if (rep.first_diff)
    std::printf("bitwise: no; first difference at step %llu, field %s: %s vs %s\n",
                static_cast<ull>(rep.first_diff->step), rep.first_diff->field.c_str(), rep.first_diff->a.c_str(),
                rep.first_diff->b.c_str());
  else std::printf("bitwise: yes (every field and digest equal, including the hash chain)\n");
  std::printf("evaluations: %s\n", r.evals_diff ? ("differ: " + *r.evals_diff).c_str() : "equal");
  std::printf("training events: %s\n", r.events_diff ? ("differ: " + *r.events_diff).c_str() : "equal");
  std::string fields;
  for (const auto& k : r.numerics_diffs) fields += (fields.empty() ? "" : ", ") + k;
  if (r.resharded && !r.invariant)
    std::printf("%s within %g, not bitwise: resharded without runtime.invariance = \"batch\"\n",
                r.verified ? "RESUME VERIFIED" : "RESUME FAILED", r.tolerance);
  else if (r.numerics_diffs.empty())
    std::printf("%s\n", r.verified ? "RESUME VERIFIED" : "RESUME FAILED (equal numerics: only equal bits verify)");
  else
    std::printf("%s within %g, not bitwise: numerics fields differ: %s\n",
                r.verified ? "RESUME VERIFIED" : "RESUME FAILED", r.tolerance, fields.c_str());
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
  if (int rc = distributed::launch_local(static_cast<uint32_t>(a.world_size), first)) return rc;
  std::vector<std::string> second = with_flag(with_flag(base, "--out", re), "--interrupt-at",
                                              std::to_string(interrupt_at));
  std::printf("== %u-rank run interrupted after step %llu -> %s\n", static_cast<unsigned>(a.world_size),
              static_cast<ull>(interrupt_at), re.c_str());
  if (int rc = distributed::launch_local(static_cast<uint32_t>(a.world_size), second)) return rc;
  const int64_t resume_world = a.resume_world_size > 0 ? a.resume_world_size : a.world_size;
  std::vector<std::string> resume_args = {"resume", re, "--plain", "--world-size", std::to_string(resume_world)};
  if (resume_world != a.world_size) resume_args.push_back("--reshard");
  std::printf("== resume %s on %lld ranks%s\n", re.c_str(), static_cast<long long>(resume_world),
              resume_world != a.world_size ? " (--reshard)" : "");
  if (int rc = distributed::launch_local(static_cast<uint32_t>(resume_world), resume_args)) return rc;
  const replay::ResumeCheck r = replay::resume_verdict(run::trace_path(un), run::trace_path(re));
  print_resume_check(r);
  return r.verified ? 0 : static_cast<int>(ExitCode::kVerificationFailed);
}

}  // namespace

void add_record(CLI::App& app, RecordArgs& args) {
  auto& r = args;
  auto* rec = app.add_subcommand("record", "train a run and record every step to a trace");
  rec->add_option("--config", r.config_path,
                  "TOML config (default: the built-in fashion-mlp config, same as configs/fashion-mlp.toml)");
  rec->add_option("--set", r.sets, "override a config key, e.g. --set optim.lr=0.01 (repeatable)");
  rec->add_option("--out", r.out, "run directory (default: run)");
  rec->add_option("--steps,--total-steps", r.steps, "optimizer steps to train (sets train.steps)")->check(step_range());
  rec->add_flag("--force", r.force, "replace an existing run directory");
  rec->add_flag("--scratch", r.scratch,
                "the run directory is a scratch directory: replace it only if retrace made it as one (it holds "
                ".retrace-scratch), never anything else");
  rec->add_option("--inject", r.inject,
                  "faults: KIND@STEP[:ARG],... with KIND nan-loss, inf-grad[:PARAM], spike[:FACTOR], crash, "
                  "perturb-param:PARAM, crash-in-eval, crash-in-save, corrupt-staging:TENSOR (sets faults.inject; "
                  "recorded and replayed)");
  rec->add_flag("--plain", r.plain, "print one row per step even on a terminal");
  rec->add_flag("--print-config", r.print_config, "print the resolved config and exit");
  rec->add_flag("--help-config", r.help_config,
                "print every config key (type, choices, default, meaning) as the Markdown tables of "
                "docs/configuration.md and exit");
  rec->add_option("--interrupt-at", r.interrupt_at,
                  "stop right after this step and its checkpoint, as if killed (resume with `retrace resume`)")
      ->check(step_range());
  rec->add_option("--checkpoint-at", r.checkpoint_at, "also checkpoint after these steps (repeatable)")
      ->check(step_range());
  rec->add_option("--accum-grid", r.accum_grid,
                  "train the same effective batch with each number of micro-batches (e.g. 1,2,4,8,16) and "
                  "print final loss, max loss difference, time per step and peak memory")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  rec->add_option("--world-size", r.world_size,
                  "data parallelism: start N rank processes on loopback (Gloo), or check WORLD_SIZE when a "
                  "launcher set RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT")
      ->check(world_range());
  rec->add_option("--tensorboard", r.tensorboard,
                  "live TensorBoard view: also write every record, as it is appended, to an event file in this "
                  "directory (an existing non-empty one needs --force, which replaces its event files)");
  rec->add_option("--resume-world-size", r.resume_world_size,
                  "with --verify-resume and --world-size: resume on this many ranks instead (resume --reshard), "
                  "e.g. --world-size 4 --resume-world-size 2")
      ->check(world_range());
  rec->add_flag("--verify-resume", r.verify_resume,
                "with --interrupt-at: run uninterrupted (OUT/uninterrupted) and interrupted then resumed "
                "(OUT/resumed), compare, print RESUME VERIFIED");
  rec->footer(
      "Examples:\n  retrace record --steps 20\n"
      "  retrace record --config configs/fashion-mlp.toml --set optim.name=sgd --set optim.lr=0.05 --out run-sgd\n"
      "  retrace record --total-steps 24 --interrupt-at 10 --out run24 && retrace resume run24\n"
      "  retrace record --total-steps 24 --interrupt-at 10 --verify-resume --out check24\n"
      "  retrace record --steps 20 --inject nan-loss@5,inf-grad@9 --set amp.mode=bf16 --set amp.scaler=on\n"
      "  retrace record --world-size 4 --total-steps 20 --checkpoint-at 10 --verify-resume --out dp4\n"
      "  retrace record --accum-grid 1,2,4,8,16 --steps 200 --out grid\n\nConfig keys:\n" +
      train::describe_keys());
}

std::optional<train::Numerics> numerics_record(RecordArgs& args) {
  if (args.print_config || args.help_config) return std::nullopt;
  args.config = std::make_shared<const train::Config>(
      resolve_config(args.config_path, args.sets, args.steps, args.inject));
  return args.config->runtime.numerics;
}

namespace {

// --accum-grid: the run at each accumulation setting, a table of their losses and costs, and under
// runtime.invariance = "batch" the verdict that they have the same bits.
int run_accum_grid(const train::Config& config, const RecordArgs& a, const Context& ctx) {
  auto rows = replay::accum_grid(config, a.accum_grid, a.out, ctx.registry);
  std::printf("accumulation grid: effective batch %lld, %llu steps each (runs in %s/accum-N)\n",
              static_cast<long long>(config.data.batch_size * config.train.accum_steps),
              static_cast<ull>(rows.front().compared), a.out.c_str());
  std::printf("%6s %8s %12s %22s %14s %12s %14s\n", "accum", "micro", "final loss", "max |loss - accum 1|", "ms / step",
              "x accum 1", "peak RSS MiB");
  for (const auto& r : rows)
    std::printf("%6lld %8lld %12.6f %22.3g %14.2f %12.2f %14.1f\n", static_cast<long long>(r.accum_steps),
                static_cast<long long>(r.micro_batch), r.final_loss, r.max_loss_diff, r.median_step_ms,
                r.median_step_ms / rows.front().median_step_ms, r.peak_rss_mib);
  if (config.runtime.invariance == train::Invariance::kBatch) {
    bool all = true;
    for (const auto& r : rows) {
      all = all && r.bitwise;
      if (!r.bitwise)
        std::printf("accum %lld differs from accum %lld: %s\n", static_cast<long long>(r.accum_steps),
                    static_cast<long long>(rows.front().accum_steps), r.first_diff.c_str());
    }
    std::printf("runtime.invariance = \"batch\" (chunks of %lld samples): %s\n",
                static_cast<long long>(config.runtime.invariance_chunk),
                all ? "BITWISE: every setting has the same losses, parameter, optimizer, RNG and state digests "
                      "at every step"
                    : "NOT BITWISE (a bug: report it)");
    return all ? 0 : static_cast<int>(ExitCode::kVerificationFailed);
  }
  if (config.model.dropout > 0)
    std::printf(
        "note: model.dropout = %g draws its masks per micro-batch, so the settings see different masks and "
        "their curves differ by more than rounding; --set model.dropout=0 compares the arithmetic alone, "
        "--set runtime.invariance=batch gives the same bits\n",
        config.model.dropout);
  return 0;
}

// torchrun restarts failed ranks with the same command line: a restarted rank resumes the run it
// started (its newest checkpoint that verifies) instead of refusing the existing directory.
int resume_restarted_rank(const RecordArgs& a, const Context& ctx, distributed::ProcessGroup* pg, bool quiet,
                          const std::shared_ptr<StepPrinter>& printer) {
  if (!quiet)
    std::printf("torchrun restart %u: resuming %s from its newest checkpoint that verifies\n",
                pg->launcher().restart_count, a.out.c_str());
  run::LoopControl control;
  control.sabotage = sabotage_from_env();
  control.interrupt_at = static_cast<uint64_t>(std::max<int64_t>(0, a.interrupt_at));
  control.tensorboard_dir = a.tensorboard;
  run::RunSummary s = run::resume(a.out, control, quiet ? run::RunCallbacks{} : callbacks_for(printer), pg,
                                  ctx.registry);
  printer->clear();
  if (!quiet) print_summary(s);
  return 0;
}

}  // namespace

int run_record(const RecordArgs& a, const Context& ctx) {
  const std::vector<std::string>& argv = ctx.argv;
  if (a.help_config) {
    std::printf("%s", train::config_reference().c_str());
    return 0;
  }
  train::Config config = a.config ? *a.config : resolve_config(a.config_path, a.sets, a.steps, a.inject);
  if (a.print_config) {
    std::printf("%s", train::to_toml(config, train::TomlForm::kComplete).c_str());
    return 0;
  }
  RETRACE_CHECK(a.tensorboard.empty() || (!a.verify_resume && a.accum_grid.empty()), ConfigError,
                "--tensorboard views one run; --verify-resume and --accum-grid make several. Record without it, then "
                "`retrace export RUN --tensorboard DIR` each run you want to see");
  if (!a.accum_grid.empty()) return run_accum_grid(config, a, ctx);
  uint64_t interrupt_at = static_cast<uint64_t>(std::max<int64_t>(0, a.interrupt_at));
  if (a.verify_resume && interrupt_at == 0 && !a.checkpoint_at.empty())
    interrupt_at = static_cast<uint64_t>(a.checkpoint_at.front());
  std::unique_ptr<distributed::ProcessGroup> pg = join_ranks(config, a.world_size);
  if (!pg && a.world_size > 1) {
    if (a.verify_resume) {
      RETRACE_CHECK(interrupt_at > 0, ConfigError, "--verify-resume needs --interrupt-at STEP or --checkpoint-at STEP");
      return verify_resume_launched(a, argv, interrupt_at);
    }
    return distributed::launch_local(static_cast<uint32_t>(a.world_size), argv);  // ranks print plain rows: a pipe
  }
  const bool quiet = pg && pg->rank() != 0;
  auto printer = std::make_shared<StepPrinter>(!a.plain && !pg && isatty(STDOUT_FILENO));
  if (pg && pg->launcher().restart_count > 0 && std::filesystem::exists(run::config_path(a.out)) && !a.force)
    return resume_restarted_rank(a, ctx, pg.get(), quiet, printer);
  if (a.verify_resume) {
    RETRACE_CHECK(interrupt_at > 0, ConfigError, "--verify-resume needs --interrupt-at STEP or --checkpoint-at STEP");
    replay::ResumeCheck r = replay::check_resume(config, a.out, interrupt_at, callbacks_for(printer), a.force,
                                                 ctx.registry);
    printer->clear();
    print_resume_check(r);
    return r.verified ? 0 : static_cast<int>(ExitCode::kVerificationFailed);
  }
  run::RecordOptions opts;
  opts.out_dir = a.out;
  opts.force = a.force;
  opts.scratch = a.scratch;
  opts.control.interrupt_at = static_cast<uint64_t>(std::max<int64_t>(0, a.interrupt_at));
  opts.control.sabotage = sabotage_from_env();
  opts.control.tensorboard_dir = a.tensorboard;
  if (!quiet && !a.tensorboard.empty()) trace::check_tensorboard_dir(a.tensorboard, true, a.force);
  for (int64_t s : a.checkpoint_at) {
    RETRACE_CHECK(s > 0, ConfigError, "--checkpoint-at expects step numbers >= 1, got ", s);
    opts.control.checkpoint_at.insert(static_cast<uint64_t>(s));
  }
  opts.process_group = pg.get();
  opts.registry = &ctx.registry;
  run::RunSummary s = run::record(train::resolve_here(std::move(config)), opts,
                                  quiet ? run::RunCallbacks{} : callbacks_for(printer));
  printer->clear();
  if (!quiet) print_summary(s);
  return 0;
}

}  // namespace retrace::cli
