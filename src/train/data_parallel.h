// Data parallelism inside a step: how a rank's step meets the others through a Collective. After
// the last micro-batch's backward, every rank's local gradient digest is gathered (rank 0 traces
// them all) and the gradients are summed over the ranks in buckets (or, under ZeRO's
// reduce-scatter, each rank receives its range's sums and the global norm adds the ranks' parts);
// the loss is summed before backward, so skip and spike decisions agree on every rank. Under
// runtime.invariance = "batch" the sums are invariant.h's: every chunk's gradients and loss folded
// in global chunk order over the ranks, through two all-to-alls (the local digest is then of this
// rank's chunk gradients). Under ZeRO the parameters are all-gathered after an applied step and the
// digests' sums added over the ranks.
//
// The step (step_state.h) makes a RankWork for itself and wires it in; nothing outside train sees
// these hooks. The collectives run in the same order on every rank (c10d matches them by order).
#pragma once

#include <functional>
#include <vector>

#include "core/digest.h"
#include "train/collective.h"
#include "train/invariant.h"
#include "train/policies.h"
#include "train/state.h"

namespace retrace::train {

class StepProbe;

// What the step calls out to (the step's internal wiring; see step_state.cpp).
struct StepHooks {
  std::function<void()> after_last_backward;
  std::function<float(float)> reduce_loss;
  std::function<void()> after_chunk_backward;
  std::function<float(const std::vector<float>&)> fold_losses;
  std::function<void()> after_optimizer_step;
  std::function<std::vector<uint64_t>(const std::vector<uint64_t>&)> sum_over_ranks;
  std::function<double()> grad_norm;
};

// One step of one rank among others: its collectives' counts and its local gradient digests,
// which the step writes into its record.
struct RankWork {
  explicit RankWork(Collective& r) : ranks(r) {}
  Collective& ranks;
  CollectiveStats stats;
  ChunkGrads chunks;                         // batch invariance: this step's per-chunk gradients
  std::vector<Digest128> rank_grad_digests;  // every rank's, in rank order
};

// The hooks of a step of `s` among `work.ranks` (world size > 1). `work` and `s` outlive the step.
StepHooks rank_hooks(RankWork& work, TrainState& s, const Policies& p);

// Every rank's `mine`, in rank order (one all-gather, not counted in the step's collectives).
std::vector<Digest128> gather_digests(Collective& ranks, const Digest128& mine);

}  // namespace retrace::train
