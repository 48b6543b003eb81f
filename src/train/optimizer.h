// Optimizers (LibTorch's SGD with momentum and AdamW) and access to their per-parameter state in
// canonical order, for digests and checkpoints.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

#include "core/tensor_digest.h"
#include "train/config.h"

namespace retrace::train {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimConfig& c,
                                                        torch::nn::Module& model);
// The same over the given tensors (ZeRO's views of a rank's range, zero.h).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimConfig& c, const std::vector<torch::Tensor>& params);
void set_lr(torch::optim::Optimizer& opt, double lr);
// Clipping's product, left to the optimizer's next step: true when opt is the fused AdamW, which then
// multiplies the gradients of `params` by coef inside its own pass (adamw_kernel.h), storing the
// product back, the bits of grad.mul_(coef) for each; a step it hands to LibTorch's code does that
// multiplication first, as its own pass. False, and nothing deferred, for any other optimizer.
bool defer_grad_scale(torch::optim::Optimizer& opt, std::vector<torch::Tensor> params, double coef);
// How many steps the fused AdamW took in one pass (-1: opt is not the fused AdamW). Steps it handed
// to LibTorch's code (tensors it does not fuse) are not counted.
int64_t fused_adamw_steps(const torch::optim::Optimizer& opt);

// The optimizer state as named tensors "<param>/<field>" (e.g. "layers.0.weight/exp_avg",
// ".../step" as an int64 scalar). Parameters without state yet are absent. Order: by name.
NamedTensors optimizer_state(torch::optim::Optimizer& opt, const torch::nn::Module& model,
                             OptimizerKind optim_name);
// The fused AdamW's lane sums of what its last step wrote: a parameter, its exp_avg or exp_avg_sq,
// when `t` is that very tensor and unchanged since (its version counter says so). False for
// anything else, any other optimizer, or before keep_lane_sums(opt, true).
bool fused_lane_sums(const torch::optim::Optimizer& opt, const torch::Tensor& t, uint64_t out[16]);
// Whether the fused AdamW takes those sums in its pass (trace.digest_version 2 asks for them).
void keep_lane_sums(torch::optim::Optimizer& opt, bool keep);

// Installs state produced by optimizer_state (for checkpoint loading). Throws FormatError naming
// the first missing or mis-shaped entry.
void load_optimizer_state(torch::optim::Optimizer& opt, const torch::nn::Module& model,
                          OptimizerKind optim_name, const NamedTensors& state);

}  // namespace retrace::train
