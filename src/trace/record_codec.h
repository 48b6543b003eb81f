// Conversion of trace records to and from Cap'n Proto flat-array messages (trace.capnp). Internal
// to src/trace; callers see only plain bytes, so Cap'n Proto stays out of every other header.
//
// serialize_* are deterministic: equal records give equal bytes. parse_* read untrusted bytes with
// hostile-input limits (a traversal limit sized to the message, nesting limit kNestingLimit) and
// throw FormatError naming `where` (e.g. "step frame at offset 1234 of run/trace.rtrace") when the
// message is malformed. Thread-safe: no shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "records/records.h"

namespace retrace::trace {

// The traversal limit of a message of n words is kTraversalFactor x n + kTraversalSlackWords: a
// reader that visits each word once stays far below it, while a list that declares millions of
// empty elements in a few bytes (each counts one word) is refused instead of allocated.
inline constexpr uint64_t kTraversalFactor = 4;
inline constexpr uint64_t kTraversalSlackWords = 1024;
inline constexpr int kNestingLimit = 16;

// Replace the contents of `out` with the serialized message.
void serialize_header(const records::TraceHeader& h, std::string& out);
void serialize_step(const records::StepRecord& r, std::string& out);
// The step dictionary of a format 2 trace (TraceHeader::step_dictionary): a Step message of the
// run's shape (its world size's per-rank digest lists, its micro-batches, a state digest), whose
// pointers, tags and constants the step frames share. zstd uses it as raw content: about 90 of a
// step frame's 310 compressed bytes are structure that it then does not have to repeat.
std::string step_dictionary_for(const records::TraceHeader& h, uint32_t micro_batches);
void serialize_eval(const records::EvalRecord& r, std::string& out);
void serialize_event(const records::EventRecord& r, std::string& out);

// `words` must be 8-byte aligned and hold n_words 64-bit words.
records::TraceHeader parse_header(const uint64_t* words, size_t n_words, const std::string& where);
records::StepRecord parse_step(const uint64_t* words, size_t n_words, const std::string& where);
records::EvalRecord parse_eval(const uint64_t* words, size_t n_words, const std::string& where);
records::EventRecord parse_event(const uint64_t* words, size_t n_words, const std::string& where);

}  // namespace retrace::trace
