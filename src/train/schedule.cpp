#include "train/schedule.h"

#include <algorithm>
#include <cmath>

namespace retrace::train {

double LrSchedule::lr_at(uint64_t step) const {
  const uint64_t warmup = static_cast<uint64_t>(schedule_.warmup_steps);
  if (warmup > 0 && step <= warmup) return peak_lr_ * static_cast<double>(step) / static_cast<double>(warmup);
  if (schedule_.kind == ScheduleKind::kConstant || total_steps_ <= warmup) return peak_lr_;
  double progress = static_cast<double>(step - warmup) / static_cast<double>(total_steps_ - warmup);
  progress = std::min(1.0, std::max(0.0, progress));
  const double m = schedule_.min_lr_ratio;
  return peak_lr_ * (m + (1.0 - m) * 0.5 * (1.0 + std::cos(M_PI * progress)));
}

}  // namespace retrace::train
