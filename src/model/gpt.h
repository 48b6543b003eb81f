// A small GPT (decoder-only transformer) over byte-level tokens, with activation-checkpoint
// policies.
//
// Layout (parameter names as in named_parameters()):
//   wte            token embedding [vocab_size, d_model]
//   wpe            learned position embedding [context, d_model]
//   blocks.i       pre-norm block: x + attn(ln_1(x)), then x + mlp(ln_2(x)); attn is causal
//                  multi-head self-attention written with plain ops (attn_qkv Linear,
//                  QK^T/sqrt(dh), causal masked_fill, softmax, dropout on the weights, @V,
//                  attn_proj Linear, dropout); mlp is mlp_fc Linear d->4d, GELU (erf),
//                  mlp_proj Linear 4d->d, dropout (the attention weights and the GELU of float32
//                  CPU tensors by model/fused.h's functions: the same bits, on two threads).
//                  Block parameters: ln_1, attn_qkv, attn_proj,
//                  ln_2, mlp_fc, mlp_proj (each .weight and .bias)
//   ln_f, head     final LayerNorm and the (untied) output Linear d -> vocab_size
// Modules are constructed one statement at a time in the order above, and then every 2-D weight
// (embeddings and Linear weights) is drawn from N(0, 0.02) in named_parameters() order and every
// bias set to zero, so the initial weights are a function of the generator state alone.
//
// Checkpoint policy (applied only when is_training() and grad mode is on; otherwise plain):
//   none       keep every activation
//   full       segments of checkpoint_every consecutive blocks, each recomputed in backward
//   sqrt       segments of ceil(sqrt(n_layers)) blocks (8 layers -> segments of 3, 3, 2)
//   selective  only each block's attention core, softmax(QK^T)V with its dropout, is recomputed
// Every policy gives outputs, losses and gradients bitwise equal to "none" (see
// activation_checkpoint.h); only memory and time differ. Do not switch train/eval mode between a
// forward and its backward: the recomputation reads the mode at backward time.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>

#include "model/options.h"

namespace retrace::model {

struct GptOptions {
  int64_t vocab_size = 0;  // required, > 0
  int64_t context = 128;   // longest sequence forward() accepts
  int64_t d_model = 128;
  int64_t n_layers = 8;
  int64_t n_heads = 4;                              // must divide d_model
  double dropout = 0.1;                             // embeddings, attention weights, attention and MLP outputs
  DropoutImpl dropout_impl = DropoutImpl::kPhilox;  // model/dropout.h
  GeluImpl gelu_impl = GeluImpl::kRetrace;          // model/fused.h
  AttentionMatmul attention_matmul = AttentionMatmul::kLanes;  // model/fused.h's lanes_bmm
  CheckpointPolicy checkpoint = CheckpointPolicy::kNone;
  int64_t checkpoint_every = 4;  // layers per segment with "full"
  // The output layer is the token embedding's weight (logits = x wte^T, no bias), as GPT-2: no
  // "head" parameters. Off: a Linear head of its own with a bias.
  bool tie_embeddings = false;
  // false: no initial draws at all, neither the GPT-2 initialization nor LibTorch's of the layers
  // (a resume, whose checkpoint sets every parameter and every generator).
  bool initialize = true;
};

// Throws ConfigError naming the key ("model.n_heads", ...) for an invalid option.
void validate(const GptOptions& options);

namespace layers {
// torch::nn::Linear's parameters ("weight" [out, in], then "bias" [out]) and forward, made either
// with LibTorch's initial draws, the calls of torch::nn::Linear's reset_parameters in its order
// (kaiming_uniform_ of the weight with a = sqrt(5), then uniform_ of the bias in +-1/sqrt(in)), so
// the same bits and the same generator state after it (gpt_test holds both against torch::nn's),
// or without them: torch::empty, for a resume, whose checkpoint sets every value (no draws and no
// pass over the bytes: a third of a gpt2-124m resume's time before its load). The module type is
// still called Linear (the probe's module types).
class LinearImpl : public torch::nn::Cloneable<LinearImpl> {
 public:
  LinearImpl(int64_t in, int64_t out, bool initialize = true);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;

 private:
  int64_t in_, out_;
  bool initialize_;
};
TORCH_MODULE(Linear);

// torch::nn::Embedding's parameter ("weight" [rows, dim]) and forward (no padding index, no max
// norm), with its initial draw (torch::nn::init::normal_) or without it, as LinearImpl.
class EmbeddingImpl : public torch::nn::Cloneable<EmbeddingImpl> {
 public:
  EmbeddingImpl(int64_t rows, int64_t dim, bool initialize = true);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& ids);
  torch::Tensor weight;

 private:
  int64_t rows_, dim_;
  bool initialize_;
};
TORCH_MODULE(Embedding);
}  // namespace layers

class BlockImpl : public torch::nn::Module {
 public:
  // initialize: LibTorch's initial draws of its Linear layers (layers::LinearImpl); false for a
  // resume.
  BlockImpl(int64_t d_model, int64_t n_heads, double dropout, DropoutImpl dropout_impl = DropoutImpl::kPhilox,
            GeluImpl gelu_impl = GeluImpl::kRetrace, AttentionMatmul attention_matmul = AttentionMatmul::kLanes,
            bool initialize = true);
  // x [B, T, d_model] -> [B, T, d_model]. With checkpoint_attention, the attention core is run
  // through checkpoint() (the selective policy).
  torch::Tensor forward(const torch::Tensor& x, bool checkpoint_attention = false);
  // The attention core: qkv [B, T, 3*d_model] -> merged heads [B, T, d_model]. With qkv_bias, qkv
  // is the projection's GEMM without its bias, and the core adds it (a contiguous float32 CPU qkv
  // only; InvariantError otherwise).
  torch::Tensor attention_core(const torch::Tensor& qkv, const torch::Tensor& qkv_bias = torch::Tensor());
  // The same block with every op out of place: the path forward() and attention_core() replaced
  // (scale, causal mask and residual sums now go in place into fresh buffers). Kept as the
  // reference their bits are tested against (gpt_test's AttentionInPlace) and that
  // tools/bench/block_bench times them against; in training, attention_core() runs
  // attention_core_out_of_place() for reduced-precision (autocast) tensors.
  torch::Tensor forward_out_of_place(const torch::Tensor& x);
  torch::Tensor attention_core_out_of_place(const torch::Tensor& qkv);

 private:
  // Attention's a @ b for [B, h, ., .] tensors: lanes_bmm (fused.h) where model.attention_matmul
  // is "lanes" and it applies, torch::matmul otherwise.
  torch::Tensor batched_matmul(const torch::Tensor& a, const torch::Tensor& b) const;
  // A linear layer in two parts (gpt.cpp says why): its GEMM, and its in-place bias add.
  static torch::Tensor gemm(const layers::Linear& layer, const torch::Tensor& x);
  static torch::Tensor& add_bias(torch::Tensor& y, const layers::Linear& layer);
  // Whether the fused functions add the layer's bias to y, its GEMM's output.
  static bool takes_bias(const torch::Tensor& y, const layers::Linear& layer);
  // x + dropout(branch + layer's bias), branch the layer's GEMM output: in training with philox
  // dropout on float32 CPU tensors one pass on the lanes (model::dropout_residual), else the bias
  // add, dropout() and then the sum.
  torch::Tensor dropout_residual(torch::Tensor branch, const layers::Linear& layer, const torch::Tensor& x);

  int64_t d_model_;
  int64_t n_heads_;
  double dropout_;
  DropoutImpl dropout_impl_;
  GeluImpl gelu_impl_;
  AttentionMatmul attention_matmul_;
  torch::nn::LayerNorm ln_1_{nullptr};
  layers::Linear qkv_{nullptr};
  layers::Linear proj_{nullptr};
  torch::nn::LayerNorm ln_2_{nullptr};
  layers::Linear fc_{nullptr};
  layers::Linear fc_out_{nullptr};
};
TORCH_MODULE(Block);

class GptImpl : public torch::nn::Module {
 public:
  explicit GptImpl(const GptOptions& options);
  // idx [B, T] int64 token ids, T <= context -> logits [B, T, vocab_size].
  torch::Tensor forward(const torch::Tensor& idx);
  std::string describe() const;
  const GptOptions& options() const { return options_; }

 private:
  torch::Tensor run_blocks(torch::Tensor x, int64_t begin, int64_t end, bool checkpoint_attention);

  GptOptions options_;
  layers::Embedding wte_{nullptr};
  layers::Embedding wpe_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm ln_f_{nullptr};
  layers::Linear head_{nullptr};
};
TORCH_MODULE(Gpt);

// Number of scalar parameters of a module (all of them, trainable or not).
int64_t count_parameters(const torch::nn::Module& module);

}  // namespace retrace::model
