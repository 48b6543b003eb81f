#include "replay/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <type_traits>

#include "records/step_fields.h"

namespace retrace::replay {
namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
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

namespace {

template <typename T>
bool same(const T& a, const T& b) {
  return a == b;
}
bool same(double a, double b) { return same_bits(a, b); }
bool same(const std::vector<double>& a, const std::vector<double>& b) { return same_bits(a, b); }

}  // namespace

std::vector<FieldDiff> diff_record(const records::StepRecord& a, const records::StepRecord& b, CompareMode mode,
                                   const ToleranceRule& tolerance) {
  const uint8_t bit = mode == CompareMode::kBitwise  ? records::kCompareBitwise
                      : mode == CompareMode::kLayout ? records::kCompareLayout
                                                     : records::kCompareTolerance;
  std::vector<FieldDiff> d;
  records::for_each_field(
      [&](const records::StepField& f, const auto& va, const auto& vb) {
        using T = std::decay_t<decltype(va)>;
        if constexpr (std::is_same_v<T, records::Timings>) {
          return;  // never compared
        } else if constexpr (std::is_same_v<T, std::vector<records::ModuleDigest>>) {
          // Where both runs recorded them (a recorder run's): the whole digests already cover the
          // same tensors, so this only adds the first module that differs.
          if (!(f.compared & bit) || va.empty() || vb.empty() || va == vb) return;
          size_t i = 0;
          while (i < va.size() && i < vb.size() && va[i] == vb[i]) ++i;
          d.push_back(
              {a.step, f.name, i < va.size() ? va[i].module : "(none)", i < vb.size() ? vb[i].module : "(none)"});
        } else {
          if constexpr (std::is_same_v<T, double>) {
            if ((f.compared & records::kLossByRule) && bit == records::kCompareTolerance) {
              const bool within = std::fabs(va - vb) <= tolerance.allowed(a.step, va) ||
                                  (std::isnan(va) && std::isnan(vb));
              if (!within) d.push_back({a.step, f.name, num(va), num(vb)});
              return;
            }
          }
          if ((f.compared & bit) && !same(va, vb))
            d.push_back({a.step, f.name, records::value_text(va), records::value_text(vb)});
        }
      },
      a, b);
  return d;
}

CompareReport compare_steps(const std::vector<records::StepRecord>& a, const std::vector<records::StepRecord>& b,
                            CompareMode mode, const ToleranceRule& tolerance) {
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
