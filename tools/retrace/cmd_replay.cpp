#include "cli.h"

#include <unistd.h>
#include <cstdio>
#include <memory>

#include "common.h"
#include "core/error.h"
#include "replay/replay.h"
#include "train/registry.h"

namespace retrace::cli {
namespace {

void print_diff_context(const char* label, const std::optional<records::StepRecord>& r) {
  if (!r) return;
  std::printf("  %-9s step %llu epoch %llu batch %llu: loss %.9g  grad %.6g -> %.6g  lr %.6g  scale %g  %s%s%s\n",
              label, static_cast<ull>(r->step), static_cast<ull>(r->epoch), static_cast<ull>(r->batch_in_epoch),
              r->loss, r->grad_norm_pre, r->grad_norm_post, r->lr, r->loss_scale,
              r->outcome == records::Outcome::kStep ? "STEP" : "SKIP", r->skip_reason.empty() ? "" : " ",
              r->skip_reason.c_str());
}

}  // namespace

void add_replay(CLI::App& app, ReplayArgs& args) {
  auto& rp = args;
  auto* rep = app.add_subcommand("replay", "re-execute a recorded run and compare every step with the trace");
  rep->add_option("run", rp.run, "run directory or its trace.rtrace")->required();
  rep->add_option("--from-checkpoint", rp.from_checkpoint, "start from the run's checkpoint of this step")
      ->check(step_range());
  rep->add_option("--steps", rp.steps, "compare (and run up to the end of) step range A:B");
  rep->add_option("--tolerance", rp.tolerance, "compare losses within this tolerance instead of bitwise")
      ->check(finite_at_least(0));
  rep->add_flag("--bitwise", rp.bitwise, "compare bitwise even when the environments differ");
  rep->add_option("--out", rp.out,
                  "scratch run directory for the replay (default RUN/replay); replaced only if "
                  "retrace made it, or with --force");
  rep->add_flag("--force", rp.force, "replace --out even if retrace did not make it");
  rep->add_flag("--plain", rp.plain, "print one row per step even on a terminal");
  rep->add_flag("--accept-changed-inputs", rp.accept_changed_inputs,
                "replay although a data or model file is not the one the trace header records (sha256)");
  rep->add_flag("--accept-other-torch", rp.accept_other_torch,
                "replay although this retrace is built against another LibTorch than the trace header records "
                "(the comparison is then within a tolerance)");
  rep->add_flag("--quiet", rp.quiet, "print only the verdict");
  rep->footer(
      "Exit 0 with REPLAY VERIFIED, 1 with the first step and field that differ.\nExamples:\n"
      "  retrace replay run\n  retrace replay run --from-checkpoint 200 --steps 201:300\n");
}

std::optional<train::Numerics> numerics_replay(ReplayArgs& args) {
  auto c = recorded_config(args.run);
  return c ? std::optional(c->runtime.numerics) : std::nullopt;
}

int run_replay(const ReplayArgs& a, const Context& ctx) {
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
  o.registry = &ctx.registry;
  o.accept_changed_inputs = a.accept_changed_inputs;
  o.accept_other_torch = a.accept_other_torch;
  auto printer = std::make_shared<StepPrinter>(!a.plain && isatty(STDOUT_FILENO));
  run::RunCallbacks cb = callbacks_for(printer);
  if (a.quiet) cb = {};
  replay::ReplayResult r = replay::replay_run(a.run, o, cb);
  printer->clear();
  std::printf("\nreplay of %s in %s\n", r.recorded_trace.c_str(), r.replay_dir.c_str());
  for (const auto& w : r.config_warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  for (const auto& path : r.input_changes)
    std::printf("note: %s is not the file the run was recorded with (--accept-changed-inputs)\n", path.c_str());
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
  std::printf("evaluations: %s\n", r.evals_diff ? ("differ: " + *r.evals_diff).c_str() : "equal");
  std::printf("training events: %s\n", r.events_diff ? ("differ: " + *r.events_diff).c_str() : "equal");
  if (r.verified()) {
    if (r.mode == replay::CompareMode::kBitwise) {
      std::printf("REPLAY VERIFIED\n");
    } else if (!r.fingerprint_diffs.empty()) {
      std::string diffs;
      for (const auto& d : r.fingerprint_diffs) diffs += (diffs.empty() ? "" : ", ") + d;
      std::printf("REPLAY VERIFIED within %g, not bitwise: numerics fields differ: %s\n", r.tolerance, diffs.c_str());
    } else {
      // Equal numerics verify only with equal bits: a tolerance asked for is reported as such.
      std::printf("REPLAY WITHIN %g (--tolerance; not verified: equal numerics verify only with equal bits)\n",
                  r.tolerance);
    }
    return 0;
  }
  if (!r.report.first_diff && r.report.only_in_a == 0 && (r.evals_diff || r.events_diff)) {
    std::printf("REPLAY DIVERGED outside the steps: %s\n", (r.evals_diff ? *r.evals_diff : *r.events_diff).c_str());
    return static_cast<int>(ExitCode::kVerificationFailed);
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

}  // namespace retrace::cli
