// One optimizer step as a function of its inputs: the model, the optimizer, a batch, the learning
// rate and the clipping policy. Order (FIELD-NOTES.md, "The AMP-safe step"): zero gradients (set
// to none), forward, skip on a non-finite loss, backward, skip on a non-finite gradient norm,
// clip the global L2 norm and record it before and after, optimizer step.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <string>

namespace retrace::train {

struct StepResult {
  float loss = 0;
  double grad_norm_pre = 0;
  double grad_norm_post = 0;
  bool skipped = false;
  std::string skip_reason;
  double forward_ms = 0, backward_ms = 0, optimizer_ms = 0;
};

using ForwardFn = std::function<torch::Tensor(const torch::Tensor&)>;

StepResult train_step(torch::nn::Module& model, const ForwardFn& forward,
                      torch::optim::Optimizer& optimizer, const torch::Tensor& inputs,
                      const torch::Tensor& targets, double max_norm);

// Global L2 norm of all gradients (float32, as torch.nn.utils.clip_grad_norm_ computes it), and
// in-place clipping to max_norm with coefficient max_norm / (norm + 1e-6) when that is below 1.
double global_grad_norm(const std::vector<torch::Tensor>& params);
void clip_grads(const std::vector<torch::Tensor>& params, double max_norm, double norm);

}  // namespace retrace::train
