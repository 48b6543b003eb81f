// The cross-entropy of portable numerics version 2 (issue 51): the summed loss of rows of logits
// against class ids, computed by kernels/reduce.h (each row's log-sum-exp in double, the rows
// summed in order in double, rounded once to float), forward and backward, rows on the lanes. The
// same bits at any lane count and on both LibTorch builds, where ATen's log_softmax and nll_loss
// are each build's own. Used where owned_kernels() is on (train::apply_environment) and the logits
// are float32 CPU tensors outside autocast; LibTorch's cross_entropy elsewhere.
#pragma once

#include <ATen/core/Tensor.h>

namespace retrace::model {

// Whether owned_cross_entropy_sum takes these: owned kernels on, logits [rows, classes] float32 on
// the CPU, targets [rows] int64, CPU autocast off.
bool owned_cross_entropy_applies(const at::Tensor& logits, const at::Tensor& targets);

// sum over rows of (log sum_j exp(logits[r, j]) - logits[r, targets[r]]), a float32 scalar; inside
// a ChunkScope (chunk_layout.h) a float32 vector instead, one such sum per chunk of rows.
// ConfigError naming the row and the class count for a target outside [0, classes).
at::Tensor owned_cross_entropy_sum(const at::Tensor& logits, const at::Tensor& targets);

}  // namespace retrace::model
