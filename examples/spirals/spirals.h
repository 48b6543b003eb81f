// The example's own model, data set and loss: nothing of it ships with retrace.
#pragma once

#include <torch/torch.h>

#include <retrace/retrace.h>

namespace spirals {

// K interleaved spiral arms in the plane, one class per arm, with noise. The points come from
// std::mt19937_64's raw outputs (its sequence is fixed by the C++ standard, unlike the standard
// distributions), so the data set is the same with every compiler and library.
retrace::Dataset make_spirals(int64_t classes, int64_t train_per_class, int64_t test_per_class, uint64_t seed);

// A residual MLP: Linear(in, width), `depth` blocks x + W2 gelu(W1 layernorm(x)), Linear(width, out).
struct ResMlpImpl : torch::nn::Module {
  ResMlpImpl(int64_t in, int64_t width, int64_t depth, int64_t out);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear input{nullptr}, output{nullptr};
  torch::nn::ModuleList blocks;
};
TORCH_MODULE(ResMlp);

// Cross entropy with label smoothing, summed over the batch (retrace divides by the item count).
torch::Tensor smoothed_cross_entropy_sum(const torch::Tensor& logits, const torch::Tensor& targets, double smoothing);

// The registry of this project: the built-ins plus model.kind "resmlp", data.kind "spirals" and
// train.loss "smoothed_ce".
retrace::Registry registry();

}  // namespace spirals
