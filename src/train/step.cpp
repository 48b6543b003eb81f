#include "train/step.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/torch_compat.h"
#include "train/guards.h"
#include "train/loss_scaler.h"
#include "train/probe.h"
#include "train/registry.h"

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

StepResult train_step(torch::nn::Module& model, const ForwardFn& forward, torch::optim::Optimizer& optimizer,
                      const std::vector<MicroBatch>& micro_batches, const StepPolicy& policy,
                      const StepFaults& faults) {
  RETRACE_CHECK(!micro_batches.empty(), InvariantError, "train_step needs at least one micro-batch");
  StepResult r;
  const std::vector<torch::Tensor> params = model.parameters();
  for (const auto& p : params) p.mutable_grad() = torch::Tensor();  // zero_grad(set_to_none)
  if (policy.probe) policy.probe->step_start(model);

  int64_t local_count = 0;
  for (const auto& mb : micro_batches) local_count += mb.targets.numel();
  const int64_t count = policy.global_count > 0 ? policy.global_count : local_count;
  const double inv_count = 1.0 / static_cast<double>(count);

  torch::Tensor total = torch::zeros({}, torch::kFloat32);
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    const auto& mb = micro_batches[i];
    const bool last = i + 1 == micro_batches.size();
    auto t = Clock::now();
    torch::Tensor loss;
    if (policy.probe) policy.probe->set_phase("forward");
    {
      compat::AutocastGuard autocast(policy.device, policy.autocast_dtype);
      torch::Tensor logits = forward(mb.inputs);
      loss = (policy.loss ? policy.loss(logits, mb.targets) : cross_entropy_sum(logits, mb.targets)) * inv_count;
    }
    if (i == 0 && faults.nan_loss) loss = loss * std::numeric_limits<float>::quiet_NaN();
    if (faults.loss_factor != 1.0) loss = loss * faults.loss_factor;
    const float loss_value = loss.item<float>();
    total = total + loss.detach().to(torch::kCPU);
    r.micro_sizes.push_back(static_cast<uint32_t>(mb.targets.size(0)));
    r.micro_losses.push_back(static_cast<double>(loss_value) * static_cast<double>(count) /
                             static_cast<double>(mb.targets.numel()));
    r.forward_ms += ms_since(t);
    if (!policy.reduce_loss && !std::isfinite(loss_value)) {
      r.loss = total.item<float>();
      r.skipped = true;
      r.skip_reason = "non_finite_loss";  // the scaler is not updated on this path
      return r;
    }
    if (last) {
      r.loss = total.item<float>();
      if (policy.reduce_loss) r.loss = policy.reduce_loss(r.loss);
      if (!std::isfinite(r.loss)) {
        r.skipped = true;
        r.skip_reason = "non_finite_loss";
        return r;
      }
      if (policy.spike && policy.spike->is_spike(r.loss)) {
        r.skipped = true;
        r.skip_reason = "loss_spike";
        return r;
      }
    }
    t = Clock::now();
    if (policy.probe) policy.probe->set_phase("backward");
    if (policy.scaler) policy.scaler->scale_loss(loss).backward();
    else loss.backward();
    if (last && policy.after_last_backward) policy.after_last_backward();
    r.backward_ms += ms_since(t);
  }
  if (policy.probe) policy.probe->after_backward(model);

  auto t = Clock::now();
  if (faults.inf_grad) {
    torch::NoGradGuard no_grad;
    for (const auto& item : model.named_parameters())
      if (item.key() == *faults.inf_grad && item.value().grad().defined())
        item.value().grad().view({-1})[0].fill_(std::numeric_limits<float>::infinity());
  }
  // With the scaler on, unscale and look for inf/NaN element by element; with it off the global
  // norm below is already non-finite when any element is, so no extra pass is needed.
  const bool found_inf = policy.scaler && policy.scaler->enabled() ? policy.scaler->unscale_and_check(params) : false;
  r.grad_norm_pre = global_grad_norm(params);
  if (found_inf || !std::isfinite(r.grad_norm_pre)) {
    if (policy.scaler) policy.scaler->update(/*found_inf=*/true);
    r.skipped = true;
    r.skip_reason = "non_finite_grad";
    r.grad_norm_post = r.grad_norm_pre;
    r.optimizer_ms = ms_since(t);
    return r;
  }
  if (policy.max_norm > 0 && policy.max_norm / (r.grad_norm_pre + 1e-6) < 1.0) {
    clip_grads(params, policy.max_norm, r.grad_norm_pre);
    // The norm after clipping is the norm before times the clip coefficient (every gradient is
    // scaled by it); computing it instead of measuring it saves a pass over the gradients.
    r.grad_norm_post = r.grad_norm_pre * (policy.max_norm / (r.grad_norm_pre + 1e-6));
  } else {
    r.grad_norm_post = r.grad_norm_pre;
  }
  optimizer.step();
  if (policy.probe) policy.probe->after_optimizer(model);
  if (policy.scaler) policy.scaler->update(/*found_inf=*/false);
  r.optimizer_ms = ms_since(t);
  return r;
}

}  // namespace retrace::train
