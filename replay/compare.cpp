#include "replay/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>

namespace retrace::replay {
namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

template <typename T>
std::string join(const std::vector<T>& v) {
  std::string s;
  for (const auto& x : v) {
    if (!s.empty()) s += ";";
    if constexpr (std::is_same_v<T, Digest128>) s += x.hex();
    else s += num(static_cast<double>(x));
  }
  return s;
}

// Bitwise equality of doubles: NaN equals NaN of the same bits, +0 differs from -0.
bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }
bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!same_bits(a[i], b[i])) return false;
  return true;
}

std::map<uint64_t, const records::StepRecord*> by_step(const std::vector<records::StepRecord>& v) {
  std::map<uint64_t, const records::StepRecord*> m;
  for (const auto& r : v) m[r.step] = &r;  // a later record of the same step wins
  return m;
}
}  // namespace

double ToleranceRule::allowed(uint64_t step, double loss_a) const {
  if (horizon == 0 || step <= horizon) return abs;
  return std::max(abs, late_rel * std::fabs(loss_a));
}

std::vector<FieldDiff> diff_record(const records::StepRecord& a, const records::StepRecord& b,
                                   CompareMode mode, const ToleranceRule& tolerance) {
  std::vector<FieldDiff> d;
  auto check = [&](const char* field, bool same, const std::string& va, const std::string& vb) {
    if (!same) d.push_back({a.step, field, va, vb});
  };
#define RETRACE_CMP_INT(f) check(#f, a.f == b.f, std::to_string(a.f), std::to_string(b.f))
#define RETRACE_CMP_DBL(f) check(#f, same_bits(a.f, b.f), num(a.f), num(b.f))
#define RETRACE_CMP_DIG(f) check(#f, a.f == b.f, a.f.hex(), b.f.hex())
  const bool layout = mode == CompareMode::kLayout;
  RETRACE_CMP_INT(epoch);
  RETRACE_CMP_INT(batch_in_epoch);
  if (!layout) {
    RETRACE_CMP_INT(batch_size);
    RETRACE_CMP_DIG(sample_digest);
  }
  if (mode == CompareMode::kBitwise || layout) {
    RETRACE_CMP_DBL(loss);
    RETRACE_CMP_INT(loss_bits);
    RETRACE_CMP_DBL(grad_norm_pre);
    RETRACE_CMP_DBL(grad_norm_post);
    RETRACE_CMP_DBL(lr);
    RETRACE_CMP_DBL(loss_scale);
  } else {
    const double diff = std::fabs(a.loss - b.loss);
    check("loss", diff <= tolerance.allowed(a.step, a.loss) || (std::isnan(a.loss) && std::isnan(b.loss)),
          num(a.loss), num(b.loss));
    // The schedule is a function of the step alone: no kernel changes it.
    RETRACE_CMP_DBL(lr);
  }
  check("outcome", a.outcome == b.outcome, a.outcome == records::Outcome::kStep ? "STEP" : "SKIP",
        b.outcome == records::Outcome::kStep ? "STEP" : "SKIP");
  check("skip_reason", a.skip_reason == b.skip_reason, a.skip_reason, b.skip_reason);
  if (mode == CompareMode::kBitwise || layout) {
    RETRACE_CMP_DIG(param_digest);
    RETRACE_CMP_DIG(optim_digest);
    RETRACE_CMP_DIG(rng_digest);
    RETRACE_CMP_DIG(state_digest);
    RETRACE_CMP_DIG(grad_digest);
    // Per-module digests where both runs recorded them (a recorder run's): the whole digests above
    // already cover the same tensors, so this only adds the first module that differs.
    if (!a.module_digests.empty() && !b.module_digests.empty() && a.module_digests != b.module_digests) {
      const auto& ma = a.module_digests;
      const auto& mb = b.module_digests;
      size_t i = 0;
      while (i < ma.size() && i < mb.size() && ma[i] == mb[i]) ++i;
      check("module_digests", false, i < ma.size() ? ma[i].module : "(none)", i < mb.size() ? mb[i].module : "(none)");
    }
  }
  if (layout) return d;
  check("micro_batch_sizes", a.micro_batch_sizes == b.micro_batch_sizes, join(a.micro_batch_sizes),
        join(b.micro_batch_sizes));
  if (mode == CompareMode::kBitwise) {
    check("micro_losses", same_bits(a.micro_losses, b.micro_losses), join(a.micro_losses), join(b.micro_losses));
    check("rank_grad_digests", a.rank_grad_digests == b.rank_grad_digests, join(a.rank_grad_digests),
          join(b.rank_grad_digests));
    check("rank_rng_digests", a.rank_rng_digests == b.rank_rng_digests, join(a.rank_rng_digests),
          join(b.rank_rng_digests));
    RETRACE_CMP_DIG(chain_digest);
  }
#undef RETRACE_CMP_INT
#undef RETRACE_CMP_DBL
#undef RETRACE_CMP_DIG
  return d;
}

CompareReport compare_steps(const std::vector<records::StepRecord>& a,
                            const std::vector<records::StepRecord>& b, CompareMode mode,
                            const ToleranceRule& tolerance) {
  CompareReport rep;
  auto ma = by_step(a), mb = by_step(b);
  for (const auto& [step, ra] : ma) {
    auto it = mb.find(step);
    if (it == mb.end()) {
      rep.only_in_a++;
      continue;
    }
    const records::StepRecord* rb = it->second;
    rep.compared++;
    // Equal non-finite losses (both NaN, both +inf) count as no difference.
    const double diff = same_bits(ra->loss, rb->loss) ? 0.0 : std::fabs(ra->loss - rb->loss);
    if (diff > rep.max_loss_diff || std::isnan(diff)) {
      rep.max_loss_diff = std::isnan(diff) ? INFINITY : diff;
      rep.max_loss_diff_step = step;
    }
    rep.final_loss_diff = diff;
    if (!rep.first_diff) {
      auto d = diff_record(*ra, *rb, mode, tolerance);
      if (!d.empty()) rep.first_diff = d.front();
    }
  }
  for (const auto& [step, rb] : mb)
    if (!ma.count(step)) rep.only_in_b++;
  return rep;
}

std::optional<std::string> compare_evals(const std::vector<records::EvalRecord>& a,
                                         const std::vector<records::EvalRecord>& b, CompareMode mode) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const auto &x = a[i], &y = b[i];
    std::ostringstream o;
    if (x.step != y.step || x.epoch != y.epoch || x.samples != y.samples || x.tokens != y.tokens)
      o << "evaluation " << i + 1 << ": after step " << x.step << " (epoch " << x.epoch << ", " << x.samples
        << " samples) in one, after step " << y.step << " (epoch " << y.epoch << ", " << y.samples << ") in the other";
    else if (mode == CompareMode::kBitwise && (!same_bits(x.loss, y.loss) || !same_bits(x.accuracy, y.accuracy)))
      o << "evaluation after step " << x.step << ": loss " << num(x.loss) << " vs " << num(y.loss) << ", accuracy "
        << num(x.accuracy) << " vs " << num(y.accuracy);
    if (!o.str().empty()) return o.str();
  }
  if (a.size() != b.size()) {
    const auto& extra = a.size() > b.size() ? a[n] : b[n];
    return std::to_string(a.size()) + " evaluations in one, " + std::to_string(b.size()) +
           " in the other (the first unmatched is after step " + std::to_string(extra.step) + ")";
  }
  return std::nullopt;
}

std::optional<std::string> compare_events(const std::vector<records::EventRecord>& all_a,
                                          const std::vector<records::EventRecord>& all_b, CompareMode mode) {
  auto training = [](const std::vector<records::EventRecord>& v) {
    std::vector<records::EventRecord> out;
    for (const auto& e : v)
      if (!records::is_process_event(e)) out.push_back(e);
    return out;
  };
  const auto a = training(all_a), b = training(all_b);
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    // Messages quote losses: under other numerics only the step and the kind must agree.
    const bool same = a[i].step == b[i].step && a[i].kind == b[i].kind &&
                      (mode == CompareMode::kTolerance || a[i].message == b[i].message);
    if (!same)
      return "event " + std::to_string(i + 1) + ": step " + std::to_string(a[i].step) + " " + a[i].kind + " \"" +
             a[i].message + "\" vs step " + std::to_string(b[i].step) + " " + b[i].kind + " \"" + b[i].message + "\"";
  }
  if (a.size() != b.size()) {
    const auto& extra = a.size() > b.size() ? a[n] : b[n];
    return std::to_string(a.size()) + " training events in one, " + std::to_string(b.size()) +
           " in the other; the first unmatched: step " + std::to_string(extra.step) + " " + extra.kind + " \"" +
           extra.message + "\"";
  }
  return std::nullopt;
}

}  // namespace retrace::replay
