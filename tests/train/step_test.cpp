// The AMP-safe step: the loss scaler's GradScaler rule, its skip paths, clipping
// after unscale, and the accumulation weighting on ragged micro-batches.
#include "train/step.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cfloat>
#include <memory>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/lanes.h"
#include "model/mlp.h"
#include "rng/rng_state.h"
#include "train/config.h"
#include "train/loss_scaler.h"
#include "train/trainer.h"

namespace retrace::train {
namespace {

AmpConfig amp_with_interval(int64_t interval, double init_scale = 65536.0) {
  AmpConfig a;
  a.init_scale = init_scale;
  a.growth_factor = 2.0;
  a.backoff_factor = 0.5;
  a.growth_interval = interval;
  return a;
}

// A small MLP with fixed initial weights (dropout 0) and a batch for it.
struct Fixture {
  std::shared_ptr<model::MlpImpl> model;
  torch::Tensor x, y;
  ForwardFn forward() const {
    auto m = model;
    return [m](const torch::Tensor& in) { return m->forward(in); };
  }
};

Fixture make_fixture(int64_t batch, uint64_t seed = 11) {
  rng::seed_cpu_and_device(seed, -1);
  model::MlpOptions o;
  o.inputs = 4;
  o.hidden = {6};
  o.outputs = 3;
  o.dropout = 0;
  Fixture f;
  f.model = std::make_shared<model::MlpImpl>(o);
  f.x = torch::randn({batch, 4}) * 3.0;
  f.y = torch::randint(0, 3, {batch}, torch::kInt64);
  return f;
}

std::vector<MicroBatch> split(const Fixture& f, const std::vector<int64_t>& sizes) {
  std::vector<MicroBatch> out;
  int64_t lo = 0;
  for (int64_t s : sizes) {
    out.push_back({f.x.slice(0, lo, lo + s), f.y.slice(0, lo, lo + s)});
    lo += s;
  }
  return out;
}

std::vector<torch::Tensor> clone_params(torch::nn::Module& m) {
  std::vector<torch::Tensor> v;
  for (const auto& p : m.parameters()) v.push_back(p.detach().clone());
  return v;
}

std::vector<torch::Tensor> clone_grads(torch::nn::Module& m) {
  std::vector<torch::Tensor> v;
  for (const auto& p : m.parameters()) v.push_back(p.grad().clone());
  return v;
}

bool all_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

bool all_close(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, double rtol, double atol) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!torch::allclose(a[i], b[i], rtol, atol)) return false;
  return true;
}

std::pair<float, int64_t> state_of(const LossScaler& s) { return {static_cast<float>(s.scale()), s.growth_tracker()}; }

// ---- (a) the GradScaler rule ---------------------------------------------------------------------

TEST(LossScaler, FollowsGradScalerRuleForAScriptedSequence) {
  LossScaler s(amp_with_interval(3), /*enabled=*/true);
  ASSERT_EQ(state_of(s), std::make_pair(65536.0f, int64_t{0}));
  // Expected values written out by hand from GradScaler's rule (growth 2, backoff 0.5, interval 3):
  // found_inf halves and resets the tracker; the third consecutive good step doubles and resets it.
  const std::vector<std::pair<bool, std::pair<float, int64_t>>> script = {
      {false, {65536.0f, 1}},  {false, {65536.0f, 2}}, {false, {131072.0f, 0}},  // growth
      {false, {131072.0f, 1}}, {true, {65536.0f, 0}},                            // backoff resets tracker
      {false, {65536.0f, 1}},  {false, {65536.0f, 2}}, {true, {32768.0f, 0}},    // interrupted run
      {true, {16384.0f, 0}},   {false, {16384.0f, 1}}, {false, {16384.0f, 2}},  {false, {32768.0f, 0}},
      {false, {32768.0f, 1}},  {false, {32768.0f, 2}}, {false, {65536.0f, 0}},
  };
  for (size_t i = 0; i < script.size(); ++i) {
    s.update(/*found_inf=*/script[i].first);
    EXPECT_EQ(state_of(s), script[i].second) << "after update " << i << " (found_inf=" << script[i].first << ")";
  }
}

TEST(LossScaler, GrowsOnlyWhenTheGrownScaleIsFinite) {
  // Near FLT_MAX, doubling overflows float32: the scale stays, the tracker still resets.
  const double near_max = static_cast<double>(FLT_MAX) / 1.5;
  LossScaler s(amp_with_interval(2, near_max), true);
  s.update(false);
  EXPECT_EQ(state_of(s), std::make_pair(static_cast<float>(near_max), int64_t{1}));
  s.update(false);
  EXPECT_EQ(state_of(s), std::make_pair(static_cast<float>(near_max), int64_t{0}));
  EXPECT_TRUE(std::isfinite(s.scale()));
  // One step lower it does grow (so the check above is about finiteness, not "never grows").
  LossScaler t(amp_with_interval(2, static_cast<double>(FLT_MAX) / 4), true);
  t.update(false);
  t.update(false);
  EXPECT_EQ(static_cast<float>(t.scale()), FLT_MAX / 2);
  EXPECT_EQ(t.growth_tracker(), 0);
}

TEST(LossScaler, StateRoundTripContinuesTheSameSequence) {
  LossScaler a(amp_with_interval(3), true);
  for (bool inf : {false, true, false, false, false, false}) a.update(inf);
  ASSERT_EQ(state_of(a), std::make_pair(65536.0f, int64_t{1}));

  LossScaler b(amp_with_interval(3, 1024.0), true);  // other initial state
  ASSERT_NE(state_of(b), state_of(a));
  b.load_state(a.state());
  EXPECT_EQ(b.state(), a.state());
  EXPECT_EQ(state_of(b), state_of(a));
  for (bool inf : {false, false, true, false, false, false, false}) {
    a.update(inf);
    b.update(inf);
    EXPECT_EQ(state_of(b), state_of(a));
  }
  // A state without the scale is a FormatError naming the key.
  auto st = a.state();
  st.erase("scaler.scale_bits");
  EXPECT_THROW(b.load_state(st), FormatError);
}

TEST(TrainStep, NonFiniteLossSkipsWithoutUpdatingTheScaler) {
  Fixture f = make_fixture(6);
  LossScaler scaler(amp_with_interval(3), true);
  torch::optim::SGD opt(f.model->parameters(), torch::optim::SGDOptions(0.1));
  StepPolicy policy;
  policy.scaler = &scaler;
  policy.max_norm = 0;

  StepResult good = train_step(*f.model, f.forward(), opt, split(f, {6}), policy);
  ASSERT_FALSE(good.skipped);
  ASSERT_EQ(state_of(scaler), std::make_pair(65536.0f, int64_t{1}));  // a good step does move it

  const auto before = clone_params(*f.model);
  StepFaults nan;
  nan.nan_loss = true;
  StepResult r = train_step(*f.model, f.forward(), opt, split(f, {2, 4}), policy, nan);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.skip_reason, records::SkipReason::kNonFiniteLoss);
  EXPECT_EQ(state_of(scaler), std::make_pair(65536.0f, int64_t{1}));  // neither backoff nor tracker reset
  EXPECT_TRUE(all_equal(clone_params(*f.model), before));
}

// ---- (d) inf gradient ----------------------------------------------------------------------------

TEST(TrainStep, InfGradientSkipsAndHalvesTheScale) {
  Fixture f = make_fixture(6);
  LossScaler scaler(amp_with_interval(3), true);
  torch::optim::SGD opt(f.model->parameters(), torch::optim::SGDOptions(0.1));
  StepPolicy policy;
  policy.scaler = &scaler;
  ASSERT_FALSE(train_step(*f.model, f.forward(), opt, split(f, {6}), policy).skipped);
  ASSERT_EQ(state_of(scaler), std::make_pair(65536.0f, int64_t{1}));

  const auto before = clone_params(*f.model);
  StepFaults faults;
  faults.inf_grad = "layers.0.weight";
  StepResult r = train_step(*f.model, f.forward(), opt, split(f, {3, 3}), policy, faults);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.skip_reason, records::SkipReason::kNonFiniteGrad);
  EXPECT_EQ(state_of(scaler), std::make_pair(32768.0f, int64_t{0}));
  EXPECT_TRUE(all_equal(clone_params(*f.model), before));
}

// ---- (b) clip after unscale ----------------------------------------------------------------------

TEST(TrainStep, ClipsTheUnscaledGradients) {
  const double lr = 0.5, max_norm = 0.05;
  Fixture f = make_fixture(8);
  AmpConfig amp = amp_with_interval(2000);
  amp.scaler = ScalerMode::kOn;
  LossScaler scaler(amp, /*enabled=*/true);
  const double s = scaler.scale();
  ASSERT_EQ(s, 65536.0);

  // Reference by hand from the same weights: plain backward of the batch mean, then clip, then SGD.
  Fixture ref = make_fixture(8);
  const auto p0 = clone_params(*ref.model);
  torch::Tensor loss = torch::nn::functional::cross_entropy(ref.model->forward(ref.x), ref.y,
                                                            torch::nn::functional::CrossEntropyFuncOptions().reduction(
                                                                torch::kSum));
  (loss / 8.0).backward();
  const auto g = clone_grads(*ref.model);
  double sq = 0;
  for (const auto& t : g) sq += t.to(torch::kFloat64).pow(2).sum().item<double>();
  const double norm = std::sqrt(sq);
  ASSERT_GT(norm, 10 * max_norm) << "the example must need clipping";
  std::vector<torch::Tensor> expected, clipped_scaled;
  const double coef = max_norm / (norm + 1e-6);
  // Clipping the scaled gradients sees a norm s times larger, so it shrinks them s times more.
  const double coef_scaled = max_norm / (norm * s + 1e-6);
  for (size_t i = 0; i < g.size(); ++i) {
    expected.push_back(p0[i] - lr * coef * g[i]);
    clipped_scaled.push_back(p0[i] - lr * coef_scaled * g[i]);
  }

  torch::optim::SGD opt(f.model->parameters(), torch::optim::SGDOptions(lr));
  StepPolicy policy;
  policy.max_norm = max_norm;
  policy.scaler = &scaler;
  StepResult r = train_step(*f.model, f.forward(), opt, split(f, {3, 5}), policy);
  ASSERT_FALSE(r.skipped);
  EXPECT_NEAR(r.grad_norm_pre, norm, 1e-5 * norm);  // the recorded norm is of unscaled gradients
  EXPECT_NEAR(r.grad_norm_post, max_norm, 1e-5 * max_norm);
  const auto after = clone_params(*f.model);
  EXPECT_TRUE(all_close(after, expected, 1e-5, 1e-7));
  EXPECT_FALSE(all_close(after, clipped_scaled, 1e-3, 1e-5));
}

// ---- (c) disabled scaler -------------------------------------------------------------------------

TEST(LossScaler, DisabledScalerIsTheIdentityAndNeverMoves) {
  Config c = parse_config("", "test", {"amp.mode=bf16", "amp.growth_interval=1"});
  ASSERT_FALSE(scaler_enabled(c));
  LossScaler scaler(c.amp, scaler_enabled(c));
  const auto initial = scaler.state();
  EXPECT_EQ(scaler.scale(), 1.0);
  torch::Tensor t = torch::tensor({1.5f, -2.0f});
  EXPECT_TRUE(torch::equal(scaler.scale_loss(t), t));

  Fixture f = make_fixture(6);
  torch::optim::SGD opt(f.model->parameters(), torch::optim::SGDOptions(0.1));
  StepPolicy policy;
  policy.autocast_dtype = autocast_dtype(c);
  policy.scaler = &scaler;
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(train_step(*f.model, f.forward(), opt, split(f, {6}), policy).skipped);
    EXPECT_EQ(scaler.state(), initial);
  }
  StepFaults faults;
  faults.inf_grad = "layers.1.bias";
  EXPECT_EQ(train_step(*f.model, f.forward(), opt, split(f, {6}), policy, faults).skip_reason,
            records::SkipReason::kNonFiniteGrad);
  EXPECT_EQ(scaler.state(), initial);
  EXPECT_EQ(scaler.scale(), 1.0);

  // unscale_and_check only checks when disabled: gradients keep their values.
  for (auto& p : f.model->parameters()) p.mutable_grad() = torch::full_like(p, 3.0);
  const auto grads = clone_grads(*f.model);
  EXPECT_FALSE(scaler.unscale_and_check(f.model->parameters()));
  EXPECT_TRUE(all_equal(clone_grads(*f.model), grads));
}

// ---- (e) accumulation weighting -----------------------------------------------------------------

TEST(TrainStep, RaggedMicroBatchesGiveTheLargeBatchGradientNotTheMeanOfMeans) {
  const std::vector<int64_t> ragged = {1, 2, 4};
  Fixture big = make_fixture(7), acc = make_fixture(7), naive = make_fixture(7);
  StepPolicy policy;
  policy.max_norm = 0;
  torch::optim::SGD opt_big(big.model->parameters(), torch::optim::SGDOptions(0.0));
  torch::optim::SGD opt_acc(acc.model->parameters(), torch::optim::SGDOptions(0.0));
  StepResult rb = train_step(*big.model, big.forward(), opt_big, split(big, {7}), policy);
  StepResult ra = train_step(*acc.model, acc.forward(), opt_acc, split(acc, ragged), policy);
  const auto g_big = clone_grads(*big.model);
  const auto g_acc = clone_grads(*acc.model);
  EXPECT_TRUE(all_close(g_acc, g_big, 1e-5, 1e-7));
  EXPECT_NEAR(ra.loss, rb.loss, 1e-6 * std::abs(rb.loss));
  EXPECT_EQ(ra.micro_sizes, (std::vector<uint32_t>{1, 2, 4}));
  // The recorded per-micro-batch losses are each micro-batch's own mean; weighted by size they
  // give the effective loss.
  double weighted = 0;
  for (size_t i = 0; i < ragged.size(); ++i) weighted += ra.micro_losses[i] * static_cast<double>(ragged[i]) / 7.0;
  EXPECT_NEAR(weighted, rb.loss, 1e-5 * std::abs(rb.loss));

  // The naive rule: each micro-batch's mean, averaged over the three micro-batches.
  for (const auto& mb : split(naive, ragged)) {
    torch::Tensor loss = torch::nn::functional::cross_entropy(naive.model->forward(mb.inputs), mb.targets);
    (loss / 3.0).backward();
  }
  const auto g_naive = clone_grads(*naive.model);
  EXPECT_FALSE(all_close(g_naive, g_big, 1e-3, 1e-5));
  double mean_of_means = 0;
  for (double l : ra.micro_losses) mean_of_means += l / 3.0;
  EXPECT_GT(std::abs(mean_of_means - rb.loss), 1e-3 * std::abs(rb.loss));
}

TEST(Clipping, NormAndClipOnSeveralLanesGiveTheBitsOfOneThread) {
  // Gradients of several 64k-float pieces, of one, a non-contiguous one, a parameter without a
  // gradient, over kAfterBackwardLanesFrom floats in all; the norm and the clipped gradients on
  // 2, 3 and 8 lanes against the plain ATen calls in parameter order on this thread.
  torch::manual_seed(5);
  std::vector<torch::Tensor> params, grads;
  for (const int64_t n : {int64_t{3 * 784 * 512}, int64_t{7}, int64_t{3 * 65536 + 3}, int64_t{65536}, int64_t{1}}) {
    params.push_back(torch::zeros({n}));
    grads.push_back(torch::randn({n}) * 3.0);
  }
  params.push_back(torch::zeros({64, 48}));
  grads.push_back(torch::randn({48, 64}).t());  // not contiguous
  params.push_back(torch::zeros({5}));          // no gradient
  grads.emplace_back();
  std::vector<torch::Tensor> norms;
  for (const auto& g : grads)
    if (g.defined()) norms.push_back(g.norm(2));
  const float want_norm = torch::stack(norms).norm(2).item<float>();
  const double coef = 1.0 / (static_cast<double>(want_norm) + 1e-6);
  std::vector<torch::Tensor> want;
  for (const auto& g : grads) want.push_back(g.defined() ? g.clone().mul_(coef) : torch::Tensor());
  const int before = model::lanes();
  for (int lanes : {2, 3, 8}) {
    for (size_t i = 0; i < params.size(); ++i)
      params[i].mutable_grad() = grads[i].defined() ? grads[i].clone(at::MemoryFormat::Preserve) : torch::Tensor();
    model::set_lanes(lanes);
    const double norm = global_grad_norm(params);
    clip_grads(params, 1.0, norm);
    model::set_lanes(before);
    EXPECT_EQ(norm, static_cast<double>(want_norm)) << lanes << " lanes";
    for (size_t i = 0; i < params.size(); ++i) {
      if (!want[i].defined()) continue;
      EXPECT_TRUE(torch::equal(params[i].grad(), want[i])) << "parameter " << i << ", " << lanes << " lanes";
    }
  }
}

}  // namespace
}  // namespace retrace::train
