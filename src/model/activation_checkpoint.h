// Activation checkpointing: run a segment of the network without keeping its activations, and
// recompute them in backward.
//
// checkpoint(segment, input) returns segment(input) as a tensor whose backward
//   1. sets the random generators back to the state they had when the segment ran forward (the
//      CPU default generator, and the device's default generator when the input lives on one),
//   2. re-runs the segment with grad enabled on a detached copy of the input, under the autocast
//      state of the forward, and back-propagates the incoming gradient through it (parameters used
//      by the segment accumulate into their .grad there),
//   3. puts the generators back to the state they had when backward started, so the random stream
//      outside the segment is not disturbed,
//   4. returns the gradient for the input.
// What it keeps between forward and backward: the input and the generator states, nothing else.
//
// Determinism: the segment must be a pure function of its input, its parameters and the
// generators (dropout). Then the recomputation draws the same dropout masks and runs the same
// kernels, and outputs, losses and gradients are bitwise equal to running the segment without
// checkpointing (tested on CPU). The generators after the checkpointed forward are in the state
// they would have without checkpointing. Backward must not run concurrently with another
// consumer of the same default generator (the generators are global to the process).
//
// Limits (as PyTorch's re-entrant checkpoint): the inner backward always accumulates into the
// .grad of the segment's parameters, so use loss.backward(), not torch::autograd::grad() or
// backward(inputs=...); no double backward (create_graph).
//
// Outside training (grad mode off, or an input that needs no grad and a segment without
// parameters) the caller should simply call the segment; checkpoint() works then too but saves
// nothing. Not thread-safe with respect to other users of the default generators.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace retrace::model {

using Segment = std::function<at::Tensor(const at::Tensor&)>;

// What backward does with the random generators. kRestore is the only correct choice;
// kDebugSkipRestore exists so a test can show that the bitwise test catches a checkpoint that
// forgets to restore them (the recomputation then draws new dropout masks).
enum class CheckpointRng { kRestore, kDebugSkipRestore };

at::Tensor checkpoint(const Segment& segment, const at::Tensor& input, CheckpointRng rng = CheckpointRng::kRestore);

// The activation-checkpoint policies of the GPT ("none", "full", "sqrt", "selective").
const std::vector<std::string>& checkpoint_policies();
bool is_checkpoint_policy(const std::string& policy);

// ceil(sqrt(n_layers)), computed in integers: the segment length of the sqrt policy
// (1 -> 1, 4 -> 2, 8 -> 3, 64 -> 8). Requires n_layers >= 1.
int64_t sqrt_segment_length(int64_t n_layers);

// The layer counts of the checkpointed segments, in order, for a policy that checkpoints whole
// blocks: "full" uses k layers per segment (the last one may be shorter), "sqrt" uses
// sqrt_segment_length(n_layers) (8 layers -> 3, 3, 2). For "none" and "selective" (no whole-block
// segments) the result is empty. Throws ConfigError for an unknown policy or k < 1 with "full".
std::vector<int64_t> checkpoint_segment_lengths(const std::string& policy, int64_t n_layers, int64_t k);

}  // namespace retrace::model
