#include "train/policies.h"

#include "core/error.h"
#include "train/environment.h"

namespace retrace::train {
namespace {
FaultKind kind_of(const std::string& kind) {
  if (kind == "nan-loss") return FaultKind::kNanLoss;
  if (kind == "inf-grad") return FaultKind::kInfGrad;
  if (kind == "spike") return FaultKind::kSpike;
  if (kind == "crash") return FaultKind::kCrash;
  if (kind == "crash-in-eval") return FaultKind::kCrashInEval;
  if (kind == "perturb-param") return FaultKind::kPerturbParam;
  if (kind == "crash-in-save") return FaultKind::kCrashInSave;
  if (kind == "corrupt-staging") return FaultKind::kCorruptStaging;
  RETRACE_FAIL(InvariantError, "fault kind \"", kind, "\" passed parse_faults but has no FaultKind");
}
}  // namespace

FaultPlan::FaultPlan(const std::vector<records::Fault>& faults) {
  for (const auto& f : faults)
    faults_.push_back({kind_of(f.kind), f.step, f.arg, f.kind + "@" + std::to_string(f.step)});
}

std::optional<const PlannedFault*> FaultPlan::due(FaultKind kind, uint64_t step,
                                                  const std::set<std::string>& fired) const {
  for (const auto& f : faults_) {
    if (f.kind != kind || f.step != step) continue;
    const bool once = kind == FaultKind::kSpike || kind == FaultKind::kCrash || kind == FaultKind::kCrashInEval ||
                      kind == FaultKind::kCrashInSave || kind == FaultKind::kCorruptStaging;
    if (once && fired.count(f.id)) continue;
    return &f;
  }
  return std::nullopt;
}

uint64_t total_steps_for(const Config& c, uint64_t batches_per_epoch) {
  return c.train.steps > 0 ? static_cast<uint64_t>(c.train.steps)
                           : static_cast<uint64_t>(c.train.epochs) * batches_per_epoch;
}

at::ScalarType autocast_dtype(const Config& c) {
  if (c.amp.mode == AmpMode::kBf16) return at::kBFloat16;
  if (c.amp.mode == AmpMode::kFp16) return at::kHalf;
  return at::ScalarType::Undefined;
}

bool scaler_enabled(const Config& c) {
  if (c.amp.scaler == ScalerMode::kOn) return true;
  if (c.amp.scaler == ScalerMode::kOff) return false;
  return c.amp.mode == AmpMode::kFp16;
}

Policies make_policies(const Config& c, const Registry& registry, uint64_t total_steps) {
  Policies p{static_cast<uint64_t>(c.seed),
             LrSchedule(c.schedule, c.optim.lr, total_steps),
             c.train.max_norm,
             c.runtime.device == DeviceKind::kCuda ? c10::DeviceType::CUDA : c10::DeviceType::CPU,
             autocast_dtype(c),
             registry.loss(c.train.loss),
             c.train.accum_steps,
             c.optim.name,
             FaultPlan(c.faults.parsed),
             static_cast<uint64_t>(c.trace.optimizer_digest_every),
             static_cast<uint8_t>(c.trace.digest_version),
             c.runtime.invariance == Invariance::kBatch ? c.runtime.invariance_chunk : 0};
  p.bucket_bytes = static_cast<uint64_t>(c.runtime.bucket_mb * 1024 * 1024);
  p.zero_reduce_scatter = c.runtime.zero_reduce == ZeroReduce::kReduceScatter;
  p.chunked_sums = chunked_sums_apply(c);
  return p;
}

}  // namespace retrace::train
