#include "replay/resume_check.h"

#include <filesystem>

#include "core/error.h"
#include "core/file_util.h"
#include "trace/trace_reader.h"
#include "train/environment.h"

namespace retrace::replay {
namespace {
run::RecordOptions with_registry(run::RecordOptions o, const train::Registry& registry) {
  o.registry = &registry;
  return o;
}
}  // namespace

ResumeCheck check_resume(const train::Config& config, const std::string& out_dir, uint64_t interrupt_at,
                         const run::RunCallbacks& cb, bool force, const train::Registry& registry) {
  RETRACE_CHECK(interrupt_at > 0, ConfigError, "--interrupt-at must be at least 1");
  fs::make_writable_dir(out_dir);
  ResumeCheck r;
  r.uninterrupted_dir = (std::filesystem::path(out_dir) / "uninterrupted").string();
  r.resumed_dir = (std::filesystem::path(out_dir) / "resumed").string();

  auto say = [&](const std::string& m) {
    if (cb.on_message) cb.on_message(m);
  };
  run::RecordOptions a;
  a.out_dir = r.uninterrupted_dir;
  a.scratch = true;
  a.force = force;
  say("== uninterrupted run -> " + r.uninterrupted_dir);
  const train::ResolvedConfig resolved = train::resolve_here(config);
  run::record(resolved, with_registry(a, registry), cb);

  run::RecordOptions b = a;
  b.out_dir = r.resumed_dir;
  b.control.interrupt_at = interrupt_at;
  say("== run interrupted after step " + std::to_string(interrupt_at) + " -> " + r.resumed_dir);
  run::RunSummary first = run::record(resolved, with_registry(b, registry), cb);
  RETRACE_CHECK(first.interrupted, ConfigError, "--interrupt-at ", interrupt_at, " is not before the last step ",
                first.last_step, ": nothing to resume");
  say("== resume " + r.resumed_dir);
  run::resume(r.resumed_dir, {}, cb, nullptr, registry);

  ResumeCheck v = resume_verdict(run::trace_path(r.uninterrupted_dir), run::trace_path(r.resumed_dir));
  v.uninterrupted_dir = r.uninterrupted_dir;
  v.resumed_dir = r.resumed_dir;
  return v;
}

ResumeCheck resume_verdict(const std::string& uninterrupted_trace, const std::string& resumed_trace) {
  ResumeCheck r;
  const trace::TraceReader a = trace::TraceReader::open(uninterrupted_trace);
  const trace::TraceReader b = trace::TraceReader::open(resumed_trace);
  for (const auto& e : b.events())
    r.resharded = r.resharded || (e.kind == "resume" && e.message.rfind(run::kReshardEventPrefix, 0) == 0);
  // Invariance is the run's (a reshard keeps it): the recorded config says which.
  const auto entries = train::config_entries(b.header().config_toml);
  const auto inv = entries.find("runtime.invariance");
  r.invariant = inv != entries.end() && (inv->second == "'batch'" || inv->second == "\"batch\"");
  r.numerics_diffs = records::numerics_differences(a.header().fingerprint, b.header().fingerprint);
  const bool bitwise = r.numerics_diffs.empty() && (!r.resharded || r.invariant);
  r.bitwise = compare_steps(a.steps(), b.steps(),
                            r.resharded && r.invariant ? CompareMode::kLayout : CompareMode::kBitwise);
  const bool same_steps = r.bitwise.only_in_a == 0 && r.bitwise.only_in_b == 0 && r.bitwise.compared > 0;
  const CompareMode mode = bitwise ? CompareMode::kBitwise : CompareMode::kTolerance;
  r.evals_diff = compare_evals(a.evals(), b.evals(), mode);
  r.events_diff = compare_events(a.events(), b.events(), mode);
  r.verified = same_steps && !r.evals_diff && !r.events_diff &&
               (bitwise ? !r.bitwise.first_diff.has_value() : r.bitwise.max_loss_diff < r.tolerance);
  return r;
}

}  // namespace retrace::replay
