#include "train/step.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>

namespace retrace::train {
namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}
}  // namespace

double global_grad_norm(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> norms;
  norms.reserve(params.size());
  for (const auto& p : params)
    if (p.grad().defined()) norms.push_back(p.grad().norm(2));
  if (norms.empty()) return 0.0;
  return torch::stack(norms).norm(2).item<float>();
}

void clip_grads(const std::vector<torch::Tensor>& params, double max_norm, double norm) {
  if (max_norm <= 0) return;
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1.0) return;
  torch::NoGradGuard no_grad;
  for (const auto& p : params)
    if (p.grad().defined()) p.grad().mul_(coef);
}

StepResult train_step(torch::nn::Module& model, const ForwardFn& forward,
                      torch::optim::Optimizer& optimizer, const torch::Tensor& inputs,
                      const torch::Tensor& targets, double max_norm) {
  StepResult r;
  const std::vector<torch::Tensor> params = model.parameters();
  for (const auto& p : params) p.mutable_grad() = torch::Tensor();  // zero_grad(set_to_none)

  auto t = Clock::now();
  torch::Tensor loss = torch::nn::functional::cross_entropy(forward(inputs), targets);
  r.loss = loss.item<float>();
  r.forward_ms = ms_since(t);
  if (!std::isfinite(r.loss)) {
    r.skipped = true;
    r.skip_reason = "non_finite_loss";
    return r;
  }

  t = Clock::now();
  loss.backward();
  r.backward_ms = ms_since(t);

  t = Clock::now();
  r.grad_norm_pre = global_grad_norm(params);
  if (!std::isfinite(r.grad_norm_pre)) {
    r.skipped = true;
    r.skip_reason = "non_finite_grad";
    r.grad_norm_post = r.grad_norm_pre;
    r.optimizer_ms = ms_since(t);
    return r;
  }
  if (max_norm > 0 && max_norm / (r.grad_norm_pre + 1e-6) < 1.0) {
    clip_grads(params, max_norm, r.grad_norm_pre);
    r.grad_norm_post = global_grad_norm(params);
  } else {
    r.grad_norm_post = r.grad_norm_pre;
  }
  optimizer.step();
  r.optimizer_ms = ms_since(t);
  return r;
}

}  // namespace retrace::train
