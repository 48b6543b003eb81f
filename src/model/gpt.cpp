#include "model/gpt.h"

#include <torch/torch.h>

#include <array>
#include <cmath>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "model/activation_checkpoint.h"
#include "model/dropout.h"
#include "model/fused.h"
#include "model/owned_layers.h"
#include "model/owned_linear.h"

namespace retrace::model {
namespace {
// A LayerNorm module's forward, or under portable numerics version 2 retrace's (owned_layers.h).
torch::Tensor layer_norm(torch::nn::LayerNorm& ln, const torch::Tensor& x) {
  if (owned_layer_norm_applies(x, ln->weight) && ln->bias.defined())
    return owned_layer_norm(x, ln->weight, ln->bias, ln->options.eps());
  return ln->forward(x);
}
}  // namespace

namespace F = torch::nn::functional;

void validate(const GptOptions& o) {
  RETRACE_CHECK(o.vocab_size > 0, ConfigError, "bad value for model.vocab_size: ", o.vocab_size,
                " (need > 0; it comes from the data set's vocabulary)");
  RETRACE_CHECK(o.context > 0, ConfigError, "bad value for model.context: ", o.context, " (need > 0)");
  RETRACE_CHECK(o.d_model > 0, ConfigError, "bad value for model.d_model: ", o.d_model, " (need > 0)");
  RETRACE_CHECK(o.n_layers > 0, ConfigError, "bad value for model.n_layers: ", o.n_layers, " (need > 0)");
  RETRACE_CHECK(o.n_heads > 0, ConfigError, "bad value for model.n_heads: ", o.n_heads, " (need > 0)");
  RETRACE_CHECK(o.d_model % o.n_heads == 0, ConfigError, "bad value for model.n_heads: ", o.n_heads,
                " does not divide model.d_model = ", o.d_model, "; choose a divisor of d_model");
  RETRACE_CHECK(o.dropout >= 0.0 && o.dropout < 1.0, ConfigError, "bad value for model.dropout: ", o.dropout,
                " (need 0 <= dropout < 1)");
  RETRACE_CHECK(o.checkpoint_every >= 1, ConfigError, "bad value for model.checkpoint_every: ", o.checkpoint_every,
                " (need >= 1 layers per segment)");
}

namespace layers {

LinearImpl::LinearImpl(int64_t in, int64_t out, bool initialize) : in_(in), out_(out), initialize_(initialize) {
  reset();
}

void LinearImpl::reset() {
  weight = register_parameter("weight", torch::empty({out_, in_}));
  bias = register_parameter("bias", torch::empty({out_}));
  if (!initialize_) return;
  torch::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
  torch::nn::init::uniform_(bias, -bound, bound);
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) { return F::linear(x, weight, bias); }

EmbeddingImpl::EmbeddingImpl(int64_t rows, int64_t dim, bool initialize)
    : rows_(rows), dim_(dim), initialize_(initialize) {
  reset();
}

void EmbeddingImpl::reset() {
  weight = register_parameter("weight", torch::empty({rows_, dim_}));
  if (!initialize_) return;
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(weight);
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& ids) { return F::embedding(ids, weight); }

}  // namespace layers

BlockImpl::BlockImpl(int64_t d_model, int64_t n_heads, double dropout, DropoutImpl dropout_impl, GeluImpl gelu_impl,
                     AttentionMatmul attention_matmul, bool initialize)
    : d_model_(d_model),
      n_heads_(n_heads),
      dropout_(dropout),
      dropout_impl_(dropout_impl),
      gelu_impl_(gelu_impl),
      attention_matmul_(attention_matmul) {
  // One statement per layer, in a fixed order: each draws its initial weights in turn.
  ln_1_ = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
  qkv_ = register_module("attn_qkv", layers::Linear(d_model, 3 * d_model, initialize));
  proj_ = register_module("attn_proj", layers::Linear(d_model, d_model, initialize));
  ln_2_ = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
  fc_ = register_module("mlp_fc", layers::Linear(d_model, 4 * d_model, initialize));
  fc_out_ = register_module("mlp_proj", layers::Linear(4 * d_model, d_model, initialize));
}

torch::Tensor BlockImpl::batched_matmul(const torch::Tensor& a, const torch::Tensor& b) const {
  if (attention_matmul_ == AttentionMatmul::kLanes && lanes_bmm_applies(a, b)) return lanes_bmm(a, b);
  return torch::matmul(a, b);
}

torch::Tensor BlockImpl::attention_core(const torch::Tensor& qkv, const torch::Tensor& qkv_bias) {
  RETRACE_CHECK(!qkv_bias.defined() || fused_applies(qkv), InvariantError,
                "attention_core: a separate qkv bias needs a contiguous float32 CPU qkv, got ", qkv.scalar_type());
  // Reduced precision (bf16 under CPU autocast) takes the plain out-of-place ops: under LibTorch
  // 2.11 the in-place scale and mask gave other bits there
  // (AttentionInPlace.BlockSameBitsAsOutOfPlaceResiduals), under 1.13 the same ones, so the plain
  // ops keep the bits every build had.
  if (qkv.scalar_type() != torch::kFloat) return attention_core_out_of_place(qkv);
  const int64_t b = qkv.size(0);
  const int64_t t = qkv.size(1);
  const int64_t dh = d_model_ / n_heads_;
  torch::Tensor q, k_t, v;  // [B, h, T, dh], k_t [B, h, dh, T]
  if (fused_applies(qkv)) {
    // The heads copied out once on the lanes (with the projection's bias added on the way when it
    // is given), in the layouts matmul would copy the strided views into itself before its batched
    // GEMMs: the same GEMM calls (fused.h).
    const std::array<torch::Tensor, 3> parts = split_heads(qkv, n_heads_, qkv_bias);
    q = parts[0];
    k_t = parts[1];
    v = parts[2];
  } else {
    auto parts = qkv.split(d_model_, /*dim=*/-1);
    q = parts[0].view({b, t, n_heads_, dh}).transpose(1, 2);
    k_t = parts[1].view({b, t, n_heads_, dh}).transpose(1, 2).transpose(-2, -1);
    v = parts[2].view({b, t, n_heads_, dh}).transpose(1, 2);
  }
  // The scale and the causal mask are applied in place to the product's own fresh buffer: the
  // product's backward saves q and k, not its result, and the scale's and the mask's backward save
  // neither input nor output, so autograd allows it, and the values are those of the out-of-place
  // ops (the same kernels on the same inputs; AttentionInPlace.SameBitsAsOutOfPlace checks forward
  // and backward). It saves two [B, h, T, T] tensors per layer, each written to memory that is not
  // in cache: 4 MB each at the char GPT's shapes.
  torch::Tensor att = batched_matmul(q, k_t);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  if (dropout_impl_ == DropoutImpl::kPhilox && fused_applies(att)) {
    // Scale, mask, softmax and dropout in one pass over tiles, on two lanes (model/fused.h): the
    // same bits as the four ops below (fused_test).
    att = causal_attention_weights(att, scale, dropout_, is_training());
  } else {
    att.mul_(scale);
    torch::Tensor future = torch::ones({t, t}, qkv.options().dtype(torch::kBool)).triu(/*diagonal=*/1);
    att.masked_fill_(future, -std::numeric_limits<double>::infinity());
    att = torch::softmax(att, /*dim=*/-1);
    att = dropout(att, dropout_, is_training(), dropout_impl_);
  }
  torch::Tensor y = batched_matmul(att, v);  // [B, h, T, dh]
  if (fused_applies(y)) return merge_heads(y);
  return y.transpose(1, 2).contiguous().view({b, t, d_model_});
}

namespace {

// x + branch, written into the branch's own fresh output (a linear layer's or dropout's product,
// which no backward saves) when that has the sum's dtype: branch + x has the bits of x + branch
// (AttentionInPlace.BlockSameBitsAsOutOfPlaceResiduals). Under autocast the branch is the lower
// precision and the sum promotes to the stream's dtype, so it stays out of place there.
torch::Tensor residual(const torch::Tensor& x, torch::Tensor& branch) {
  if (branch.scalar_type() == x.scalar_type() && branch.sizes() == x.sizes()) return branch.add_(x);
  return x + branch;
}

}  // namespace

// LibTorch's linear for the block's 3-d activations is input.matmul(weight.t()) and then an
// in-place `output += bias` (torch/nn/functional/linear.h, in 1.13 and 2.x): two passes, the second
// on one thread. The block runs the GEMM here and adds the bias inside the fused function that
// reads the GEMM's output next, with the same rounding (fused.h); where no fused function applies
// (bf16 under autocast, CUDA), add_bias is that in-place add.
torch::Tensor BlockImpl::gemm(const layers::Linear& layer, const torch::Tensor& x) {
  if (owned_linear_applies(x, layer->weight)) return owned_linear(x, layer->weight, {});
  return x.matmul(layer->weight.t());
}

torch::Tensor& BlockImpl::add_bias(torch::Tensor& y, const layers::Linear& layer) { return y += layer->bias; }

bool BlockImpl::takes_bias(const torch::Tensor& y, const layers::Linear& layer) {
  return fused_applies(y) && fused_applies(layer->bias);
}

torch::Tensor BlockImpl::dropout_residual(torch::Tensor branch, const layers::Linear& layer, const torch::Tensor& x) {
  if (dropout_impl_ == DropoutImpl::kPhilox && is_training() && dropout_ > 0.0 && takes_bias(branch, layer) &&
      fused_applies(x) && branch.sizes() == x.sizes()) {
    // One pass on the lanes: the bias, the mask, the product and the sum, with the bits of the ops
    // below.
    return model::dropout_residual(branch, layer->bias, x, dropout_);
  }
  add_bias(branch, layer);
  branch = dropout(branch, dropout_, is_training(), dropout_impl_);
  return residual(x, branch);
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, bool checkpoint_attention) {
  torch::Tensor qkv = gemm(qkv_, layer_norm(ln_1_, x));
  torch::Tensor qkv_bias;  // defined: attention_core adds it (split_heads)
  if (takes_bias(qkv, qkv_)) {
    qkv_bias = qkv_->bias;
  } else {
    add_bias(qkv, qkv_);
  }
  torch::Tensor y;
  if (checkpoint_attention) {
    y = checkpoint([this, qkv_bias](const torch::Tensor& in) { return attention_core(in, qkv_bias); }, qkv);
  } else {
    y = attention_core(qkv, qkv_bias);
  }
  torch::Tensor h = dropout_residual(gemm(proj_, y), proj_, x);
  torch::Tensor m = gemm(fc_, layer_norm(ln_2_, h));
  // "torch": torch::gelu's bits, tile by tile on the lanes (fused_test).
  if (takes_bias(m, fc_)) {
    m = bias_gelu(m, fc_->bias, gelu_impl_);
  } else {
    m = gelu(add_bias(m, fc_), gelu_impl_);
  }
  return dropout_residual(gemm(fc_out_, m), fc_out_, h);
}

torch::Tensor BlockImpl::attention_core_out_of_place(const torch::Tensor& qkv) {
  const int64_t b = qkv.size(0);
  const int64_t t = qkv.size(1);
  const int64_t dh = d_model_ / n_heads_;
  auto parts = qkv.split(d_model_, /*dim=*/-1);
  torch::Tensor q = parts[0].view({b, t, n_heads_, dh}).transpose(1, 2);
  torch::Tensor k = parts[1].view({b, t, n_heads_, dh}).transpose(1, 2);
  torch::Tensor v = parts[2].view({b, t, n_heads_, dh}).transpose(1, 2);
  torch::Tensor att = batched_matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(dh)));
  torch::Tensor future = torch::ones({t, t}, qkv.options().dtype(torch::kBool)).triu(/*diagonal=*/1);
  att = att.masked_fill(future, -std::numeric_limits<double>::infinity());
  att = torch::softmax(att, /*dim=*/-1);
  att = dropout(att, dropout_, is_training(), dropout_impl_);
  return batched_matmul(att, v).transpose(1, 2).contiguous().view({b, t, d_model_});
}

torch::Tensor BlockImpl::forward_out_of_place(const torch::Tensor& x) {
  torch::Tensor y = attention_core_out_of_place(qkv_->forward(ln_1_->forward(x)));
  y = dropout(proj_->forward(y), dropout_, is_training(), dropout_impl_);
  torch::Tensor h = x + y;
  torch::Tensor m = gelu(fc_->forward(ln_2_->forward(h)), gelu_impl_);
  m = dropout(fc_out_->forward(m), dropout_, is_training(), dropout_impl_);
  return h + m;
}

GptImpl::GptImpl(const GptOptions& options) : options_(options) {
  validate(options_);
  const int64_t d = options_.d_model;
  wte_ = register_module("wte", layers::Embedding(options_.vocab_size, d, options_.initialize));
  wpe_ = register_module("wpe", layers::Embedding(options_.context, d, options_.initialize));
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < options_.n_layers; ++i) {
    Block block(d, options_.n_heads, options_.dropout, options_.dropout_impl, options_.gelu_impl,
                options_.attention_matmul, options_.initialize);
    blocks_->push_back(block);
  }
  ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  if (!options_.tie_embeddings)
    head_ = register_module("head", layers::Linear(d, options_.vocab_size, options_.initialize));

  // GPT-2 style initialization, in named_parameters() order (a fixed order of draws).
  if (!options_.initialize) return;
  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters(/*recurse=*/true)) {
    const std::string& name = p.key();
    torch::Tensor& w = p.value();
    if (name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0) {
      w.zero_();
    } else if (w.dim() == 2) {
      w.normal_(0.0, 0.02);
    }
  }
}

torch::Tensor GptImpl::run_blocks(torch::Tensor x, int64_t begin, int64_t end, bool checkpoint_attention) {
  for (int64_t i = begin; i < end; ++i) {
    x = blocks_[static_cast<size_t>(i)]->as<BlockImpl>()->forward(x, checkpoint_attention);
  }
  return x;
}

torch::Tensor GptImpl::forward(const torch::Tensor& idx) {
  // The inputs come from the user's data set: a mismatch is the config's (data.kind), not a bug.
  RETRACE_CHECK(idx.dim() == 2 && idx.scalar_type() == torch::kLong, ConfigError,
                "model.kind = \"gpt\" reads int64 token ids [batch, time], and the data set gives ", idx.dim(), "-d ",
                idx.scalar_type(),
                " inputs; give it token data (data.kind = \"text\" or \"tokens\", or "
                "\"tensors\" whose inputs are I64 [samples, time])");
  const int64_t t = idx.size(1);
  RETRACE_CHECK(t >= 1 && t <= options_.context, ConfigError, "gpt forward: sequence length ", t,
                " is outside 1..model.context = ", options_.context);
  torch::Tensor pos = torch::arange(t, idx.options());
  torch::Tensor x = owned_embedding_applies(idx, wte_->weight, wpe_->weight)
                        ? owned_embedding(idx, wte_->weight, wpe_->weight)
                        : wte_->forward(idx) + wpe_->forward(pos);
  x = dropout(x, options_.dropout, is_training(), options_.dropout_impl);

  const bool active = is_training() && torch::GradMode::is_enabled();
  const int64_t n = options_.n_layers;
  if (active && (options_.checkpoint == CheckpointPolicy::kFull || options_.checkpoint == CheckpointPolicy::kSqrt)) {
    int64_t begin = 0;
    for (int64_t length : checkpoint_segment_lengths(option_name(options_.checkpoint), n, options_.checkpoint_every)) {
      const int64_t end = begin + length;
      x = checkpoint([this, begin, end](const torch::Tensor& in) { return run_blocks(in, begin, end, false); }, x);
      begin = end;
    }
  } else {
    x = run_blocks(x, 0, n, /*checkpoint_attention=*/active && options_.checkpoint == CheckpointPolicy::kSelective);
  }
  x = layer_norm(ln_f_, x);
  const torch::Tensor& head = options_.tie_embeddings ? wte_->weight : head_->weight;
  if (owned_linear_applies(x, head))
    return owned_linear(x, head, options_.tie_embeddings ? torch::Tensor() : head_->bias);
  return options_.tie_embeddings ? torch::matmul(x, wte_->weight.t()) : head_->forward(x);
}

std::string GptImpl::describe() const {
  std::ostringstream out;
  out << "gpt vocab=" << options_.vocab_size << " context=" << options_.context << " d_model=" << options_.d_model
      << " n_layers=" << options_.n_layers << " n_heads=" << options_.n_heads << " dropout=" << options_.dropout
      << " checkpoint=" << option_name(options_.checkpoint);
  if (options_.tie_embeddings) out << " tied";
  if (options_.checkpoint == CheckpointPolicy::kFull) out << "(every " << options_.checkpoint_every << ")";
  if (options_.checkpoint == CheckpointPolicy::kSqrt) out << "(every " << sqrt_segment_length(options_.n_layers) << ")";
  out << " params=" << count_parameters(*this);
  return out.str();
}

int64_t count_parameters(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters(/*recurse=*/true)) n += p.numel();
  return n;
}

}  // namespace retrace::model
