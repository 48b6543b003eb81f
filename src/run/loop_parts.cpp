#include "run/loop_parts.h"

#include <cstdio>
#include <filesystem>
#include <map>

#include "run/layout.h"
#include "trace/trace_writer.h"
#include "train/trainer.h"

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

Checkpointer::Checkpointer(std::string run_dir, uint32_t keep_last, train::Collective* ranks)
    : run_dir_(std::move(run_dir)), keep_last_(keep_last), ranks_(ranks) {}

std::string Checkpointer::save(train::Trainer& trainer, trace::TraceWriter* writer, uint64_t step, bool eval_due,
                               const Anchor& anchor, const RunCallbacks& cb) {
  ckpt::TracePosition pos;
  if (writer) {
    writer->sync();  // the checkpoint points into the trace: that prefix must be durable
    pos.bytes = writer->bytes_written();
    pos.chain = writer->last_chain();
  }
  ckpt::RotationReport rotation;
  // An evaluation due at this step runs after the checkpoint: a kill or an error during it loses
  // no step, and the resume redoes it (the checkpoint says it is due).
  std::map<std::string, std::string> extra;
  if (eval_due) extra[kEvalDueKey] = "1";
  const auto start = LoopClock::now();
  std::string dir = ckpt::save_checkpoint(trainer.state(), trainer.state_context(), checkpoint_root(run_dir_), pos,
                                          keep_last_, extra, ranks_, &rotation, anchor ? &*anchor : nullptr);
  if (cb.on_message && trainer.rank() == 0)
    cb.on_message("checkpoint " + dir + " (" + bytes_and_speed(directory_bytes(dir), start) + ")");
  for (const auto& [path, why] : rotation.left) {
    if (!left_reported_.insert(path).second) continue;  // once per run, not at every save
    const std::string warn = "checkpoint rotation left " + path + " in place: " + why;
    if (writer) writer->append_event({step, "checkpoint", warn});
    if (cb.on_message) cb.on_message("warning: " + warn);
  }
  return dir;
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
