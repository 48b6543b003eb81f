#include "train/loss_scaler.h"

#include <torch/torch.h>

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/parse_number.h"

namespace retrace::train {

LossScaler::LossScaler(const AmpConfig& amp, bool enabled)
    : growth_factor_(amp.growth_factor),
      backoff_factor_(amp.backoff_factor),
      growth_interval_(amp.growth_interval),
      enabled_(enabled),
      scale_(static_cast<float>(amp.init_scale)) {}

torch::Tensor LossScaler::scale_loss(const torch::Tensor& loss) const {
  if (!enabled_) return loss;
  return loss * scale_;
}

bool LossScaler::unscale_and_check(const std::vector<torch::Tensor>& params) const {
  torch::NoGradGuard no_grad;
  const float inv = static_cast<float>(1.0 / static_cast<double>(scale_));
  std::vector<torch::Tensor> flags;
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    if (enabled_) p.grad().mul_(inv);
    flags.push_back(p.grad().isfinite().all().logical_not());
  }
  if (flags.empty()) return false;
  return torch::stack(flags).any().item<bool>();
}

void LossScaler::update(bool found_inf) {
  if (!enabled_) return;
  if (found_inf) {
    scale_ = static_cast<float>(scale_ * backoff_factor_);
    growth_tracker_ = 0;
    return;
  }
  growth_tracker_ += 1;
  if (growth_tracker_ == growth_interval_) {
    float grown = static_cast<float>(scale_ * growth_factor_);
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
}

std::map<std::string, std::string> LossScaler::state() const {
  uint32_t bits;
  std::memcpy(&bits, &scale_, sizeof bits);
  return {{"scaler.scale_bits", std::to_string(bits)}, {"scaler.growth_tracker", std::to_string(growth_tracker_)}};
}

void LossScaler::load_state(const std::map<std::string, std::string>& state) {
  auto get = [&](const std::string& key, uint64_t max) -> uint64_t {
    auto it = state.find(key);
    RETRACE_CHECK(it != state.end(), FormatError, "checkpoint lacks loss scaler state \"", key, "\"");
    const std::string& v = it->second;
    return parse_u64_field(v, "loss scaler state \"" + key + "\"", max);
  };
  uint32_t bits = static_cast<uint32_t>(get("scaler.scale_bits", UINT32_MAX));
  float scale;
  std::memcpy(&scale, &bits, sizeof bits);
  RETRACE_CHECK(std::isfinite(scale) && scale >= 0, FormatError, "loss scaler state holds the scale ", scale,
                "; a scale is finite and not negative");
  scale_ = scale;
  growth_tracker_ = static_cast<int64_t>(get("scaler.growth_tracker", static_cast<uint64_t>(growth_interval_)));
}

}  // namespace retrace::train
