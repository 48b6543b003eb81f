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
// The step (step_state.cpp) makes a RankWork for itself and calls these from its StepCalls
// (step.h); nothing outside train sees them. The collectives run in the same order on every rank
// (c10d matches them by order).
#pragma once

#include <torch/nn/module.h>

#include <vector>

#include "core/digest.h"
#include "train/collective.h"
#include "train/invariant.h"
#include "train/policies.h"
#include "train/state.h"

namespace retrace::train {

class ZeroShard;

// One step of one rank among others: its collectives' counts and its local gradient digests,
// which the step writes into its record.
struct RankWork {
  explicit RankWork(Collective& r) : ranks(r) {}
  Collective& ranks;
  CollectiveStats stats;
  ChunkGrads chunks;                         // batch invariance: this step's per-chunk gradients
  std::vector<Digest128> rank_grad_digests;  // every rank's, in rank order
};

// After the last micro-batch's backward: this rank's local gradient digest gathered from every
// rank, then the gradients summed over the ranks: in buckets, or by ZeRO's reduce-scatter (`zero`
// and p.zero_reduce_scatter), or under batch invariance every chunk's gradients folded in global
// chunk order (the local digest then of this rank's chunk gradients).
void reduce_gradients(RankWork& work, torch::nn::Module& module, const Policies& p, const ZeroShard* zero);

// Batch invariance: the step's loss from every rank's chunk losses, folded in global chunk order.
float fold_losses_over_ranks(RankWork& work, const std::vector<float>& mine);

// ZeRO's reduce-scatter: the global gradient norm from the ranks' squared norms of their parts,
// added in rank order on every rank (the same norm everywhere).
double zero_grad_norm_over_ranks(RankWork& work, const ZeroShard& zero);

// ZeRO after an applied step: each rank updated its range; one all-gather gives every rank all
// the parameters.
void all_gather_parameters(RankWork& work, const ZeroShard& zero);

// ZeRO's digests: this rank's sums of its ranges added over the ranks, modulo 2^64.
std::vector<uint64_t> sum_over_ranks(RankWork& work, const std::vector<uint64_t>& mine);

// Every rank's `mine`, in rank order (one all-gather, not counted in the step's collectives).
std::vector<Digest128> gather_digests(Collective& ranks, const Digest128& mine);

}  // namespace retrace::train
