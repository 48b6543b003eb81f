#include "run/loop_parts.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/file_util.h"
#include "core/safetensors.h"
#include "model/lanes.h"
#include "run/layout.h"
#include "trace/trace_writer.h"
#include "train/trainer.h"
#include "records/records.h"

namespace retrace::run {
using LoopClock = std::chrono::steady_clock;

CheckpointCadence::CheckpointCadence(const train::CheckpointConfig& config, const LoopControl& control,
                                     train::Collective* ranks)
    : config_(config), control_(control), ranks_(ranks), last_(LoopClock::now()) {}

bool CheckpointCadence::due(uint64_t step, bool last, bool interrupt) {
  bool time_due = config_.every_seconds > 0 &&
                  std::chrono::duration<double>(LoopClock::now() - last_).count() >= config_.every_seconds;
  if (ranks_ && config_.every_seconds > 0) {
    train::CollectiveStats ignored;  // not the step's collectives
    time_due = ranks_->allreduce_sum(ranks_->rank() == 0 && time_due ? 1.0f : 0.0f, ignored) > 0;
  }
  return (interrupt && control_.checkpoint_on_interrupt) || control_.checkpoint_at.count(step) ||
         (config_.every_steps > 0 && step % static_cast<uint64_t>(config_.every_steps) == 0) || time_due ||
         (last && config_.at_end);
}

void CheckpointCadence::saved() { last_ = LoopClock::now(); }

Checkpointer::Checkpointer(std::string run_dir, const train::CheckpointConfig& config, train::Collective* ranks,
                           train::Collective* save_group, std::string sync_reason)
    : run_dir_(std::move(run_dir)),
      keep_last_(static_cast<uint32_t>(config.keep_last)),
      on_error_(config.on_error),
      lend_lane_(config.lend_lane),
      ranks_(ranks && ranks->world_size() > 1 ? ranks : nullptr),
      save_group_(save_group),
      background_(config.async_save && sync_reason.empty() && (!ranks_ || save_group_)) {
  safetensors::set_direct_writes(config.direct_io);  // the run's every shard, whichever way it is saved
}

std::string background_save_unavailable(const train::Config& config) {
  if (!config.checkpoint.async_save) return {};
  if (!config.trace.enabled || !config.trace.digests)
    return "the trace holds no digests to check the staged copy against (trace.enabled and trace.digests)";
  if (config.runtime.zero_stage != 0)
    return "under runtime.zero_stage = 1 the trace's digests are sums over the ranks' slices, not kept tensor by "
           "tensor for the staged copy's check";
  return {};
}

ckpt::TracePosition Checkpointer::position(trace::TraceWriter* writer) const {
  ckpt::TracePosition pos;
  if (writer) {
    writer->sync();  // the checkpoint points into the trace: that prefix must be durable
    pos.bytes = writer->bytes_written();
    pos.chain = writer->last_chain();
  }
  return pos;
}

void Checkpointer::report_rotation(const ckpt::RotationReport& rotation, trace::TraceWriter* writer, uint64_t step,
                                   const RunCallbacks& cb) {
  for (const auto& [path, why] : rotation.left) {
    if (!left_reported_.insert(path).second) continue;  // once per run, not at every save
    const std::string warn = "checkpoint rotation left " + path + " in place: " + why;
    if (writer) writer->append_event({step, "checkpoint", warn});
    if (cb.on_message) cb.on_message("warning: " + warn);
  }
}

Checkpointer::LoopTimer::~LoopTimer() {
  if (--c_.timing_depth_ == 0)
    c_.loop_ms_ += std::chrono::duration<double, std::milli>(LoopClock::now() - start_).count();
}

std::string Checkpointer::save(train::Trainer& trainer, trace::TraceWriter* writer, uint64_t step, bool eval_due,
                               const Anchor& anchor, const RunCallbacks& cb) {
  const LoopTimer timed(*this);
  take_finished(writer, step, cb, /*wait=*/true);
  const ckpt::TracePosition pos = position(writer);
  ckpt::RotationReport rotation;
  // An evaluation due at this step runs after the checkpoint: a kill or an error during it loses
  // no step, and the resume redoes it (the checkpoint says it is due).
  std::map<std::string, std::string> extra;
  if (eval_due) extra[kEvalDueKey] = "1";
  if (const auto fault = trainer.corrupt_staging_due(step); fault && trainer.rank() == 0)
    emit(writer, cb, step, "checkpoint",
         "corrupt-staging@" + std::to_string(step) + " not injected: the save of step " + std::to_string(step) +
             " is synchronous (no staging copy)");
  if (trainer.crash_in_save_due(step) && trainer.rank() == 0)
    emit(writer, cb, step, "checkpoint",
         "crash-in-save@" + std::to_string(step) + " not injected: the save of step " + std::to_string(step) +
             " is synchronous (no background save to kill)");
  const auto start = LoopClock::now();
  std::string dir = ckpt::save_checkpoint(trainer.state(), trainer.state_context(), checkpoint_root(run_dir_), pos,
                                          keep_last_, extra, ranks_, &rotation, anchor ? &*anchor : nullptr);
  last_committed_ = dir;
  if (cb.on_message && trainer.rank() == 0)
    cb.on_message("checkpoint " + dir + " (" + bytes_and_speed(directory_bytes(dir), start) + ")");
  report_rotation(rotation, writer, step, cb);
  return dir;
}

void Checkpointer::save_in_background(train::Trainer& trainer, trace::TraceWriter* writer,
                                      const records::StepRecord& rec, bool eval_due, const Anchor& anchor,
                                      const RunCallbacks& cb) {
  const LoopTimer timed(*this);
  const uint64_t step = trainer.step();
  const auto start = LoopClock::now();
  if (writer_thread_.in_flight()) {
    take_finished(writer, step, cb, /*wait=*/true);
    const double waited = std::chrono::duration<double>(LoopClock::now() - start).count();
    if (waited > 0.01) {
      char text[160];
      std::snprintf(text, sizeof text,
                    "waited %.2f s for the previous background save before step %llu's (the disk is slower than "
                    "the cadence)",
                    waited, static_cast<unsigned long long>(step));
      say(writer, cb, step, text);
    }
  }
  BackgroundSave::Job job;
  job.position = position(writer);
  ckpt::StateSnapshot live = ckpt::snapshot_of(trainer.state(), trainer.state_context(), /*copy=*/false);
  if (eval_due) live.metadata[std::string("x.") + kEvalDueKey] = "1";
  job.snapshot = staging_.stage(live);
  job.anchor = anchor;  // the anchor's tensors are copies the loop never writes into
  job.root = checkpoint_root(run_dir_);
  job.keep_last = keep_last_;
  job.sync = save_group_;
  job.proof.step = rec.step;
  job.proof.kind = digest_kind_of(trainer.config().trace.digest_version);
  job.proof.param = rec.param_digest;
  job.proof.optim = rec.optim_digest;
  job.proof.rng = rec.rng_digest;
  job.proof.parts = trainer.state().digest_parts;
  job.lend_lane = lend_lane_ && model::configured_lanes() > 1;
  lanes_while_saving_ = job.lend_lane ? model::configured_lanes() - 1 : 0;
  if (const auto tensor = trainer.corrupt_staging_due(step)) {
    const std::string id = "corrupt-staging@" + std::to_string(step);
    mark_fired_on_disk(run_dir_, id);
    corrupt_staged(job.snapshot, *tensor);
    say(writer, cb, step, id + ": flipped a bit of " + *tensor + " in the staging copy");
  }
  if (trainer.crash_in_save_due(step)) {
    job.crash_run_dir = run_dir_;
    job.crash_id = "crash-in-save@" + std::to_string(step);
  }
  blocked_seconds_ = std::chrono::duration<double>(LoopClock::now() - start).count();
  writer_thread_.start(std::move(job));
}

void Checkpointer::say(trace::TraceWriter* writer, const RunCallbacks& cb, uint64_t step,
                       const std::string& text) const {
  if (leader()) emit(writer, cb, step, "checkpoint", text);
}

void Checkpointer::take_finished(trace::TraceWriter* writer, uint64_t step, const RunCallbacks& cb, bool wait) {
  if (!writer_thread_.in_flight()) return;
  const LoopTimer timed(*this);
  if (!wait) {
    bool done = writer_thread_.finished();
    if (ranks_) {
      train::CollectiveStats ignored;  // not the step's collectives
      done = ranks_->allreduce_sum(done ? 1.0f : 0.0f, ignored) == static_cast<float>(ranks_->world_size());
    }
    if (!done) return;
  }
  SaveOutcome out = *writer_thread_.wait();
  if (!out.error) {
    last_committed_ = out.dir;
    if (cb.on_message && leader()) {
      char speed[200];
      std::snprintf(speed, sizeof speed, "%.1f MB in %.2f s, %.0f MB/s, in the background; the loop was blocked %.3f s",
                    static_cast<double>(out.bytes) / 1e6, out.seconds,
                    out.seconds > 0 ? static_cast<double>(out.bytes) / 1e6 / out.seconds : 0.0, blocked_seconds_);
      char lent[48];
      std::snprintf(lent, sizeof lent, " for %.2f s of it", out.seconds_lent);
      const std::string lanes = lanes_while_saving_ > 0 ? "; the step ran on " + std::to_string(lanes_while_saving_) +
                                                              " lane" + (lanes_while_saving_ == 1 ? "" : "s") + lent
                                                        : "";
      cb.on_message("checkpoint " + out.dir + " (" + speed + lanes + ")");
    }
    report_rotation(out.rotation, writer, step, cb);
    return;
  }
  // A failure other than the disk's (a staging mismatch, a bug) leaves this rethrow as it is.
  try {
    std::rethrow_exception(out.error);
  } catch (const IoError& e) {
    if (on_error_ == train::CkptOnError::kContinue) {
      say(writer, cb, step,
          "warning: the background save of step " + std::to_string(out.step) + " failed and was not committed: " +
              e.what() + "; training goes on (checkpoint.on_error = \"continue\"), the next due save tries again");
      return;
    }
    // The newest this process committed, else the newest on disk (a resumed run's first save).
    std::string newest = last_committed_;
    if (newest.empty())
      if (const auto m = ckpt::newest_checkpoint_manifest(checkpoint_root(run_dir_)))
        newest = checkpoint_root(run_dir_) + "/" + ckpt::step_dir_name(m->step);
    RETRACE_FAIL(IoError, "the background save of step ", out.step, " failed: ", e.what(), "; the run stops (",
                 "checkpoint.on_error = \"stop\") at step ", step, ". ",
                 newest.empty() ? std::string("No checkpoint is committed yet")
                                : "The newest checkpoint committed is " + newest,
                 "; free space or fix the directory, then `retrace resume` (or set checkpoint.on_error = "
                 "\"continue\" to train on when a save fails)");
  }
}

void emit(trace::TraceWriter* writer, const RunCallbacks& cb, uint64_t step, const std::string& kind,
          const std::string& message) {
  if (writer) writer->append_event({step, kind, message});
  if (cb.on_message) cb.on_message(kind + ": " + message);
}

Rollback::Rollback(const train::Config& config, std::string run_dir, Sabotage sabotage, Anchor anchor)
    : guarded_(config.guards.spike_factor > 0),
      every_steps_(config.checkpoint.every_steps),
      skip_batches_(config.guards.spike_skip_batches),
      run_dir_(std::move(run_dir)),
      sabotage_(sabotage),
      anchor_(std::move(anchor)) {}

bool Rollback::after_step(train::Trainer& trainer, const records::StepRecord& rec, trace::TraceWriter* writer,
                          const RunCallbacks& cb) {
  if (records::skip_reason_of(rec.skip_reason) == records::SkipReason::kLossSpike) {
    RETRACE_CHECK(++in_a_row_ <= kMaxInARow, ConfigError, kMaxInARow,
                  " loss-spike rollbacks in a row without a step applied (last at step ", rec.step, ", loss ", rec.loss,
                  "): the run cannot get past this point. Raise guards.spike_factor or set it to 0, "
                  "or resume from an older checkpoint (the newest one's guard state may be damaged)");
    if (roll_back(trainer, rec, writer, cb)) return true;
  }
  if (rec.outcome == records::Outcome::kStep) in_a_row_ = 0;
  return false;
}

void Rollback::keep_anchor_if_due(train::Trainer& trainer, uint64_t step) {
  if (guarded_ && every_steps_ > 0 && step % static_cast<uint64_t>(every_steps_) == 0) {
    // The old anchor goes first, so that the process never holds two (a background save of the
    // previous step keeps its own reference to the one it writes).
    anchor_.reset();
    anchor_ = ckpt::snapshot_of(trainer.state(), trainer.state_context(), /*copy=*/true);
  }
}

bool Rollback::roll_back(train::Trainer& trainer, const records::StepRecord& spike, trace::TraceWriter* writer,
                         const RunCallbacks& cb) {
  const data::Cursor at{spike.epoch, spike.batch_in_epoch};
  std::ostringstream msg;
  msg << "loss spike at step " << spike.step << " (loss " << spike.loss << ")";
  bool rolled = false;
  if (sabotage_ == Sabotage::kRollbackNewestCheckpoint) {
    if (ckpt::load_newest_checkpoint(trainer.state(), trainer.state_context(), checkpoint_root(run_dir_), nullptr))
      rolled = true;
  } else if (anchor_) {
    ckpt::apply_snapshot(trainer.state(), trainer.state_context(), *anchor_,
                         "the rollback anchor of step " + std::to_string(anchor_->step));
    rolled = true;
  }
  trainer.set_aside_batches(at, skip_batches_);
  if (rolled) msg << "; rolled back to step " << trainer.step();
  else
    msg << "; no rollback anchor yet (none before the first multiple of checkpoint.every_steps), the step was skipped";
  msg << "; batches set aside (epoch:batch):";
  for (const auto& [e, b] : trainer.state().set_aside) msg << " " << e << ":" << b;
  emit(writer, cb, spike.step, "rollback", msg.str());
  return rolled;
}

void mark_fired_on_disk(const std::string& run_dir, const std::string& id) {
  const std::string path = fired_path(run_dir);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  RETRACE_CHECK(fd >= 0, IoError, "cannot open ", path, ": ", fs::errno_text(errno));
  std::string line = id + "\n";
  ssize_t n = ::write(fd, line.data(), line.size());
  ::fsync(fd);
  ::close(fd);
  RETRACE_CHECK(n == static_cast<ssize_t>(line.size()), IoError, "cannot write ", path);
}

void InjectedCrash::load_fired(train::Trainer& trainer) const {
  std::ifstream in(fired_path(run_dir_));
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) trainer.state().fired.insert(line);
}

void InjectedCrash::after_step(const train::Trainer& trainer, uint64_t step, trace::TraceWriter* writer,
                               const RunCallbacks& cb) const {
  const auto crash_rank = trainer.crash_due(step);
  if (!crash_rank || !(crash_rank->empty() || *crash_rank == std::to_string(trainer.rank()))) return;
  mark_fired_on_disk(run_dir_, "crash@" + std::to_string(step));
  emit(writer, cb, step, "crash", "injected crash after step " + std::to_string(step) + ": SIGKILL");
  std::fflush(stdout);
  ::raise(SIGKILL);
}

std::function<void(int64_t)> InjectedCrash::in_evaluation(const train::Trainer& trainer, trace::TraceWriter* writer,
                                                          const RunCallbacks& cb) const {
  if (!trainer.crash_in_eval_due(trainer.step())) return {};
  const std::string id = "crash-in-eval@" + std::to_string(trainer.step());
  return [run_dir = run_dir_, id, writer, &cb, step = trainer.step()](int64_t) {
    mark_fired_on_disk(run_dir, id);
    emit(writer, cb, step, "crash",
         "injected crash in the evaluation after step " + std::to_string(step) + ": SIGKILL");
    std::fflush(stdout);
    ::raise(SIGKILL);
  };
}

void RunSummary::add(const records::StepRecord& r) {
  steps += 1;
  last_step = r.step;
  skipped += r.outcome == records::Outcome::kSkip ? 1 : 0;
  final_loss = r.loss;
  data_ms += r.timings.data_ms;
  forward_ms += r.timings.forward_ms;
  backward_ms += r.timings.backward_ms;
  optimizer_ms += r.timings.optimizer_ms;
  trace_ms += r.timings.trace_ms;
  checkpoint_ms += r.timings.checkpoint_ms;
}

uint64_t directory_bytes(const std::string& dir) {
  uint64_t n = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec)) n += it->file_size(ec);
  return n;
}

std::string mb_text(uint64_t bytes) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

std::string bytes_and_speed(uint64_t bytes, LoopClock::time_point start) {
  const double s = std::chrono::duration<double>(LoopClock::now() - start).count();
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.1f MB in %.2f s, %.0f MB/s", static_cast<double>(bytes) / 1e6, s,
                s > 0 ? static_cast<double>(bytes) / 1e6 / s : 0.0);
  return buf;
}

}  // namespace retrace::run
