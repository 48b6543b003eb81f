// Appends records to a trace file (layout in trace/framing.h). One writer per file; the writer is
// not thread-safe and is move-only.
//
// Durability: each append hands its whole frame to the kernel in one write(2) call, so a crash
// of the process loses nothing already appended and a crash of the machine loses at most the
// frames since the last sync(); a torn last frame is detected by the reader as an incomplete tail.
// flush() exists for symmetry and is a no-op: nothing is buffered in user space.
//
// Step frames are hash-chained: append_step() fills the record's content_digest (see
// records::content_digest() in records.h) and its chain_digest = records::chain_digest(previous step's chain,
// content), starting from Digest128{0, 0} in a new trace and from the given chain on resume.
// Evals and events are not part of the chain.
//
// Errors: IoError when the file cannot be created, written or synced; IntegrityError when resume
// finds a file shorter than the checkpoint's trace position.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/digest.h"
#include "trace/fd_io.h"
#include "records/records.h"

namespace retrace::trace {

// Receives every record right after the writer has appended it, in trace order (the live
// TensorBoard view, trace/tensorboard.h). A sink must not throw: a view that cannot be written
// never stops the run or costs the trace a record.
class RecordSink {
 public:
  virtual ~RecordSink() = default;
  virtual void on_step(const records::StepRecord& r) noexcept = 0;
  virtual void on_eval(const records::EvalRecord& r) noexcept = 0;
  virtual void on_event(const records::EventRecord& r) noexcept = 0;
};

class TraceWriter {
 public:
  // Creates a new trace at `path` (never overwrites: an existing file is an IoError) and writes
  // the file header and the header frame. zstd_level is any level zstd accepts (1..19 typical).
  // `micro_batches` (accumulation steps per optimizer step) shapes the step dictionary only.
  static TraceWriter create(const std::string& path, const records::TraceHeader& header, int zstd_level,
                            uint32_t micro_batches = 1);

  // Reopens a trace to continue a run from a checkpoint. `keep_bytes` is the checkpoint's trace
  // position (bytes_written() when it was taken), `chain` and `last_step` the writer's state then.
  // Complete frames after keep_bytes (written by a run that died after that checkpoint) are
  // appended to `side_file` and synced before the trace is truncated to keep_bytes; a side file
  // that does not exist yet is started with the trace's file header and header frame, so it is a
  // trace that TraceReader opens. An incomplete frame at the very end (a write the crash cut
  // short, never a whole record) is not copied. Damaged frames after keep_bytes throw, and the
  // trace is left untouched.
  static TraceWriter resume(const std::string& path, uint64_t keep_bytes, const Digest128& chain, uint64_t last_step,
                            const std::string& side_file, int zstd_level);

  TraceWriter(TraceWriter&&) noexcept;
  TraceWriter& operator=(TraceWriter&&) noexcept;
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;
  ~TraceWriter();

  // Fills r.content_digest and r.chain_digest, then writes the step frame.
  void append_step(records::StepRecord& r);
  void append_eval(const records::EvalRecord& r);
  void append_event(const records::EventRecord& r);

  // Size of the file = offset at which the next frame begins (a checkpoint stores this).
  uint64_t bytes_written() const { return bytes_written_; }
  // Chain digest of the last step appended (or the resume chain; {0,0} before any step).
  Digest128 last_chain() const { return last_chain_; }
  // Step number of the last step appended (or the resume step; 0 before any step).
  uint64_t last_step() const { return last_step_; }
  const std::string& path() const { return path_; }

  // Hands every record appended from now on to `sink` too (nullptr: none).
  void set_sink(std::unique_ptr<RecordSink> sink);

  void flush();  // every append is already handed to the kernel; kept for callers' clarity
  void sync();   // fsync: appended frames survive a machine crash

 private:
  TraceWriter(std::string path, UniqueFd fd, int zstd_level, uint64_t size);
  void append_frame(uint8_t kind, uint64_t step);

  std::string path_;
  UniqueFd fd_;
  int zstd_level_;
  void* cctx_ = nullptr;         // ZSTD_CCtx, reused across frames
  std::string step_dictionary_;  // format 2: the header's; empty when appending to a format 1 trace
  uint64_t bytes_written_ = 0;
  Digest128 last_chain_;
  uint64_t last_step_ = 0;
  std::string raw_;             // serialized message of the current record, reused
  std::vector<uint8_t> frame_;  // frame header + compressed payload, reused
  std::unique_ptr<RecordSink> sink_;
};

}  // namespace retrace::trace
