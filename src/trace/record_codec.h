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
void serialize_eval(const records::EvalRecord& r, std::string& out);
void serialize_event(const records::EventRecord& r, std::string& out);

// `words` must be 8-byte aligned and hold n_words 64-bit words.
records::TraceHeader parse_header(const uint64_t* words, size_t n_words, const std::string& where);
records::StepRecord parse_step(const uint64_t* words, size_t n_words, const std::string& where);
records::EvalRecord parse_eval(const uint64_t* words, size_t n_words, const std::string& where);
records::EventRecord parse_event(const uint64_t* words, size_t n_words, const std::string& where);

}  // namespace retrace::trace
