// Step-by-step comparison of two sequences of step records: the core of resume verification,
// replay, diff and golden checks. Expected outcomes are values: a divergence is a report.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trace/records.h"

namespace retrace::replay {

enum class CompareMode {
  kBitwise,    // every field equal (timings excluded), digests included
  kTolerance,  // |loss a - loss b| <= tolerance; digests and exact bits are not compared
};

struct FieldDiff {
  uint64_t step = 0;
  std::string field;
  std::string a;
  std::string b;
};

struct CompareReport {
  uint64_t compared = 0;          // steps present in both
  uint64_t only_in_a = 0, only_in_b = 0;
  double max_loss_diff = 0;       // over the steps present in both
  uint64_t max_loss_diff_step = 0;
  double final_loss_diff = 0;
  std::optional<FieldDiff> first_diff;  // first step (then first field) that differs
  bool equal() const { return !first_diff && only_in_a == 0 && only_in_b == 0; }
};

// Compares the records with equal step numbers in order. When a step appears more than once (a
// rollback), the later record counts. Fields are compared in declaration order of StepRecord.
CompareReport compare_steps(const std::vector<trace::StepRecord>& a,
                            const std::vector<trace::StepRecord>& b, CompareMode mode,
                            double tolerance = 1e-4);

// All differing fields of one pair of records (for reports), in declaration order.
std::vector<FieldDiff> diff_record(const trace::StepRecord& a, const trace::StepRecord& b,
                                   CompareMode mode, double tolerance);

}  // namespace retrace::replay
