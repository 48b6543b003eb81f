// What the C++ benchmarks share: a millisecond clock and the median with its range.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace retrace::bench {

using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

struct Spread {
  double median, lo, hi;
};

// The median of the values with their min and max; `v` must not be empty.
inline Spread spread(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return {n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v.front(), v.back()};
}

}  // namespace retrace::bench
