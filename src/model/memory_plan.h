// A back-of-the-envelope training memory estimate for a GPT-like transformer: parameters,
// gradients, AdamW state, activations under each checkpoint policy, and ZeRO-1 sharding.
// Pure arithmetic (no torch); the figures are estimates to plan with, not measurements.
//
// Formulas (P parameters, B batch, T sequence, d width, L layers, h heads, s dtype bytes):
//   param_bytes        = P * s
//   grad_bytes         = P * s
//   optimizer_bytes    = 8 * P                    (AdamW: two fp32 moments)
//   zero1_optimizer_bytes_per_rank = 12 * P / N   (fp32 master copy + two fp32 moments, split
//                                                  across N ranks; the field-notes figure)
//   activation_bytes_per_layer = 12 * B * T * d * s   (the field-notes figure for a block that
//                                                  keeps all of its activations)
//   attention_core_fraction f = 5*h*T / (34*d + 5*h*T)
//       the attention core's (QK^T scores, softmax, dropout mask, dropped weights) share of a
//       block's activations, from the per-layer model s*b*d*(34 + 5*h*T/d) bytes of Korthikanti
//       et al., "Reducing Activation Recomputation in Large Transformer Models" (2022). It keeps
//       the selective figure positive and grows with T/d as the T*T scores do.
//   logits_bytes       = 4 * B * T * V * 4        (a language model's output layer in float32: the
//                                                  logits, their log-softmax, and in backward the
//                                                  gradients of both; at GPT-2's V = 50257 these
//                                                  outweigh a small model's blocks)
//   eval_bytes         = param_bytes + 2 * B_eval * T * V * 4 + 2 * B_eval * T * 4d * s
//                                                 (no gradients, no optimizer state, no activations
//                                                  kept: the weights, the logits and their
//                                                  log-softmax, and one block's widest tensors)
//   state_copy_bytes   = copies * (param_bytes + optimizer_bytes)
//                                                 (whole copies of the training state kept beside
//                                                  it: the spike guard's rollback anchor, a
//                                                  background save's staging buffer; the caller
//                                                  says how many)
//   activation_bytes_total by policy:
//     none       L * per_layer
//     full (k)   ceil(L/k) * B*T*d*s  +  min(k, L) * per_layer
//                (the input of every segment is kept; in backward one segment at a time is
//                recomputed and holds its k layers' activations)
//     sqrt       as full with k = ceil(sqrt(L))
//     selective  L * per_layer * (1 - f)   (the attention core is recomputed, the rest is kept)
// Example (field notes): d = T = 8192, B = 1, L = 64, BF16 -> per layer 12*8192*8192*2 =
// 1.61e9 bytes, 64 layers 1.03e11 bytes with "none".
#pragma once

#include <cstdint>
#include <string>

namespace retrace::model {

struct MemoryEstimate {
  int64_t params = 0;
  double param_bytes = 0;
  double grad_bytes = 0;
  double optimizer_bytes = 0;
  double activation_bytes_per_layer = 0;  // without checkpointing
  double activation_bytes_total = 0;      // under the policy
  double zero1_optimizer_bytes_per_rank = 0;
  double attention_core_fraction = 0;  // f above
  int64_t segment_length = 0;          // k used by full / sqrt, 0 otherwise
  double logits_bytes = 0;             // 0 unless a vocabulary is given (estimate_lm_memory)
  double eval_bytes = 0;               // an evaluation batch (estimate_lm_memory)
  int64_t state_copies = 0;            // see with_state_copies
  double state_copy_bytes = 0;
  double total_bytes() const {
    return param_bytes + grad_bytes + optimizer_bytes + activation_bytes_total + logits_bytes + state_copy_bytes;
  }
};

// The parameters of model/gpt.h's GPT: embeddings V*d + T*d; per block 12 d^2 + 13 d (two
// LayerNorms, the qkv, projection and MLP layers with biases); the final LayerNorm 2 d; and,
// without tied embeddings, a head of V*d + V.
int64_t gpt_parameter_count(int64_t vocab, int64_t context, int64_t d_model, int64_t n_layers, bool tied);

// Throws ConfigError naming the argument for non-positive sizes, an unknown policy, k < 1 with
// "full", or d_model not divisible by n_heads.
MemoryEstimate estimate_memory(int64_t params, int64_t batch, int64_t seq, int64_t d_model, int64_t n_layers,
                               int64_t n_heads, int64_t dtype_bytes, const std::string& policy, int64_t k,
                               int64_t world_size);
// estimate_memory plus a language model's output layer of `vocab` classes (logits_bytes) and an
// evaluation at `eval_batch` sequences (eval_bytes).
MemoryEstimate estimate_lm_memory(int64_t params, int64_t batch, int64_t seq, int64_t d_model, int64_t n_layers,
                                  int64_t n_heads, int64_t dtype_bytes, const std::string& policy, int64_t k,
                                  int64_t world_size, int64_t vocab, int64_t eval_batch);

// e with `copies` whole copies of the training state (weights and optimizer state) kept beside it.
MemoryEstimate with_state_copies(MemoryEstimate e, int64_t copies);

}  // namespace retrace::model
