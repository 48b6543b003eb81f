// One optimizer step as a function of its inputs: model, optimizer, the micro-batches of one
// effective batch, the policies (clipping, autocast, loss scaler, spike guard) and the faults to
// inject. The order is the AMP-safe one (it matters):
//   1. zero gradients (set to none), once per effective step
//   2. per micro-batch: forward under autocast; loss_i = sum of per-sample (per-token) losses / N,
//      N = samples (tokens) of the whole effective batch, so the sum over micro-batches is the
//      large-batch mean whatever the micro-batch sizes; a non-finite loss skips the step
//      (`non_finite_loss`) BEFORE backward and the scaler is NOT updated; the spike guard judges
//      the effective loss before the last backward (`loss_spike`, nothing applied)
//   3. backward on the scaled loss; gradients add up in .grad; after the last micro-batch only,
//      StepCalls::after_last_backward runs (the data-parallel all-reduce: one sync per effective step)
//   4. unscale the gradients and check them; non-finite: scaler.update(found_inf), skip
//      (`non_finite_grad`)
//   5. clip the global L2 norm, recording it before and after
//   6. optimizer step, then scaler.update()
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "records/records.h"

namespace retrace::train {

class LossScaler;
class SpikeGuard;
class StepProbe;

struct MicroBatch {
  torch::Tensor inputs;
  torch::Tensor targets;  // class indices; the loss is over targets.numel() items
};

// What a step calls out to between its phases, in this order, on every rank alike. This base class
// is a step of one process with nothing to call; step_state.cpp's implementation brings in the other
// ranks (data_parallel.h), ZeRO's shard and batch invariance's chunk keys. A virtual call each, in
// place of the std::functions a step used to be wired with.
class StepCalls {
 public:
  virtual ~StepCalls() = default;
  // Batch invariance: before chunk `chunk` (its index in the global batch) is computed alone.
  virtual void before_chunk(uint64_t /*chunk*/) {}
  // True when the loss is decided with other ranks: a non-finite micro-batch loss then waits for
  // the last forward, so that every rank takes the same decision.
  virtual bool loss_over_ranks() const { return false; }
  // The sum over ranks of this rank's effective-batch loss (each already divided by the global count).
  virtual float reduce_loss(float mine) { return mine; }
  // Batch invariance: the step's loss from this rank's chunk losses, in order.
  virtual float fold_losses(const std::vector<float>& mine);
  virtual void after_chunk_backward() {}  // batch invariance, after each chunk's backward
  virtual void after_last_backward() {}
  // The global gradient norm where the ranks hold parts of the gradients; nullopt: global_grad_norm.
  virtual std::optional<double> grad_norm() { return std::nullopt; }
  // Run only when the step is applied: before clipping and the optimizer, and after the optimizer.
  virtual void before_optimizer_step() {}
  virtual void after_optimizer_step() {}
};

struct StepPolicy {
  double max_norm = 1.0;
  c10::DeviceType device = c10::DeviceType::CPU;
  at::ScalarType autocast_dtype = at::ScalarType::Undefined;  // Undefined: no autocast
  LossScaler* scaler = nullptr;
  const SpikeGuard* spike = nullptr;
  // Total loss items (samples or tokens) of the effective batch over all ranks; 0: this rank's.
  int64_t global_count = 0;
  StepCalls* calls = nullptr;  // nullptr: a step of one process with nothing to call
  StepProbe* probe = nullptr;  // bisection only
  // outputs, targets -> the sum of the per-item losses (registry.h); empty: cross entropy.
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> loss;
  // Batch invariance (train/invariant.h): every micro-batch is computed as chunks of `chunk`
  // samples (0: off), each alone: calls->before_chunk(global chunk index) keys the generators, then
  // forward and loss; backward runs chunk by chunk in order, calls->after_chunk_backward after each.
  // The step's loss is calls->fold_losses(this rank's chunk losses in order). first_chunk: the
  // global index of this rank's first chunk.
  int64_t chunk = 0;
  uint64_t first_chunk = 0;
  // Batch invariance in one piece (model/chunk_layout.h): each micro-batch goes through one forward
  // and one backward under a ChunkScope, and the kernels sum over samples chunk by chunk, with the
  // piecewise path's bits. Only where every kernel of the model does (chunked_sums_apply), on one
  // process, without a probe; the loss must return one sum per chunk (InvariantError otherwise).
  bool chunked_sums = false;
  // ZeRO (train/zero.h): the tensors the optimizer steps (empty: the model's parameters).
  std::vector<torch::Tensor> optimizer_params;
  // ZeRO's reduce-scatter (runtime.zero_reduce): the tensors whose gradients this rank holds
  // reduced (the scaler unscales and checks them, clipping scales them; empty: the model's
  // parameters); calls->grad_norm adds the ranks' parts of the norm.
  std::vector<torch::Tensor> grad_params;
};

struct StepFaults {
  bool nan_loss = false;
  double loss_factor = 1.0;             // spike fault
  std::optional<std::string> inf_grad;  // parameter name
};

struct StepResult {
  float loss = 0;                    // mean over the effective batch (float32, as computed)
  std::vector<double> micro_losses;  // mean loss of each micro-batch
  std::vector<uint32_t> micro_sizes;
  double grad_norm_pre = 0;
  double grad_norm_post = 0;
  bool skipped = false;
  records::SkipReason skip_reason = records::SkipReason::kNone;
  double forward_ms = 0, backward_ms = 0, optimizer_ms = 0;
};

using ForwardFn = std::function<torch::Tensor(const torch::Tensor&)>;

StepResult train_step(torch::nn::Module& model, const ForwardFn& forward, torch::optim::Optimizer& optimizer,
                      const std::vector<MicroBatch>& micro_batches, const StepPolicy& policy,
                      const StepFaults& faults = {});

// Global L2 norm of all gradients (float32, as torch.nn.utils.clip_grad_norm_ computes it), and
// in-place clipping to max_norm with coefficient max_norm / (norm + 1e-6) when that is below 1.
double global_grad_norm(const std::vector<torch::Tensor>& params);
void clip_grads(const std::vector<torch::Tensor>& params, double max_norm, double norm);

}  // namespace retrace::train
