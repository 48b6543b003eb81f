// Learning-rate schedule: linear warmup from 0 to optim.lr over warmup_steps, then constant or a
// cosine decay to min_lr_ratio * optim.lr at total_steps. A pure function of the 1-based step, so
// its whole state is the step counter (which the checkpoint holds).
#pragma once

#include <cstdint>

#include "train/config.h"

namespace retrace::train {

class LrSchedule {
 public:
  LrSchedule(const ScheduleConfig& schedule, double peak_lr, uint64_t total_steps)
      : schedule_(schedule), peak_lr_(peak_lr), total_steps_(total_steps) {}
  double lr_at(uint64_t step) const;

 private:
  ScheduleConfig schedule_;
  double peak_lr_;
  uint64_t total_steps_;
};

}  // namespace retrace::train
