// Comparing step records field by field in tests, through the one table of their fields
// (records/step_fields.h): a field added there is compared here without another line.
#pragma once

#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "records/step_fields.h"

namespace retrace::testing {

namespace step_records_detail {
inline bool same(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }  // NaN == NaN, +0 != -0
inline bool same(const records::Timings& a, const records::Timings& b) {
  return same(a.data_ms, b.data_ms) && same(a.forward_ms, b.forward_ms) && same(a.backward_ms, b.backward_ms) &&
         same(a.optimizer_ms, b.optimizer_ms) && same(a.trace_ms, b.trace_ms) && same(a.allreduce_ms, b.allreduce_ms);
}
template <typename T>
bool same(const T& a, const T& b) {
  return a == b;
}
template <typename T>
bool same(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!same(a[i], b[i])) return false;
  return true;
}
}  // namespace step_records_detail

// Which fields of the step records differ, bit for bit (doubles by their bits), in the trace's
// order. The informational ones (timings, the collectives' counts) only when `informational`:
// two runs of one config differ there.
inline std::vector<std::string> differing_fields(const records::StepRecord& a, const records::StepRecord& b,
                                                 bool informational = true) {
  std::vector<std::string> out;
  records::for_each_field(
      [&](const records::StepField& f, const auto& va, const auto& vb) {
        const bool info = f.digest == records::InDigest::kNever && f.compared == 0 &&
                          std::string(f.name) != "content_digest";
        if (info && !informational) return;
        if (!step_records_detail::same(va, vb)) out.push_back(f.name);
      },
      a, b);
  return out;
}

// "" when equal, else "field, field differ at step N".
inline std::string first_differences(const records::StepRecord& a, const records::StepRecord& b,
                                     bool informational = true) {
  std::string s;
  for (const std::string& f : differing_fields(a, b, informational)) s += (s.empty() ? "" : ", ") + f;
  return s.empty() ? s : s + " differ at step " + std::to_string(a.step);
}

}  // namespace retrace::testing
