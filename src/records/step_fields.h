// The fields of a StepRecord, listed once. for_each_field visits them in the trace's order
// (trace.capnp's ordinals, which is also the content digest's order), each with what retrace
// does with it: whether and how it enters the content digest, which comparisons check it, and
// the phase of a step that decides it. The content digest, `inspect` (JSON and CSV), `compare`,
// `diff` and the tests' record helpers walk this table; a new field of the step record is one
// line here, one in trace.capnp and its two lines in the codec (src/trace/record_codec.cpp).
//
// Consumers overload on the value type: uint64_t, uint32_t, double, Digest128, Outcome,
// std::string, std::vector of uint32_t, double, Digest128 and ModuleDigest, and Timings. A field
// of a new type fails to compile until every consumer knows it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "records/records.h"

namespace retrace::records {

// How a field enters the content digest (records.cpp). kWhenSet: only when it is not zero or
// empty, behind its tag byte, so that traces from before the field existed keep their chains.
enum class InDigest : uint8_t { kAlways, kWhenSet, kNever };

// The comparisons that check a field (replay/compare.cpp), as bits: bitwise, tolerance (loss
// within a rule, the rest as the comparison says) and layout (another batch order).
enum CompareModes : uint8_t {
  kCompareBitwise = 1,
  kCompareTolerance = 2,
  kCompareLayout = 4,
  kLossByRule = 8,  // the loss: bitwise except under kCompareTolerance, where the rule decides
};

// The phase of a step that decides a field: where `diff` places a divergence.
enum class StepPhase : uint8_t { kNone, kData, kForward, kBackward, kOptimizer, kState };

struct StepField {
  const char* name;  // snake_case: the JSON and CSV key, the name compare and diff report
  InDigest digest;
  uint8_t tag;       // kWhenSet: the tag byte written before the value
  uint8_t compared;  // CompareModes
  StepPhase phase;
};

inline constexpr uint8_t kCompareAll = kCompareBitwise | kCompareTolerance | kCompareLayout;
inline constexpr uint8_t kCompareExact = kCompareBitwise | kCompareLayout;  // the bits, in any batch order

// Visits every field of one or more records (StepRecord or const StepRecord) in the trace's
// order: visit(field, value of the first, value of the second, ...).
template <typename Visit, typename... Records>
void for_each_field(Visit&& visit, Records&... r) {
  using D = InDigest;
  using P = StepPhase;
  visit(StepField{"step", D::kAlways, 0, 0, P::kNone}, r.step...);
  visit(StepField{"epoch", D::kAlways, 0, kCompareAll, P::kData}, r.epoch...);
  visit(StepField{"batch_in_epoch", D::kAlways, 0, kCompareAll, P::kData}, r.batch_in_epoch...);
  visit(StepField{"batch_size", D::kAlways, 0, kCompareBitwise | kCompareTolerance, P::kData}, r.batch_size...);
  visit(StepField{"sample_digest", D::kAlways, 0, kCompareBitwise | kCompareTolerance, P::kData}, r.sample_digest...);
  visit(StepField{"loss", D::kAlways, 0, kCompareExact | kLossByRule, P::kForward}, r.loss...);
  visit(StepField{"loss_bits", D::kAlways, 0, kCompareExact, P::kForward}, r.loss_bits...);
  visit(StepField{"grad_norm_pre", D::kAlways, 0, kCompareExact, P::kBackward}, r.grad_norm_pre...);
  visit(StepField{"grad_norm_post", D::kAlways, 0, kCompareExact, P::kOptimizer}, r.grad_norm_post...);
  visit(StepField{"lr", D::kAlways, 0, kCompareAll, P::kOptimizer}, r.lr...);  // a function of the step alone
  visit(StepField{"loss_scale", D::kAlways, 0, kCompareExact, P::kOptimizer}, r.loss_scale...);
  visit(StepField{"outcome", D::kAlways, 0, kCompareAll, P::kOptimizer}, r.outcome...);
  visit(StepField{"skip_reason", D::kAlways, 0, kCompareAll, P::kOptimizer}, r.skip_reason...);
  visit(StepField{"param_digest", D::kAlways, 0, kCompareExact, P::kOptimizer}, r.param_digest...);
  visit(StepField{"optim_digest", D::kAlways, 0, kCompareExact, P::kOptimizer}, r.optim_digest...);
  visit(StepField{"rng_digest", D::kAlways, 0, kCompareExact, P::kState}, r.rng_digest...);
  visit(StepField{"micro_batch_sizes", D::kAlways, 0, kCompareBitwise | kCompareTolerance, P::kData},
        r.micro_batch_sizes...);
  visit(StepField{"micro_losses", D::kAlways, 0, kCompareBitwise, P::kForward}, r.micro_losses...);
  visit(StepField{"rank_grad_digests", D::kAlways, 0, kCompareBitwise, P::kBackward}, r.rank_grad_digests...);
  visit(StepField{"state_digest", D::kWhenSet, 1, kCompareExact, P::kState}, r.state_digest...);
  visit(StepField{"rank_rng_digests", D::kWhenSet, 2, kCompareBitwise, P::kState}, r.rank_rng_digests...);
  visit(StepField{"grad_digest", D::kWhenSet, 3, kCompareExact, P::kBackward}, r.grad_digest...);
  // Compared only where both runs recorded them (a recorder run's), naming the first module apart.
  visit(StepField{"module_digests", D::kWhenSet, 4, kCompareExact, P::kState}, r.module_digests...);
  // Made by the trace writer from the fields above; the chain covers every earlier step too.
  visit(StepField{"content_digest", D::kNever, 0, 0, P::kNone}, r.content_digest...);
  visit(StepField{"chain_digest", D::kNever, 0, kCompareBitwise, P::kState}, r.chain_digest...);
  // Informational: wall times and the collectives' counts differ from run to run.
  visit(StepField{"timings", D::kNever, 0, 0, P::kNone}, r.timings...);
  visit(StepField{"allreduce_calls", D::kNever, 0, 0, P::kNone}, r.allreduce_calls...);
  visit(StepField{"allreduce_bytes", D::kNever, 0, 0, P::kNone}, r.allreduce_bytes...);
}

// The table as a list, and the position of a field in it (reports list differences in the
// trace's order; an unknown name sorts last, at the list's size).
const std::vector<StepField>& step_fields();
size_t step_field_index(const std::string& name);

// Whether a field holds its initial value (zero or empty): a kWhenSet field then stays out of
// the content digest.
inline bool unset(const Digest128& d) { return d == Digest128{}; }
template <typename T>
bool unset(const std::vector<T>& v) {
  return v.empty();
}

// "STEP" or "SKIP", as every view of a trace writes the outcome.
inline const char* outcome_text(Outcome o) { return o == Outcome::kSkip ? "SKIP" : "STEP"; }

// A field's value as text, as `compare` reports it and `inspect --csv` writes it: integers in
// decimal, doubles in the shortest "%.17g" that reads back to the same bits, digests in hex, lists
// joined by ';', a module's digests as module:param:grad:optim.
std::string value_text(uint64_t v);
std::string value_text(uint32_t v);
std::string value_text(double v);
std::string value_text(const Digest128& d);
std::string value_text(Outcome o);
std::string value_text(const std::string& s);
std::string value_text(const ModuleDigest& m);
template <typename T>
std::string value_text(const std::vector<T>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s.push_back(';');
    s += value_text(v[i]);
  }
  return s;
}

}  // namespace retrace::records
