// The GPT and its activation-checkpoint policies: shapes, causality, and bitwise equality of
// loss, gradients and generator state between every policy and "none" with dropout on.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/torch_compat.h"
#include "model/activation_checkpoint.h"
#include "model/gpt.h"
#include "model/memory_plan.h"

namespace retrace::model {
namespace {

constexpr int64_t kVocab = 11;
constexpr int64_t kContext = 16;
constexpr int64_t kBatch = 4;

GptOptions tiny(const std::string& policy = "none", int64_t every = 4) {
  GptOptions o;
  o.vocab_size = kVocab;
  o.context = kContext;
  o.d_model = 32;
  o.n_layers = 4;
  o.n_heads = 4;
  o.dropout = 0.1;
  o.checkpoint = *from_name<CheckpointPolicy>(kCheckpointPolicyNames, policy.c_str());
  o.checkpoint_every = every;
  return o;
}

at::Generator cpu_generator() { return at::globalContext().defaultGenerator(c10::Device(c10::kCPU)); }

void seed(uint64_t s) {
  at::Generator g = cpu_generator();
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_current_seed(s);
}

torch::Tensor cpu_rng_state() {
  at::Generator g = cpu_generator();
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}

struct StepResult {
  torch::Tensor logits;
  torch::Tensor loss;
  std::map<std::string, torch::Tensor> grads;
  torch::Tensor rng_after_forward;
  torch::Tensor rng_after_backward;
};

// One training forward and backward of a freshly seeded tiny GPT; dropout on.
StepResult train_step(const GptOptions& options) {
  seed(1234);
  Gpt model(options);
  model->train();
  torch::Tensor idx = torch::randint(0, kVocab, {kBatch, kContext}, torch::kLong);
  torch::Tensor targets = torch::randint(0, kVocab, {kBatch, kContext}, torch::kLong);
  StepResult r;
  r.logits = model->forward(idx);
  r.loss = torch::nn::functional::cross_entropy(r.logits.view({-1, kVocab}), targets.view({-1}));
  r.rng_after_forward = cpu_rng_state();
  r.loss.backward();
  r.rng_after_backward = cpu_rng_state();
  for (const auto& p : model->named_parameters()) r.grads[p.key()] = p.value().grad().clone();
  return r;
}

TEST(Gpt, ForwardShapes) {
  seed(1);
  Gpt model(tiny());
  torch::Tensor idx = torch::randint(0, kVocab, {kBatch, kContext}, torch::kLong);
  EXPECT_EQ(model->forward(idx).sizes(), (std::vector<int64_t>{kBatch, kContext, kVocab}));
  EXPECT_EQ(model->forward(idx.slice(1, 0, 5)).sizes(), (std::vector<int64_t>{kBatch, 5, kVocab}));
  EXPECT_THROW(model->forward(torch::zeros({1, kContext + 1}, torch::kLong)), ConfigError);
  EXPECT_NE(model->describe().find("n_layers=4"), std::string::npos);
}

TEST(Gpt, NamesAndParameterCount) {
  seed(1);
  Gpt model(tiny());
  auto params = model->named_parameters();
  EXPECT_TRUE(params.contains("wte.weight"));
  EXPECT_TRUE(params.contains("wpe.weight"));
  EXPECT_TRUE(params.contains("blocks.3.attn_qkv.weight"));
  EXPECT_TRUE(params.contains("blocks.0.mlp_proj.bias"));
  EXPECT_TRUE(params.contains("head.weight"));
  // wte + wpe + 4 * (2 LN + qkv + proj + fc + fc_out) + ln_f + head
  const int64_t d = 32;
  const int64_t block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d);
  EXPECT_EQ(count_parameters(*model), kVocab * d + kContext * d + 4 * block + 2 * d + (d * kVocab + kVocab));
}

TEST(Gpt, TiedEmbeddingsShareTheTokenEmbeddingAsOutputLayer) {
  seed(1);
  GptOptions o = tiny();
  o.tie_embeddings = true;
  Gpt model(o);
  auto params = model->named_parameters();
  EXPECT_FALSE(params.contains("head.weight"));
  EXPECT_FALSE(params.contains("head.bias"));
  Gpt untied(tiny());
  EXPECT_EQ(count_parameters(*untied) - count_parameters(*model), kVocab * 32 + kVocab);
  for (bool tied : {false, true})
    EXPECT_EQ(gpt_parameter_count(kVocab, kContext, 32, 4, tied), count_parameters(*(tied ? model : untied)));
  // The logits are the final hidden states times the embedding: its gradient gets both uses.
  model->eval();
  torch::Tensor idx = torch::randint(0, kVocab, {kBatch, kContext}, torch::kLong);
  torch::Tensor logits = model->forward(idx);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{kBatch, kContext, kVocab}));
  logits.sum().backward();
  const torch::Tensor g = params["wte.weight"].grad();
  ASSERT_TRUE(g.defined());
  // Every row gets the output layer's gradient, also tokens that never occur in idx.
  EXPECT_GT(g.abs().sum(1).min().item<float>(), 0.0f);
  EXPECT_NE(model->describe().find("tied"), std::string::npos);
  // GPT-2 small, as configs/gpt2-124m.toml: 124,439,808 parameters tied, 163,087,441 untied.
  EXPECT_EQ(gpt_parameter_count(50257, 1024, 768, 12, true), 124439808);
  EXPECT_EQ(gpt_parameter_count(50257, 1024, 768, 12, false), 124439808 + 50257 * 768 + 50257);
}

TEST(Gpt, CausalMaskHidesTheFuture) {
  seed(2);
  Gpt model(tiny());
  model->eval();
  torch::NoGradGuard no_grad;
  torch::Tensor idx = torch::randint(0, kVocab, {kBatch, kContext}, torch::kLong);
  torch::Tensor changed = idx.clone();
  changed.select(1, kContext - 1).copy_((idx.select(1, kContext - 1) + 1) % kVocab);
  torch::Tensor a = model->forward(idx);
  torch::Tensor b = model->forward(changed);
  EXPECT_TRUE(torch::equal(a.slice(1, 0, kContext - 1), b.slice(1, 0, kContext - 1)));
  EXPECT_FALSE(torch::equal(a.select(1, kContext - 1), b.select(1, kContext - 1)));
}

TEST(Gpt, InitializationIsAFunctionOfTheSeed) {
  seed(3);
  Gpt a(tiny());
  seed(3);
  Gpt b(tiny("full"));
  auto pa = a->named_parameters();
  for (const auto& p : b->named_parameters()) EXPECT_TRUE(torch::equal(p.value(), pa[p.key()])) << p.key();
}

// A resume builds the model with initialize = false: the GPT-2 draws are skipped (the checkpoint
// sets every parameter), so the weights are torch::nn's own and fewer numbers are drawn.
TEST(Gpt, WithoutInitializationTheGpt2DrawsAreSkipped) {
  seed(3);
  Gpt drawn(tiny());
  const torch::Tensor after_drawn = torch::rand({4});
  GptOptions o = tiny();
  o.initialize = false;
  seed(3);
  Gpt skipped(o);
  const torch::Tensor after_skipped = torch::rand({4});
  EXPECT_FALSE(torch::equal(after_drawn, after_skipped));  // the generator drew less
  auto pd = drawn->named_parameters();
  int64_t weights = 0;
  for (const auto& p : skipped->named_parameters()) {
    if (p.value().dim() != 2) continue;
    ++weights;
    EXPECT_FALSE(torch::equal(p.value(), pd[p.key()])) << p.key();
  }
  EXPECT_GT(weights, 0);
  // No draw at all: neither GPT-2's nor LibTorch's of the layers.
  seed(3);
  EXPECT_TRUE(torch::equal(torch::rand({4}), after_skipped));
}

// The GPT's own Linear and Embedding draw what torch::nn's draw, in the same order: equal bits, and
// the same generator state after (so a recording's initial weights and the generator state its
// trace digests are those of torch::nn's modules, on both LibTorch builds).
TEST(Gpt, ItsLayersDrawWhatTorchNnDraws) {
  seed(11);
  torch::nn::Linear theirs(torch::nn::LinearOptions(48, 20));
  torch::nn::Embedding their_table(torch::nn::EmbeddingOptions(30, 12));
  const torch::Tensor their_next = torch::rand({8});
  seed(11);
  model::layers::Linear ours(48, 20);
  model::layers::Embedding our_table(30, 12);
  const torch::Tensor our_next = torch::rand({8});
  EXPECT_TRUE(torch::equal(ours->weight, theirs->weight));
  EXPECT_TRUE(torch::equal(ours->bias, theirs->bias));
  EXPECT_TRUE(torch::equal(our_table->weight, their_table->weight));
  EXPECT_TRUE(torch::equal(our_next, their_next));
  // The same parameter names in the same order, and the same forward.
  std::vector<std::string> names, their_names;
  for (const auto& p : ours->named_parameters()) names.push_back(p.key());
  for (const auto& p : theirs->named_parameters()) their_names.push_back(p.key());
  EXPECT_EQ(names, their_names);
  const torch::Tensor x = torch::randn({5, 48});
  EXPECT_TRUE(torch::equal(ours->forward(x), theirs->forward(x)));
  const torch::Tensor ids = torch::randint(30, {3, 4}, torch::kLong);
  EXPECT_TRUE(torch::equal(our_table->forward(ids), their_table->forward(ids)));
}

void expect_bitwise_equal(const StepResult& want, const StepResult& got) {
  EXPECT_TRUE(torch::equal(want.logits, got.logits));
  EXPECT_TRUE(torch::equal(want.loss, got.loss)) << want.loss.item<double>() << " vs " << got.loss.item<double>();
  EXPECT_TRUE(torch::equal(want.rng_after_forward, got.rng_after_forward));
  EXPECT_TRUE(torch::equal(want.rng_after_backward, got.rng_after_backward));
  ASSERT_EQ(want.grads.size(), got.grads.size());
  for (const auto& [name, g] : want.grads) {
    ASSERT_TRUE(got.grads.at(name).defined()) << name;
    EXPECT_TRUE(torch::equal(g, got.grads.at(name))) << name;
  }
}

class PolicyTest : public ::testing::TestWithParam<std::pair<std::string, int64_t>> {};

TEST_P(PolicyTest, BitwiseEqualToNoCheckpointing) {
  const StepResult reference = train_step(tiny("none"));
  const StepResult got = train_step(tiny(GetParam().first, GetParam().second));
  expect_bitwise_equal(reference, got);
}

INSTANTIATE_TEST_SUITE_P(Policies, PolicyTest,
                         ::testing::Values(std::make_pair(std::string("full"), int64_t{4}),
                                           std::make_pair(std::string("full"), int64_t{1}),
                                           std::make_pair(std::string("full"), int64_t{3}),
                                           std::make_pair(std::string("sqrt"), int64_t{4}),
                                           std::make_pair(std::string("selective"), int64_t{4})),
                         [](const auto& info) { return info.param.first + "_k" + std::to_string(info.param.second); });

// Counts the checkpoint nodes in the autograd graph of `output`, so the bitwise tests above cannot
// pass merely because a policy was silently not applied.
int count_checkpoint_nodes(const torch::Tensor& output) {
  std::vector<torch::autograd::Node*> stack = {output.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  int count = 0;
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    if (node->name().find("CheckpointFunction") != std::string::npos) ++count;
    for (const auto& edge : node->next_edges()) stack.push_back(edge.function.get());
  }
  return count;
}

TEST(Gpt, PoliciesPutTheExpectedSegmentsInTheGraph) {
  auto nodes = [](const std::string& policy, int64_t every) {
    seed(4);
    Gpt model(tiny(policy, every));
    model->train();
    return count_checkpoint_nodes(model->forward(torch::zeros({2, kContext}, torch::kLong)));
  };
  EXPECT_EQ(nodes("none", 4), 0);
  EXPECT_EQ(nodes("full", 4), 1);
  EXPECT_EQ(nodes("full", 1), 4);
  EXPECT_EQ(nodes("full", 3), 2);
  EXPECT_EQ(nodes("sqrt", 4), 2);       // 4 layers: segments of 2
  EXPECT_EQ(nodes("selective", 4), 4);  // one attention core per block
}

TEST(Gpt, EvalAndNoGradRunPlain) {
  seed(5);
  Gpt plain(tiny("none"));
  seed(5);
  Gpt full(tiny("full", 2));
  torch::Tensor idx = torch::randint(0, kVocab, {kBatch, kContext}, torch::kLong);
  plain->eval();
  full->eval();
  EXPECT_TRUE(torch::equal(plain->forward(idx), full->forward(idx)));
  EXPECT_TRUE(full->forward(idx).requires_grad());
  plain->train();
  full->train();
  torch::NoGradGuard no_grad;
  seed(9);
  torch::Tensor a = plain->forward(idx);
  seed(9);
  torch::Tensor b = full->forward(idx);
  EXPECT_TRUE(torch::equal(a, b));
}

TEST(Gpt, ValidationNamesTheKey) {
  auto message = [](const GptOptions& o) {
    try {
      Gpt model(o);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  GptOptions o = tiny();
  o.n_heads = 3;
  EXPECT_NE(message(o).find("model.n_heads"), std::string::npos) << message(o);
  o = tiny();
  o.vocab_size = 0;
  EXPECT_NE(message(o).find("model.vocab_size"), std::string::npos);
  o = tiny("full", 0);
  EXPECT_NE(message(o).find("model.checkpoint_every"), std::string::npos);
  o = tiny();
  o.dropout = 1.0;
  EXPECT_NE(message(o).find("model.dropout"), std::string::npos);
}

TEST(ActivationCheckpoint, SegmentLengths) {
  EXPECT_EQ(checkpoint_segment_lengths("sqrt", 8, 4), (std::vector<int64_t>{3, 3, 2}));
  EXPECT_EQ(checkpoint_segment_lengths("sqrt", 64, 4), std::vector<int64_t>(8, 8));
  EXPECT_EQ(checkpoint_segment_lengths("full", 8, 4), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(checkpoint_segment_lengths("full", 8, 3), (std::vector<int64_t>{3, 3, 2}));
  EXPECT_EQ(checkpoint_segment_lengths("full", 2, 4), (std::vector<int64_t>{2}));
  EXPECT_TRUE(checkpoint_segment_lengths("none", 8, 4).empty());
  EXPECT_TRUE(checkpoint_segment_lengths("selective", 8, 4).empty());
  EXPECT_THROW(checkpoint_segment_lengths("bogus", 8, 4), ConfigError);
  EXPECT_THROW(checkpoint_segment_lengths("full", 8, 0), ConfigError);
  EXPECT_EQ(sqrt_segment_length(1), 1);
  EXPECT_EQ(sqrt_segment_length(4), 2);
  EXPECT_EQ(sqrt_segment_length(5), 3);
  EXPECT_EQ(sqrt_segment_length(8), 3);
  EXPECT_EQ(sqrt_segment_length(9), 3);
}

// A small MLP segment with dropout, run plainly or through checkpoint().
struct MlpSegment {
  torch::nn::Linear fc1{nullptr};
  torch::nn::Linear fc2{nullptr};
  MlpSegment() {
    fc1 = torch::nn::Linear(8, 16);
    fc2 = torch::nn::Linear(16, 8);
  }
  torch::Tensor operator()(const torch::Tensor& x) {
    namespace F = torch::nn::functional;
    torch::Tensor h = F::dropout(torch::gelu(fc1->forward(x)), F::DropoutFuncOptions().p(0.5).training(true));
    return fc2->forward(h);
  }
};

struct SegmentRun {
  torch::Tensor out, loss, x_grad, w1_grad, w2_grad, rng_after_forward, rng_after_backward, after_draw;
};

enum class Mode { kPlain, kCheckpoint, kCheckpointNoRestore };

SegmentRun run_segment(Mode mode, bool input_requires_grad = true) {
  seed(77);
  MlpSegment seg;
  torch::Tensor x = torch::randn({5, 8});
  if (input_requires_grad) x.requires_grad_(true);
  SegmentRun r;
  auto fn = [&seg](const torch::Tensor& in) { return seg(in); };
  if (mode == Mode::kPlain) {
    r.out = fn(x);
  } else {
    r.out = checkpoint(fn, x, mode == Mode::kCheckpoint ? CheckpointRng::kRestore : CheckpointRng::kDebugSkipRestore);
  }
  r.rng_after_forward = cpu_rng_state();
  // A second dropout after the segment: it must draw the same mask with and without checkpointing.
  r.loss = torch::nn::functional::dropout(r.out, torch::nn::functional::DropoutFuncOptions().p(0.5).training(true))
               .pow(2)
               .sum();
  r.loss.backward();
  r.rng_after_backward = cpu_rng_state();
  r.after_draw = torch::rand({4});
  if (input_requires_grad) r.x_grad = x.grad().clone();
  r.w1_grad = seg.fc1->weight.grad().clone();
  r.w2_grad = seg.fc2->weight.grad().clone();
  return r;
}

TEST(ActivationCheckpoint, MlpSegmentWithDropoutIsBitwiseEqual) {
  const SegmentRun plain = run_segment(Mode::kPlain);
  const SegmentRun ckpt = run_segment(Mode::kCheckpoint);
  EXPECT_TRUE(torch::equal(plain.out, ckpt.out));
  EXPECT_TRUE(torch::equal(plain.loss, ckpt.loss));
  EXPECT_TRUE(torch::equal(plain.rng_after_forward, ckpt.rng_after_forward));
  EXPECT_TRUE(torch::equal(plain.rng_after_backward, ckpt.rng_after_backward));
  EXPECT_TRUE(torch::equal(plain.after_draw, ckpt.after_draw));
  EXPECT_TRUE(torch::equal(plain.x_grad, ckpt.x_grad));
  EXPECT_TRUE(torch::equal(plain.w1_grad, ckpt.w1_grad));
  EXPECT_TRUE(torch::equal(plain.w2_grad, ckpt.w2_grad));
}

TEST(ActivationCheckpoint, InputWithoutGradStillReachesParameters) {
  const SegmentRun plain = run_segment(Mode::kPlain, /*input_requires_grad=*/false);
  const SegmentRun ckpt = run_segment(Mode::kCheckpoint, /*input_requires_grad=*/false);
  EXPECT_TRUE(torch::equal(plain.loss, ckpt.loss));
  EXPECT_TRUE(torch::equal(plain.w1_grad, ckpt.w1_grad));
  EXPECT_TRUE(torch::equal(plain.w2_grad, ckpt.w2_grad));
}

// The bitwise test can fail: a checkpoint that does not restore the generators recomputes the
// segment with fresh dropout masks, so its gradients (and the generator after backward) differ.
TEST(ActivationCheckpoint, WithoutRngRestoreTheGradientsDiffer) {
  const SegmentRun plain = run_segment(Mode::kPlain);
  const SegmentRun broken = run_segment(Mode::kCheckpointNoRestore);
  EXPECT_TRUE(torch::equal(plain.loss, broken.loss));  // the forward is untouched
  EXPECT_FALSE(torch::equal(plain.x_grad, broken.x_grad));
  EXPECT_FALSE(torch::equal(plain.w1_grad, broken.w1_grad));
  EXPECT_FALSE(torch::equal(plain.rng_after_backward, broken.rng_after_backward));
}

// Equal bits, not equal values (torch::equal counts -0 == +0).
bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.numel() * a.element_size()) == 0;
}

// The fast path (scale and mask in place on the product's buffer) against the out-of-place ops,
// forward and backward, at the char GPT's head size (dh = 32: a scale that is not a power of two)
// and at an odd one.
TEST(AttentionInPlace, SameBitsAsOutOfPlace) {
  for (auto [d, heads, t] : {std::tuple<int64_t, int64_t, int64_t>{128, 4, 128}, {60, 5, 37}}) {
    seed(7 + d);
    Block block(d, heads, /*dropout=*/0.0);
    torch::Tensor qkv = torch::randn({3, t, 3 * d}) * 2.0;
    torch::Tensor upstream = torch::randn({3, t, d});
    torch::Tensor a_in = qkv.clone().requires_grad_(true);
    torch::Tensor b_in = qkv.clone().requires_grad_(true);
    torch::Tensor a = block->attention_core(a_in);
    torch::Tensor b = block->attention_core_out_of_place(b_in);
    ASSERT_TRUE(same_bits(a, b)) << "forward differs at d " << d << ", " << heads << " heads";
    a.backward(upstream);
    b.backward(upstream);
    EXPECT_TRUE(same_bits(a_in.grad(), b_in.grad())) << "gradient differs at d " << d << ", " << heads << " heads";
    EXPECT_GT(a_in.grad().abs().sum().item<double>(), 0.0);
  }
}

// The whole block, residual sums in place, against the out-of-place sums, with dropout on (each
// side from the same generator state) and off: output, input gradient and every parameter gradient.
TEST(AttentionInPlace, BlockSameBitsAsOutOfPlaceResiduals) {
  for (auto [p, amp] : {std::pair<double, bool>{0.0, false}, {0.1, false}, {0.1, true}}) {
    // amp: under CPU autocast to bfloat16 the branches are bf16 and the sums stay out of place.
    compat::AutocastGuard autocast(c10::kCPU, amp ? at::kBFloat16 : at::ScalarType::Undefined);
    seed(11);
    Block block(128, 4, p);
    torch::Tensor x = torch::randn({3, 64, 128});
    torch::Tensor upstream = torch::randn({3, 64, 128});
    std::vector<torch::Tensor> grads[2];
    torch::Tensor outs[2], input_grads[2];
    for (int side = 0; side < 2; ++side) {
      block->zero_grad();
      seed(99);
      torch::Tensor in = x.clone().requires_grad_(true);
      outs[side] = side == 0 ? block->forward(in) : block->forward_out_of_place(in);
      outs[side].backward(upstream);
      input_grads[side] = in.grad();
      for (const auto& w : block->parameters()) grads[side].push_back(w.grad().clone());
    }
    ASSERT_TRUE(same_bits(outs[0], outs[1])) << "block output differs, dropout " << p << ", bf16 autocast " << amp;
    EXPECT_TRUE(same_bits(input_grads[0], input_grads[1]))
        << "input gradient differs, dropout " << p << ", bf16 autocast " << amp;
    ASSERT_EQ(grads[0].size(), grads[1].size());
    for (size_t i = 0; i < grads[0].size(); ++i)
      EXPECT_TRUE(same_bits(grads[0][i], grads[1][i]))
          << "parameter gradient " << i << " differs, dropout " << p << ", bf16 autocast " << amp;
  }
}

}  // namespace
}  // namespace retrace::model
