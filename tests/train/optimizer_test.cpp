// The fused AdamW (train/adamw_kernel.h) against LibTorch's torch::optim::AdamW: the same bits for
// parameters and both moments at every step, through warmup-style learning-rate changes, weight
// decay on and off, parameters without a gradient, odd sizes (vector tails), extreme values, the
// fallback for tensors it does not fuse, and state handed over through a checkpoint.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <limits>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/torch_compat.h"
#include "model/lanes.h"
#include "train/adamw_kernel.h"
#include "train/config.h"
#include "train/optimizer.h"

namespace retrace::train {
namespace {

// A module holding one parameter per size, so make_optimizer can build either implementation.
struct Params : torch::nn::Module {
  Params(const std::vector<int64_t>& sizes, torch::Dtype dtype, uint64_t seed) {
    torch::manual_seed(seed);
    for (size_t i = 0; i < sizes.size(); ++i)
      register_parameter("p" + std::to_string(i), torch::randn({sizes[i]}, torch::TensorOptions(dtype)));
  }
};

OptimConfig adamw(bool fused, double weight_decay) {
  OptimConfig c;
  c.name = OptimizerKind::kAdamW;
  c.fused = fused;
  c.weight_decay = weight_decay;
  return c;
}

// Bit equality, with any NaN equal to any NaN (payloads are not specified by either side).
int64_t differing(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return -1;
  auto x = a.contiguous(), y = b.contiguous();
  const auto both_nan = torch::isnan(x) & torch::isnan(y);
  if (x.scalar_type() == torch::kFloat32)
    return ((x.view(torch::kInt32) != y.view(torch::kInt32)) & ~both_nan).sum().item<int64_t>();
  return ((x.view(torch::kInt64) != y.view(torch::kInt64)) & ~both_nan).sum().item<int64_t>();
}

void expect_same_state(torch::optim::Optimizer& a, Params& ma, torch::optim::Optimizer& b, Params& mb, int step) {
  const auto pa = ma.parameters(), pb = mb.parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_EQ(differing(pa[i], pb[i]), 0) << "parameter " << i << " at step " << step;
  const auto sa = optimizer_state(a, ma, OptimizerKind::kAdamW), sb = optimizer_state(b, mb, OptimizerKind::kAdamW);
  ASSERT_EQ(sa.size(), sb.size()) << "at step " << step;
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, sb[i].first);
    EXPECT_EQ(differing(sa[i].second, sb[i].second), 0) << sa[i].first << " at step " << step;
  }
}

// The process's lane count for one scope (model/lanes.h).
struct LanesGuard {
  explicit LanesGuard(int n) : before(model::lanes()) { model::set_lanes(n); }
  ~LanesGuard() { model::set_lanes(before); }
  int before;
};

// Runs both implementations side by side for `steps` steps with the same gradients and learning
// rates; parameter k gets no gradient on steps where (step + k) % 7 == 0. The fused one updates on
// `lanes` lanes, in pieces of 64k floats.
// With clip > 0, every step first clips by a coefficient near it: the fused one takes the product
// into its pass (defer_grad_scale), LibTorch's side multiplies the gradients first, as clip_grads
// does; the clipped gradients must then be equal too.
void run_side_by_side(const std::vector<int64_t>& sizes, torch::Dtype dtype, double weight_decay, int steps,
                      bool extremes, int lanes = 1, double clip = 0) {
  const LanesGuard guard(lanes);
  if (!compat::kFusedAdamWMatchesLibTorch)
    GTEST_SKIP() << "the fused AdamW reproduces LibTorch 1.13's roundings, not LibTorch " << compat::libtorch_version()
                 << "'s: there optim.fused steps through LibTorch's AdamW (FusedAdamW.FallsBackWhereNotMatched)";
  Params ma(sizes, dtype, 7), mb(sizes, dtype, 7);
  auto fused = make_optimizer(adamw(true, weight_decay), ma);
  auto plain = make_optimizer(adamw(false, weight_decay), mb);
  torch::manual_seed(11);
  for (int step = 1; step <= steps; ++step) {
    set_lr(*fused, 1e-3 * std::min(1.0, step / 10.0));
    set_lr(*plain, 1e-3 * std::min(1.0, step / 10.0));
    const auto pa = ma.parameters(), pb = mb.parameters();
    for (size_t k = 0; k < pa.size(); ++k) {
      if ((step + k) % 7 == 0) {
        pa[k].mutable_grad() = torch::Tensor();
        pb[k].mutable_grad() = torch::Tensor();
        continue;
      }
      auto g = torch::randn_like(pa[k]) * std::pow(10.0, (step % 9) - 4);
      if (extremes && g.numel() >= 6) {
        auto f = g.view({-1});
        f[0] = 0.0;
        f[1] = -0.0;
        f[2] = 1e30;
        f[3] = 1e-40;  // subnormal in float32
        f[4] = std::numeric_limits<double>::infinity();
        f[5] = std::numeric_limits<double>::quiet_NaN();
      }
      pa[k].mutable_grad() = g.clone();
      pb[k].mutable_grad() = g.clone();
    }
    if (clip > 0) {
      const double coef = clip * (1.0 + 0.01 * step);
      EXPECT_TRUE(defer_grad_scale(*fused, ma.parameters(), coef));
      torch::NoGradGuard no_grad;
      for (auto& p : pb)
        if (p.grad().defined()) p.mutable_grad().mul_(coef);
    }
    fused->step();
    plain->step();
    expect_same_state(*fused, ma, *plain, mb, step);
    for (size_t k = 0; clip > 0 && k < pa.size(); ++k)
      if (pa[k].grad().defined()) {
        EXPECT_EQ(differing(pa[k].grad(), pb[k].grad()), 0) << "gradient " << k << " at step " << step;
      }
    if (::testing::Test::HasFailure()) return;
  }
  // The comparison means something only if the fused loop really ran (float32) or really did not.
  EXPECT_EQ(fused_adamw_steps(*fused), dtype == torch::kFloat32 ? steps : 0);
  EXPECT_EQ(fused_adamw_steps(*plain), -1);
}

TEST(FusedAdamW, SameBitsAsLibTorchWithWeightDecay) {
  run_side_by_side({784 * 512, 512, 256 * 10, 10, 13, 7, 1}, torch::kFloat32, 0.01, 40, false);
}

TEST(FusedAdamW, SameBitsAsLibTorchOnSeveralLanes) {
  // Parameters of several pieces (the last one short), of one, and empty-gradient steps; more
  // than kAfterBackwardLanesFrom floats in all, so the lanes take the pieces.
  static_assert(784 * 512 + 3 * 65536 + 5 + 512 + 65536 + 1 + (1 << 19) >= model::kAfterBackwardLanesFrom);
  for (int lanes : {2, 3, 8})
    run_side_by_side({784 * 512, 3 * 65536 + 5, 512, 65536, 1, 1 << 19}, torch::kFloat32, 0.01, 15, false, lanes);
}

TEST(FusedAdamW, ClippingInsideThePassGivesTheBitsOfClippingFirst) {
  run_side_by_side({784 * 512, 512, 256 * 10, 10, 13, 7, 1}, torch::kFloat32, 0.01, 20, false, 1, 0.37);
  run_side_by_side({1031, 17, 8}, torch::kFloat32, 0.01, 12, true, 1, 0.61);
  run_side_by_side({784 * 512, 3 * 65536 + 5, 512, 65536, 1, 1 << 19}, torch::kFloat32, 0.01, 6, false, 2, 0.29);
}

TEST(FusedAdamW, ClippingLeftToAStepHandedToLibTorchComesFirst) {
  // Float64 parameters: the fused AdamW hands the step to LibTorch's code, after the product.
  run_side_by_side({515, 9}, torch::kFloat64, 0.01, 5, false, 1, 0.43);
}

TEST(FusedAdamW, OnlyTheFusedOneTakesClipping) {
  Params m({10}, torch::kFloat32, 1);
  auto plain = make_optimizer(adamw(false, 0.01), m);
  EXPECT_FALSE(defer_grad_scale(*plain, m.parameters(), 0.5));
  auto fused = make_optimizer(adamw(true, 0.01), m);
  EXPECT_EQ(defer_grad_scale(*fused, m.parameters(), 0.5), compat::kFusedAdamWMatchesLibTorch);
}

TEST(FusedAdamW, TwoProductsLeftBeforeOneStepAreBothTaken) {
  if (!compat::kFusedAdamWMatchesLibTorch) GTEST_SKIP() << "no fused AdamW on LibTorch " << compat::libtorch_version();
  Params ma({3000, 7}, torch::kFloat32, 4), mb({3000, 7}, torch::kFloat32, 4);
  auto fused = make_optimizer(adamw(true, 0.01), ma);
  auto plain = make_optimizer(adamw(false, 0.01), mb);
  const auto pa = ma.parameters(), pb = mb.parameters();
  for (size_t k = 0; k < pa.size(); ++k) {
    pa[k].mutable_grad() = torch::randn_like(pa[k]);
    pb[k].mutable_grad() = pa[k].grad().clone();
    pb[k].mutable_grad().mul_(0.7).mul_(0.3);
  }
  ASSERT_TRUE(defer_grad_scale(*fused, pa, 0.7));
  ASSERT_TRUE(defer_grad_scale(*fused, pa, 0.3));
  fused->step();
  plain->step();
  expect_same_state(*fused, ma, *plain, mb, 1);
  // Taken once: the next step does not multiply again.
  for (size_t k = 0; k < pa.size(); ++k) pb[k].mutable_grad() = pa[k].grad().clone();
  fused->step();
  plain->step();
  expect_same_state(*fused, ma, *plain, mb, 2);
}

TEST(FusedAdamW, SameBitsAsLibTorchWithoutWeightDecay) {
  run_side_by_side({4099, 64, 3}, torch::kFloat32, 0.0, 25, false);
}

TEST(FusedAdamW, SameBitsOnZerosSubnormalsInfAndNaN) {
  run_side_by_side({1031, 17, 8}, torch::kFloat32, 0.01, 12, true);
}

// Where its roundings are not LibTorch's, optim.fused = on is LibTorch's AdamW: the bits a run
// gets never depend on the key there.
TEST(FusedAdamW, FallsBackWhereNotMatched) {
  Params m({100, 3}, torch::kFloat32, 1);
  auto opt = make_optimizer(adamw(true, 0.01), m);
  for (auto& p : m.parameters()) p.mutable_grad() = torch::ones_like(p);
  opt->step();
  EXPECT_EQ(fused_adamw_steps(*opt), compat::kFusedAdamWMatchesLibTorch ? 1 : -1) << compat::libtorch_version();
}

TEST(FusedAdamW, FallsBackToLibTorchForFloat64) { run_side_by_side({515, 9}, torch::kFloat64, 0.01, 10, false); }

TEST(FusedAdamW, VectorAndBaselineLoopsAgreeBitwise) {
  torch::manual_seed(3);
  const int64_t n = 1000003;
  auto p = torch::randn({n}), g = torch::randn({n}) * 1e-2, m = torch::randn({n}) * 1e-3, v = torch::rand({n}) * 1e-4;
  auto p2 = p.clone(), m2 = m.clone(), v2 = v.clone();
  for (int step = 1; step <= 3; ++step) {
    const auto c = adamw_coefficients(1e-3, 0.9, 0.999, 1e-8, 0.01, step);
    adamw_update(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), n, c, true);
    adamw_update(p2.data_ptr<float>(), g.data_ptr<float>(), m2.data_ptr<float>(), v2.data_ptr<float>(), n, c, false);
  }
  EXPECT_EQ(differing(p, p2), 0) << "kernel " << adamw_kernel_isa();
  EXPECT_EQ(differing(m, m2), 0);
  EXPECT_EQ(differing(v, v2), 0);
}

// The sums the fused pass keeps (lane sums, or mixed sums at given first positions, the
// gradients' included, after clipping's product when `scale`) against sums of the tensors.
void check_kept_sums(int lanes, KeptSums kind, bool scale) {
  const LanesGuard guard(lanes);
  // Sizes across the pass's 1024-element chunks and its 64k-float pieces, odd ones included (a
  // 4-byte tail word).
  const std::vector<int64_t> sizes{5000, 2048, 7, 1, 2 * 65536 + 1029, int64_t{1} << 20};  // lanes: over 1M
  Params m(sizes, torch::kFloat32, 3);
  auto opt = make_optimizer(adamw(true, 0.01), m);
  keep_sums(*opt, kind);
  // Where each parameter's first element lies (ZeRO's views start inside their parameter).
  std::vector<uint64_t> positions;
  for (size_t i = 0; i < sizes.size(); ++i) positions.push_back(i % 2 ? 0 : 1000003 * i + 17);
  set_sum_positions(*opt, m.parameters(), positions);
  const bool mixed = kind == KeptSums::kMixed || kind == KeptSums::kMixed4;
  const Mix mix = kind == KeptSums::kMixed4 ? Mix::kHalves : Mix::kFmix64;
  auto check_all = [&](bool expect_known, const char* when) {
    auto state = optimizer_state(*opt, m, OptimizerKind::kAdamW);
    std::vector<uint64_t> at;  // the parameter's first position of each state entry
    for (size_t i = 0; i < state.size(); ++i) at.push_back(positions[i / 3]);  // step, exp_avg, exp_avg_sq
    for (size_t i = 0; i < sizes.size(); ++i) {
      state.emplace_back(m.named_parameters()[i].key(), m.parameters()[i]);
      at.push_back(positions[i]);
      if (!mixed) continue;
      state.emplace_back(m.named_parameters()[i].key() + ".grad", m.parameters()[i].grad());
      at.push_back(positions[i]);
    }
    for (size_t i = 0; i < state.size(); ++i) {
      const auto& [name, t] = state[i];
      if (name.size() > 5 && name.substr(name.size() - 5) == "/step") continue;  // not the fused pass's
      uint64_t known[16], want[16];
      const bool has = fused_sums(*opt, t, known);
      EXPECT_EQ(has, expect_known) << name << " " << when;
      if (!has) continue;
      if (mixed) {
        ASSERT_EQ(known[0], tensor_mixed_sum(t, at[i], mix)) << name << " " << when;
        continue;
      }
      lane_sums(t.data_ptr(), t.nbytes(), want);
      for (int l = 0; l < 16; ++l) ASSERT_EQ(known[l], want[l]) << name << " lane " << l << " " << when;
    }
  };
  for (int step = 1; step <= 3; ++step) {
    torch::manual_seed(50 + step);
    for (auto& p : m.parameters()) p.mutable_grad() = torch::randn_like(p);
    if (scale) {
      ASSERT_TRUE(defer_grad_scale(*opt, m.parameters(), 0.37));
    }
    opt->step();
    check_all(true, "after a fused step");
  }
  uint64_t out[16];
  if (mixed) {
    // A new gradient in the old one's place is not the one summed.
    const torch::Tensor old = m.parameters()[1].grad();
    m.parameters()[1].mutable_grad() = old.clone();
    EXPECT_FALSE(fused_sums(*opt, m.parameters()[1].grad(), out));
    EXPECT_TRUE(fused_sums(*opt, old, out));
    torch::NoGradGuard no_grad;
    old.mul_(2.0f);  // and a write to the summed one
    EXPECT_FALSE(fused_sums(*opt, old, out));
  }
  {
    torch::NoGradGuard no_grad;
    m.parameters()[0].add_(1.0f);  // a write through a tensor operation
  }
  EXPECT_FALSE(fused_sums(*opt, m.parameters()[0], out));
  load_optimizer_state(*opt, m, OptimizerKind::kAdamW, optimizer_state(*opt, m, OptimizerKind::kAdamW));
  for (const auto& [name, t] : optimizer_state(*opt, m, OptimizerKind::kAdamW))
    EXPECT_FALSE(fused_sums(*opt, t, out)) << name << " after a load";
  // Nothing kept: nothing known.
  keep_sums(*opt, KeptSums::kNone);
  for (auto& p : m.parameters()) p.mutable_grad() = torch::randn_like(p);
  opt->step();
  EXPECT_FALSE(fused_sums(*opt, m.parameters()[2], out));
}

TEST(FusedAdamW, LaneSumsOfItsPassAreThoseOfTheTensorsAndLapseWhenTheyChange) {
  if (!compat::kFusedAdamWMatchesLibTorch) GTEST_SKIP() << "no fused AdamW on LibTorch " << compat::libtorch_version();
  check_kept_sums(1, KeptSums::kLanes, false);
  check_kept_sums(2, KeptSums::kLanes, true);
}

// The validation layer's optimizer check: what a checkpoint's optimizer state must be before any
// of it is installed (issue 38: a step count of 0 elements, moments stored as int32).
TEST(OptimizerState, EveryEntryIsCheckedBeforeAnyIsInstalled) {
  Params m({6, 4}, torch::kFloat32, 1);
  auto opt = make_optimizer(adamw(false, 0.01), m);
  for (auto& p : m.parameters()) p.mutable_grad() = torch::ones_like(p);
  opt->step();
  const NamedTensors good = optimizer_state(*opt, m, OptimizerKind::kAdamW);
  EXPECT_NO_THROW(check_optimizer_state(good, m, OptimizerKind::kAdamW, "here"));
  auto with = [&](const std::string& name, const torch::Tensor& t) {
    NamedTensors s = good;
    bool found = false;
    for (auto& [n, v] : s)
      if (n == name) v = t, found = true;
    if (!found) s.emplace_back(name, t);
    return s;
  };
  auto refused = [&](const NamedTensors& s, const std::string& says) {
    try {
      check_optimizer_state(s, m, OptimizerKind::kAdamW, "shard X");
      return std::string("accepted");
    } catch (const FormatError& e) {
      const std::string w = e.what();
      return w.find("shard X") != std::string::npos && w.find(says) != std::string::npos ? std::string() : w;
    }
  };
  EXPECT_EQ(refused(with("p0/step", torch::zeros({0}, torch::kInt64)), "a step count is one number"), "");
  EXPECT_EQ(refused(with("p0/step", torch::zeros({2}, torch::kInt64)), "a step count is one number"), "");
  EXPECT_EQ(refused(with("p0/step", torch::tensor(1.0, torch::kFloat64)), "a step count is Long"), "");
  EXPECT_EQ(refused(with("p0/step", torch::tensor(int64_t{-3})), "not negative"), "");
  EXPECT_EQ(refused(with("p0/exp_avg", torch::zeros({6}, torch::kInt32)), "the state of a parameter has its dtype"),
            "");
  EXPECT_EQ(refused(with("p0/exp_avg", torch::zeros({3})), "has shape [3]"), "");
  EXPECT_EQ(refused(with("p0/momentum_buffer", torch::zeros({6})), "is not a field of a parameter"), "");
  EXPECT_EQ(refused(with("p9/exp_avg", torch::zeros({6})), "is not a field of a parameter"), "");
  NamedTensors missing;
  for (const auto& [n, t] : good)
    if (n != "p1/exp_avg_sq") missing.emplace_back(n, t);
  EXPECT_EQ(refused(missing, "has a step count but no exp_avg_sq"), "");
  // Loading goes through the same check: nothing installed from a bad entry.
  EXPECT_THROW(load_optimizer_state(*opt, m, OptimizerKind::kAdamW,
                                    with("p0/exp_avg", torch::zeros({6}, torch::kInt32))),
               FormatError);
  // A ZeRO rank's own part of a parameter, and nothing of one it does not own.
  const std::function<int64_t(size_t)> part = [](size_t i) { return i == 0 ? int64_t{2} : int64_t{0}; };
  NamedTensors sliced = {{"p0/step", torch::tensor(int64_t{1})},
                         {"p0/exp_avg", torch::zeros({2})},
                         {"p0/exp_avg_sq", torch::zeros({2})},
                         {"p1/step", torch::zeros({0}, torch::kInt64)}};
  EXPECT_NO_THROW(check_optimizer_state(sliced, m, OptimizerKind::kAdamW, "here", &part));
  sliced[1].second = torch::zeros({3});
  EXPECT_THROW(check_optimizer_state(sliced, m, OptimizerKind::kAdamW, "here", &part), FormatError);
}

TEST(FusedAdamW, MixedSumsOfItsPassAreThoseOfTheTensorsAtTheirPositions) {
  if (!compat::kFusedAdamWMatchesLibTorch) GTEST_SKIP() << "no fused AdamW on LibTorch " << compat::libtorch_version();
  check_kept_sums(1, KeptSums::kMixed, false);
  check_kept_sums(2, KeptSums::kMixed, true);
  check_kept_sums(2, KeptSums::kMixed4, true);
}

TEST(FusedAdamW, ContinuesFromStateLoadedOutOfLibTorchsOptimizer) {
  if (!compat::kFusedAdamWMatchesLibTorch) GTEST_SKIP() << "no fused AdamW on LibTorch " << compat::libtorch_version();
  // A checkpoint written by one implementation resumes in the other with the same bits.
  const std::vector<int64_t> sizes{300, 11};
  Params ma(sizes, torch::kFloat32, 5), mb(sizes, torch::kFloat32, 5);
  auto plain = make_optimizer(adamw(false, 0.01), mb);
  auto fused = make_optimizer(adamw(true, 0.01), ma);
  auto grads = [&](int step) {
    torch::manual_seed(100 + step);
    std::vector<torch::Tensor> g;
    for (auto n : sizes) g.push_back(torch::randn({n}));
    return g;
  };
  for (int step = 1; step <= 4; ++step) {
    auto g = grads(step);
    const auto pb = mb.parameters();
    for (size_t k = 0; k < pb.size(); ++k) pb[k].mutable_grad() = g[k];
    plain->step();
  }
  {
    torch::NoGradGuard no_grad;
    const auto pa = ma.parameters(), pb = mb.parameters();
    for (size_t k = 0; k < pa.size(); ++k) pa[k].copy_(pb[k]);
  }
  load_optimizer_state(*fused, ma, OptimizerKind::kAdamW, optimizer_state(*plain, mb, OptimizerKind::kAdamW));
  for (int step = 5; step <= 8; ++step) {
    auto g = grads(step);
    const auto pa = ma.parameters(), pb = mb.parameters();
    for (size_t k = 0; k < pa.size(); ++k) {
      pa[k].mutable_grad() = g[k].clone();
      pb[k].mutable_grad() = g[k].clone();
    }
    fused->step();
    plain->step();
    expect_same_state(*fused, ma, *plain, mb, step);
  }
  EXPECT_EQ(fused_adamw_steps(*fused), 4);
}

}  // namespace
}  // namespace retrace::train
