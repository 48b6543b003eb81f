// The kernels of portable numerics version 2 in the model and the step: the linear layer
// (model/owned_linear.h), LayerNorm and the embedding (model/owned_layers.h), the cross-entropy
// (model/owned_loss.h) and the gradient norm
// (train/step.h's global_grad_norm): the same bits at 1, 2, 3, 4 and 8 lanes, and close in value to
// LibTorch's (another library's sums), forward and backward.
#include "model/owned_linear.h"

#include <gtest/gtest.h>
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>
#include <utility>
#include <torch/torch.h>

#include "core/error.h"
#include "model/lanes.h"
#include "model/owned_layers.h"
#include "model/owned_loss.h"
#include "train/step.h"

namespace retrace::model {
namespace {

struct OwnedPath {
  int lanes_before = lanes();
  explicit OwnedPath(int n) {
    set_gemm_path(GemmPath::kOwned);
    set_lanes(n);
  }
  ~OwnedPath() {
    set_gemm_path(GemmPath::kAten);
    set_lanes(lanes_before);
  }
};

struct Grads {
  torch::Tensor y, gx, gw, gb;
};

// One forward and backward of owned_linear (owned = true) or LibTorch's linear.
Grads run(const torch::Tensor& x0, const torch::Tensor& w0, const torch::Tensor& b0, bool owned) {
  torch::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  torch::Tensor b = b0.defined() ? b0.clone().requires_grad_(true) : torch::Tensor();
  torch::Tensor y = owned ? owned_linear(x, w, b) : torch::nn::functional::linear(x, w, b);
  (y * y.detach().cos()).sum().backward();  // a non-uniform output gradient
  return {y.detach(), x.grad(), w.grad(), b.defined() ? b.grad() : torch::Tensor()};
}

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  return a.sizes() == b.sizes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

struct Shape {
  std::vector<int64_t> x;
  int64_t out;
  bool bias;
};

TEST(OwnedLinear, SameBitsAtEveryLaneCountAndCloseToLibTorch) {
  torch::manual_seed(7);
  for (const Shape& s : {Shape{{128, 784}, 512, true}, Shape{{128, 256}, 10, true}, Shape{{4, 64, 128}, 384, false},
                         Shape{{3, 37, 129}, 77, true}, Shape{{1, 5}, 3, true}}) {
    const torch::Tensor x = torch::randn(s.x), w = torch::randn({s.out, s.x.back()}) * 0.05;
    const torch::Tensor b = s.bias ? torch::randn({s.out}) : torch::Tensor();
    Grads one;
    {
      OwnedPath p(1);
      ASSERT_TRUE(owned_linear_applies(x, w));
      one = run(x, w, b, true);
    }
    for (int n : {2, 3, 4, 8}) {
      OwnedPath p(n);
      const Grads g = run(x, w, b, true);
      EXPECT_TRUE(same_bits(g.y, one.y) && same_bits(g.gx, one.gx) && same_bits(g.gw, one.gw) &&
                  same_bits(g.gb, one.gb))
          << "lanes " << n << ", x " << x.sizes();
    }
    const Grads ref = run(x.to(torch::kDouble), w.to(torch::kDouble), b.defined() ? b.to(torch::kDouble) : b, false);
    EXPECT_TRUE(torch::allclose(one.y.to(torch::kDouble), ref.y, 1e-4, 1e-4)) << x.sizes();
    EXPECT_TRUE(torch::allclose(one.gx.to(torch::kDouble), ref.gx, 1e-4, 1e-4)) << x.sizes();
    EXPECT_TRUE(torch::allclose(one.gw.to(torch::kDouble), ref.gw, 1e-4, 1e-3)) << x.sizes();
    if (s.bias) {
      EXPECT_TRUE(torch::allclose(one.gb.to(torch::kDouble), ref.gb, 1e-4, 1e-3)) << x.sizes();
    }
  }
}

// A lane lent to a background thread (LaneLoan, the checkpoint writer's) counts one lane fewer, never
// fewer than one, and loans taken and returned while the layer runs, between and during its calls,
// change no bit of its output or gradients.
TEST(OwnedLinear, ALaneLentDuringTheStepChangesNoBit) {
  OwnedPath p(3);
  {
    LaneLoan first;
    EXPECT_EQ(lanes(), 2);
    EXPECT_EQ(configured_lanes(), 3);
    LaneLoan second, third;
    EXPECT_EQ(lanes(), 1);
    EXPECT_EQ(lanes_lent(), 3);
  }
  EXPECT_EQ(lanes(), 3);
  EXPECT_EQ(lanes_lent(), 0);
  torch::manual_seed(11);
  const torch::Tensor x = torch::randn({4, 64, 256}), w = torch::randn({384, 256}) * 0.05, b = torch::randn({384});
  const Grads whole = run(x, w, b, true);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> loans{0};
  std::thread lender([&] {
    while (!stop.load()) {
      LaneLoan loan;
      loans++;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      if (loans % 2 == 0) {
        LaneLoan another;  // down to one lane for a while
        std::this_thread::sleep_for(std::chrono::microseconds(300));
      }
    }
  });
  for (int i = 0; i < 20; ++i) {
    const Grads g = run(x, w, b, true);
    EXPECT_TRUE(same_bits(g.y, whole.y) && same_bits(g.gx, whole.gx) && same_bits(g.gw, whole.gw) &&
                same_bits(g.gb, whole.gb))
        << "run " << i;
  }
  stop = true;
  lender.join();
  EXPECT_GT(loans.load(), 0);
  EXPECT_EQ(lanes(), 3);
}

TEST(OwnedLinear, OnlyWhereTheOwnedPathIsOnAndTheTensorsAreFloatCpu) {
  const torch::Tensor x = torch::randn({4, 8}), w = torch::randn({3, 8});
  EXPECT_FALSE(owned_linear_applies(x, w));  // the path is off (version 1, native)
  OwnedPath p(2);
  EXPECT_TRUE(owned_linear_applies(x, w));
  EXPECT_FALSE(owned_linear_applies(x.to(torch::kDouble), w.to(torch::kDouble)));
  EXPECT_FALSE(owned_linear_applies(x.to(torch::kBFloat16), w.to(torch::kBFloat16)));
  EXPECT_FALSE(owned_linear_applies(x, torch::randn({3, 9})));
}

TEST(OwnedLinear, ABatchOfSequencesGivesAnOutputTheBlockMayAddItsBiasToInPlace) {
  // The GPT block adds a linear layer's bias in place when no dropout follows (model.dropout = 0,
  // gpt2-124m's): the output of a [batch, context, features] input must be a tensor of its own,
  // not a view made inside the autograd Function, and its gradients those of the out-of-place sum.
  OwnedPath p(2);
  const torch::Tensor x = torch::randn({2, 5, 8}, torch::requires_grad()),
                      w = torch::randn({3, 8}, torch::requires_grad());
  const torch::Tensor b = torch::randn({3});
  torch::Tensor y = owned_linear(x, w, {});
  y += b;
  y.sum().backward();
  const torch::Tensor x2 = x.detach().clone().requires_grad_(), w2 = w.detach().clone().requires_grad_();
  (owned_linear(x2, w2, {}) + b).sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), x2.grad()));
  EXPECT_TRUE(torch::equal(w.grad(), w2.grad()));
}

TEST(OwnedCrossEntropy, SameBitsAtEveryLaneCountAndCloseToLibTorch) {
  torch::manual_seed(3);
  for (const auto& [rows, classes] : {std::pair<int64_t, int64_t>{128, 10}, {300, 65}, {7, 50257}, {1, 1}}) {
    const torch::Tensor logits = torch::randn({rows, classes}) * 3, targets = torch::randint(classes, {rows});
    auto run_owned = [&](int n) {
      OwnedPath p(n);
      torch::Tensor x = logits.clone().requires_grad_(true);
      torch::Tensor loss = owned_cross_entropy_sum(x, targets);
      (loss * 0.75).backward();
      return std::make_pair(loss.detach(), x.grad());
    };
    const auto one = run_owned(1);
    for (int n : {2, 3, 8}) {
      const auto g = run_owned(n);
      EXPECT_TRUE(same_bits(g.first, one.first) && same_bits(g.second, one.second)) << "lanes " << n;
    }
    torch::Tensor xd = logits.to(torch::kDouble).requires_grad_(true);
    torch::Tensor ref = torch::nn::functional::cross_entropy(xd, targets,
                                                             torch::nn::functional::CrossEntropyFuncOptions().reduction(
                                                                 torch::kSum));
    (ref * 0.75).backward();
    EXPECT_NEAR(one.first.item<double>(), ref.item<double>(), 1e-6 * std::max(1.0, std::abs(ref.item<double>())));
    EXPECT_TRUE(torch::allclose(one.second.to(torch::kDouble), xd.grad(), 1e-5, 1e-7)) << rows << "x" << classes;
  }
}

TEST(OwnedCrossEntropy, TargetOutsideTheClassesIsAConfigErrorNamingTheRow) {
  OwnedPath p(1);
  const torch::Tensor logits = torch::randn({3, 4});
  try {
    owned_cross_entropy_sum(logits, torch::tensor({0, 4, 1}, torch::kLong));
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("the target of row 1 is 4, outside the model's 4 classes"), std::string::npos)
        << e.what();
  }
}

TEST(OwnedLayerNorm, SameBitsAtEveryLaneCountAndCloseToLibTorch) {
  torch::manual_seed(11);
  const torch::Tensor x = torch::randn({4, 33, 96}) * 2 + 0.5, w = torch::randn({96}), b = torch::randn({96});
  const torch::Tensor up = torch::randn({4, 33, 96});
  auto run_ln = [&](bool owned, int n, torch::ScalarType dtype) {
    OwnedPath p(n);
    auto leaf = [&](const torch::Tensor& t) { return t.to(dtype).detach().clone().requires_grad_(true); };
    torch::Tensor xi = leaf(x), wi = leaf(w), bi = leaf(b);
    torch::Tensor y = owned ? owned_layer_norm(xi, wi, bi, 1e-5)
                            : torch::nn::functional::layer_norm(
                                  xi, torch::nn::functional::LayerNormFuncOptions({96}).weight(wi).bias(bi).eps(1e-5));
    (y * up.to(dtype)).sum().backward();
    return std::vector<torch::Tensor>{y.detach(), xi.grad(), wi.grad(), bi.grad()};
  };
  const auto one = run_ln(true, 1, torch::kFloat);
  for (int n : {2, 3, 8}) {
    const auto g = run_ln(true, n, torch::kFloat);
    for (size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(same_bits(g[i], one[i])) << "lanes " << n << ", output " << i;
  }
  const auto ref = run_ln(false, 1, torch::kDouble);
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_TRUE(torch::allclose(one[i].to(torch::kDouble), ref[i], 1e-5, 1e-5)) << "output " << i;
}

TEST(OwnedEmbedding, SameBitsAtEveryLaneCountAndCloseToLibTorch) {
  torch::manual_seed(13);
  const torch::Tensor ids = torch::randint(50, {4, 40}), wte = torch::randn({50, 96}), wpe = torch::randn({64, 96});
  const torch::Tensor up = torch::randn({4, 40, 96});
  auto run_emb = [&](bool owned, int n) {
    OwnedPath p(n);
    torch::Tensor e = wte.clone().requires_grad_(true), q = wpe.clone().requires_grad_(true);
    torch::Tensor y = owned ? owned_embedding(ids, e, q)
                            : torch::nn::functional::embedding(ids, e) +
                                  torch::nn::functional::embedding(torch::arange(40), q);
    (y * up).sum().backward();
    return std::vector<torch::Tensor>{y.detach(), e.grad(), q.grad()};
  };
  const auto one = run_emb(true, 1);
  for (int n : {2, 3, 8}) {
    const auto g = run_emb(true, n);
    for (size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(same_bits(g[i], one[i])) << "lanes " << n << ", output " << i;
  }
  const auto ref = run_emb(false, 1);
  EXPECT_TRUE(same_bits(one[0], ref[0]));  // the forward is a copy and one add, as LibTorch's
  for (size_t i = 1; i < ref.size(); ++i) EXPECT_TRUE(torch::allclose(one[i], ref[i], 1e-5, 1e-5)) << "output " << i;
  OwnedPath p(1);
  try {
    owned_embedding(torch::tensor({{1, 50}}, torch::kLong), wte, wpe);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("token id 50 at position 1"), std::string::npos) << e.what();
  }
}

TEST(OwnedGradNorm, SameBitsAtEveryLaneCountAndCloseToLibTorch) {
  torch::manual_seed(5);
  std::vector<torch::Tensor> params;
  for (int64_t n : {int64_t{401408}, int64_t{512}, int64_t{131072}, int64_t{10}, int64_t{200003}}) {
    torch::Tensor p = torch::zeros({n}, torch::requires_grad());
    p.mutable_grad() = torch::randn({n});
    params.push_back(p);
  }
  double one = 0;
  {
    OwnedPath p(1);
    one = train::global_grad_norm(params);
  }
  for (int n : {2, 3, 8}) {
    OwnedPath p(n);
    EXPECT_EQ(train::global_grad_norm(params), one) << "lanes " << n;
  }
  double exact = 0;
  for (const auto& p : params) exact += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
  EXPECT_NEAR(one, std::sqrt(exact), 1e-6 * std::sqrt(exact));
}

}  // namespace
}  // namespace retrace::model
