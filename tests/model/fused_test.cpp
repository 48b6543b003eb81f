// The fused GPT ops (model/fused.h) against the plain ops they replace, bitwise, at one and two
// lanes; the lanes themselves (model/lanes.h); and a negative control showing that the alignment
// rule the fused ops follow is needed.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "model/blas_threads.h"
#include "model/dropout.h"
#include "model/fused.h"
#include "model/gelu_kernel.h"
#include "model/gpt.h"
#include "model/lanes.h"
#include "model/mlp.h"
#include "rng/philox.h"

namespace retrace::model {
namespace {

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  // Not torch::equal: NaN != NaN there, and -0 == +0; the bits are what a trace digests.
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.numel() * a.element_size()) == 0;
}

void seed(uint64_t s) {
  at::Generator g = at::globalContext().defaultGenerator(c10::Device(c10::kCPU));
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_current_seed(s);
}

torch::Tensor rng_state() {
  at::Generator g = at::globalContext().defaultGenerator(c10::Device(c10::kCPU));
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}

// The lane counts every lane test runs at: results must equal one lane's bit for bit.
constexpr int kLaneCounts[] = {1, 2, 3, 4, 8};

struct LanesGuard {
  explicit LanesGuard(int n) : before(lanes()) { set_lanes(n); }
  ~LanesGuard() { set_lanes(before); }
  int before;
};

// The ops the GPT ran before the fused function, out of place (their in-place forms have the same
// bits: gpt_test's AttentionInPlace).
torch::Tensor plain_attention_weights(const torch::Tensor& scores, double scale, double p, bool training) {
  const int64_t t = scores.size(-1);
  torch::Tensor att = scores * scale;
  torch::Tensor future = torch::ones({t, t}, scores.options().dtype(torch::kBool)).triu(/*diagonal=*/1);
  att = att.masked_fill(future, -std::numeric_limits<double>::infinity());
  att = torch::softmax(att, /*dim=*/-1);
  return dropout(att, p, training, DropoutImpl::kPhilox);
}

TEST(Fused, AttentionWeightsSameBitsAsThePlainOps) {
  // The char GPT's shape (32 tiles), sizes that are not multiples of 16, and one element.
  for (auto [b, h, t] : {std::tuple<int64_t, int64_t, int64_t>{16, 4, 128}, {3, 5, 37}, {2, 3, 130}, {1, 1, 1}}) {
    for (auto [p, training] : {std::pair<double, bool>{0.1, true}, {0.0, true}, {0.1, false}}) {
      for (int n : kLaneCounts) {
        LanesGuard lanes(n);
        seed(5 + t);
        torch::Tensor scores = torch::randn({b, h, t, t}) * 3.0;
        scores.view({-1})[0] = 40.0f;  // a large logit: exp's range
        if (t > 2) {
          // An infinite and a NaN score: their rows' weights are NaN, masked positions included.
          scores[0][0][t - 1][1] = std::numeric_limits<float>::infinity();
          scores[0][0][t - 2][0] = std::numeric_limits<float>::quiet_NaN();
        }
        torch::Tensor upstream = torch::randn({b, h, t, t});
        const double scale = 1.0 / std::sqrt(32.0);
        torch::Tensor a_in = scores.clone().requires_grad_(true);
        torch::Tensor b_in = scores.clone().requires_grad_(true);
        seed(77);
        torch::Tensor a = causal_attention_weights(a_in, scale, p, training);
        torch::Tensor rng_a = rng_state();
        seed(77);
        torch::Tensor ref = plain_attention_weights(b_in, scale, p, training);
        torch::Tensor rng_b = rng_state();
        const std::string where = "[" + std::to_string(b) + ", " + std::to_string(h) + ", " + std::to_string(t) +
                                  "] p " + std::to_string(p) + (training ? " training" : " eval") + ", lanes " +
                                  std::to_string(n);
        ASSERT_TRUE(same_bits(a, ref)) << "forward differs, " << where;
        EXPECT_TRUE(same_bits(rng_a, rng_b)) << "generator state differs, " << where;
        a.backward(upstream);
        ref.backward(upstream);
        EXPECT_TRUE(same_bits(a_in.grad(), b_in.grad())) << "gradient differs, " << where;
        if (t > 1) {
          EXPECT_GT(a_in.grad().nan_to_num(0.0, 0.0, 0.0).abs().sum().item<double>(), 0.0) << where;
        }
      }
    }
  }
}

TEST(Fused, GeluSameBitsAsTorchGelu) {
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            1e-40f,
                            -1e-40f,
                            1e30f,
                            -9.5f,
                            5.0f};
  for (int64_t n :
       {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{32768}, int64_t{2 * 32768 + 17}, int64_t{200003}}) {
    for (int lanes_n : kLaneCounts) {
      LanesGuard lanes(lanes_n);
      seed(static_cast<uint64_t>(n));
      torch::Tensor x = torch::randn({n}) * 4.0;
      for (int64_t i = 0; i < n && i < 10; ++i) x[n - 1 - i] = specials[i];  // the scalar tail too
      torch::Tensor upstream = torch::randn({n});
      torch::Tensor a_in = x.clone().requires_grad_(true), b_in = x.clone().requires_grad_(true);
      torch::Tensor a = fused_gelu(a_in), ref = torch::gelu(b_in);
      ASSERT_TRUE(same_bits(a, ref)) << "forward differs, n " << n << ", lanes " << lanes_n;
      a.backward(upstream);
      ref.backward(upstream);
      EXPECT_TRUE(same_bits(a_in.grad(), b_in.grad())) << "gradient differs, n " << n << ", lanes " << lanes_n;
    }
  }
}

// model.gelu_impl = "retrace": the autograd function on the lanes gives the kernel's own bits
// (model/gelu_kernel.h, computed here in one call over the whole tensor), forward and backward, at
// one and two lanes; gelu() takes LibTorch's GELU for what the fused path does not take.
TEST(Fused, RetraceGeluSameBitsAsItsKernelOnTheLanes) {
  for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{32768}, int64_t{2 * 32768 + 17}, int64_t{200003}}) {
    for (int lanes_n : kLaneCounts) {
      LanesGuard lanes(lanes_n);
      seed(static_cast<uint64_t>(n) + 5);
      const torch::Tensor x = torch::randn({n}) * 4.0, upstream = torch::randn({n});
      torch::Tensor want = torch::empty({n}), want_grad = torch::empty({n});
      gelu_forward(x.data_ptr<float>(), want.data_ptr<float>(), n);
      gelu_backward(upstream.data_ptr<float>(), x.data_ptr<float>(), want_grad.data_ptr<float>(), n);
      torch::Tensor in = x.clone().requires_grad_(true);
      torch::Tensor y = gelu(in, GeluImpl::kRetrace);
      ASSERT_TRUE(same_bits(y, want)) << "forward differs, n " << n << ", lanes " << lanes_n;
      y.backward(upstream);
      EXPECT_TRUE(same_bits(in.grad(), want_grad)) << "gradient differs, n " << n << ", lanes " << lanes_n;
      // Not LibTorch's bits (else the key would choose nothing), yet the same function.
      if (n >= 17) {
        EXPECT_FALSE(same_bits(y, torch::gelu(x))) << n;
      }
      EXPECT_TRUE(torch::allclose(y, torch::gelu(x), 1e-5, 1e-6)) << n;
    }
  }
  const torch::Tensor d = torch::randn({40}, torch::kDouble);
  EXPECT_TRUE(same_bits(gelu(d, GeluImpl::kRetrace), torch::gelu(d)));  // float64: LibTorch's
}

// The MLP's GELU (model.activation = "gelu") follows model.gelu_impl too; "torch" is the call it
// made before the key existed.
TEST(Fused, MlpGeluFollowsTheKey) {
  for (GeluImpl impl : {GeluImpl::kRetrace, GeluImpl::kTorch}) {
    MlpOptions o;
    o.inputs = 20, o.hidden = {48}, o.outputs = 3, o.activation = Activation::kGelu, o.dropout = 0, o.gelu_impl = impl;
    seed(21);
    MlpImpl mlp(o);
    const torch::Tensor x = torch::randn({5, 20});
    const auto modules = mlp.named_modules("", /*include_self=*/false);
    auto& l0 = *modules["layers.0"]->as<torch::nn::Linear>();
    auto& l1 = *modules["layers.1"]->as<torch::nn::Linear>();
    torch::NoGradGuard no_grad;
    const torch::Tensor h = l0.forward(x);
    torch::Tensor a = torch::empty_like(h);
    if (impl == GeluImpl::kRetrace) gelu_forward(h.data_ptr<float>(), a.data_ptr<float>(), h.numel());
    else a = torch::gelu(h);
    EXPECT_TRUE(same_bits(mlp.forward(x), l1.forward(a))) << option_name(impl);
  }
}

// Negative control: ATen's scalar GELU loop (taken by a strided tensor, and by elements outside
// the vector blocks) rounds many values differently from its vector loop: tiles that moved an
// element from one loop to the other would move bits, which the alignment rule of fused.h rules out.
TEST(Fused, NegativeControlGeluScalarAndVectorLoopsRoundDifferently) {
  seed(3);
  torch::Tensor x = torch::randn({1 << 16}) * 3.0;
  torch::Tensor vector_loop = torch::gelu(x);
  torch::Tensor spaced = torch::stack({x, torch::zeros_like(x)}, 1);  // x at stride 2: the scalar loop
  torch::Tensor scalar_loop = torch::gelu(spaced.select(1, 0));
  ASSERT_FALSE(spaced.select(1, 0).is_contiguous());
  const int64_t differ = (vector_loop != scalar_loop).sum().item<int64_t>();
  std::printf("GELU: %lld of %d elements round differently in ATen's scalar and vector loops\n",
              static_cast<long long>(differ), 1 << 16);
  EXPECT_GT(differ, 0) << "no element rounded differently: this control no longer shows the rule";
  torch::Tensor aligned = torch::cat(
      {torch::gelu(x.narrow(0, 0, 4096)), torch::gelu(x.narrow(0, 4096, x.numel() - 4096))});
  EXPECT_TRUE(same_bits(vector_loop, aligned));
}

TEST(Fused, SplitAndMergeHeadsSameBitsAsTheViews) {
  // The char GPT's shape, odd sizes, one token and one head of one element; every lane count.
  for (auto [b, t, h, dh] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t>{16, 128, 4, 32}, {3, 37, 5, 12}, {2, 1, 1, 1}}) {
    for (int n : kLaneCounts) {
      LanesGuard lanes(n);
      const int64_t d = h * dh;
      const std::string where = "[" + std::to_string(b) + ", " + std::to_string(t) + ", " + std::to_string(h) + " x " +
                                std::to_string(dh) + "], lanes " + std::to_string(n);
      seed(3 + t);
      torch::Tensor qkv = torch::randn({b, t, 3 * d});
      torch::Tensor up[3] = {torch::randn({b, h, t, dh}), torch::randn({b, h, dh, t}), torch::randn({b, h, t, dh})};
      torch::Tensor bias = torch::randn({3 * d});
      // Gradients for all three parts, and for k alone (split's backward fills zeros for q and v);
      // with the projection's bias added on the way (against qkv + bias) and without.
      for (auto [k_only, with_bias] :
           {std::pair<bool, bool>{false, false}, {true, false}, {false, true}, {true, true}}) {
        torch::Tensor a_in = qkv.clone().requires_grad_(true);
        torch::Tensor b_in = qkv.clone().requires_grad_(true);
        torch::Tensor a_bias = bias.clone().requires_grad_(true);
        torch::Tensor b_bias = bias.clone().requires_grad_(true);
        const std::array<torch::Tensor, 3> a = split_heads(a_in, h, with_bias ? a_bias : torch::Tensor());
        auto parts = (with_bias ? b_in + b_bias : b_in).split(d, /*dim=*/-1);
        const torch::Tensor ref[3] = {parts[0].view({b, t, h, dh}).transpose(1, 2),
                                      parts[1].view({b, t, h, dh}).transpose(1, 2).transpose(-2, -1),
                                      parts[2].view({b, t, h, dh}).transpose(1, 2)};
        for (int p = 0; p < 3; ++p) {
          ASSERT_TRUE(a[p].is_contiguous()) << where;
          ASSERT_TRUE(same_bits(a[p], ref[p])) << "part " << p << " differs, " << where;
        }
        if (k_only) {
          torch::autograd::backward({a[1]}, {up[1]});
          torch::autograd::backward({ref[1]}, {up[1]});
        } else {
          torch::autograd::backward({a[0], a[1], a[2]}, {up[0], up[1], up[2]});
          torch::autograd::backward({ref[0], ref[1], ref[2]}, {up[0], up[1], up[2]});
        }
        const std::string which = std::string(k_only ? ", k only" : "") + (with_bias ? ", bias" : "");
        EXPECT_TRUE(same_bits(a_in.grad(), b_in.grad())) << "gradient differs, " << where << which;
        EXPECT_GT(a_in.grad().abs().sum().item<double>(), 0.0) << where;
        if (with_bias) {
          EXPECT_TRUE(same_bits(a_bias.grad(), b_bias.grad())) << "bias gradient differs, " << where << which;
        }
      }
      torch::Tensor y = torch::randn({b, h, t, dh});
      torch::Tensor upstream = torch::randn({b, t, d});
      torch::Tensor a_in = y.clone().requires_grad_(true);
      torch::Tensor b_in = y.clone().requires_grad_(true);
      torch::Tensor merged = merge_heads(a_in);
      torch::Tensor ref = b_in.transpose(1, 2).contiguous().view({b, t, d});
      ASSERT_TRUE(same_bits(merged, ref)) << "merge differs, " << where;
      merged.backward(upstream);
      ref.backward(upstream);
      EXPECT_TRUE(same_bits(a_in.grad(), b_in.grad())) << "merge gradient differs, " << where;
    }
  }
  EXPECT_THROW(split_heads(torch::randn({2, 3, 10}), 4), InvariantError);  // 10 is not 3 x a multiple of 4
  EXPECT_THROW(split_heads(torch::randn({2, 3, 12}), 2, torch::randn({11})), InvariantError);
  EXPECT_THROW(merge_heads(torch::randn({2, 3, 4})), InvariantError);
}

// x + dropout(branch): forward, both gradients and the generator state against model::dropout and
// the sum, at one and two lanes, on sizes that are and are not multiples of the tile.
TEST(Fused, DropoutResidualSameBitsAsThePlainOps) {
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{16, 128, 128}, {3, 37, 60}, {300007}, {1}}) {
    for (auto [n, with_bias] : {std::pair<int, bool>{1, false}, {2, false}, {1, true}, {2, true}}) {
      LanesGuard lanes(n);
      seed(8);
      torch::Tensor branch = torch::randn(shape) * 2.0;
      torch::Tensor x = torch::randn(shape);
      torch::Tensor bias = torch::randn({shape.back()});
      torch::Tensor upstream = torch::randn(shape);
      torch::Tensor a_branch = branch.clone().requires_grad_(true), a_x = x.clone().requires_grad_(true);
      torch::Tensor b_branch = branch.clone().requires_grad_(true), b_x = x.clone().requires_grad_(true);
      torch::Tensor a_bias = bias.clone().requires_grad_(true), b_bias = bias.clone().requires_grad_(true);
      seed(41);
      torch::Tensor a = dropout_residual(a_branch, with_bias ? a_bias : torch::Tensor(), a_x, 0.1);
      torch::Tensor rng_a = rng_state();
      seed(41);
      torch::Tensor ref = dropout(with_bias ? b_branch + b_bias : b_branch, 0.1, /*training=*/true,
                                  DropoutImpl::kPhilox) +
                          b_x;
      torch::Tensor rng_b = rng_state();
      const std::string where = std::to_string(branch.numel()) + " elements, lanes " + std::to_string(n) +
                                (with_bias ? ", bias" : "");
      ASSERT_TRUE(same_bits(a, ref)) << "forward differs, " << where;
      EXPECT_TRUE(same_bits(rng_a, rng_b)) << "generator state differs, " << where;
      a.backward(upstream);
      ref.backward(upstream);
      EXPECT_TRUE(same_bits(a_branch.grad(), b_branch.grad())) << "branch gradient differs, " << where;
      EXPECT_TRUE(same_bits(a_x.grad(), b_x.grad())) << "residual gradient differs, " << where;
      if (with_bias) {
        EXPECT_TRUE(same_bits(a_bias.grad(), b_bias.grad())) << "bias gradient differs, " << where;
      }
      if (branch.numel() > 100) {
        EXPECT_GT((a_branch.grad() == 0).sum().item<int64_t>(), 0) << "nothing dropped, " << where;
      }
    }
  }
  EXPECT_THROW(dropout_residual(torch::randn({4}), torch::Tensor(), torch::randn({5}), 0.1), InvariantError);
  EXPECT_THROW(dropout_residual(torch::randn({4}), torch::Tensor(), torch::randn({4}), 1.0), ConfigError);
  EXPECT_THROW(dropout_residual(torch::randn({2, 4}), torch::randn({2}), torch::randn({2, 4}), 0.1), InvariantError);
}

// gelu(x + bias) against the sum and the GELU, both implementations, forward and both gradients, at
// one and two lanes, on rows that are and are not multiples of 16 floats.
TEST(Fused, BiasGeluSameBitsAsTheSumAndTheGelu) {
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{16, 128, 512}, {3, 37, 60}, {5, 1}}) {
    for (GeluImpl impl : {GeluImpl::kRetrace, GeluImpl::kTorch}) {
      for (int n : kLaneCounts) {
        LanesGuard lanes(n);
        seed(12);
        torch::Tensor x = torch::randn(shape) * 3.0;
        torch::Tensor bias = torch::randn({shape.back()});
        torch::Tensor upstream = torch::randn(shape);
        torch::Tensor a_x = x.clone().requires_grad_(true), b_x = x.clone().requires_grad_(true);
        torch::Tensor a_bias = bias.clone().requires_grad_(true), b_bias = bias.clone().requires_grad_(true);
        torch::Tensor a = bias_gelu(a_x, a_bias, impl);
        torch::Tensor ref = gelu(b_x + b_bias, impl);
        const std::string where = std::to_string(x.numel()) + " elements, " +
                                  (impl == GeluImpl::kRetrace ? "retrace" : "torch") + ", lanes " + std::to_string(n);
        ASSERT_TRUE(same_bits(a, ref)) << "forward differs, " << where;
        a.backward(upstream);
        ref.backward(upstream);
        EXPECT_TRUE(same_bits(a_x.grad(), b_x.grad())) << "input gradient differs, " << where;
        EXPECT_TRUE(same_bits(a_bias.grad(), b_bias.grad())) << "bias gradient differs, " << where;
        EXPECT_GT(a_bias.grad().abs().sum().item<double>(), 0.0) << where;
      }
    }
  }
  EXPECT_THROW(bias_gelu(torch::randn({2, 4}), torch::randn({3}), GeluImpl::kRetrace), InvariantError);
}

// The bias gradient on two lanes against at::sum_to, for every width up to 300 and wider ones,
// over rows that are and are not a multiple of the vector blocks.
TEST(Fused, BiasGradientSameBitsAsSumTo) {
  std::vector<int64_t> widths;
  for (int64_t n = 1; n <= 300; ++n) widths.push_back(n);
  for (int64_t n : {383, 384, 385, 511, 512, 513, 640, 1000}) widths.push_back(n);
  for (int64_t rows : {int64_t{2048}, int64_t{37}}) {
    for (int64_t n : widths) {
      seed(static_cast<uint64_t>(n));
      torch::Tensor g = torch::randn({rows / 16 > 0 ? 16 : 1, rows / 16 > 0 ? rows / 16 : rows, n}) * 4.0;
      const int64_t shape[1] = {n};
      torch::Tensor ref = at::sum_to(g, at::IntArrayRef(shape, 1));
      for (int lanes_n : kLaneCounts) {
        LanesGuard lanes(lanes_n);
        ASSERT_TRUE(same_bits(bias_gradient(g, n), ref)) << "width " << n << ", " << rows << " rows, lanes " << lanes_n;
      }
    }
  }
  EXPECT_THROW(bias_gradient(torch::randn({4, 5}), 4), InvariantError);
}

// torch::matmul(a, b) and its gradients with OpenBLAS on one thread: what lanes_bmm must give.
std::array<torch::Tensor, 3> matmul_on_one_blas_thread(const torch::Tensor& a, const torch::Tensor& b,
                                                       const torch::Tensor& upstream) {
  const OneBlasThread one;
  const torch::Tensor x = a.detach().clone().set_requires_grad(true), y = b.detach().clone().set_requires_grad(true);
  const torch::Tensor xs = a.is_contiguous() ? x : x.transpose(-2, -1).contiguous().transpose(-2, -1);
  torch::Tensor out = torch::matmul(xs, y);
  out.backward(upstream);
  return {out.detach(), x.grad(), y.grad()};
}

TEST(Fused, LanesBmmSameBitsAsMatmulOnOneBlasThread) {
  // The char GPT's two products (q @ k^T, weights @ v), odd sizes, batches that do not split into
  // whole slices, matrices under ATen's 400-element threshold (its own loop, not the BLAS), 3-d
  // inputs, and a transposed (strided) operand, which matmul and lanes_bmm both copy first.
  const int before = openblas_threads();
  struct Case {
    std::vector<int64_t> a, b;
    bool transposed_a;
  };
  const std::vector<Case> cases = {{{16, 4, 128, 32}, {16, 4, 32, 128}, false},
                                   {{16, 4, 128, 128}, {16, 4, 128, 32}, false},
                                   {{3, 5, 37, 12}, {3, 5, 12, 29}, false},
                                   {{2, 3, 5, 4}, {2, 3, 4, 6}, false},
                                   {{17, 33, 9}, {17, 9, 40}, false},
                                   {{2, 7, 24, 10}, {2, 7, 24, 19}, true},
                                   {{3, 5, 24, 10}, {3, 5, 24, 19}, true},
                                   {{1, 1, 24, 10}, {1, 1, 24, 19}, true},
                                   {{3, 1, 24, 10}, {3, 1, 24, 19}, true}};
  for (const Case& c : cases) {
    seed(17 + c.a.back());
    torch::Tensor a = torch::randn(c.a), b = torch::randn(c.b);
    if (c.transposed_a) a = a.transpose(-2, -1);  // [.., 10, 24] seen through a transpose
    std::vector<int64_t> out_shape(a.sizes().begin(), a.sizes().end());
    out_shape.back() = b.size(-1);
    const torch::Tensor upstream = torch::randn(out_shape);
    const auto want = matmul_on_one_blas_thread(a, b, upstream);
    for (int n : kLaneCounts) {
      LanesGuard lanes(n);
      const torch::Tensor x = a.detach().clone().set_requires_grad(true),
                          y = b.detach().clone().set_requires_grad(true);
      const torch::Tensor xs = c.transposed_a ? x.transpose(-2, -1).contiguous().transpose(-2, -1) : x;
      ASSERT_TRUE(lanes_bmm_applies(xs, y));
      torch::Tensor out = lanes_bmm(xs, y);
      out.backward(upstream);
      EXPECT_TRUE(same_bits(out, want[0])) << c.a << " lanes " << n;
      EXPECT_TRUE(same_bits(x.grad(), want[1])) << c.a << " lanes " << n << " (a's gradient)";
      EXPECT_TRUE(same_bits(y.grad(), want[2])) << c.a << " lanes " << n << " (b's gradient)";
    }
  }
  EXPECT_EQ(openblas_threads(), before) << "OneBlasThread must restore OpenBLAS's thread count";
  // What it does not take: broadcast batches, other dtypes, matrices (matmul's other paths).
  EXPECT_FALSE(lanes_bmm_applies(torch::randn({2, 3, 4}), torch::randn({1, 4, 5})));
  EXPECT_FALSE(lanes_bmm_applies(torch::randn({2, 3, 4}, torch::kDouble), torch::randn({2, 4, 5}, torch::kDouble)));
  EXPECT_FALSE(lanes_bmm_applies(torch::randn({3, 4}), torch::randn({4, 5})));
  EXPECT_THROW(lanes_bmm(torch::randn({2, 3, 4}), torch::randn({2, 5, 4})), InvariantError);
}

TEST(Fused, DropoutMaskSameAtEveryLaneCount) {
  torch::Tensor x = torch::ones({300007});
  torch::Tensor out[2];
  for (int n : kLaneCounts) {
    LanesGuard lanes(n);
    seed(21);
    out[n > 1] = dropout(x, 0.1, /*training=*/true, DropoutImpl::kPhilox);
    if (n > 1) {
      EXPECT_TRUE(same_bits(out[0], out[1])) << n << " lanes";
    }
  }
  seed(21);
  const PhiloxMask m = *draw_philox_mask(0.1, /*training=*/true);
  std::vector<float> mask(300007);
  rng::dropout_mask(m.key, m.threshold, m.keep_scale, mask.data(), 300007);
  EXPECT_EQ(std::memcmp(out[1].data_ptr<float>(), mask.data(), mask.size() * sizeof(float)), 0);
}

// A GPT whose attention weights and MLP activations span several tiles: forward, loss, every
// gradient and the generator state at one and two lanes.
TEST(Fused, GptStepSameBitsAtEveryLaneCount) {
  GptOptions o;
  o.vocab_size = 13;
  o.context = 64;
  o.d_model = 64;
  o.n_layers = 2;
  o.n_heads = 4;
  o.dropout = 0.1;
  seed(1);
  Gpt model(o);
  seed(2);
  torch::Tensor idx = torch::randint(0, 13, {8, 64}, torch::kLong);
  torch::Tensor target = torch::randint(0, 13, {8, 64}, torch::kLong);
  torch::Tensor loss[2], rng[2];
  std::vector<torch::Tensor> grads[2];
  for (int n : kLaneCounts) {
    LanesGuard lanes(n);
    const int k = n > 1;  // 0: the one-lane reference, 1: this lane count
    model->zero_grad();
    seed(3);
    torch::Tensor logits = model->forward(idx);
    loss[k] = torch::nn::functional::cross_entropy(logits.view({-1, 13}), target.view({-1}));
    loss[k].backward();
    rng[k] = rng_state();
    grads[k].clear();
    for (const auto& p : model->parameters()) grads[k].push_back(p.grad().clone());
    if (k == 0) continue;
    EXPECT_TRUE(same_bits(loss[0], loss[1])) << n << " lanes";
    EXPECT_TRUE(same_bits(rng[0], rng[1])) << n << " lanes";
    ASSERT_EQ(grads[0].size(), grads[1].size());
    for (size_t i = 0; i < grads[0].size(); ++i)
      EXPECT_TRUE(same_bits(grads[0][i], grads[1][i])) << "gradient " << i << ", " << n << " lanes";
  }
}

TEST(Lanes, EachLaneRunsOnceAndExceptionsReachTheCaller) {
  LanesGuard lanes(2);
  std::atomic<int> ran[2] = {0, 0};
  std::thread::id who[2];
  run_lanes([&](int lane) {
    ran[lane]++;
    who[lane] = std::this_thread::get_id();
  });
  EXPECT_EQ(ran[0].load(), 1);
  EXPECT_EQ(ran[1].load(), 1);
  EXPECT_EQ(who[0], std::this_thread::get_id());
  EXPECT_NE(who[1], std::this_thread::get_id());
  for (int failing : {0, 1}) {
    EXPECT_THROW(run_lanes([&](int lane) {
                   if (lane == failing) throw std::runtime_error("lane failed");
                 }),
                 std::runtime_error);
  }
  // Grad mode travels to the helper lane.
  bool grad_on[2] = {true, true};
  {
    torch::NoGradGuard no_grad;
    run_lanes([&](int lane) { grad_on[lane] = torch::GradMode::is_enabled(); });
  }
  EXPECT_FALSE(grad_on[0]);
  EXPECT_FALSE(grad_on[1]);
}

// Loans (LaneLoan, the checkpoint writer's) taken and returned while tiles are handed out, between a
// caller's reading of lanes() and the call's, lose no tile and run none twice.
TEST(Lanes, ALoanTakenOrReturnedDuringACallLosesNoTile) {
  LanesGuard three(3);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> toggles{0};
  std::thread lender([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      LaneLoan loan;
      toggles++;
      std::this_thread::yield();
    }
  });
  std::vector<std::atomic<int>> seen(7);
  int64_t calls = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  for (; calls < 20000 && std::chrono::steady_clock::now() < until; ++calls) {
    for (auto& s : seen) s.store(0, std::memory_order_relaxed);
    // Tiles as many as the lanes counted now (gemm_on_lanes does so), handed out by for_each_tile.
    const int64_t tiles = std::min<int64_t>(lanes(), 7);
    for_each_tile(tiles * 10, 10, [&](int64_t begin, int64_t end, int) {
      for (int64_t t = begin / 10; t < (end + 9) / 10; ++t) seen[t]++;
    });
    for (int64_t t = 0; t < 7; ++t) ASSERT_EQ(seen[t].load(), t < tiles ? 1 : 0) << "tile " << t << ", call " << calls;
  }
  stop = true;
  lender.join();
  EXPECT_GT(toggles.load(), 0);
  EXPECT_EQ(lanes(), 3);
  EXPECT_EQ(lanes_lent(), 0);
}

TEST(Lanes, ConcurrentCallersAllFinish) {
  LanesGuard lanes(2);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&] {
      for (int i = 0; i < 200; ++i) run_lanes([&](int lane) { total += lane + 1; });
    });
  for (auto& c : callers) c.join();
  EXPECT_EQ(total.load(), 4 * 200 * 3);
  {
    // More lanes than before: the pool grows; fewer again: the extra helpers sit the jobs out.
    LanesGuard five(5);
    total = 0;
    for (int i = 0; i < 100; ++i) run_lanes([&](int lane) { total += lane + 1; });
    EXPECT_EQ(total.load(), 100 * 15);
  }
  total = 0;
  for (int i = 0; i < 100; ++i) run_lanes([&](int lane) { total += lane + 1; });
  EXPECT_EQ(total.load(), 100 * 3);
  EXPECT_THROW(set_lanes(0), ConfigError);
  EXPECT_THROW(set_lanes(kMaxLanes + 1), ConfigError);
}

}  // namespace
}  // namespace retrace::model
