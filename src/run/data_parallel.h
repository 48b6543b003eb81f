// Data parallelism on a trainer: after the last micro-batch's backward, every rank's local gradient
// digest is gathered (rank 0 traces them all) and the gradients are summed over the ranks in
// buckets; the loss is summed before backward, so skip and spike decisions agree on every rank;
// a sharded checkpoint save agrees through the group. Under runtime.invariance = "batch" the sums
// are train/invariant.h's instead: every chunk's gradients and loss are folded in global chunk
// order over the ranks, through two all-to-alls (the local digest is then of this rank's chunk
// gradients). The record loop and bisection's
// re-execution wire a rank the same way.
#pragma once

#include <optional>
#include <vector>

#include "ckpt/train_state.h"
#include "core/digest.h"
#include "distributed/process_group.h"
#include "train/config.h"
#include "train/invariant.h"
#include "train/trainer.h"

namespace retrace::run {

// The checkpoint code's view of the ranks (ckpt/train_state.h): all-gather and barrier over `pg`,
// which must outlive it.
ckpt::ShardSync shard_sync(distributed::ProcessGroup& pg);

class DataParallel {
 public:
  // Installs the hooks on `trainer` (both must outlive this object, which must not move).
  DataParallel(train::Trainer& trainer, distributed::ProcessGroup& pg, const train::Config& config);
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Every rank's `mine`, in rank order (one all-gather).
  std::vector<Digest128> gather(const Digest128& mine);
  const ckpt::ShardSync& sync() const { return sync_; }

  distributed::CollectiveStats stats;              // this step's collectives (reset by the caller)
  std::vector<Digest128> rank_grad_digests;  // this step's, filled by the backward hook

 private:
  distributed::ProcessGroup& pg_;
  ckpt::ShardSync sync_;
  train::ChunkGrads chunks_;  // batch invariance: this step's per-chunk gradients
};

}  // namespace retrace::run
