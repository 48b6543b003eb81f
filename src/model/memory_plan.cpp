#include "model/memory_plan.h"

#include <algorithm>

#include "core/error.h"
#include "model/activation_checkpoint.h"

namespace retrace::model {

MemoryEstimate estimate_memory(int64_t params, int64_t batch, int64_t seq, int64_t d_model, int64_t n_layers,
                               int64_t n_heads, int64_t dtype_bytes, const std::string& policy, int64_t k,
                               int64_t world_size) {
  RETRACE_CHECK(params >= 0, ConfigError, "memory estimate: params is ", params, " (need >= 0)");
  RETRACE_CHECK(batch > 0, ConfigError, "memory estimate: batch is ", batch, " (need > 0)");
  RETRACE_CHECK(seq > 0, ConfigError, "memory estimate: seq is ", seq, " (need > 0)");
  RETRACE_CHECK(d_model > 0, ConfigError, "memory estimate: d_model is ", d_model, " (need > 0)");
  RETRACE_CHECK(n_layers > 0, ConfigError, "memory estimate: n_layers is ", n_layers, " (need > 0)");
  RETRACE_CHECK(n_heads > 0 && d_model % n_heads == 0, ConfigError, "memory estimate: n_heads ", n_heads,
                " must be positive and divide d_model ", d_model);
  RETRACE_CHECK(dtype_bytes > 0, ConfigError, "memory estimate: dtype_bytes is ", dtype_bytes, " (need > 0)");
  RETRACE_CHECK(world_size > 0, ConfigError, "memory estimate: world_size is ", world_size, " (need > 0)");
  RETRACE_CHECK(is_checkpoint_policy(policy), ConfigError, "memory estimate: policy \"", policy,
                "\" is not one of \"none\", \"full\", \"sqrt\", \"selective\"");

  MemoryEstimate e;
  const double p = static_cast<double>(params);
  const double s = static_cast<double>(dtype_bytes);
  const double b = static_cast<double>(batch);
  const double t = static_cast<double>(seq);
  const double d = static_cast<double>(d_model);
  const double h = static_cast<double>(n_heads);
  const double layers = static_cast<double>(n_layers);
  e.params = params;
  e.param_bytes = p * s;
  e.grad_bytes = p * s;
  e.optimizer_bytes = 8.0 * p;
  e.zero1_optimizer_bytes_per_rank = 12.0 * p / static_cast<double>(world_size);
  e.activation_bytes_per_layer = 12.0 * b * t * d * s;
  e.attention_core_fraction = 5.0 * h * t / (34.0 * d + 5.0 * h * t);

  if (policy == "none") {
    e.activation_bytes_total = layers * e.activation_bytes_per_layer;
  } else if (policy == "selective") {
    e.activation_bytes_total = layers * e.activation_bytes_per_layer * (1.0 - e.attention_core_fraction);
  } else {
    RETRACE_CHECK(policy != "full" || k >= 1, ConfigError, "memory estimate: k is ", k,
                  " (need >= 1 layers per segment with \"full\")");
    e.segment_length = policy == "full" ? k : sqrt_segment_length(n_layers);
    const int64_t segments = (n_layers + e.segment_length - 1) / e.segment_length;
    const double live_layers = static_cast<double>(std::min(e.segment_length, n_layers));
    e.activation_bytes_total = static_cast<double>(segments) * b * t * d * s +
                               live_layers * e.activation_bytes_per_layer;
  }
  return e;
}

int64_t gpt_parameter_count(int64_t vocab, int64_t context, int64_t d_model, int64_t n_layers, bool tied) {
  const int64_t d = d_model;
  return vocab * d + context * d + n_layers * (12 * d * d + 13 * d) + 2 * d + (tied ? 0 : vocab * d + vocab);
}

MemoryEstimate estimate_lm_memory(int64_t params, int64_t batch, int64_t seq, int64_t d_model, int64_t n_layers,
                                  int64_t n_heads, int64_t dtype_bytes, const std::string& policy, int64_t k,
                                  int64_t world_size, int64_t vocab, int64_t eval_batch) {
  MemoryEstimate e = estimate_memory(params, batch, seq, d_model, n_layers, n_heads, dtype_bytes, policy, k,
                                     world_size);
  RETRACE_CHECK(vocab > 0, ConfigError, "memory estimate: vocab is ", vocab, " (need > 0)");
  RETRACE_CHECK(eval_batch > 0, ConfigError, "memory estimate: eval_batch is ", eval_batch, " (need > 0)");
  const double logits_per_sequence = static_cast<double>(seq) * static_cast<double>(vocab) * 4.0;
  e.logits_bytes = 4.0 * static_cast<double>(batch) * logits_per_sequence;
  e.eval_bytes = e.param_bytes + 2.0 * static_cast<double>(eval_batch) * logits_per_sequence +
                 2.0 * static_cast<double>(eval_batch) * static_cast<double>(seq) * 4.0 * static_cast<double>(d_model) *
                     static_cast<double>(dtype_bytes);
  return e;
}

MemoryEstimate with_state_copies(MemoryEstimate e, int64_t copies) {
  RETRACE_CHECK(copies >= 0, InvariantError, "memory estimate: ", copies, " state copies");
  e.state_copies = copies;
  e.state_copy_bytes = static_cast<double>(copies) * (e.param_bytes + e.optimizer_bytes);
  return e;
}

}  // namespace retrace::model
