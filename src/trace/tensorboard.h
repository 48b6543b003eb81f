// A run's records as TensorBoard event files: `retrace export RUN --tensorboard DIR` after the fact,
// `record/resume --tensorboard DIR` live (a RecordSink on the trace writer). Both map records to
// the same tags (tensorboard_tags(), listed in docs/traces.md):
//
//   step   train/loss, train/learning_rate, train/grad_norm_pre_clip, train/grad_norm_post_clip,
//          train/loss_scale, train/skipped (1 for SKIP, 0 for STEP), train/skip_reason (text, SKIP
//          only), time/step_ms (data + forward + backward + optimizer + trace + checkpoint),
//          time/data_ms, time/forward_ms, time/backward_ms, time/optimizer_ms, time/trace_ms,
//          time/allreduce_ms, time/checkpoint_ms
//   eval   eval/loss, eval/accuracy
//   event  markers/KIND (1 at the event's step: rollback, resume, fault, warning, ...) and
//          events/KIND (text: the message)
//   header run/config (text, at step 0): the resolved config; run/fingerprint (text)
//
// Every scalar is a 0-d DT_DOUBLE tensor with the "scalars" plugin, so TensorBoard reads back the
// recorded double exactly (a simple_value would round it to float32). Records are written in
// trace order, so a rolled-back step appears twice, as in the trace.
//
// File format: TensorBoard's record framing (u64 length, u32 masked CRC32C of the length, the
// serialized Event, u32 masked CRC32C of it; little-endian), first event file_version
// "brain.Event:2". The CRC32C is Boost.CRC's.
//
// Wall times: live, the time each record was written; exported, the header's created_utc plus the
// recorded step times summed, so an export is a pure function of the trace (same bytes each time).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "records/records.h"
#include "trace/trace_reader.h"
#include "trace/trace_writer.h"

namespace retrace::trace {

// Every tag retrace writes, fixed ones first; KIND stands for an event kind.
std::vector<std::string> tensorboard_tags();

struct TensorBoardExport {
  std::string file;  // the event file written
  uint64_t events = 0;
  uint64_t scalars = 0;
};

// Writes every record of `reader` into DIR/events.out.tfevents.<created>.retrace, atomically.
// DIR is readied by prepare_tensorboard_dir(dir, true, force).
TensorBoardExport export_tensorboard(const TraceReader& reader, const std::string& dir, bool force);

// The live view: a sink that appends each record as it is written to a new event file in DIR
// (readied by the caller) named events.out.tfevents.<now>.<host>.<pid>.retrace, beginning with the
// header's config and fingerprint. A write that fails prints one warning to stderr and ends the
// view; the run and its trace go on.
std::unique_ptr<RecordSink> tensorboard_sink(const std::string& dir, const records::TraceHeader& header);

// Readies DIR for event files: created when missing; ConfigError (exit 2) when it is not a
// directory, or when `fresh` (an export, a new record) and it holds anything, unless `force`, which
// removes the event files (events.out.tfevents.*) in it and leaves everything else. A resume
// (fresh false) adds its own file next to the ones before it.
void prepare_tensorboard_dir(const std::string& dir, bool fresh, bool force);
// The checks of prepare_tensorboard_dir alone, changing nothing: for a command to fail early.
void check_tensorboard_dir(const std::string& dir, bool fresh, bool force);

}  // namespace retrace::trace
