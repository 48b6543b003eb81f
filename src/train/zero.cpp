#include "train/zero.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <unordered_map>

#include "core/error.h"
#include "core/torch_compat.h"
#include "train/optimizer.h"

namespace retrace::train {

std::vector<int64_t> ZeroShard::bounds(const std::vector<int64_t>& numels, uint32_t world) {
  RETRACE_CHECK(world > 0, InvariantError, "ZeroShard::bounds: world size 0");
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (int64_t n : numels) {
    offsets.push_back(total);
    total += n;
  }
  std::vector<int64_t> out = {0};
  size_t t = 0;
  for (uint32_t k = 1; k < world; ++k) {
    // The even share, exact in 128-bit arithmetic.
    int64_t cut = static_cast<int64_t>(static_cast<__int128>(total) * k / world);
    while (t + 1 < numels.size() && offsets[t + 1] <= cut) ++t;
    if (t < numels.size() && cut > offsets[t]) cut = offsets[t] + (cut - offsets[t]) / kAlign * kAlign;
    out.push_back(std::max(cut, out.back()));
  }
  out.push_back(total);
  return out;
}

ZeroShard::ZeroShard(std::vector<torch::Tensor> params, uint32_t rank, uint32_t world)
    : params_(std::move(params)), rank_(rank), world_(world) {
  RETRACE_CHECK(!params_.empty(), ConfigError, "runtime.zero_stage = 1: the model has no parameters to split; use 0");
  std::vector<int64_t> numels;
  for (const auto& p : params_) {
    RETRACE_CHECK(p.is_contiguous() && p.scalar_type() == params_.front().scalar_type(), ConfigError,
                  "runtime.zero_stage = 1 needs contiguous parameters of one dtype; this model has a ",
                  c10::toString(p.scalar_type()), " parameter of shape ", p.sizes(), " besides ",
                  c10::toString(params_.front().scalar_type()), "; use runtime.zero_stage = 0");
    offsets_.push_back(numels.empty() ? 0 : offsets_.back() + numels.back());
    numels.push_back(p.numel());
  }
  bounds_ = bounds(numels, world_);
  // Every rank's parts once: the all-gather walks them each window of each step.
  for (uint32_t r = 0; r < world_; ++r) {
    padded_ = std::max(padded_, bounds_[r + 1] - bounds_[r]);
    std::vector<Part>& out = parts_.emplace_back();
    for (size_t i = 0; i < params_.size(); ++i) {
      const int64_t b = std::max(bounds_[r], offsets_[i]),
                    e = std::min(bounds_[r + 1], offsets_[i] + params_[i].numel());
      if (b < e) out.push_back({i, b - offsets_[i], e - offsets_[i]});
    }
  }
  mine_ = parts_[rank_];
  for (const Part& part : mine_)
    views_.push_back(params_[part.param].detach().view({-1}).narrow(0, part.begin, part.end - part.begin));
}

void ZeroShard::bind_grads() const {
  for (size_t k = 0; k < mine_.size(); ++k) {
    const torch::Tensor& g = params_[mine_[k].param].grad();
    torch::Tensor& view_grad = views_[k].mutable_grad();
    view_grad = g.defined() ? g.view({-1}).narrow(0, mine_[k].begin, mine_[k].end - mine_[k].begin) : torch::Tensor();
  }
}

void ZeroShard::for_window(uint32_t r, int64_t offset, int64_t n,
                           const std::function<void(const Part&, int64_t, int64_t, int64_t)>& fn) const {
  int64_t at = 0;  // the part's first element's position in rank r's range
  for (const Part& part : parts_[r]) {
    const int64_t len = part.end - part.begin;
    const int64_t lo = std::max(at, offset), hi = std::min(at + len, offset + n);
    if (lo < hi) fn(part, part.begin + (lo - at), lo - offset, hi - lo);
    at += len;
  }
}

void ZeroShard::pack(int64_t offset, torch::Tensor& out) const {
  torch::NoGradGuard no_grad;
  out.zero_();
  for_window(rank_, offset, out.numel(), [&](const Part& part, int64_t first, int64_t at, int64_t n) {
    out.narrow(0, at, n).copy_(params_[part.param].detach().view({-1}).narrow(0, first, n));
  });
}

void ZeroShard::unpack(const std::vector<torch::Tensor>& gathered, int64_t offset) const {
  RETRACE_CHECK(gathered.size() == world_, InvariantError, "ZeroShard::unpack: ", gathered.size(), " ranges for ",
                world_, " ranks");
  torch::NoGradGuard no_grad;
  for (uint32_t r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    for_window(r, offset, gathered[r].numel(), [&](const Part& part, int64_t first, int64_t at, int64_t n) {
      params_[part.param].detach().view({-1}).narrow(0, first, n).copy_(gathered[r].narrow(0, at, n));
    });
  }
}

int64_t ZeroShard::window() const {
  return std::max(kAlign, std::min(kGatherWindow, 8 * kGatherWindow / static_cast<int64_t>(world_)));
}

void ZeroShard::all_gather(const std::function<std::vector<torch::Tensor>(const torch::Tensor&)>& gather) const {
  if (padded_ == 0) return;
  const int64_t width = this->window();
  // One send buffer for every window (the last one narrower), on the parameters' device.
  torch::Tensor buffer = torch::empty({std::min(padded_, width)}, params_.front().options().requires_grad(false));
  for (int64_t offset = 0; offset < padded_; offset += width) {
    torch::Tensor window = buffer.narrow(0, 0, std::min(width, padded_ - offset));
    pack(offset, window);
    unpack(gather(window), offset);
  }
}

void ZeroShard::pack_grads(int64_t offset, torch::Tensor& rows) const {
  torch::NoGradGuard no_grad;
  rows.zero_();
  for (uint32_t q = 0; q < world_; ++q) {
    torch::Tensor row = rows[q];
    for_window(q, offset, rows.size(1), [&](const Part& part, int64_t first, int64_t at, int64_t count) {
      const torch::Tensor& g = params_[part.param].grad();
      if (g.defined()) row.narrow(0, at, count).copy_(g.view({-1}).narrow(0, first, count));
    });
  }
}

void ZeroShard::fold_grads(const torch::Tensor& rows, int64_t offset) const {
  RETRACE_CHECK(rows.dim() == 2 && rows.size(0) == static_cast<int64_t>(world_), InvariantError,
                "ZeroShard::fold_grads: rows of shape ", rows.sizes(), " for ", world_, " ranks");
  torch::NoGradGuard no_grad;
  // Rank order, one rank at a time: the sum's bits do not depend on how the rows arrived.
  torch::Tensor sum = rows[0].clone();
  for (uint32_t q = 1; q < world_; ++q) sum.add_(rows[q]);
  for_window(rank_, offset, rows.size(1), [&](const Part& part, int64_t first, int64_t at, int64_t count) {
    const torch::Tensor& g = params_[part.param].grad();
    if (g.defined()) g.view({-1}).narrow(0, first, count).copy_(sum.narrow(0, at, count));
  });
}

void ZeroShard::reduce_scatter(const std::function<torch::Tensor(const torch::Tensor&)>& exchange,
                               int64_t window) const {
  if (window == 0) window = this->window();
  RETRACE_CHECK(window > 0, InvariantError, "ZeroShard::reduce_scatter: window ", window);
  if (padded_ == 0) return;
  // One send buffer for every window (the last one narrower), on the parameters' device.
  torch::Tensor buffer = torch::empty({static_cast<int64_t>(world_), std::min(padded_, window)},
                                      params_.front().options().requires_grad(false));
  for (int64_t offset = 0; offset < padded_; offset += window) {
    torch::Tensor rows = buffer.narrow(1, 0, std::min(window, padded_ - offset));
    pack_grads(offset, rows);
    fold_grads(exchange(rows), offset);
  }
}

std::vector<double> ZeroShard::grad_square_norms() const {
  torch::NoGradGuard no_grad;
  std::vector<double> out(params_.size(), 0.0);
  for (const Part& part : mine_) {
    const torch::Tensor& g = params_[part.param].grad();
    if (!g.defined()) continue;
    // Accumulated in double, a window at a time (a float32 norm of a million elements is off by
    // about 1e-6 relative; the double copy stays a few MiB). ATen's reduction, not a BLAS dot: its
    // order is pinned with the CPU capability (train/numerics.h).
    double square = 0;
    for (int64_t b = part.begin; b < part.end; b += kGatherWindow) {
      const double norm =
          g.view({-1}).narrow(0, b, std::min(kGatherWindow, part.end - b)).to(torch::kDouble).norm(2).item<double>();
      square += norm * norm;
    }
    out[part.param] = square;
  }
  return out;
}

double zero_grad_norm(const std::vector<std::vector<double>>& by_rank) {
  double total = 0;
  const size_t n = by_rank.empty() ? 0 : by_rank.front().size();
  for (const auto& rank : by_rank)
    RETRACE_CHECK(rank.size() == n, InvariantError, "zero_grad_norm: a rank sent ", rank.size(), " norms, rank 0 ", n);
  for (size_t t = 0; t < n; ++t) {
    double square = 0;
    for (const auto& rank : by_rank) square += rank[t];
    total += square;
  }
  return static_cast<double>(static_cast<float>(std::sqrt(total)));
}

namespace {

std::vector<std::string> param_names(const torch::nn::Module& model) {
  std::vector<std::string> out;
  for (const auto& item : model.named_parameters()) out.push_back(item.key());
  return out;
}

// The field's tensor in `state` (undefined when the optimizer keeps none).
torch::Tensor field_of(torch::optim::OptimizerParamState& state, OptimizerKind kind, size_t field) {
  if (kind == OptimizerKind::kAdamW) {
    auto& s = static_cast<torch::optim::AdamWParamState&>(state);
    if (field == 0) return torch::tensor(static_cast<int64_t>(s.step()), torch::kInt64);
    return field == 1 ? s.exp_avg() : s.exp_avg_sq();
  }
  return static_cast<torch::optim::SGDParamState&>(state).momentum_buffer();
}

}  // namespace

NamedTensors zero_optimizer_state(torch::optim::Optimizer& opt, const ZeroShard& zero, const torch::nn::Module& model,
                                  OptimizerKind kind, std::vector<SliceOf>& slices) {
  const std::vector<std::string> names = param_names(model);
  const std::vector<std::string> fields = optimizer_fields(kind);
  NamedTensors out;
  slices.clear();
  for (size_t k = 0; k < zero.mine().size(); ++k) {
    const ZeroShard::Part& part = zero.mine()[k];
    auto* st = compat::find_param_state(opt, zero.views()[k]);
    if (!st) continue;
    const torch::Tensor& p = zero.params()[part.param];
    for (size_t f = 0; f < fields.size(); ++f) {
      torch::Tensor t = field_of(*st, kind, f);
      if (!t.defined()) continue;
      out.emplace_back(names[part.param] + "/" + fields[f], t);
      if (t.dim() == 0) slices.push_back({{}, 0, part.begin == 0});  // the step count: whole
      else slices.push_back({std::vector<int64_t>(p.sizes().begin(), p.sizes().end()), part.begin, true});
    }
  }
  return out;
}

std::function<int64_t(size_t)> zero_part_lengths(const ZeroShard& zero) {
  std::vector<int64_t> length(zero.params().size(), 0);
  for (const ZeroShard::Part& part : zero.mine()) length[part.param] += part.end - part.begin;
  return [length](size_t param) { return param < length.size() ? length[param] : int64_t{0}; };
}

void zero_load_optimizer_state(torch::optim::Optimizer& opt, const ZeroShard& zero, const torch::nn::Module& model,
                               OptimizerKind kind, const NamedTensors& state) {
  const std::vector<std::string> names = param_names(model);
  const std::function<int64_t(size_t)> part_length = zero_part_lengths(zero);
  check_optimizer_state(state, model, kind, "the optimizer state to load", &part_length);
  std::map<std::string, torch::Tensor> by_name(state.begin(), state.end());
  // This part's elements of entry `key`: the whole tensor's slice, or the part itself.
  auto take = [&](const std::string& key, const ZeroShard::Part& part, const torch::Tensor& p) -> torch::Tensor {
    auto it = by_name.find(key);
    RETRACE_CHECK(it != by_name.end(), FormatError, "optimizer state entry ", key, " is missing");
    const torch::Tensor& t = it->second;
    const int64_t n = part.end - part.begin;
    torch::Tensor flat;
    if (t.sizes() == p.sizes()) flat = t.reshape({-1}).narrow(0, part.begin, n);
    else if (t.dim() == 1 && t.numel() == n) flat = t;
    else
      RETRACE_FAIL(FormatError, "optimizer state entry ", key, " has shape ", t.sizes(), ", expected ", p.sizes(),
                   " (or this rank's ", n, " elements of it)");
    return flat.to(p.device()).clone();
  };
  for (size_t k = 0; k < zero.mine().size(); ++k) {
    const ZeroShard::Part& part = zero.mine()[k];
    const std::string& n = names[part.param];
    const torch::Tensor& p = zero.params()[part.param];
    const torch::Tensor& view = zero.views()[k];
    if (kind == OptimizerKind::kAdamW) {
      auto step = by_name.find(n + "/step");
      if (step == by_name.end()) continue;  // no state yet for this parameter
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(step->second.item<int64_t>());
      s->exp_avg(take(n + "/exp_avg", part, p));
      s->exp_avg_sq(take(n + "/exp_avg_sq", part, p));
      compat::set_param_state(opt, view, std::move(s));
    } else {
      if (!by_name.count(n + "/momentum_buffer")) continue;
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(take(n + "/momentum_buffer", part, p));
      compat::set_param_state(opt, view, std::move(s));
    }
  }
}

namespace {

// Where the sums of zero_digests lie in its vector: the model's tensors first, then per parameter a
// (holders, sum) pair of its gradient, then (with the optimizer) per parameter and field a
// (holders, sum) pair.
struct SumLayout {
  size_t model_count = 0, params = 0, optim_from = 0;
  std::vector<std::string> fields;  // the optimizer's fields
};

// This rank's sums of its ranges, in a fixed order every rank shares (SumLayout).
std::vector<uint64_t> range_sums(const NamedTensors& model_state, torch::optim::Optimizer& opt, const ZeroShard& zero,
                                 OptimizerKind kind, bool with_optimizer, const KnownSums* known, Mix mix,
                                 SumLayout& at) {
  const auto mixed = [known, mix](const torch::Tensor& t, uint64_t first_position) {
    uint64_t out[16];
    if (known && t.defined() && (*known)(t, out)) return out[0];
    return tensor_mixed_sum(t, first_position, mix);
  };
  std::unordered_map<const c10::TensorImpl*, size_t> param_of;
  for (size_t i = 0; i < zero.params().size(); ++i) param_of.emplace(zero.params()[i].unsafeGetTensorImpl(), i);
  std::vector<uint64_t> local;
  for (const auto& [name, t] : model_state) {
    auto found = param_of.find(t.unsafeGetTensorImpl());
    uint64_t s = 0;
    if (found == param_of.end()) {
      if (zero.rank() == 0) s = tensor_mixed_sum(t, 0, mix);  // a buffer: every rank holds it whole
    } else {
      for (size_t k = 0; k < zero.mine().size(); ++k)
        if (zero.mine()[k].param == found->second)
          s += mixed(zero.views()[k], static_cast<uint64_t>(zero.mine()[k].begin));
    }
    local.push_back(s);
  }
  const size_t model_count = local.size(), params = zero.params().size();
  at.model_count = model_count;
  at.params = params;
  local.resize(model_count + params * 2, 0);
  for (size_t k = 0; k < zero.mine().size(); ++k) {
    const ZeroShard::Part& part = zero.mine()[k];
    const torch::Tensor& g = zero.views()[k].grad();
    if (!g.defined()) continue;
    uint64_t* slot = &local[model_count + part.param * 2];
    slot[0] += 1;
    slot[1] += mixed(g, static_cast<uint64_t>(part.begin));
  }
  at.fields = optimizer_fields(kind);
  const std::vector<std::string>& fields = at.fields;
  const size_t optim_from = local.size();
  at.optim_from = optim_from;
  if (with_optimizer) {
    local.resize(optim_from + params * fields.size() * 2, 0);
    for (size_t k = 0; k < zero.mine().size(); ++k) {
      const ZeroShard::Part& part = zero.mine()[k];
      auto* st = compat::find_param_state(opt, zero.views()[k]);
      if (!st) continue;
      for (size_t f = 0; f < fields.size(); ++f) {
        const torch::Tensor t = field_of(*st, kind, f);
        if (!t.defined()) continue;
        uint64_t* slot = &local[optim_from + (part.param * fields.size() + f) * 2];
        slot[0] += 1;
        if (t.dim() == 0) slot[1] += part.begin == 0 ? tensor_mixed_sum(t, 0, mix) : 0;  // the step count, once
        else slot[1] += mixed(t, static_cast<uint64_t>(part.begin));
      }
    }
  }
  return local;
}

// The digests of the sums added over the ranks: every tensor's entry as a whole tensor's.
ZeroDigests digests_of_sums(const std::vector<uint64_t>& total, const SumLayout& at, const NamedTensors& model_state,
                            const ZeroShard& zero, const torch::nn::Module& model, OptimizerKind kind,
                            bool with_optimizer) {
  const size_t model_count = at.model_count, params = at.params, optim_from = at.optim_from;
  const std::vector<std::string>& fields = at.fields;
  std::vector<MixedEntry> model_entries;
  for (size_t i = 0; i < model_count; ++i) {
    const torch::Tensor& t = model_state[i].second;
    model_entries.push_back({model_state[i].first, t.defined(), t.defined() ? t.scalar_type() : torch::kFloat32,
                             t.defined() ? t.sizes().vec() : std::vector<int64_t>{}, total[i]});
  }
  const std::vector<std::string> names = param_names(model);
  std::vector<MixedEntry> grad_entries;
  for (size_t i = 0; i < params; ++i) {
    const uint64_t* slot = &total[model_count + i * 2];
    const torch::Tensor& p = zero.params()[i];
    grad_entries.push_back({names[i], slot[0] > 0, p.scalar_type(), p.sizes().vec(), slot[1]});
  }
  ZeroDigests out{digest_mixed(std::move(model_entries)), {}, digest_mixed(std::move(grad_entries))};
  if (with_optimizer) {
    std::vector<MixedEntry> entries;
    for (size_t i = 0; i < params; ++i)
      for (size_t f = 0; f < fields.size(); ++f) {
        const uint64_t* slot = &total[optim_from + (i * fields.size() + f) * 2];
        if (slot[0] == 0) continue;
        const torch::Tensor& p = zero.params()[i];
        const bool step = kind == OptimizerKind::kAdamW && f == 0;
        entries.push_back({names[i] + "/" + fields[f], true, step ? torch::kInt64 : p.scalar_type(),
                           step ? std::vector<int64_t>{} : p.sizes().vec(), slot[1]});
      }
    out.optim = digest_mixed(std::move(entries));
  }
  return out;
}

}  // namespace

ZeroDigests zero_digests(const NamedTensors& model_state, torch::optim::Optimizer& opt, const ZeroShard& zero,
                         const torch::nn::Module& model, OptimizerKind kind, bool with_optimizer,
                         const SumOverRanks& sum, const KnownSums* known, Mix mix) {
  SumLayout at;
  const std::vector<uint64_t> local = range_sums(model_state, opt, zero, kind, with_optimizer, known, mix, at);
  const std::vector<uint64_t> total = sum ? sum(local) : local;
  RETRACE_CHECK(total.size() == local.size(), InvariantError, "zero_digests: ", total.size(), " sums for ",
                local.size());
  return digests_of_sums(total, at, model_state, zero, model, kind, with_optimizer);
}

KnownSums capture_sums(torch::optim::Optimizer& opt, const ZeroShard& zero) {
  auto taken = std::make_shared<std::unordered_map<const c10::TensorImpl*, std::pair<torch::Tensor, uint64_t>>>();
  const auto take = [&](const torch::Tensor& t) {
    uint64_t out[16];
    if (t.defined() && fused_sums(opt, t, out)) taken->emplace(t.unsafeGetTensorImpl(), std::make_pair(t, out[0]));
  };
  for (const torch::Tensor& view : zero.views()) {
    take(view);
    take(view.grad());
    if (auto* st = compat::find_param_state(opt, view))
      if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(st)) {
        take(adamw->exp_avg());
        take(adamw->exp_avg_sq());
      }
  }
  // The tensors are held (not their copies), so a looked-up address is always the tensor taken.
  return [taken](const torch::Tensor& t, uint64_t out[16]) {
    auto it = taken->find(t.unsafeGetTensorImpl());
    if (it == taken->end()) return false;
    out[0] = it->second.second;
    return true;
  };
}

}  // namespace retrace::train
