// Optimizers (LibTorch's SGD with momentum and AdamW) and access to their per-parameter state in
// canonical order, for digests and checkpoints.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor_digest.h"
#include "train/config.h"

namespace retrace::train {

// optim.fused takes the fused AdamW (adamw_kernel.h) where it reproduces this LibTorch's AdamW
// (1.13), and under portable numerics version 2 (`owned`) on every build: there its roundings are
// the run's numerics, the same on 1.13 and 2.x. Elsewhere LibTorch's AdamW.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimConfig& c, torch::nn::Module& model,
                                                        bool owned = false);
// The same over the given tensors (ZeRO's views of a rank's range, zero.h).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimConfig& c, const std::vector<torch::Tensor>& params,
                                                        bool owned = false);
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
NamedTensors optimizer_state(torch::optim::Optimizer& opt, const torch::nn::Module& model, OptimizerKind optim_name);
// The sums the fused AdamW takes of what its pass touches, for the trace's digests: none, the lane
// sums (trace.digest_version 2) of each parameter, exp_avg and exp_avg_sq it wrote, or their mixed
// sums (version 3, core/digest.h; kMixed4: version 4's mix) and the gradient's as used (after
// clipping's product).
enum class KeptSums : uint8_t { kNone, kLanes, kMixed, kMixed4 };
void keep_sums(torch::optim::Optimizer& opt, KeptSums kind);
// The global position of each parameter's first element for the mixed sums, in the order the
// optimizer was given them (ZeRO's views start inside their parameter); 0 for any not listed.
void set_sum_positions(torch::optim::Optimizer& opt, const std::vector<torch::Tensor>& params,
                       const std::vector<uint64_t>& first_positions);
// The fused AdamW's sums, of the kind it keeps, of what its last step wrote or used: a
// parameter, its exp_avg or exp_avg_sq, or (mixed) the parameter's gradient, when `t` is that very
// tensor and unchanged since (its version counter says so). Lane sums fill out[0..15], a mixed sum
// out[0]. False for anything else, any other optimizer, or with KeptSums::kNone.
bool fused_sums(const torch::optim::Optimizer& opt, const torch::Tensor& t, uint64_t out[16]);

// The per-parameter fields of an optimizer's state, in a fixed order: AdamW's step count, exp_avg
// and exp_avg_sq; SGD's momentum_buffer.
std::vector<std::string> optimizer_fields(OptimizerKind kind);
// The validation layer's check of optimizer state read from a checkpoint, before any of it is
// installed: every entry is "<param>/<field>" for a parameter of `model` and a field of `kind`
// (AdamW: step, exp_avg, exp_avg_sq; SGD: momentum_buffer); the step count an int64 scalar, not
// negative; every other field of the parameter's dtype and shape, or, where `part_length` is given
// (a ZeRO rank, which reads only its range), a 1-D tensor of part_length(parameter index) elements
// (0 for a parameter it owns none of, whose step count may then be empty too); an AdamW parameter
// with a step count has both moments. FormatError naming `where`, the entry, what was expected and
// what was found.
void check_optimizer_state(const NamedTensors& state, const torch::nn::Module& model, OptimizerKind kind,
                           const std::string& where, const std::function<int64_t(size_t)>* part_length = nullptr);
// The same against the model's named parameters, in its order (a loop whose model is not a
// torch::nn::Module: the recorder's tensor-level API).
void check_optimizer_state(const NamedTensors& state, const NamedTensors& parameters, OptimizerKind kind,
                           const std::string& where, const std::function<int64_t(size_t)>* part_length = nullptr);
// Installs state produced by optimizer_state (for checkpoint loading). Throws FormatError naming
// the first missing or mis-shaped entry. Each tensor is copied, unless `adopt` (the caller gives
// them away: a resume's tensors read for this alone) and it is on its parameter's device already.
void load_optimizer_state(torch::optim::Optimizer& opt, const torch::nn::Module& model, OptimizerKind optim_name,
                          const NamedTensors& state, bool adopt = false);

}  // namespace retrace::train
