// Guards that watch the step outcomes: hundreds of skips per epoch (a model outside the FP16 range)
// and a loss that shoots past 2x its recent level (a bad step or bad data).
//
// SkipRateGuard: the rate of SKIP outcomes over the last `window` steps. It is evaluated once at
// least min(window, 50) outcomes are in the window, as skips / outcomes in the window, and warns
// once each time the rate rises above `warn_rate` (it re-arms when the rate falls back under it).
//
// SpikeGuard: the recent level of the loss is the median of the last `window` losses of applied
// steps (finite losses only; the mean of the two middle values for an even count). A loss above
// factor x level is a spike, judged only once `window` losses are known. A median, unlike a mean
// or an EMA, is not dragged up by the spike's own neighbours.
//
// Both are deterministic functions of the sequence they were fed; their state is saved in
// checkpoints as strings (state()/load_state()).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>

namespace retrace::train {

class SkipRateGuard {
 public:
  SkipRateGuard(int64_t window, double warn_rate) : window_(window), warn_rate_(warn_rate) {}
  // Records one outcome; returns a warning message when the rate has just passed the threshold.
  std::optional<std::string> record(bool skipped, uint64_t step);
  double rate() const;
  std::map<std::string, std::string> state() const;
  void load_state(const std::map<std::string, std::string>& s);

 private:
  int64_t window_;
  double warn_rate_;
  std::deque<bool> outcomes_;
  int64_t skips_ = 0;
  bool warned_ = false;
};

class SpikeGuard {
 public:
  SpikeGuard(double factor, int64_t window) : factor_(factor), window_(window) {}
  bool enabled() const { return factor_ > 0; }
  // The level the loss is compared with, once `window` losses are known.
  std::optional<double> level() const;
  bool is_spike(double loss) const;
  void record(double loss);  // a loss of an applied step
  std::map<std::string, std::string> state() const;
  void load_state(const std::map<std::string, std::string>& s);

 private:
  double factor_;
  int64_t window_;
  std::deque<double> losses_;
};

}  // namespace retrace::train
