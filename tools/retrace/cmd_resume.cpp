#include "cli.h"

#include <unistd.h>
#include <filesystem>
#include <memory>

#include "common.h"
#include "trace/tensorboard.h"
#include "distributed/launcher.h"
#include "train/registry.h"

namespace retrace::cli {
void add_resume(CLI::App& app, ResumeArgs& args) {
  auto* res = app.add_subcommand("resume", "continue a run from its newest checkpoint that verifies");
  res->add_option("run", args.run, "run directory")->required();
  res->add_flag("--plain", args.plain, "print one row per step even on a terminal");
  res->add_flag("--accept-changed-inputs", args.accept_changed_inputs,
                "resume although a data or model file is not the one the trace header records (sha256); "
                "the change is recorded in the trace");
  res->add_flag("--accept-other-torch", args.accept_other_torch,
                "resume although this retrace is built against another LibTorch than the trace header records; "
                "a warning event says so, and later steps compare with other runs within a tolerance only");
  res->add_option("--interrupt-at", args.interrupt_at, "stop after this step and its checkpoint")->check(step_range());
  res->add_option("--world-size", args.world_size,
                  "data parallelism: ranks to resume on (as recorded, or any with --reshard)")
      ->check(world_range());
  res->add_flag("--reshard", args.reshard,
                "resume on another world size than the checkpoint's: the global batch stays (data.batch_size becomes "
                "the checkpoint's x its ranks / --world-size, written to the run's config.toml) and a \"resume\" "
                "event records it; bitwise under runtime.invariance = \"batch\", within rounding otherwise");
  res->add_option("--zero-stage", args.zero_stage,
                  "continue at this runtime.zero_stage (0 or 1; written to the run's config.toml, a \"resume\" event "
                  "records it): a checkpoint of either stage loads in the other, the same bits")
      ->check(CLI::Range(0, 1));
  res->add_option("--tensorboard", args.tensorboard,
                  "live TensorBoard view: also write every record, as it is appended, to a new event file in this "
                  "directory (next to the files of the run's earlier processes)");
  res->footer(
      "Example:\n  retrace record --total-steps 24 --interrupt-at 10 --out run24\n  retrace resume run24\n"
      "  retrace record --world-size 4 --set runtime.invariance=batch --total-steps 20 --interrupt-at 10 --out dp4\n"
      "  retrace resume dp4 --world-size 2 --reshard");
}

std::optional<train::Numerics> numerics_resume(ResumeArgs& args) {
  const std::string cfg = run::config_path(args.run);
  if (!std::filesystem::exists(cfg)) return std::nullopt;
  return train::load_config(cfg, {}, train::ConfigSource::kRecorded).runtime.numerics;
}

int run_resume(const ResumeArgs& a, const Context& ctx) {
  const std::vector<std::string>& argv = ctx.argv;
  // The ranks meet with the run's own timeout and device (its recorded config), when it has one;
  // resume itself reports a run directory without a config.
  const std::string cfg = run::config_path(a.run);
  const train::Config config = std::filesystem::exists(cfg)
                                   ? train::load_config(cfg, {}, train::ConfigSource::kRecorded)
                                   : train::Config{};
  std::unique_ptr<distributed::ProcessGroup> pg = join_ranks(config, a.world_size);
  if (!pg && a.world_size > 1) return distributed::launch_local(static_cast<uint32_t>(a.world_size), argv);
  const bool quiet = pg && pg->rank() != 0;
  auto printer = std::make_shared<StepPrinter>(!a.plain && !pg && isatty(STDOUT_FILENO));
  run::LoopControl control;
  control.sabotage = sabotage_from_env();
  control.interrupt_at = static_cast<uint64_t>(std::max<int64_t>(0, a.interrupt_at));
  control.accept_changed_inputs = a.accept_changed_inputs;
  control.accept_other_torch = a.accept_other_torch;
  control.reshard = a.reshard;
  if (a.zero_stage >= 0) control.zero_stage = a.zero_stage;
  control.tensorboard_dir = a.tensorboard;
  if (!quiet && !a.tensorboard.empty()) trace::check_tensorboard_dir(a.tensorboard, false, false);
  run::RunSummary s = run::resume(a.run, control, quiet ? run::RunCallbacks{} : callbacks_for(printer), pg.get(),
                                  ctx.registry);
  printer->clear();
  if (!quiet) print_summary(s);
  return 0;
}

}  // namespace retrace::cli
