// Diff of two traces: what differs in their headers (config, environment, model, data, faults),
// where their steps first diverge (overall and per field), how their losses differ, and which
// skipped steps, events and evaluations disagree. Any two readable traces are diffable: traces of
// different models or lengths give a report that says so; nothing here throws for a difference.
//
// Step comparison is bitwise (compare_steps with CompareMode::kBitwise). Bitwise agreement is
// promised only between equal environments; when the fingerprints differ the report lists the
// differing keys (environment_differs()) and renderers say that bitwise differences are expected.
//
// Determinism: the report is a pure function of the two traces' contents; every list is in a
// fixed order (by key or by step). Not thread-safe only in the sense that the readers are not.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "replay/compare.h"
#include "records/records.h"
#include "trace/trace_reader.h"

namespace retrace::replay {

// One keyed value that differs; an absent side means the key exists only on the other side.
struct ValueDiff {
  std::string key;
  std::optional<std::string> a;
  std::optional<std::string> b;
};

struct HeaderDiff {
  std::vector<ValueDiff> config;       // dotted keys of the resolved config ("optim.lr")
  std::vector<ValueDiff> fingerprint;  // environment keys; "info.*" keys are never listed
  std::vector<ValueDiff> model;        // "description" and one entry per parameter: "shape dtype"
  std::vector<ValueDiff> data_files;   // by path: "sha256 (size bytes)"
  std::vector<ValueDiff> faults;       // by "kind@step": the fault's argument
  std::vector<ValueDiff> other;        // schema, retrace_version, seed, world_size, total_steps
  bool empty() const {
    return config.empty() && fingerprint.empty() && model.empty() && data_files.empty() && faults.empty() &&
           other.empty();
  }
};

// An inclusive range of step numbers.
struct StepSpan {
  uint64_t first = 0;
  uint64_t last = 0;
  uint64_t count = 0;  // distinct step numbers in [first, last] that the span stands for
};

// A step that is SKIP in one trace and STEP in the other (both traces have it).
struct SkipDiff {
  uint64_t step = 0;
  records::Outcome a = records::Outcome::kStep;
  records::Outcome b = records::Outcome::kStep;
  std::string reason_a;  // "" for STEP
  std::string reason_b;
};

// Events of one kind at one step whose messages differ (absent on one side = empty list).
struct EventDiff {
  uint64_t step = 0;
  std::string kind;  // "rollback", "resume", "warning", "fault", ...
  std::vector<std::string> a;
  std::vector<std::string> b;
};

// One evaluation step of either trace (every eval step is listed, differing or not).
struct EvalRow {
  uint64_t step = 0;
  std::optional<records::EvalRecord> a;
  std::optional<records::EvalRecord> b;
  bool differs() const;  // one side missing, or loss or accuracy not bitwise equal
};

// Where within its first divergent step two runs part. `phase`: the earliest part of a step whose
// fields differ: "data" (the batch: epoch, position, size, sample digest), "forward" (the loss),
// "backward" (the gradients and their norm), "optimizer" (LR, clipping, STEP/SKIP, parameters,
// optimizer state) or "state" (RNG and the rest of the state). With the per-module digests both
// traces recorded (recorder runs), `module` is the first module in the model's order whose
// digests differ, `parts` which of its digests ("param", "grad", "optim"), `modules_differing`
// how many modules differ in all; without them `module` is empty.
struct StepDivergence {
  uint64_t step = 0;
  std::string phase;
  std::string module;
  std::vector<std::string> parts;
  size_t modules_differing = 0;
  size_t modules = 0;
};

struct DiffReport {
  std::string path_a, path_b;
  std::optional<std::string> tail_warning_a, tail_warning_b;  // truncated traces
  HeaderDiff header;
  // Bitwise comparison of the steps both traces have (a later record of a step number wins, as
  // after a rollback): compared count, only-in counts, max and final loss difference, and the
  // first divergent step with its first differing field.
  CompareReport steps;
  std::optional<StepSpan> span_a, span_b;      // absent for a trace without steps
  std::optional<StepSpan> common;              // min..max of the steps present in both
  std::vector<StepSpan> only_in_a, only_in_b;  // maximal runs of consecutive step numbers
  // For every StepRecord field that differs anywhere: its first differing step and values.
  std::map<std::string, FieldDiff> first_by_field;
  std::optional<StepDivergence> where;  // present when the common steps differ
  std::vector<SkipDiff> skips;
  std::vector<EventDiff> events;
  std::vector<EvalRow> evals;

  bool models_differ() const { return !header.model.empty(); }
  bool environment_differs() const { return !header.fingerprint.empty(); }
  std::optional<uint64_t> first_divergent_step() const {
    return steps.first_diff ? std::optional<uint64_t>(steps.first_diff->step) : std::nullopt;
  }
  // Nothing differs: headers, steps (bitwise, same step numbers), training events (process events,
  // records::is_process_event, are listed but do not count) and evals.
  bool identical() const;
};

// Reads every step, eval and event of both traces. Errors: those of TraceReader when a frame
// cannot be read.
DiffReport diff_traces(const trace::TraceReader& a, const trace::TraceReader& b);

// The header part alone (exposed for tests and for `inspect`-like uses).
HeaderDiff diff_headers(const records::TraceHeader& a, const records::TraceHeader& b);
// The fingerprint part of diff_headers: the numerics fields (records::is_numerics_key) whose values
// differ or exist on one side, by key; information fields are never listed.
std::vector<ValueDiff> diff_fingerprints(const std::vector<records::KeyValue>& a,
                                         const std::vector<records::KeyValue>& b);

// Visits every header difference with its part ("config", "environment", "model", "data", "fault",
// "header"), in that order: the one order both renderings use.
void for_each_header_diff(const HeaderDiff& h, const std::function<void(const char* part, const ValueDiff&)>& fn);

// Where the records of one step part (phase, and module where both carry module digests); none
// when they are equal (bitwise).
std::optional<StepDivergence> locate_divergence(const records::StepRecord& a, const records::StepRecord& b);
// "step 7, phase optimizer, module fc2 (param, optim; 3 of 3 modules differ)".
std::string divergence_text(const StepDivergence& d);

// The entries of first_by_field ordered by step, then by declaration order in StepRecord.
std::vector<const FieldDiff*> fields_by_step(const DiffReport& r);

// For people: a compact report with aligned columns; long lists are cut with "... N more".
std::string render_text(const DiffReport& r);

// For programs: every list in full. Doubles that are not finite become null.
nlohmann::json to_json(const DiffReport& r);

// "STEP" or "SKIP".
const char* outcome_name(records::Outcome o);

}  // namespace retrace::replay
