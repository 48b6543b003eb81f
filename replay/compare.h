// Step-by-step comparison of two sequences of step records: the core of resume verification,
// replay, diff and golden checks. Expected outcomes are values: a divergence is a report.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "records/records.h"

namespace retrace::replay {

enum class CompareMode {
  kBitwise,    // every field equal (timings excluded), digests included
  kTolerance,  // losses within a ToleranceRule; digests and exact loss bits are not compared
  // Batch invariance: every field that does not depend on the layout (micro-batches, world size)
  // bitwise: loss bits, norms, LR, scale, outcome, parameter, optimizer, RNG and state digests.
  // Left out: this rank's batch size and sample digest, micro-batch sizes and losses, per-rank
  // digests and the hash chain (which covers them).
  kLayout,
};

// How close losses must be when the numerics differ. Steps up to `horizon` (every step when it is
// 0) need |loss a - loss b| <= abs; later steps need it within late_rel x |loss a| (or abs, when
// larger): rounding differences between kernels grow with the steps (measured: below 1e-6 for 20
// steps, up to 4e-3 after 100 on the default MLP), a regression shows from the first steps.
// Whatever the rule, the fields that no kernel changes (data order, batch sizes, learning rate,
// STEP or SKIP and why) are compared exactly.
struct ToleranceRule {
  double abs = 1e-4;
  uint64_t horizon = 0;
  double late_rel = 0;
  double allowed(uint64_t step, double loss_a) const;
};

struct FieldDiff {
  uint64_t step = 0;
  std::string field;
  std::string a;
  std::string b;
};

struct CompareReport {
  uint64_t compared = 0;  // steps present in both
  uint64_t only_in_a = 0, only_in_b = 0;
  double max_loss_diff = 0;  // over the steps present in both
  uint64_t max_loss_diff_step = 0;
  double final_loss_diff = 0;
  std::optional<FieldDiff> first_diff;  // first step (then first field) that differs
  bool equal() const { return !first_diff && only_in_a == 0 && only_in_b == 0; }
};

// Compares the records with equal step numbers in order. When a step appears more than once (a
// rollback), the later record counts. Fields are compared in declaration order of StepRecord.
CompareReport compare_steps(const std::vector<records::StepRecord>& a, const std::vector<records::StepRecord>& b,
                            CompareMode mode, const ToleranceRule& tolerance);
inline CompareReport compare_steps(const std::vector<records::StepRecord>& a, const std::vector<records::StepRecord>& b,
                                   CompareMode mode, double tolerance = 1e-4) {
  return compare_steps(a, b, mode, ToleranceRule{tolerance});
}

// All differing fields of one pair of records (for reports), in declaration order.
std::vector<FieldDiff> diff_record(const records::StepRecord& a, const records::StepRecord& b, CompareMode mode,
                                   const ToleranceRule& tolerance);

// The first difference between two runs' evaluations (in order: step, epoch, samples; under
// kBitwise also the bits of loss and accuracy), or none.
std::optional<std::string> compare_evals(const std::vector<records::EvalRecord>& a,
                                         const std::vector<records::EvalRecord>& b, CompareMode mode);
// The first difference between two runs' training events (records::is_process_event ones left
// out): step, kind and, under kBitwise, message.
std::optional<std::string> compare_events(const std::vector<records::EventRecord>& a,
                                          const std::vector<records::EventRecord>& b, CompareMode mode);

}  // namespace retrace::replay
