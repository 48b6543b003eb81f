#include "train/step.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>

#include "core/error.h"
#include "core/torch_compat.h"
#include "model/lanes.h"
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

double global_grad_norm(const std::vector<torch::Tensor>& params) {
  // Each gradient's norm is the one ATen call it always was, now on one of the two lanes; the
  // norms are stacked in parameter order, so the result has the same bits.
  const std::vector<torch::Tensor> grads = gradients(params);
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

StepResult train_step(torch::nn::Module& model, const ForwardFn& forward, torch::optim::Optimizer& optimizer,
                      const std::vector<MicroBatch>& micro_batches, const StepPolicy& policy,
                      const StepFaults& faults) {
  RETRACE_CHECK(!micro_batches.empty(), InvariantError, "train_step needs at least one micro-batch");
  adopt_thread_settings();
  StepCalls one_process;
  StepCalls& calls = policy.calls ? *policy.calls : one_process;
  StepResult r;
  const std::vector<torch::Tensor> params = model.parameters();
  for (const auto& p : params) p.mutable_grad() = torch::Tensor();  // zero_grad(set_to_none)
  if (policy.probe) policy.probe->step_start(model);

  int64_t local_count = 0;
  for (const auto& mb : micro_batches) local_count += mb.targets.numel();
  const int64_t count = policy.global_count > 0 ? policy.global_count : local_count;
  const double inv_count = 1.0 / static_cast<double>(count);

  // Data parallelism decides on non-finite losses with the global loss, after the last forward.
  const bool collective_loss = calls.loss_over_ranks();
  torch::Tensor total = torch::zeros({}, torch::kFloat32);
  std::vector<float> chunk_losses;
  uint64_t next_chunk = policy.first_chunk;
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    const auto& mb = micro_batches[i];
    const bool last = i + 1 == micro_batches.size();
    auto t = Clock::now();
    // The pieces computed alone: the micro-batch itself, or its chunks (batch invariance).
    std::vector<MicroBatch> pieces;
    if (policy.chunk > 0) {
      const int64_t n = mb.targets.size(0);
      RETRACE_CHECK(n % policy.chunk == 0, ConfigError, "a micro-batch of ", n,
                    " samples does not split into whole chunks of runtime.invariance_chunk = ", policy.chunk,
                    "; choose data.batch_size, train.accum_steps and the world size so that it does");
      for (int64_t lo = 0; lo < n; lo += policy.chunk)
        pieces.push_back({mb.inputs.slice(0, lo, lo + policy.chunk), mb.targets.slice(0, lo, lo + policy.chunk)});
    } else {
      pieces.push_back(mb);
    }
    std::vector<torch::Tensor> losses;
    float loss_value = 0;
    if (policy.probe) policy.probe->set_phase("forward");
    for (size_t j = 0; j < pieces.size(); ++j) {
      if (policy.chunk > 0) calls.before_chunk(next_chunk++);
      torch::Tensor loss;
      {
        compat::AutocastGuard autocast(policy.device, policy.autocast_dtype);
        torch::Tensor logits = forward(pieces[j].inputs);
        loss = (policy.loss ? policy.loss(logits, pieces[j].targets) : cross_entropy_sum(logits, pieces[j].targets)) *
               inv_count;
      }
      if (i == 0 && j == 0 && faults.nan_loss) loss = loss * std::numeric_limits<float>::quiet_NaN();
      if (faults.loss_factor != 1.0) loss = loss * faults.loss_factor;
      const float v = loss.item<float>();
      loss_value = j == 0 ? v : loss_value + v;
      if (policy.chunk > 0) chunk_losses.push_back(v);
      else total = total + loss.detach().to(torch::kCPU);
      losses.push_back(std::move(loss));
    }
    r.micro_sizes.push_back(static_cast<uint32_t>(mb.targets.size(0)));
    r.micro_losses.push_back(static_cast<double>(loss_value) * static_cast<double>(count) /
                             static_cast<double>(mb.targets.numel()));
    r.forward_ms += ms_since(t);
    if (!collective_loss && !std::isfinite(loss_value)) {
      r.loss = policy.chunk > 0 ? calls.fold_losses(chunk_losses) : total.item<float>();
      r.skipped = true;
      r.skip_reason = records::SkipReason::kNonFiniteLoss;  // the scaler is not updated on this path
      return r;
    }
    if (last) {
      if (policy.chunk > 0) {
        r.loss = calls.fold_losses(chunk_losses);
      } else {
        r.loss = calls.reduce_loss(total.item<float>());
      }
      if (!std::isfinite(r.loss)) {
        r.skipped = true;
        r.skip_reason = records::SkipReason::kNonFiniteLoss;
        return r;
      }
      if (policy.spike && policy.spike->is_spike(r.loss)) {
        r.skipped = true;
        r.skip_reason = records::SkipReason::kLossSpike;
        return r;
      }
    }
    t = Clock::now();
    if (policy.probe) policy.probe->set_phase("backward");
    for (auto& loss : losses) {
      if (policy.scaler) policy.scaler->scale_loss(loss).backward();
      else loss.backward();
      calls.after_chunk_backward();
    }
    if (last) calls.after_last_backward();
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
  // Under ZeRO's reduce-scatter a rank holds its range's reduced gradients only: a non-finite one
  // makes the global norm non-finite on every rank, so all ranks skip together.
  const std::vector<torch::Tensor>& held = policy.grad_params.empty() ? params : policy.grad_params;
  const bool found_inf = policy.scaler && policy.scaler->enabled() ? policy.scaler->unscale_and_check(held) : false;
  const std::optional<double> over_ranks = calls.grad_norm();
  r.grad_norm_pre = over_ranks ? *over_ranks : global_grad_norm(params);
  if (found_inf || !std::isfinite(r.grad_norm_pre)) {
    if (policy.scaler) policy.scaler->update(/*found_inf=*/true);
    r.skipped = true;
    r.skip_reason = records::SkipReason::kNonFiniteGrad;
    r.grad_norm_post = r.grad_norm_pre;
    r.optimizer_ms = ms_since(t);
    return r;
  }
  const double clip_coef = policy.max_norm / (r.grad_norm_pre + 1e-6);  // clip_grads' coefficient
  calls.before_optimizer_step();
  if (policy.max_norm > 0 && clip_coef < 1.0) {
    // The fused AdamW multiplies in its own pass, where the product costs almost nothing; any
    // other optimizer gets the gradients clipped here. The same bits either way.
    const std::vector<torch::Tensor>& stepped = policy.optimizer_params.empty() ? params : policy.optimizer_params;
    if (!defer_grad_scale(optimizer, stepped, clip_coef)) clip_grads(held, policy.max_norm, r.grad_norm_pre);
    // The norm after clipping is the norm before times the clip coefficient (every gradient is
    // scaled by it); computing it instead of measuring it saves a pass over the gradients.
    r.grad_norm_post = r.grad_norm_pre * clip_coef;
  } else {
    r.grad_norm_post = r.grad_norm_pre;
  }
  optimizer.step();
  calls.after_optimizer_step();
  if (policy.probe) policy.probe->after_optimizer(model);
  if (policy.scaler) policy.scaler->update(/*found_inf=*/false);
  r.optimizer_ms = ms_since(t);
  return r;
}

}  // namespace retrace::train
