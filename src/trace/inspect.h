// Human- and machine-readable views of a trace, for `retrace inspect`.
//
//   kTable: a header summary, then one row per step (step, epoch, batch, loss, grad_pre,
//           grad_post, lr, scale, outcome, param digest prefix, chain prefix, step ms), then the
//           evals and events.
//   kJson:  one object {"header": {...}, "steps": [...], "evals": [...], "events": [...]} holding
//           every field; digests as 32 hex digits, timings in milliseconds.
//   kCsv:   a header row and one row per step with every scalar field (digests as hex).
//   kJsonl: one JSON object per line, for other tools (`retrace export --jsonl`): first
//           {"type": "header", ...}, then in step order {"type": "step", ...} with every field as
//           in kJson, each followed by the {"type": "eval"} and {"type": "event"} rows of its step
//           (events before the first step come first).
//
// Only steps with first <= step <= last are printed; evals and events are printed whole. Output is
// deterministic for a given trace. Throws what TraceReader throws for a damaged frame.
#pragma once

#include <cstdint>
#include <ostream>

#include "trace/trace_reader.h"

namespace retrace::trace {

enum class InspectFormat { kTable, kJson, kCsv, kJsonl };

void print_inspect(const TraceReader& reader, InspectFormat format, uint64_t first, uint64_t last, std::ostream& out);

}  // namespace retrace::trace
