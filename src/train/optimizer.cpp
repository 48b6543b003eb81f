#include "train/optimizer.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <map>

#include "core/error.h"
#include "core/torch_compat.h"

namespace retrace::train {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimConfig& c,
                                                        torch::nn::Module& model) {
  if (c.name == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        model.parameters(), torch::optim::SGDOptions(c.lr)
                                .momentum(c.momentum)
                                .nesterov(c.nesterov)
                                .weight_decay(c.weight_decay));
  }
  if (c.name == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        model.parameters(), torch::optim::AdamWOptions(c.lr)
                                .betas({c.beta1, c.beta2})
                                .eps(c.eps)
                                .weight_decay(c.weight_decay));
  }
  RETRACE_FAIL(ConfigError, "bad value for optim.name: \"", c.name, "\" is not one of \"adamw\", \"sgd\"");
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) group.options().set_lr(lr);
}

NamedTensors optimizer_state(torch::optim::Optimizer& opt, const torch::nn::Module& model,
                             const std::string& optim_name) {
  NamedTensors out;
  for (const auto& item : model.named_parameters()) {
    auto* st = compat::find_param_state(opt, item.value());
    if (!st) continue;
    const std::string& n = item.key();
    if (optim_name == "adamw") {
      auto& s = static_cast<torch::optim::AdamWParamState&>(*st);
      out.emplace_back(n + "/step", torch::tensor(static_cast<int64_t>(s.step()), torch::kInt64));
      out.emplace_back(n + "/exp_avg", s.exp_avg());
      out.emplace_back(n + "/exp_avg_sq", s.exp_avg_sq());
    } else {
      auto& s = static_cast<torch::optim::SGDParamState&>(*st);
      if (s.momentum_buffer().defined()) out.emplace_back(n + "/momentum_buffer", s.momentum_buffer());
    }
  }
  return out;
}

void load_optimizer_state(torch::optim::Optimizer& opt, const torch::nn::Module& model,
                          const std::string& optim_name, const NamedTensors& state) {
  std::map<std::string, torch::Tensor> by_name(state.begin(), state.end());
  auto take = [&](const std::string& key, const torch::Tensor& like) -> torch::Tensor {
    auto it = by_name.find(key);
    RETRACE_CHECK(it != by_name.end(), FormatError, "optimizer state entry ", key, " is missing");
    if (like.defined())
      RETRACE_CHECK(it->second.sizes() == like.sizes(), FormatError, "optimizer state entry ", key,
                    " has shape ", it->second.sizes(), ", expected ", like.sizes());
    return like.defined() ? it->second.to(like.device()).clone() : it->second.clone();
  };
  for (const auto& item : model.named_parameters()) {
    const std::string& n = item.key();
    const auto& p = item.value();
    if (optim_name == "adamw") {
      if (!by_name.count(n + "/step")) continue;  // no state yet for this parameter
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(take(n + "/step", {}).item<int64_t>());
      s->exp_avg(take(n + "/exp_avg", p));
      s->exp_avg_sq(take(n + "/exp_avg_sq", p));
      compat::set_param_state(opt, p, std::move(s));
    } else {
      if (!by_name.count(n + "/momentum_buffer")) continue;
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(take(n + "/momentum_buffer", p));
      compat::set_param_state(opt, p, std::move(s));
    }
  }
}

}  // namespace retrace::train
