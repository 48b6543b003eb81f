// The training loop's concerns other than the step, each a part of its own (issue 53): when a
// checkpoint is due (steps, clock, the ranks' vote), writing the loop's checkpoints (trace
// position, the evaluation-due key, rotation warnings once per run), the loss-spike rollback and
// its anchor, the injected crashes, and the sizes and speeds the loop reports. run.cpp's loop calls
// them; none of them trains.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "ckpt/train_state.h"
#include "run/async_save.h"
#include "train/collective.h"
#include "run/run.h"

namespace retrace::trace {
class TraceWriter;
}
namespace retrace::records {
struct StepRecord;
}
namespace retrace::train {
class Trainer;
}

namespace retrace::run {

// The checkpoint metadata key that says an evaluation was due at its step (run after it).
inline constexpr const char* kEvalDueKey = "eval_due";

// The rollback anchor: the state after the newest step that is a multiple of
// checkpoint.every_steps (while the spike guard is on), kept in memory and stored in every
// checkpoint taken after it. A rollback always returns to it, so the trajectory after a spike
// depends on the config and the step alone, not on which checkpoint files exist.
using Anchor = std::optional<ckpt::StateSnapshot>;

// When the loop saves: after the interrupt step (when the control asks for a checkpoint there), at
// the control's extra steps, every checkpoint.every_steps steps, every checkpoint.every_seconds
// seconds and after the last step (checkpoint.at_end). With ranks, rank 0's clock decides for all
// (clocks differ; the ranks would part ways in the save).
class CheckpointCadence {
 public:
  CheckpointCadence(const train::CheckpointConfig& config, const LoopControl& control, train::Collective* ranks);
  // Called once after every step by every rank: holds a collective when the clock counts.
  bool due(uint64_t step, bool last, bool interrupt);
  // A checkpoint was written: the clock starts again.
  void saved();

 private:
  train::CheckpointConfig config_;
  const LoopControl& control_;
  train::Collective* ranks_;
  std::chrono::steady_clock::time_point last_;
};

// Writes the loop's checkpoints into RUN/checkpoints: the trace made durable first (a checkpoint
// points into it), the evaluation-due key when one follows the step, the rollback anchor, and the
// paths rotation left in place reported once per run (an event and a message).
class Checkpointer {
 public:
  // `sync_reason`: why saves stay synchronous although checkpoint.async asks for the background
  // (no trace digests, ZeRO); empty where they go to the background. `save_group`: with several
  // ranks, a second group of them (ProcessGroup::side_group) on which the writer threads agree on
  // the commit, apart from the loop's collectives; without it several ranks save synchronously.
  Checkpointer(std::string run_dir, const train::CheckpointConfig& config, train::Collective* ranks,
               train::Collective* save_group, std::string sync_reason);
  // Whether due saves go to the background (save_in_background), the last and the interrupt's aside.
  bool background() const { return background_; }
  // A synchronous save, after the one in flight (taken first). Returns the step directory written.
  std::string save(train::Trainer& trainer, trace::TraceWriter* writer, uint64_t step, bool eval_due,
                   const Anchor& anchor, const RunCallbacks& cb);
  // Waits for the save in flight (taken first), stages the state and hands it to the writer thread,
  // which checks the copy against `rec`'s digests before it commits (async_save.h).
  void save_in_background(train::Trainer& trainer, trace::TraceWriter* writer, const records::StepRecord& rec,
                          bool eval_due, const Anchor& anchor, const RunCallbacks& cb);
  // At a step boundary (`step`, the last traced): a finished background save is reported, or its
  // failure raised (checkpoint.on_error = "stop", or not the disk's) or reported (continue). `wait`:
  // waits for one in flight. With several ranks every rank takes the outcome at the same step (one
  // scalar all-reduce per step while a save is in flight: is every rank's writer done?), and the
  // commit vote gave every rank the same outcome, so all stop or all go on together.
  void take_finished(trace::TraceWriter* writer, uint64_t step, const RunCallbacks& cb, bool wait);
  // The loop's milliseconds in the three calls above since the last take (a call inside another
  // counted once): a step record's timings.checkpoint_ms.
  double take_loop_ms() { return std::exchange(loop_ms_, 0.0); }

 private:
  // Adds the time of the outermost timed call to loop_ms_.
  class LoopTimer {
   public:
    explicit LoopTimer(Checkpointer& c) : c_(c) { ++c_.timing_depth_; }
    ~LoopTimer();
    LoopTimer(const LoopTimer&) = delete;
    LoopTimer& operator=(const LoopTimer&) = delete;

   private:
    Checkpointer& c_;
    std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  };

  ckpt::TracePosition position(trace::TraceWriter* writer) const;
  void report_rotation(const ckpt::RotationReport& rotation, trace::TraceWriter* writer, uint64_t step,
                       const RunCallbacks& cb);

  std::string run_dir_;
  uint32_t keep_last_;
  train::CkptOnError on_error_;
  bool lend_lane_;
  bool leader() const { return !ranks_ || ranks_->rank() == 0; }
  // A checkpoint event and line, from rank 0 only (every rank sees the same saves).
  void say(trace::TraceWriter* writer, const RunCallbacks& cb, uint64_t step, const std::string& text) const;

  train::Collective* ranks_;
  train::Collective* save_group_;
  bool background_;
  std::set<std::string> left_reported_;
  StagingBuffer staging_;
  BackgroundSave writer_thread_;
  double blocked_seconds_ = 0;  // of the save in flight: its wait and its copy
  int lanes_while_saving_ = 0;  // the step's lanes while the save in flight is written
  std::string last_committed_;  // the newest step directory committed in this process
  int timing_depth_ = 0;
  double loop_ms_ = 0;
};

// Why checkpoint.async cannot apply to this run (empty: it can, or it is off): no trace digests to
// prove the staged copy with, or ZeRO's (sums over slices, no tensor's share kept).
std::string background_save_unavailable(const train::Config& config);

// An event into the trace (when this rank writes one) and to the callbacks as "kind: message".
void emit(trace::TraceWriter* writer, const RunCallbacks& cb, uint64_t step, const std::string& kind,
          const std::string& message);

// Loss-spike rollback (guards.spike_factor): keeps the anchor, and after a spike puts the state back
// to it and sets the batches that led to the spike aside (guards.spike_skip_batches), so that the
// deterministic re-run does not meet the same spike again. Without an anchor yet (no multiple of
// checkpoint.every_steps passed) the spiking step stays skipped and the run goes on.
class Rollback {
 public:
  Rollback(const train::Config& config, std::string run_dir, Sabotage sabotage, Anchor anchor);
  // After each step: true when it was a spike and the state went back to the anchor (under the test
  // sabotage kRollbackNewestCheckpoint, to the newest checkpoint; the loop goes on from there).
  // ConfigError after kMaxInARow rollbacks without a step applied between them.
  bool after_step(train::Trainer& trainer, const records::StepRecord& rec, trace::TraceWriter* writer,
                  const RunCallbacks& cb);
  // Once `step` is settled: a copy of the state becomes the anchor when `step` is a multiple of
  // checkpoint.every_steps (while the spike guard is on).
  void keep_anchor_if_due(train::Trainer& trainer, uint64_t step);
  const Anchor& anchor() const { return anchor_; }

  // Each rollback sets one more batch aside; a run that meets a spike on every re-run would walk
  // the whole data set back and forth: it stops after this many in a row, and says why.
  static constexpr uint64_t kMaxInARow = 16;

 private:
  bool roll_back(train::Trainer& trainer, const records::StepRecord& spike, trace::TraceWriter* writer,
                 const RunCallbacks& cb);

  bool guarded_;
  int64_t every_steps_, skip_batches_;
  std::string run_dir_;
  Sabotage sabotage_;
  Anchor anchor_;
  uint64_t in_a_row_ = 0;
};

// The injected crashes (faults crash@S[:RANK] and crash-in-eval@S): the fault is marked fired in
// the run directory first (a resume must not crash again at the same step), then an event, then
// SIGKILL.
class InjectedCrash {
 public:
  explicit InjectedCrash(std::string run_dir) : run_dir_(std::move(run_dir)) {}
  // The crash faults that fired before (a resume): marked fired in the trainer's state.
  void load_fired(train::Trainer& trainer) const;
  // After step `step`: kills this process when a crash fault is due there for this rank.
  void after_step(const train::Trainer& trainer, uint64_t step, trace::TraceWriter* writer,
                  const RunCallbacks& cb) const;
  // The evaluation after the trainer's step: a per-batch hook that kills this process when
  // crash-in-eval is due there; empty otherwise.
  std::function<void(int64_t)> in_evaluation(const train::Trainer& trainer, trace::TraceWriter* writer,
                                             const RunCallbacks& cb) const;

 private:
  std::string run_dir_;
};

// Marks a once-only process fault ("crash@17") as fired in the run directory, durably, before the
// process kills itself: a resume does not fire it again.
void mark_fired_on_disk(const std::string& run_dir, const std::string& id);

// The bytes of the files in `dir` (not recursive).
uint64_t directory_bytes(const std::string& dir);
// "1503.2 MB" (MB = 10^6 bytes).
std::string mb_text(uint64_t bytes);
// "1503.2 MB in 2.10 s, 716 MB/s" (MB = 10^6 bytes), for messages.
std::string bytes_and_speed(uint64_t bytes, std::chrono::steady_clock::time_point start);

}  // namespace retrace::run
