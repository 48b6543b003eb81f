#include "train/step.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>

#include "core/error.h"
#include "core/torch_compat.h"
#include "kernels/reduce.h"
#include "model/chunk_layout.h"
#include "model/lanes.h"
#include "model/owned_linear.h"
#include "train/environment.h"
#include "train/guards.h"
#include "train/invariant.h"
#include "train/loss_scaler.h"
#include "train/optimizer.h"
#include "train/probe.h"
#include "train/registry.h"

namespace retrace::train {
namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// The defined gradients of params.
std::vector<torch::Tensor> gradients(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  return grads;
}

// Indices of `tensors`, largest first (ties in their order), for the lanes to take in turn: the two
// lanes then end close together.
std::vector<size_t> largest_first(const std::vector<torch::Tensor>& tensors) {
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return tensors[a].numel() > tensors[b].numel(); });
  return order;
}

// fn(k) for k < n: on the two lanes (model/lanes.h) when every tensor is on the CPU and they hold
// enough floats (kAfterBackwardLanesFrom), in order on this thread otherwise (a device's current
// stream is this thread's).
void for_each_item(const std::vector<torch::Tensor>& tensors, size_t n, const std::function<void(size_t)>& fn) {
  int64_t floats = 0;
  bool cpu = true;
  for (const auto& t : tensors) floats += t.numel(), cpu = cpu && t.is_cpu();
  if (!cpu || floats < model::kAfterBackwardLanesFrom) {
    for (size_t k = 0; k < n; ++k) fn(k);
    return;
  }
  model::for_each_tile(static_cast<int64_t>(n), 1, [&](int64_t first, int64_t last, int) {
    for (int64_t k = first; k < last; ++k) fn(static_cast<size_t>(k));
  });
}
}  // namespace

float StepCalls::fold_losses(const std::vector<float>& mine) { return fold_chunk_losses(mine, 1, {}); }

namespace {
// Portable numerics version 2: every gradient cut into pieces of kAfterBackwardPiece floats, each
// piece's sum of squares in double (kernels::sum_squares) on the lanes, the pieces summed in
// parameter order, the root rounded to float as ATen's float norm would be. The same bits at any
// lane count and on both LibTorch builds.
double owned_grad_norm(const std::vector<torch::Tensor>& grads) {
  constexpr int64_t kPiece = model::kAfterBackwardPiece;
  std::vector<torch::Tensor> flat;
  std::vector<std::pair<size_t, int64_t>> pieces;  // (gradient, first element)
  for (const torch::Tensor& g : grads) {
    flat.push_back(g.contiguous().view({-1}));
    RETRACE_CHECK(flat.back().scalar_type() == torch::kFloat && flat.back().device().is_cpu(), InvariantError,
                  "owned_grad_norm: needs float32 CPU gradients, got ", flat.back().scalar_type());
    for (int64_t b = 0; b < flat.back().numel(); b += kPiece) pieces.emplace_back(flat.size() - 1, b);
  }
  std::vector<double> sums(pieces.size());
  model::for_each_tile(static_cast<int64_t>(pieces.size()), 1, [&](int64_t first, int64_t last, int) {
    for (int64_t k = first; k < last; ++k) {
      const torch::Tensor& f = flat[pieces[k].first];
      const int64_t b = pieces[k].second;
      sums[k] = kernels::sum_squares(f.data_ptr<float>() + b, std::min(kPiece, f.numel() - b));
    }
  });
  double total = 0.0;
  for (double s : sums) total += s;
  return static_cast<float>(std::sqrt(total));
}
}  // namespace

double global_grad_norm(const std::vector<torch::Tensor>& params) {
  const std::vector<torch::Tensor> grads = gradients(params);
  if (model::owned_kernels() && std::all_of(grads.begin(), grads.end(), model::owned_float))
    return owned_grad_norm(grads);
  // Each gradient's norm is the one ATen call it always was, now on one of the two lanes; the
  // norms are stacked in parameter order, so the result has the same bits.
  if (grads.empty()) return 0.0;
  const std::vector<size_t> order = largest_first(grads);
  std::vector<torch::Tensor> norms(grads.size());
  for_each_item(grads, order.size(), [&](size_t k) { norms[order[k]] = grads[order[k]].norm(2); });
  return torch::stack(norms).norm(2).item<float>();
}

void clip_grads(const std::vector<torch::Tensor>& params, double max_norm, double norm) {
  if (max_norm <= 0) return;
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1.0) return;
  torch::NoGradGuard no_grad;
  // An elementwise product: pieces of a gradient get the bits the whole would, so the lanes take
  // pieces of at most kAfterBackwardPiece floats.
  constexpr int64_t kPiece = model::kAfterBackwardPiece;
  const std::vector<torch::Tensor> grads = gradients(params);
  std::vector<torch::Tensor> pieces;
  for (const size_t i : largest_first(grads)) {
    const torch::Tensor& g = grads[i];
    if (!g.is_contiguous() || g.numel() <= kPiece) {
      pieces.push_back(g);
      continue;
    }
    const torch::Tensor flat = g.view({-1});
    for (int64_t b = 0; b < flat.numel(); b += kPiece)
      pieces.push_back(flat.narrow(0, b, std::min(kPiece, flat.numel() - b)));
  }
  for_each_item(grads, pieces.size(), [&](size_t k) { pieces[k].mul_(coef); });
}

namespace {

// The number of whole chunks of `chunk` samples in a micro-batch of n; ConfigError if they are not whole.
int64_t chunks_of(int64_t n, int64_t chunk) {
  RETRACE_CHECK(n % chunk == 0, ConfigError, "a micro-batch of ", n,
                " samples does not split into whole chunks of runtime.invariance_chunk = ", chunk,
                "; choose data.batch_size, train.accum_steps and the world size so that it does");
  return n / chunk;
}

// The pieces of a micro-batch computed alone: the micro-batch itself, or under batch invariance its
// chunks of `chunk` samples.
std::vector<MicroBatch> pieces_of(const MicroBatch& mb, int64_t chunk) {
  if (chunk <= 0) return {mb};
  const int64_t n = mb.targets.size(0);
  chunks_of(n, chunk);
  std::vector<MicroBatch> pieces;
  for (int64_t lo = 0; lo < n; lo += chunk)
    pieces.push_back({mb.inputs.slice(0, lo, lo + chunk), mb.targets.slice(0, lo, lo + chunk)});
  return pieces;
}

// One train_step under way: its inputs, what it adds up over the micro-batches (the loss, the chunk
// losses, the next chunk's index) and its result. Its functions are the step's phases, in order.
class StepRun {
 public:
  StepRun(torch::nn::Module& model, const ForwardFn& forward, const StepPolicy& policy, StepCalls& calls,
          const StepFaults& faults, int64_t count)
      : model_(model),
        forward_(forward),
        policy_(policy),
        calls_(calls),
        faults_(faults),
        count_(count),
        inv_count_(1.0 / static_cast<double>(count)),
        next_chunk_(policy.first_chunk) {}

  // Forward of micro-batch `i` under autocast, piece by piece, each loss divided by the effective
  // batch's item count: the losses still to be backpropagated. Records the micro-batch's size and
  // mean loss, and returns its loss (the sum of its pieces' losses) in `loss_value`.
  std::vector<torch::Tensor> forward(const MicroBatch& mb, size_t i, float& loss_value) {
    // The owned kernels are process-wide (train::apply_environment): a caller that never applied the
    // environment computes piecewise.
    if (policy_.chunk > 0 && policy_.chunked_sums && model::owned_kernels())
      return forward_in_one_piece(mb, i, loss_value);
    const auto t = Clock::now();
    const std::vector<MicroBatch> pieces = pieces_of(mb, policy_.chunk);
    std::vector<torch::Tensor> losses;
    loss_value = 0;
    if (policy_.probe) policy_.probe->set_phase("forward");
    for (size_t j = 0; j < pieces.size(); ++j) {
      if (policy_.chunk > 0) calls_.before_chunk(next_chunk_++);
      torch::Tensor loss;
      {
        compat::AutocastGuard autocast(policy_.device, policy_.autocast_dtype);
        torch::Tensor logits = forward_(pieces[j].inputs);
        loss = (policy_.loss ? policy_.loss(logits, pieces[j].targets) : cross_entropy_sum(logits, pieces[j].targets)) *
               inv_count_;
      }
      if (i == 0 && j == 0 && faults_.nan_loss) loss = loss * std::numeric_limits<float>::quiet_NaN();
      if (faults_.loss_factor != 1.0) loss = loss * faults_.loss_factor;
      const float v = loss.item<float>();
      loss_value = j == 0 ? v : loss_value + v;
      if (policy_.chunk > 0) chunk_losses_.push_back(v);
      else total_ = total_ + loss.detach().to(torch::kCPU);
      losses.push_back(std::move(loss));
    }
    record_micro_batch(mb, loss_value, t);
    return losses;
  }

  // Batch invariance in one piece (StepPolicy::chunked_sums): the micro-batch's chunks keyed as
  // the piecewise path keys them, each chunk's generator kept for its dropout masks; one forward
  // under the ChunkScope, whose loss is one sum per chunk. The same chunk losses, loss value and
  // gradients as the piecewise path, bit for bit (Invariance tests, accumulation grid).
  std::vector<torch::Tensor> forward_in_one_piece(const MicroBatch& mb, size_t i, float& loss_value) {
    const auto t = Clock::now();
    const int64_t samples = mb.targets.size(0);
    const int64_t chunks = chunks_of(samples, policy_.chunk);
    model::ChunkLayout layout{samples, policy_.chunk, {}};
    for (int64_t c = 0; c < chunks; ++c) {
      calls_.before_chunk(next_chunk_++);
      layout.generators.push_back(at::detail::getDefaultCPUGenerator().clone());
    }
    if (policy_.probe) policy_.probe->set_phase("forward");
    torch::Tensor loss;
    {
      model::ChunkScope scope(std::move(layout));
      compat::AutocastGuard autocast(policy_.device, policy_.autocast_dtype);
      torch::Tensor logits = forward_(mb.inputs);
      loss = policy_.loss ? policy_.loss(logits, mb.targets) : cross_entropy_sum(logits, mb.targets);
    }
    RETRACE_CHECK(loss.dim() == 1 && loss.numel() == chunks, InvariantError,
                  "batch invariance in one piece: the loss came back as ", loss.sizes(), ", not one sum for each of ",
                  chunks, " chunks");
    loss = loss * inv_count_;
    if (i == 0 && faults_.nan_loss) {  // the first chunk's loss, as the piecewise path spoils it
      torch::Tensor spoil = torch::ones({chunks}, loss.options());
      spoil[0] = std::numeric_limits<float>::quiet_NaN();
      loss = loss * spoil;
    }
    if (faults_.loss_factor != 1.0) loss = loss * faults_.loss_factor;
    const torch::Tensor values = loss.detach().to(torch::kCPU).contiguous();
    for (int64_t c = 0; c < chunks; ++c) {
      const float v = values.data_ptr<float>()[c];
      loss_value = c == 0 ? v : loss_value + v;
      chunk_losses_.push_back(v);
    }
    record_micro_batch(mb, loss_value, t);
    return {loss.sum()};  // its gradient reaches every chunk's loss as 1, as each chunk's own would
  }

  void record_micro_batch(const MicroBatch& mb, float loss_value, Clock::time_point t) {
    r.micro_sizes.push_back(static_cast<uint32_t>(mb.targets.size(0)));
    r.micro_losses.push_back(static_cast<double>(loss_value) * static_cast<double>(count_) /
                             static_cast<double>(mb.targets.numel()));
    r.forward_ms += ms_since(t);
  }

  // After a micro-batch's forward: whether the step is skipped before any backward. A non-finite
  // micro-batch loss skips at once (one process: the scaler is not updated on this path); after the
  // last forward, the step's loss (over the ranks) is decided, and a non-finite one or a spike skips.
  bool skipped_after_forward(float loss_value, bool last) {
    // Data parallelism decides on non-finite losses with the global loss, after the last forward.
    if (!calls_.loss_over_ranks() && !std::isfinite(loss_value)) {
      r.loss = policy_.chunk > 0 ? calls_.fold_losses(chunk_losses_) : total_.item<float>();
      return skip(records::SkipReason::kNonFiniteLoss);
    }
    if (!last) return false;
    r.loss = policy_.chunk > 0 ? calls_.fold_losses(chunk_losses_) : calls_.reduce_loss(total_.item<float>());
    if (!std::isfinite(r.loss)) return skip(records::SkipReason::kNonFiniteLoss);
    if (policy_.spike && policy_.spike->is_spike(r.loss)) return skip(records::SkipReason::kLossSpike);
    return false;
  }

  // Backward on each (scaled) loss in order; gradients add up in .grad. After the last micro-batch
  // only, the ranks meet (one sync per effective step).
  void backward(std::vector<torch::Tensor>& losses, bool last) {
    const auto t = Clock::now();
    if (policy_.probe) policy_.probe->set_phase("backward");
    for (auto& loss : losses) {
      if (policy_.scaler) policy_.scaler->scale_loss(loss).backward();
      else loss.backward();
      calls_.after_chunk_backward();
    }
    if (last) calls_.after_last_backward();
    r.backward_ms += ms_since(t);
  }

  // Unscale and check the gradients (non-finite: the scaler backs off, skip), clip, step.
  void apply_gradients(torch::optim::Optimizer& optimizer, const std::vector<torch::Tensor>& params);

  StepResult r;

 private:
  bool skip(records::SkipReason why) {
    r.skipped = true;
    r.skip_reason = why;
    return true;
  }

  torch::nn::Module& model_;
  const ForwardFn& forward_;
  const StepPolicy& policy_;
  StepCalls& calls_;
  const StepFaults& faults_;
  const int64_t count_;
  const double inv_count_;
  torch::Tensor total_ = torch::zeros({}, torch::kFloat32);
  std::vector<float> chunk_losses_;
  uint64_t next_chunk_;
};

void StepRun::apply_gradients(torch::optim::Optimizer& optimizer, const std::vector<torch::Tensor>& params) {
  const auto t = Clock::now();
  if (faults_.inf_grad) {
    torch::NoGradGuard no_grad;
    for (const auto& item : model_.named_parameters())
      if (item.key() == *faults_.inf_grad && item.value().grad().defined())
        item.value().grad().view({-1})[0].fill_(std::numeric_limits<float>::infinity());
  }
  // With the scaler on, unscale and look for inf/NaN element by element; with it off the global
  // norm below is already non-finite when any element is, so no extra pass is needed.
  // Under ZeRO's reduce-scatter a rank holds its range's reduced gradients only: a non-finite one
  // makes the global norm non-finite on every rank, so all ranks skip together.
  const std::vector<torch::Tensor>& held = policy_.grad_params.empty() ? params : policy_.grad_params;
  LossScaler* scaler = policy_.scaler;
  const bool found_inf = scaler && scaler->enabled() ? scaler->unscale_and_check(held) : false;
  const std::optional<double> over_ranks = calls_.grad_norm();
  r.grad_norm_pre = over_ranks ? *over_ranks : global_grad_norm(params);
  if (found_inf || !std::isfinite(r.grad_norm_pre)) {
    if (scaler) scaler->update(/*found_inf=*/true);
    skip(records::SkipReason::kNonFiniteGrad);
    r.grad_norm_post = r.grad_norm_pre;
    r.optimizer_ms = ms_since(t);
    return;
  }
  const double clip_coef = policy_.max_norm / (r.grad_norm_pre + 1e-6);  // clip_grads' coefficient
  calls_.before_optimizer_step();
  if (policy_.max_norm > 0 && clip_coef < 1.0) {
    // The fused AdamW multiplies in its own pass, where the product costs almost nothing; any
    // other optimizer gets the gradients clipped here. The same bits either way.
    const std::vector<torch::Tensor>& stepped = policy_.optimizer_params.empty() ? params : policy_.optimizer_params;
    if (!defer_grad_scale(optimizer, stepped, clip_coef)) clip_grads(held, policy_.max_norm, r.grad_norm_pre);
    // The norm after clipping is the norm before times the clip coefficient (every gradient is
    // scaled by it); computing it instead of measuring it saves a pass over the gradients.
    r.grad_norm_post = r.grad_norm_pre * clip_coef;
  } else {
    r.grad_norm_post = r.grad_norm_pre;
  }
  optimizer.step();
  calls_.after_optimizer_step();
  if (policy_.probe) policy_.probe->after_optimizer(model_);
  if (scaler) scaler->update(/*found_inf=*/false);
  r.optimizer_ms = ms_since(t);
}

}  // namespace

StepResult train_step(torch::nn::Module& model, const ForwardFn& forward, torch::optim::Optimizer& optimizer,
                      const std::vector<MicroBatch>& micro_batches, const StepPolicy& policy,
                      const StepFaults& faults) {
  RETRACE_CHECK(!micro_batches.empty(), InvariantError, "train_step needs at least one micro-batch");
  adopt_thread_settings();
  const std::vector<torch::Tensor> params = model.parameters();
  for (const auto& p : params) p.mutable_grad() = torch::Tensor();  // zero_grad(set_to_none)
  if (policy.probe) policy.probe->step_start(model);
  int64_t local_count = 0;
  for (const auto& mb : micro_batches) local_count += mb.targets.numel();
  StepCalls one_process;
  StepRun run(model, forward, policy, policy.calls ? *policy.calls : one_process, faults,
              policy.global_count > 0 ? policy.global_count : local_count);
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    const bool last = i + 1 == micro_batches.size();
    float loss_value = 0;
    std::vector<torch::Tensor> losses = run.forward(micro_batches[i], i, loss_value);
    if (run.skipped_after_forward(loss_value, last)) return run.r;
    run.backward(losses, last);
  }
  if (policy.probe) policy.probe->after_backward(model);
  run.apply_gradients(optimizer, params);
  return run.r;
}

}  // namespace retrace::train
