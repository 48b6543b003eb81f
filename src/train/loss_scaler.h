// A loss scaler with the semantics and defaults of PyTorch's torch.cuda.amp.GradScaler:
//   scale(loss)      -> loss * scale
//   unscale(params)  -> grads *= 1/scale (the reciprocal computed in float64, then float32),
//                       returns whether any gradient is not finite
//   update(found_inf)-> found_inf: scale *= backoff_factor, growth tracker = 0;
//                       else: tracker += 1, and when it reaches growth_interval, scale *= growth_factor
//                       if that is finite, tracker = 0.
// Disabled (BF16 or no autocast, unless forced on), it is the identity and its state never moves.
// Its state (scale, growth tracker) is part of the checkpoint.
#pragma once

#include <torch/types.h>

#include <map>
#include <string>
#include <vector>

#include "train/config.h"

namespace retrace::train {

class LossScaler {
 public:
  LossScaler(const AmpConfig& amp, bool enabled);

  bool enabled() const { return enabled_; }
  double scale() const { return enabled_ ? scale_ : 1.0; }
  int64_t growth_tracker() const { return growth_tracker_; }

  torch::Tensor scale_loss(const torch::Tensor& loss) const;
  // Unscales every defined gradient in place; true if any is inf or NaN (checked after unscale).
  // When disabled, only checks.
  bool unscale_and_check(const std::vector<torch::Tensor>& params) const;
  void update(bool found_inf);

  std::map<std::string, std::string> state() const;
  void load_state(const std::map<std::string, std::string>& state);  // FormatError on bad values

 private:
  double growth_factor_, backoff_factor_;
  int64_t growth_interval_;
  bool enabled_;
  float scale_;  // float32, as GradScaler keeps it in a float tensor
  int64_t growth_tracker_ = 0;
};

}  // namespace retrace::train
