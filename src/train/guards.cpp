#include "train/guards.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/parse_number.h"

namespace retrace::train {
namespace {
const std::string& need(const std::map<std::string, std::string>& s, const std::string& key) {
  auto it = s.find(key);
  RETRACE_CHECK(it != s.end(), FormatError, "checkpoint lacks guard state \"", key, "\"");
  return it->second;
}
}  // namespace

std::optional<std::string> SkipRateGuard::record(bool skipped, uint64_t step) {
  outcomes_.push_back(skipped);
  skips_ += skipped ? 1 : 0;
  while (static_cast<int64_t>(outcomes_.size()) > window_) {
    skips_ -= outcomes_.front() ? 1 : 0;
    outcomes_.pop_front();
  }
  const int64_t min_seen = std::min<int64_t>(window_, 50);
  if (static_cast<int64_t>(outcomes_.size()) < min_seen) return std::nullopt;
  const double r = rate();
  if (r > warn_rate_ && !warned_) {
    warned_ = true;
    std::ostringstream m;
    m << "skip rate " << 100.0 * r << " % over the last " << outcomes_.size() << " steps (at step " << step
      << ") is above " << 100.0 * warn_rate_
      << " %: the model may live outside the FP16 range; consider BF16, a lower learning rate or "
         "checking the data";
    return m.str();
  }
  if (r <= warn_rate_) warned_ = false;
  return std::nullopt;
}

double SkipRateGuard::rate() const {
  return outcomes_.empty() ? 0.0 : static_cast<double>(skips_) / static_cast<double>(outcomes_.size());
}

std::map<std::string, std::string> SkipRateGuard::state() const {
  std::string bits;
  for (bool b : outcomes_) bits.push_back(b ? '1' : '0');
  return {{"skip_guard.outcomes", bits}, {"skip_guard.warned", warned_ ? "1" : "0"}};
}

void SkipRateGuard::load_state(const std::map<std::string, std::string>& s) {
  const std::string& bits = need(s, "skip_guard.outcomes");
  outcomes_.clear();
  skips_ = 0;
  RETRACE_CHECK(static_cast<int64_t>(bits.size()) <= window_, FormatError, "skip guard state holds ", bits.size(),
                " outcomes, more than its window of ", window_);
  for (char c : bits) {
    RETRACE_CHECK(c == '0' || c == '1', FormatError, "skip guard state holds '", c, "'");
    outcomes_.push_back(c == '1');
    skips_ += c == '1';
  }
  const std::string& warned = need(s, "skip_guard.warned");
  RETRACE_CHECK(warned == "0" || warned == "1", FormatError, "skip guard state \"warned\" is \"", warned.substr(0, 64),
                "\"; it is 0 or 1");
  warned_ = warned == "1";
}

std::optional<double> SpikeGuard::level() const {
  if (static_cast<int64_t>(losses_.size()) < window_ || losses_.empty()) return std::nullopt;
  std::vector<double> v(losses_.begin(), losses_.end());
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

bool SpikeGuard::is_spike(double loss) const {
  if (!enabled()) return false;
  auto l = level();
  return l.has_value() && std::isfinite(loss) && loss > factor_ * *l;
}

void SpikeGuard::record(double loss) {
  if (!std::isfinite(loss)) return;
  losses_.push_back(loss);
  while (static_cast<int64_t>(losses_.size()) > window_) losses_.pop_front();
}

std::map<std::string, std::string> SpikeGuard::state() const {
  std::ostringstream out;
  for (double d : losses_) {
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    out << bits << ' ';
  }
  return {{"spike_guard.losses", out.str()}};
}

void SpikeGuard::load_state(const std::map<std::string, std::string>& s) {
  std::istringstream in(need(s, "spike_guard.losses"));
  losses_.clear();
  std::string word;
  while (in >> word) {
    const uint64_t bits = parse_u64_field(word, "a loss's bits in the spike guard state");
    double d;
    std::memcpy(&d, &bits, sizeof d);
    RETRACE_CHECK(std::isfinite(d), FormatError,
                  "spike guard state holds a non-finite loss; only finite losses are "
                  "recorded");
    losses_.push_back(d);
  }
  RETRACE_CHECK(static_cast<int64_t>(losses_.size()) <= window_, FormatError, "spike guard state holds ",
                losses_.size(), " losses, more than its window of ", window_);
}

}  // namespace retrace::train
