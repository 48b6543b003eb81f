// Building and comparing step records field by field in tests, through the one table of their
// fields (records/step_fields.h): a field added there is filled and compared here without another
// line.
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
         same(a.optimizer_ms, b.optimizer_ms) && same(a.trace_ms, b.trace_ms) && same(a.allreduce_ms, b.allreduce_ms) &&
         same(a.checkpoint_ms, b.checkpoint_ms);
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

// A value of each field type that is not its initial one, distinct for each n >= 1.
inline void fill(uint64_t& v, uint64_t n) { v = 1000 + n; }
inline void fill(uint32_t& v, uint64_t n) { v = static_cast<uint32_t>(100 + n); }
inline void fill(double& v, uint64_t n) { v = 0.5 + static_cast<double>(n) / 3; }
inline void fill(Digest128& v, uint64_t n) { v = {0x9e3779b97f4a7c15ull * n, n}; }
inline void fill(records::Outcome& v, uint64_t n) { v = n % 2 ? records::Outcome::kSkip : records::Outcome::kStep; }
inline void fill(std::string& v, uint64_t n) { v = "reason_" + std::to_string(n); }
inline void fill(records::ModuleDigest& v, uint64_t n) {
  v.module = "blocks." + std::to_string(n);
  fill(v.param, n);
  fill(v.grad, n + 1);
  fill(v.optim, n + 2);
}
inline void fill(records::Timings& v, uint64_t n) {
  const double x = static_cast<double>(n);
  v = {x, x + 1, x + 2, x + 3, x + 4, x + 5};
}
template <typename T>
void fill(std::vector<T>& v, uint64_t n) {
  v.resize(2 + n % 2);
  for (size_t i = 0; i < v.size(); ++i) fill(v[i], n + i);
}
}  // namespace step_records_detail

// A record with every field of the table set (none at its initial value): field `only`, when
// named, to the values of `n`, the others to those of `base`; without `only`, every field to n's.
// A codec or view that forgets a field then loses a value a test can see.
inline records::StepRecord filled_record(uint64_t n, const std::string& only = "", uint64_t base = 1) {
  records::StepRecord r;
  records::for_each_field([&](const records::StepField& f,
                              auto& v) { step_records_detail::fill(v, only.empty() || only == f.name ? n : base); },
                          r);
  return r;
}

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
