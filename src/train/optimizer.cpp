#include "train/optimizer.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/torch_compat.h"
#include "model/lanes.h"
#include "train/adamw_kernel.h"

namespace retrace::train {
namespace {

// LibTorch's AdamW in one pass per parameter (adamw_kernel.h) instead of seven tensor operations
// with two temporaries: the same state, the same checkpoints, the same bits (torch_test checks
// that), about a third of the time on the MLP. It steps through LibTorch's own code whenever a
// parameter is not a dense contiguous float32 CPU tensor (CUDA, half precision), for AMSGrad, and
// when a closure is passed.
class FusedAdamW final : public torch::optim::AdamW {
  // Pieces of a parameter's update on the lanes must start at multiples of the kernel's 1024-float
  // chunk (adamw_kernel.cpp), whose lane sums need whole 64-byte blocks.
  static constexpr int64_t kPiece = model::kAfterBackwardPiece;
  static_assert(kPiece % 1024 == 0);

 public:
  using torch::optim::AdamW::AdamW;

  torch::Tensor step(LossClosure closure = nullptr) override {
    // Clipping's product left to this step (defer_grad_scale) is taken now, whichever way it goes.
    Deferred scale = std::move(deferred_);
    deferred_ = {};
    if (closure) return hand_over(scale, std::move(closure));
    // One pass finds every parameter's state and whether all of them can be fused; the update
    // starts only when they can, so a hand-over to LibTorch never follows a partial update.
    struct Item {
      torch::Tensor p;
      const torch::optim::AdamWOptions* options;
      torch::optim::AdamWParamState* state;  // nullptr: first step of this parameter
    };
    std::vector<Item> items;
    for (auto& group : param_groups()) {
      const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
      if (o.amsgrad()) return hand_over(scale);
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        if (!dense_f32_cpu(p, p.numel()) || !dense_f32_cpu(p.grad(), p.numel()) || p.data_ptr() == p.grad().data_ptr())
          return hand_over(scale);
        auto* s = static_cast<torch::optim::AdamWParamState*>(compat::find_param_state(*this, p));
        if (s && (!dense_f32_cpu(s->exp_avg(), p.numel()) || !dense_f32_cpu(s->exp_avg_sq(), p.numel())))
          return hand_over(scale);
        items.push_back({p, &o, s});
      }
    }
    ++fused_steps_;
    sums_.clear();  // this step's replace them; a parameter without a gradient now has none
    torch::NoGradGuard no_grad;
    // The deferred product goes into the pass for the parameters it updates; any other gradient it
    // covers (a parameter this optimizer does not hold) gets it here.
    std::vector<bool> scaled(items.size(), false);
    const float scale_f = static_cast<float>(scale.coef);
    if (scale.active) {
      std::unordered_map<const c10::TensorImpl*, size_t> item_of;
      for (size_t i = 0; i < items.size(); ++i) item_of.emplace(items[i].p.unsafeGetTensorImpl(), i);
      for (const auto& p : scale.params) {
        auto found = item_of.find(p.unsafeGetTensorImpl());
        if (found != item_of.end()) scaled[found->second] = true;
        else if (p.grad().defined()) p.mutable_grad().mul_(scale.coef);
      }
    }
    // Each parameter's update in pieces of at most kPiece floats, cut at multiples of the kernel's
    // chunk, which the two lanes take in turn (model/lanes.h) when there are enough of them:
    // elements are independent, so pieces keep the bits, and each piece's lane sums append to the
    // whole's (core/digest.h).
    struct Piece {
      size_t item;
      int64_t begin, end;
      LaneSums sums[3];
      uint64_t mixed[4];
    };
    std::vector<Piece> pieces;
    std::vector<AdamWCoefficients> coefficients;
    coefficients.reserve(items.size());
    int64_t floats = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      Item& it = items[i];
      if (!it.state) {
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(it.p, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(it.p, torch::MemoryFormat::Preserve));
        it.state = fresh.get();
        compat::set_param_state(*this, it.p, std::move(fresh));
      }
      auto& s = *it.state;
      const auto& o = *it.options;
      s.step(s.step() + 1);
      coefficients.push_back(adamw_coefficients(o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(),
                                                o.weight_decay(), s.step()));
      const int64_t n = it.p.numel();
      floats += n;
      for (int64_t b = 0; b < n || b == 0; b += kPiece) pieces.push_back({i, b, std::min(n, b + kPiece), {}, {}});
    }
    const KeptSums keep = keep_sums_;
    const bool mixed_keep = keep == KeptSums::kMixed || keep == KeptSums::kMixed4;
    const Mix mix = keep == KeptSums::kMixed4 ? Mix::kHalves : Mix::kFmix64;
    std::vector<uint64_t> first_positions(items.size(), 0);
    if (mixed_keep)
      for (size_t i = 0; i < items.size(); ++i) {
        auto found = positions_.find(items[i].p.unsafeGetTensorImpl());
        if (found != positions_.end()) first_positions[i] = found->second;
      }
    auto update = [&](int64_t first, int64_t last, int) {
      for (int64_t k = first; k < last; ++k) {
        Piece& piece = pieces[static_cast<size_t>(k)];
        Item& it = items[piece.item];
        auto& s = *it.state;
        const int64_t b = piece.begin;
        adamw_update(it.p.data_ptr<float>() + b, it.p.grad().data_ptr<float>() + b, s.exp_avg().data_ptr<float>() + b,
                     s.exp_avg_sq().data_ptr<float>() + b, piece.end - b, coefficients[piece.item], true,
                     keep == KeptSums::kLanes ? piece.sums : nullptr, scaled[piece.item] ? &scale_f : nullptr,
                     mixed_keep ? piece.mixed : nullptr, first_positions[piece.item] + static_cast<uint64_t>(b), mix);
      }
    };
    if (floats >= model::kAfterBackwardLanesFrom) model::for_each_tile(static_cast<int64_t>(pieces.size()), 1, update);
    else update(0, static_cast<int64_t>(pieces.size()), 0);
    size_t next_piece = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      Item& it = items[i];
      auto& s = *it.state;
      LaneSums sums[3];
      uint64_t mixed[4] = {0, 0, 0, 0};
      for (; next_piece < pieces.size() && pieces[next_piece].item == i; ++next_piece)
        for (int k = 0; k < 4; ++k) {
          if (k < 3) sums[k].append(pieces[next_piece].sums[k]);
          mixed[k] += pieces[next_piece].mixed[k];
        }
      // What an in-place tensor operation would do, so autograd's checks still see the writes.
      if (scaled[i]) it.p.grad().unsafeGetTensorImpl()->bump_version();
      const torch::Tensor grad = it.p.grad();
      const torch::Tensor* touched[4] = {&it.p, &s.exp_avg(), &s.exp_avg_sq(), &grad};
      for (int k = 0; k < 4; ++k) {
        c10::TensorImpl* impl = touched[k]->unsafeGetTensorImpl();
        if (k < 3) impl->bump_version();
        if (keep == KeptSums::kNone || (k == 3 && !mixed_keep)) continue;
        Known& known = sums_[impl];
        known.alive = Weak(touched[k]->getIntrusivePtr());
        known.version = impl->version_counter().current_version();
        known.data = impl->data();
        if (keep == KeptSums::kLanes) sums[k].finish(known.sums);
        else known.sums[0] = mixed[k];
      }
    }
    return {};
  }
  void defer_grad_scale(std::vector<torch::Tensor> params, double coef) {
    if (deferred_.active) apply(deferred_);  // two products in a row: the first one now
    deferred_ = {std::move(params), coef, true};
  }
  int64_t fused_steps() const { return fused_steps_; }
  void keep_sums(KeptSums keep) {
    keep_sums_ = keep;
    sums_.clear();
  }
  void forget_sums() { sums_.clear(); }
  void set_positions(const std::vector<torch::Tensor>& params, const std::vector<uint64_t>& first) {
    positions_.clear();
    for (size_t i = 0; i < params.size() && i < first.size(); ++i)
      positions_[params[i].unsafeGetTensorImpl()] = first[i];
    sums_.clear();
  }
  bool known_sums(const torch::Tensor& t, uint64_t out[16]) const {
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    auto it = sums_.find(impl);
    // The very tensor, unchanged since this optimizer wrote it: any write through a tensor
    // operation (a checkpoint's copy_, a load) bumps its version.
    if (it == sums_.end() || it->second.alive.expired() ||
        it->second.version != impl->version_counter().current_version() || it->second.data != impl->data())
      return false;
    std::memcpy(out, it->second.sums, sizeof it->second.sums);
    return true;
  }

 private:
  // A weak reference keeps the TensorImpl's address from being reused while the entry lives (a
  // gradient is a new tensor every step; a freed one's address could come back with version 0).
  using Weak = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
  struct Known {
    Weak alive{c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>()};
    uint32_t version = 0;
    const void* data = nullptr;
    uint64_t sums[16];
  };
  // Gradients to multiply by coef before the next update.
  struct Deferred {
    std::vector<torch::Tensor> params;
    double coef = 1.0;
    bool active = false;
  };
  static void apply(const Deferred& d) {
    if (!d.active) return;
    torch::NoGradGuard no_grad;
    for (const auto& p : d.params)
      if (p.grad().defined()) p.mutable_grad().mul_(d.coef);
  }
  // LibTorch's own step, after the deferred product as its own pass (clip_grads' bits).
  torch::Tensor hand_over(const Deferred& d, LossClosure closure = nullptr) {
    apply(d);
    return torch::optim::AdamW::step(std::move(closure));
  }
  Deferred deferred_;
  int64_t fused_steps_ = 0;
  KeptSums keep_sums_ = KeptSums::kNone;
  std::unordered_map<const c10::TensorImpl*, Known> sums_;
  std::unordered_map<const c10::TensorImpl*, uint64_t> positions_;
  static bool dense_f32_cpu(const torch::Tensor& t, int64_t numel) {
    return t.defined() && t.device().is_cpu() && t.layout() == torch::kStrided && t.scalar_type() == torch::kFloat32 &&
           t.is_contiguous() && t.numel() == numel;
  }
};

// LibTorch's AdamW with the first moment as PyTorch 2.x's Python AdamW computes it (optim.adamw_moment
// = "lerp"): the single-tensor path of torch.optim.AdamW(foreach=False), op for op and with the same
// double scalars: param.mul_(1 - lr * wd); exp_avg.lerp_(grad, 1 - beta1); exp_avg_sq.mul_(beta2)
// .addcmul_(grad, grad, 1 - beta2); denom = (exp_avg_sq.sqrt() / sqrt(1 - beta2^t)).add_(eps);
// param.addcdiv_(exp_avg, denom, -lr / (1 - beta1^t)). The state is LibTorch's AdamW's, so
// checkpoints are the same files. No AMSGrad (no key asks for it).
class LerpAdamW final : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;

  torch::Tensor step(LossClosure closure = nullptr) override {
    torch::NoGradGuard no_grad;
    torch::Tensor loss;
    if (closure) {
      at::AutoGradMode enable_grad(true);
      loss = closure();
    }
    for (auto& group : param_groups()) {
      const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        const torch::Tensor& grad = p.grad();
        if (o.weight_decay() != 0) p.mul_(1 - o.lr() * o.weight_decay());
        auto* s = static_cast<torch::optim::AdamWParamState*>(compat::find_param_state(*this, p));
        if (!s) {
          auto fresh = std::make_unique<torch::optim::AdamWParamState>();
          fresh->step(0);
          fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
          fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
          s = fresh.get();
          compat::set_param_state(*this, p, std::move(fresh));
        }
        s->step(s->step() + 1);
        const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
        const double t = static_cast<double>(s->step());
        const double bias_correction1 = 1 - std::pow(beta1, t);
        const double bias_correction2 = 1 - std::pow(beta2, t);
        s->exp_avg().lerp_(grad, 1 - beta1);
        s->exp_avg_sq().mul_(beta2).addcmul_(grad, grad, 1 - beta2);
        const torch::Tensor denom = (s->exp_avg_sq().sqrt() / std::pow(bias_correction2, 0.5)).add_(o.eps());
        p.addcdiv_(s->exp_avg(), denom, -(o.lr() / bias_correction1));
      }
    }
    return loss;
  }
};

}  // namespace

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimConfig& c, torch::nn::Module& model, bool owned) {
  return make_optimizer(c, model.parameters(), owned);
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimConfig& c, const std::vector<torch::Tensor>& params,
                                                        bool owned) {
  if (c.name == OptimizerKind::kSgd) {
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(c.lr).momentum(c.momentum).nesterov(c.nesterov).weight_decay(c.weight_decay));
  }
  auto options = torch::optim::AdamWOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay);
  if (c.adamw_moment == AdamwMoment::kLerp) return std::make_unique<LerpAdamW>(params, options);
  if (c.fused && (compat::kFusedAdamWMatchesLibTorch || owned)) return std::make_unique<FusedAdamW>(params, options);
  return std::make_unique<torch::optim::AdamW>(params, options);
}

bool fused_sums(const torch::optim::Optimizer& opt, const torch::Tensor& t, uint64_t out[16]) {
  const auto* f = dynamic_cast<const FusedAdamW*>(&opt);
  return f && f->known_sums(t, out);
}

void keep_sums(torch::optim::Optimizer& opt, KeptSums kind) {
  if (auto* f = dynamic_cast<FusedAdamW*>(&opt)) f->keep_sums(kind);
}

void set_sum_positions(torch::optim::Optimizer& opt, const std::vector<torch::Tensor>& params,
                       const std::vector<uint64_t>& first_positions) {
  if (auto* f = dynamic_cast<FusedAdamW*>(&opt)) f->set_positions(params, first_positions);
}

bool defer_grad_scale(torch::optim::Optimizer& opt, std::vector<torch::Tensor> params, double coef) {
  auto* f = dynamic_cast<FusedAdamW*>(&opt);
  if (!f) return false;
  f->defer_grad_scale(std::move(params), coef);
  return true;
}

int64_t fused_adamw_steps(const torch::optim::Optimizer& opt) {
  const auto* f = dynamic_cast<const FusedAdamW*>(&opt);
  return f ? f->fused_steps() : -1;
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) group.options().set_lr(lr);
}

NamedTensors optimizer_state(torch::optim::Optimizer& opt, const torch::nn::Module& model, OptimizerKind optim_name) {
  NamedTensors out;
  for (const auto& item : model.named_parameters()) {
    auto* st = compat::find_param_state(opt, item.value());
    if (!st) continue;
    const std::string& n = item.key();
    if (optim_name == OptimizerKind::kAdamW) {
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

std::vector<std::string> optimizer_fields(OptimizerKind kind) {
  if (kind == OptimizerKind::kAdamW) return {"step", "exp_avg", "exp_avg_sq"};
  return {"momentum_buffer"};
}

void check_optimizer_state(const NamedTensors& state, const torch::nn::Module& model, OptimizerKind kind,
                           const std::string& where, const std::function<int64_t(size_t)>* part_length) {
  NamedTensors parameters;
  for (const auto& item : model.named_parameters()) parameters.emplace_back(item.key(), item.value());
  check_optimizer_state(state, parameters, kind, where, part_length);
}

void check_optimizer_state(const NamedTensors& state, const NamedTensors& parameters, OptimizerKind kind,
                           const std::string& where, const std::function<int64_t(size_t)>* part_length) {
  const std::vector<std::string> fields = optimizer_fields(kind);
  std::map<std::string, size_t> param_index;
  std::vector<torch::Tensor> params;
  for (const auto& [name, t] : parameters) {
    param_index.emplace(name, params.size());
    params.push_back(t);
  }
  std::map<std::string, std::map<std::string, const torch::Tensor*>> by_param;
  for (const auto& [name, t] : state) {
    const size_t slash = name.rfind('/');
    const std::string param = slash == std::string::npos ? name : name.substr(0, slash);
    const std::string field = slash == std::string::npos ? std::string() : name.substr(slash + 1);
    RETRACE_CHECK(param_index.count(param) && std::find(fields.begin(), fields.end(), field) != fields.end(),
                  FormatError, where, ": optimizer state entry \"", name,
                  "\" is not a field of a parameter of this "
                  "model (",
                  optimizer_name(kind), " keeps ", fields.size() == 1 ? fields[0] : "step, exp_avg and exp_avg_sq",
                  " per parameter); the checkpoint belongs to another model or optimizer, or was altered");
    RETRACE_CHECK(t.defined(), FormatError, where, ": optimizer state entry ", name, " holds no tensor");
    const torch::Tensor& p = params[param_index.at(param)];
    const int64_t part = part_length ? (*part_length)(param_index.at(param)) : -1;
    if (field == "step") {
      RETRACE_CHECK(t.scalar_type() == torch::kInt64, FormatError, where, ": optimizer state entry ", name, " is ",
                    c10::toString(t.scalar_type()), "; a step count is Long (int64)");
      if (part == 0 && t.numel() == 0) continue;  // a ZeRO rank's: a parameter it owns nothing of
      RETRACE_CHECK(t.dim() == 0 && t.numel() == 1, FormatError, where, ": optimizer state entry ", name, " has shape ",
                    t.sizes(), " (", t.numel(), " elements); a step count is one number (shape [])");
      const int64_t step = t.item<int64_t>();
      RETRACE_CHECK(step >= 0, FormatError, where, ": optimizer state entry ", name, " is ", step,
                    "; a step count is not negative");
    } else {
      RETRACE_CHECK(t.scalar_type() == p.scalar_type(), FormatError, where, ": optimizer state entry ", name, " is ",
                    c10::toString(t.scalar_type()), ", the parameter ", param, " is ", c10::toString(p.scalar_type()),
                    "; the state of a parameter has its dtype");
      const bool whole = t.sizes() == p.sizes();
      const bool own_part = part >= 0 && t.dim() == 1 && t.numel() == part;
      RETRACE_CHECK(whole || own_part, FormatError, where, ": optimizer state entry ", name, " has shape ", t.sizes(),
                    ", the parameter ", param, " has ", p.sizes(),
                    part >= 0 ? " (or this rank's " + std::to_string(part) + " elements of it)" : std::string());
    }
    by_param[param][field] = &t;
  }
  if (kind != OptimizerKind::kAdamW) return;
  for (const auto& [param, have] : by_param) {
    auto step = have.find("step");
    if (step == have.end() || step->second->numel() == 0) continue;
    for (const char* field : {"exp_avg", "exp_avg_sq"})
      RETRACE_CHECK(have.count(field), FormatError, where, ": optimizer state of ", param, " has a step count but no ",
                    field, "; the checkpoint lost part of the optimizer's state");
  }
}

void load_optimizer_state(torch::optim::Optimizer& opt, const torch::nn::Module& model, OptimizerKind optim_name,
                          const NamedTensors& state, bool adopt) {
  // New state tensors: whatever sums the fused AdamW kept are of tensors that are going away.
  if (auto* f = dynamic_cast<FusedAdamW*>(&opt)) f->forget_sums();
  check_optimizer_state(state, model, optim_name, "the optimizer state to load");
  std::map<std::string, torch::Tensor> by_name(state.begin(), state.end());
  auto take = [&](const std::string& key, const torch::Tensor& like) -> torch::Tensor {
    auto it = by_name.find(key);
    RETRACE_CHECK(it != by_name.end(), FormatError, "optimizer state entry ", key, " is missing");
    if (like.defined())
      RETRACE_CHECK(it->second.sizes() == like.sizes(), FormatError, "optimizer state entry ", key, " has shape ",
                    it->second.sizes(), ", expected ", like.sizes());
    if (adopt && (!like.defined() || it->second.device() == like.device())) return it->second;
    return like.defined() ? it->second.to(like.device()).clone() : it->second.clone();
  };
  for (const auto& item : model.named_parameters()) {
    const std::string& n = item.key();
    const auto& p = item.value();
    if (optim_name == OptimizerKind::kAdamW) {
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
