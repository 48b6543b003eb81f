// A checkpoint saved in the background (checkpoint.async, issue 52). At the step boundary the
// loop copies its state into a staging buffer that is reused from save to save, and a writer
// thread writes the shard from that copy, checks the copy against the digests the trace holds for
// that step (each tensor's share, so a mismatch names the tensor), and only then commits it with
// the same two-phase commit as a synchronous save. The shard's bytes are those of a synchronous
// save of the same step: one function (ckpt::save_snapshot) writes both, from equal tensors.
// At most one save is in flight; the loop takes its outcome at a later step boundary.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <thread>

#include "ckpt/train_state.h"
#include "core/tensor_digest.h"
#include "model/lanes.h"

namespace retrace::run {

// What a staged copy of step `step` must match: the step record's digests and each tensor's share.
struct StepProof {
  uint64_t step = 0;
  DigestKind kind = DigestKind::kLanes;
  Digest128 param, optim, rng;
  StepDigestParts parts;  // parts.with_optimizer: the record holds the optimizer's digest
};

// One rank's state copied into tensors of its own, allocated at the first save (pinned host memory
// where the state lives on a GPU) and copied into at every later one: no fresh pages per save.
class StagingBuffer {
 public:
  // A snapshot equal to `live` whose tensors are the buffer's, holding live's values.
  ckpt::StateSnapshot stage(const ckpt::StateSnapshot& live);
  uint64_t bytes() const { return bytes_; }

 private:
  NamedTensors model_, optim_;
  uint64_t bytes_ = 0;
};

// Checks a staged snapshot against its step's proof: IntegrityError naming the first tensor whose
// share differs (or the RNG state). `where`: the step directory, for the message.
void check_staged(const ckpt::StateSnapshot& staged, const StepProof& proof, const std::string& where);

// Flips the lowest bit of element 0 of the staged tensor `name` ("model/fc1.weight",
// "optim/fc1.weight/exp_avg"): the corrupt-staging fault. ConfigError naming the tensors when there
// is no such tensor.
void corrupt_staged(ckpt::StateSnapshot& staged, const std::string& name);

// The writer's loan of a lane (checkpoint.lend_lane): a model::LaneLoan held while this thread
// works and given back to the step while it waits on the disk (fs::DiskWait: fsync, a writeback
// that blocks), so the lent core idles neither way. Sets this thread's disk-wait hooks while it
// lives; make it on the thread whose waits it follows.
class WriterLaneLoan {
 public:
  WriterLaneLoan();
  ~WriterLaneLoan();
  WriterLaneLoan(const WriterLaneLoan&) = delete;
  WriterLaneLoan& operator=(const WriterLaneLoan&) = delete;
  // Seconds the lane has been lent so far (the waits left out).
  double seconds_lent() const;

 private:
  void take();
  void give_back();
  std::optional<model::LaneLoan> loan_;
  std::chrono::steady_clock::time_point since_;
  double lent_ = 0;
};

// What a background save came to.
struct SaveOutcome {
  uint64_t step = 0;
  std::string dir;          // the committed step directory (empty on error)
  uint64_t bytes = 0;       // of the step directory's files
  double seconds = 0;       // the writer's wall time
  double seconds_lent = 0;  // of which it held a lane of the step's (checkpoint.lend_lane)
  ckpt::RotationReport rotation;
  std::exception_ptr error;  // what stopped it, or null
  bool disk_error = false;   // the error is the disk's (IoError): checkpoint.on_error applies
};

// The writer thread of one save at a time.
class BackgroundSave {
 public:
  struct Job {
    ckpt::StateSnapshot snapshot;  // staged
    std::optional<ckpt::StateSnapshot> anchor;
    std::string root;
    ckpt::TracePosition position;
    uint32_t keep_last = 1;
    // Several ranks: the group the writer threads vote on (never the loop's), else nullptr.
    train::Collective* sync = nullptr;
    StepProof proof;
    // The writer borrows a lane while it works, not while it waits (WriterLaneLoan).
    bool lend_lane = false;
    // crash-in-save: marked fired in this run directory, then SIGKILL before the commit.
    std::string crash_run_dir, crash_id;
  };
  BackgroundSave() = default;
  BackgroundSave(const BackgroundSave&) = delete;
  BackgroundSave& operator=(const BackgroundSave&) = delete;
  // Waits for a save in flight (its outcome is dropped: the loop is leaving by an error).
  ~BackgroundSave();

  bool in_flight() const { return thread_.joinable(); }
  // Whether the save in flight has finished (its outcome is waiting).
  bool finished() const { return done_.load(std::memory_order_acquire); }
  // Starts the job; InvariantError when one is in flight.
  void start(Job job);
  // The outcome of the save in flight, waiting for it; nullopt when none is in flight.
  std::optional<SaveOutcome> wait();

 private:
  std::thread thread_;
  std::atomic<bool> done_{false};
  SaveOutcome outcome_;
};

}  // namespace retrace::run
