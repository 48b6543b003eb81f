// The step's policies, chosen once from the parsed config: the LR schedule, clipping, autocast,
// the loss, the fault plan, what the record digests. Small typed values; nothing here is looked
// up by string while training.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "records/records.h"
#include "train/config.h"
#include "train/registry.h"
#include "train/schedule.h"

namespace retrace::train {

enum class FaultKind : uint8_t {
  kNanLoss,
  kInfGrad,
  kSpike,
  kCrash,
  kPerturbParam,
  kCrashInEval,
  kCrashInSave,
  kCorruptStaging
};

struct PlannedFault {
  FaultKind kind;
  uint64_t step = 0;
  std::string arg;
  std::string id;  // "spike@17": how a fired once-only fault is remembered
};

// The faults of faults.inject, by kind. Spike and crash fire once per run (`fired` holds them).
class FaultPlan {
 public:
  explicit FaultPlan(const std::vector<records::Fault>& faults);
  // The fault of `kind` due at `step` (its argument), or nullopt.
  std::optional<const PlannedFault*> due(FaultKind kind, uint64_t step, const std::set<std::string>& fired) const;
  const std::vector<PlannedFault>& faults() const { return faults_; }

 private:
  std::vector<PlannedFault> faults_;
};

struct Policies {
  uint64_t seed = 0;
  LrSchedule schedule;
  double max_norm = 1.0;
  c10::DeviceType device = c10::DeviceType::CPU;
  at::ScalarType autocast = at::ScalarType::Undefined;  // Undefined: no autocast
  LossFn loss;
  int64_t accum_steps = 1;
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  FaultPlan faults;
  uint64_t optimizer_digest_every = 1;
  uint8_t digest_version = 2;    // trace.digest_version
  int64_t invariance_chunk = 0;  // runtime.invariance = "batch": samples per chunk (0: not invariant)
  // Data parallelism (data_parallel.h): the gradient buckets' size (runtime.bucket_mb) and ZeRO's
  // reduce-scatter of the gradients (runtime.zero_reduce).
  uint64_t bucket_bytes = 0;
  bool zero_reduce_scatter = false;
  // Batch invariance's fold as the ranks' own sums (invariant.h ChunkOrder::kRankSums) instead of
  // the global fold: only the invariance property's negative control sets it.
  bool chunk_rank_sums = false;
  // Batch invariance in one piece where the model's kernels allow it (chunked_sums_apply); the
  // step takes it on one process without a probe.
  bool chunked_sums = false;
};

Policies make_policies(const Config& config, const Registry& registry, uint64_t total_steps);

uint64_t total_steps_for(const Config& c, uint64_t batches_per_epoch);
at::ScalarType autocast_dtype(const Config& c);
bool scaler_enabled(const Config& c);

}  // namespace retrace::train
