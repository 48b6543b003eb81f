#include "replay/replay.h"

#include <filesystem>
#include <fstream>
#include <map>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/manifest.h"
#include "core/error.h"
#include "core/file_util.h"
#include "replay/diff.h"
#include "run/inputs.h"
#include "trace/framing.h"
#include "trace/trace_reader.h"
#include "train/config.h"
#include "train/environment.h"
#include "train/faults.h"

namespace retrace::replay {
namespace stdfs = std::filesystem;

namespace {

// Warns when the run directory's config.toml is missing or not what the trace header recorded (the
// replay re-executes the header's).
void check_config_beside(const std::string& run_dir, const records::TraceHeader& h, ReplayResult& res) {
  if (stdfs::path(res.recorded_trace).filename() != stdfs::path(run::trace_path(".")).filename()) return;
  const std::string cfg = run::config_path(run_dir);
  std::error_code ec;
  const auto type = stdfs::symlink_status(cfg, ec).type();
  const char* what = "; the replay re-executes the config recorded in the trace header (the run as recorded)";
  if (type == stdfs::file_type::not_found) res.config_warnings.push_back(cfg + " is missing beside the trace" + what);
  else if (type != stdfs::file_type::regular) res.config_warnings.push_back(cfg + " is not a regular file" + what);
  else if (stdfs::file_size(cfg, ec) > (1u << 20) || fs::read_file(cfg, 1u << 20) != h.config_toml)
    res.config_warnings.push_back(cfg +
                                  " differs from the config recorded in the trace header (edited by hand, "
                                  "or rewritten by `resume --reshard` or `--zero-stage`)" +
                                  std::string(what));
}

// The replay from a checkpoint: lays out a run directory that `resume` continues (the config, the
// chosen checkpoint, and the recorded trace cut at the checkpoint's position, so the hash chain
// continues) and resumes it.
std::vector<std::string> replay_from_checkpoint(const std::string& run_dir, const trace::TraceReader& recorded,
                                                const ReplayOptions& options, run::LoopControl control,
                                                const run::RunCallbacks& cb, const ReplayResult& res) {
  const records::TraceHeader& h = recorded.header();
  const std::string src =
      (stdfs::path(run::checkpoint_root(run_dir)) / ckpt::step_dir_name(*options.from_checkpoint)).string();
  RETRACE_CHECK(stdfs::exists(src), IntegrityError, "no checkpoint for step ", *options.from_checkpoint, " in ",
                run::checkpoint_root(run_dir), "; list them with: ls ", run::checkpoint_root(run_dir));
  ckpt::Manifest m = ckpt::verify_checkpoint(src, std::nullopt);
  std::error_code ec;
  run::RunLock lock = run::claim_scratch_dir(res.replay_dir, options.force, "replay");
  fs::make_writable_dir(run::checkpoint_root(res.replay_dir));
  stdfs::copy(src, (stdfs::path(run::checkpoint_root(res.replay_dir)) / ckpt::step_dir_name(m.step)),
              stdfs::copy_options::recursive, ec);
  RETRACE_CHECK(!ec, IoError, "cannot copy ", src, " into ", res.replay_dir, ": ", ec.message());
  fs::write_file_atomic(run::config_path(res.replay_dir), h.config_toml);
  {
    // Checked against the bytes present before anything is allocated: the position comes from a
    // file that may be hostile.
    RETRACE_CHECK(m.trace_position <= recorded.valid_bytes(), IntegrityError, "checkpoint ", src,
                  " records trace position ", m.trace_position, " but ", res.recorded_trace, " has ",
                  recorded.valid_bytes(), " bytes of complete frames; the checkpoint does not belong to this trace");
    std::ifstream in(res.recorded_trace, std::ios::binary);
    std::ofstream out(run::trace_path(res.replay_dir), std::ios::binary);
    std::vector<char> buf(m.trace_position);
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    RETRACE_CHECK(static_cast<uint64_t>(in.gcount()) == m.trace_position, FormatError, res.recorded_trace,
                  " is shorter (", in.gcount(), " bytes) than the checkpoint's trace position ", m.trace_position);
    out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
  }
  for (const auto& id : control.fired) {
    std::ofstream fired(run::fired_path(res.replay_dir), std::ios::app);
    fired << id << "\n";
  }
  control.run_locked = true;  // this replay holds the scratch directory's lock (claimed above)
  return run::resume(res.replay_dir, control, cb, nullptr,
                     options.registry ? *options.registry : train::builtin_registry())
      .input_changes;
}

// The replayed trace against the recorded one over steps [first, stop]: steps, evaluations, events,
// in the mode asked for (or bitwise where the numerics fingerprints agree, else with tolerance).
void compare_replay(const trace::TraceReader& recorded, const ReplayOptions& options, uint64_t stop,
                    ReplayResult& res) {
  trace::TraceReader replayed = trace::TraceReader::open(run::trace_path(res.replay_dir));
  res.fingerprint_diffs = records::numerics_differences(recorded.header().fingerprint, replayed.header().fingerprint);
  if (options.bitwise) res.mode = CompareMode::kBitwise;
  else if (options.tolerance) res.mode = CompareMode::kTolerance;
  else res.mode = res.fingerprint_diffs.empty() ? CompareMode::kBitwise : CompareMode::kTolerance;
  if (options.tolerance) res.tolerance = *options.tolerance;

  uint64_t first = std::max<uint64_t>(options.first, options.from_checkpoint ? *options.from_checkpoint + 1 : 1);
  // The records (steps, evaluations, events) of the compared steps.
  auto in_range = [&](auto records) {
    decltype(records) out;
    for (auto& r : records)
      if (r.step >= first && r.step <= stop) out.push_back(std::move(r));
    return out;
  };
  auto a = in_range(recorded.steps());
  auto b = in_range(replayed.steps());
  res.report = compare_steps(a, b, res.mode, res.tolerance);
  res.evals_diff = compare_evals(in_range(recorded.evals()), in_range(replayed.evals()), res.mode);
  res.events_diff = compare_events(in_range(recorded.events()), in_range(replayed.events()), res.mode);
  if (res.report.first_diff) {
    res.recorded_at_diff = recorded.step(res.report.first_diff->step);
    res.replayed_at_diff = replayed.step(res.report.first_diff->step);
  }
}

}  // namespace

ReplayResult replay_run(const std::string& run_or_trace, const ReplayOptions& options, const run::RunCallbacks& cb) {
  ReplayResult res;
  std::string run_dir;
  if (stdfs::is_directory(run_or_trace)) {
    run_dir = run_or_trace;
    res.recorded_trace = run::trace_path(run_dir);
  } else {
    res.recorded_trace = run_or_trace;
    run_dir = stdfs::path(run_or_trace).parent_path().string();
  }
  RETRACE_CHECK(stdfs::exists(res.recorded_trace), IoError, "no trace at ", res.recorded_trace,
                "; pass a run directory or its trace.rtrace");
  trace::TraceReader recorded = trace::TraceReader::open(res.recorded_trace);
  if (auto w = recorded.tail_warning(); w && cb.on_message) cb.on_message("warning: " + *w);
  const records::TraceHeader& h = recorded.header();
  train::Config config = train::parse_config(h.config_toml, res.recorded_trace + " (header)", {},
                                             train::ConfigSource::kRecorded);
  run::check_same_libtorch(h.fingerprint, res.recorded_trace, "replay", options.accept_other_torch);
  check_config_beside(run_dir, h, res);
  // A replay on other inputs re-executes another run: refused unless asked for (checked as the
  // data set is loaded, which reads and hashes it once).

  res.replay_dir = options.scratch_dir.empty() ? run::replay_dir(run_dir) : options.scratch_dir;
  run::LoopControl control;
  control.accept_changed_inputs = options.accept_changed_inputs;
  control.checkpoint_on_interrupt = false;
  // A crash fault is a process event, not a training event: the replay runs through it.
  for (const auto& f : config.faults.parsed)
    if (train::is_process_fault(f.kind)) control.fired.insert(f.kind + "@" + std::to_string(f.step));
  uint64_t last_recorded = 0;
  for (const auto& e : recorded.index())
    if (e.kind == trace::FrameKind::kStep) last_recorded = std::max(last_recorded, e.step);
  const uint64_t stop = std::min(options.last, last_recorded);
  if (stop < h.total_steps) control.interrupt_at = stop;

  if (!options.from_checkpoint) {
    run::RecordOptions ro;
    ro.out_dir = res.replay_dir;
    ro.scratch = true;
    ro.force = options.force;
    ro.control = control;
    ro.registry = options.registry;
    ro.expected_inputs = &h.data_files;
    ro.inputs_what = "cannot replay " + res.recorded_trace;
    res.input_changes = run::record(train::resolve_here(config), ro, cb).input_changes;
  } else {
    res.input_changes = replay_from_checkpoint(run_dir, recorded, options, control, cb, res);
  }
  compare_replay(recorded, options, stop, res);
  return res;
}

}  // namespace retrace::replay
