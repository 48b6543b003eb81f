#include "train/step_state.h"

#include "train/data_parallel.h"

#include <torch/torch.h>

#include <chrono>
#include <cstring>
#include <optional>

#include "core/error.h"
#include "core/parse_number.h"
#include "rng/philox.h"
#include "rng/rng_state.h"
#include "train/invariant.h"
#include "train/optimizer.h"
#include "train/step.h"
#include "train/step_digests.h"
#include "train/zero.h"

namespace retrace::train {
namespace {
using Clock = std::chrono::steady_clock;
constexpr uint64_t kFaultPurpose = 0x6661756c74733031ull;  // "faults01"

using Events = std::vector<std::pair<std::string, std::string>>;

// perturb-param@S:PARAM flips the lowest bit of PARAM[0] before step S.
void apply_perturbation(TrainState& s, const Policies& p, uint64_t step, Events& events) {
  auto fault = p.faults.due(FaultKind::kPerturbParam, step, s.fired);
  if (!fault) return;
  const std::string& name = (*fault)->arg;
  torch::NoGradGuard no_grad;
  for (const auto& item : s.model.module->named_parameters()) {
    if (item.key() != name) continue;
    torch::Tensor flat = item.value().view({-1});
    RETRACE_CHECK(flat.scalar_type() == torch::kFloat32, ConfigError, "perturb-param supports float32 parameters");
    float v = flat[0].item<float>();
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    bits ^= 1u;
    std::memcpy(&v, &bits, sizeof v);
    flat[0].fill_(v);
    events.emplace_back("fault", "injected perturb-param: flipped the lowest bit of " + name + "[0] before step " +
                                     std::to_string(step));
  }
}

StepFaults faults_for(TrainState& s, const Policies& p, uint64_t step, Events& events) {
  StepFaults f;
  if (p.faults.due(FaultKind::kNanLoss, step, s.fired)) {
    f.nan_loss = true;
    events.emplace_back("fault", "injected nan-loss at step " + std::to_string(step));
  }
  if (auto spike = p.faults.due(FaultKind::kSpike, step, s.fired)) {
    f.loss_factor = (*spike)->arg.empty() ? 10.0 : *parse_finite_double((*spike)->arg);  // checked by parse_faults
    s.fired.insert((*spike)->id);
    events.emplace_back("fault",
                        "injected spike x" + std::to_string(f.loss_factor) + " at step " + std::to_string(step));
  }
  if (auto inf = p.faults.due(FaultKind::kInfGrad, step, s.fired)) {
    std::string arg = (*inf)->arg;
    if (arg.empty()) {
      // A parameter chosen by a Philox draw keyed by (seed, step): a pure function, no state.
      auto named = s.model.module->named_parameters();
      rng::PhiloxStream r(rng::mix_key(rng::mix_key(p.seed, kFaultPurpose), step));
      arg = named[static_cast<size_t>(r.next_below(named.size()))].key();
    }
    f.inf_grad = arg;
    events.emplace_back("fault", "injected inf-grad in " + arg + " at step " + std::to_string(step));
  }
  return f;
}

// What the step of a TrainState calls out to (step.h's StepCalls): batch invariance's chunk keys,
// ZeRO's shard, and among other ranks (world size > 1) their collectives (data_parallel.h).
class StateStepCalls final : public StepCalls {
 public:
  StateStepCalls(TrainState& s, const Policies& p, Collective* ranks, uint64_t step, int cuda, bool mixed_digests)
      : s_(s), p_(p), step_(step), cuda_(cuda), mixed_digests_(mixed_digests) {
    if (ranks && ranks->world_size() > 1) work_.emplace(*ranks);
  }

  // This rank holds reduced gradients for its ZeRO range only (runtime.zero_reduce =
  // "reduce_scatter" among ranks, batch invariance off): the scaler and clipping touch those, the
  // norm adds the ranks' parts.
  bool holds_range_grads() const { return s_.zero && work_ && p_.invariance_chunk == 0 && p_.zero_reduce_scatter; }
  RankWork* work() { return work_ ? &*work_ : nullptr; }
  // ZeRO under trace.digest_version 3: the fused AdamW's sums of this rank's range, taken before the
  // all-gather (zero.h capture_sums), for the step's digests.
  KnownSums& zero_known() { return zero_known_; }

  void before_chunk(uint64_t chunk) override {
    // Chunk k of the global batch holds its samples [k*c, (k+1)*c); keyed by (seed, step, k).
    rng::seed_cpu_and_device(chunk_seed(p_.seed, step_, chunk), cuda_);
  }
  bool loss_over_ranks() const override { return work_.has_value(); }
  float reduce_loss(float mine) override { return work_ ? work_->ranks.allreduce_sum(mine, work_->stats) : mine; }
  float fold_losses(const std::vector<float>& mine) override {
    return work_ ? fold_losses_over_ranks(*work_, mine) : StepCalls::fold_losses(mine);
  }
  void after_chunk_backward() override {
    if (work_ && p_.invariance_chunk > 0) work_->chunks.take(s_.model.module->parameters());
  }
  void after_last_backward() override {
    if (work_) reduce_gradients(*work_, *s_.model.module, p_, s_.zero.get());
    if (holds_range_grads()) s_.zero->bind_grads();  // the views' gradients, for the optimizer too
  }
  std::optional<double> grad_norm() override {
    if (holds_range_grads()) return zero_grad_norm_over_ranks(*work_, *s_.zero);
    return std::nullopt;
  }
  void before_optimizer_step() override {
    if (s_.zero && !holds_range_grads()) s_.zero->bind_grads();
  }
  void after_optimizer_step() override {
    if (!s_.zero) return;
    if (mixed_digests_) zero_known_ = capture_sums(*s_.optimizer, *s_.zero);
    if (work_) all_gather_parameters(*work_, *s_.zero);
  }

 private:
  TrainState& s_;
  const Policies& p_;
  const uint64_t step_;
  const int cuda_;
  const bool mixed_digests_;
  std::optional<RankWork> work_;
  KnownSums zero_known_;
};
// The rank's batch as accum_steps micro-batches, as evenly as possible (a kept last batch can be
// ragged): piece j holds samples [j*n/a, (j+1)*n/a).
std::vector<MicroBatch> micro_batches_of(const Batch& batch, int64_t accum_steps) {
  std::vector<MicroBatch> micro;
  const int64_t n = static_cast<int64_t>(batch.indices.size());
  const int64_t a = std::min<int64_t>(accum_steps, n);
  for (int64_t j = 0; j < a; ++j) {
    int64_t lo = j * n / a, hi = (j + 1) * n / a;
    micro.push_back({batch.inputs.slice(0, lo, hi), batch.targets.slice(0, lo, hi)});
  }
  return micro;
}

// train_step's policy for this step of `s`.
StepPolicy policy_for(TrainState& s, const Policies& p, const Batch& batch, StateStepCalls& calls, StepProbe* probe) {
  StepPolicy policy;
  policy.max_norm = p.max_norm;
  policy.device = p.device;
  policy.autocast_dtype = p.autocast;
  policy.scaler = &s.scaler;
  policy.spike = &s.spike_guard;
  policy.calls = &calls;
  // Under data parallelism each rank divides by the loss items of the whole global batch, so the
  // summed gradients are the large-batch mean.
  if (batch.global_samples > 0) {
    const auto& y = batch.targets;
    policy.global_count = static_cast<int64_t>(batch.global_samples) * (y.numel() / std::max<int64_t>(1, y.size(0)));
  }
  if (p.invariance_chunk > 0) {
    policy.chunk = p.invariance_chunk;
    policy.first_chunk = batch.global_offset / static_cast<uint64_t>(p.invariance_chunk);
    policy.chunked_sums = p.chunked_sums && !calls.loss_over_ranks() && probe == nullptr;
  }
  if (s.zero) policy.optimizer_params = s.zero->views();
  if (calls.holds_range_grads()) policy.grad_params = s.zero->views();
  policy.probe = probe;
  policy.loss = p.loss;
  return policy;
}

// What train_step did, into the step's record.
void record_result(const StepResult& r, records::StepRecord& rec) {
  rec.loss = static_cast<double>(r.loss);
  std::memcpy(&rec.loss_bits, &r.loss, sizeof r.loss);
  rec.grad_norm_pre = r.grad_norm_pre;
  rec.grad_norm_post = r.grad_norm_post;
  rec.outcome = r.skipped ? records::Outcome::kSkip : records::Outcome::kStep;
  rec.skip_reason = records::skip_text(r.skip_reason);
  rec.micro_batch_sizes = r.micro_sizes;
  rec.micro_losses = r.micro_losses;
  rec.timings.forward_ms = records::Timings::whole_ns(r.forward_ms);  // sums over micro-batches
  rec.timings.backward_ms = records::Timings::whole_ns(r.backward_ms);
  rec.timings.optimizer_ms = records::Timings::whole_ns(r.optimizer_ms);
}

// The step's digests, as the trace records them (trace.digest_version): parameters, gradients (the
// mixed digests), the optimizer every trace.optimizer_digest_every steps, RNG, and the policies'
// state. Under ZeRO each rank's sums of its ranges, added over the ranks.
void step_digests(TrainState& s, const Policies& p, StateStepCalls& calls, records::StepRecord& rec) {
  const DigestKind kind = digest_kind_of(p.digest_version);
  // The fused AdamW summed what it wrote (optimizer.h): those tensors are not read again.
  const KnownSums known = [&s](const torch::Tensor& t, uint64_t out[16]) { return fused_sums(*s.optimizer, t, out); };
  // Every trace.optimizer_digest_every steps (1, every step, unless a config says otherwise),
  // zero in between.
  const bool with_optimizer = rec.step % p.optimizer_digest_every == 0;
  s.digest_parts = {};
  if (s.zero) {
    // Each rank's sums of its ranges, added over the ranks (config validation asks for version 3
    // or 4).
    SumOverRanks sum;
    if (RankWork* work = calls.work())
      sum = [work](const std::vector<uint64_t>& mine) { return sum_over_ranks(*work, mine); };
    const KnownSums& zero_known = calls.zero_known();
    const ZeroDigests d = zero_digests(model_state(s), *s.optimizer, *s.zero, *s.model.module, p.optimizer,
                                       with_optimizer, sum, zero_known ? &zero_known : nullptr, mix_of(kind));
    rec.param_digest = d.model;
    rec.grad_digest = d.grads;
    if (with_optimizer) rec.optim_digest = d.optim;
  } else {
    StepTensors tensors;
    tensors.model = model_state(s);
    // The gradients as the optimizer used them (reduced, unscaled, clipped), every step.
    if (is_mixed(kind))
      for (const auto& item : s.model.module->named_parameters())
        tensors.grads.emplace_back(item.key(), item.value().grad());
    tensors.with_optimizer = with_optimizer;
    if (with_optimizer) tensors.optim = optimizer_state(*s.optimizer, *s.model.module, p.optimizer);
    // Each tensor's share costs a few words under the sums (versions 2 to 4); under version 1 it would
    // hash every byte a second time each step, so none is kept there.
    digest_step_tensors(tensors, kind, &known, nullptr, rec, kind == DigestKind::kXxh3 ? nullptr : &s.digest_parts);
    if (kind == DigestKind::kXxh3) {
      s.digest_parts.step = rec.step;
      s.digest_parts.with_optimizer = with_optimizer;
    }
  }
  rec.rng_digest = rng_digest(rng_state(s, p.seed).serialize());
  if (p.digest_version >= 2) rec.state_digest = policy_digest(s);
}
}  // namespace

StepOutput step_state(TrainState& s, const Batch& batch, const Policies& p, Collective* ranks, StepProbe* probe,
                      bool with_digests) {
  StepOutput out;
  records::StepRecord& rec = out.record;
  const std::vector<MicroBatch> micro = micro_batches_of(batch, p.accum_steps);
  const int64_t n = static_cast<int64_t>(batch.indices.size());
  rec.timings.data_ms = batch.data_ms;

  rec.step = s.step + 1;
  rec.epoch = batch.at.epoch;
  rec.batch_in_epoch = batch.at.batch_in_epoch;
  rec.batch_size = static_cast<uint32_t>(n);
  rec.sample_digest = digest_indices(batch.indices);
  rec.lr = p.schedule.lr_at(rec.step);
  rec.loss_scale = s.scaler.scale();

  apply_perturbation(s, p, rec.step, out.events);
  set_lr(*s.optimizer, rec.lr);
  s.model.module->train();
  const int cuda = batch.inputs.is_cuda() ? static_cast<int>(batch.inputs.device().index()) : -1;
  // Among other ranks, the step meets them through `calls` (data_parallel.h); one process meets none.
  StateStepCalls calls(s, p, ranks, rec.step, cuda, with_digests && p.digest_version >= 3);
  const StepPolicy policy = policy_for(s, p, batch, calls, probe);
  const StepResult r = train_step(*s.model.module, s.model.forward, *s.optimizer, micro, policy,
                                  faults_for(s, p, rec.step, out.events));
  record_result(r, rec);

  if (!r.skipped) s.spike_guard.record(rec.loss);
  if (auto warning = s.skip_guard.record(r.skipped, rec.step)) out.events.emplace_back("warning", *warning);

  // Invariant: the generators after a step depend on (seed, step) alone, the same on every rank
  // and layout; the samples seen are the global batch's, so the state digest is layout-free too.
  if (p.invariance_chunk > 0) rng::seed_cpu_and_device(step_end_seed(p.seed, rec.step), cuda);
  s.step += 1;
  s.samples_seen += p.invariance_chunk > 0 && batch.global_samples > 0 ? batch.global_samples : batch.indices.size();
  s.cursor = batch.next;
  if (with_digests) {
    const auto t = Clock::now();
    step_digests(s, p, calls, rec);
    rec.timings.trace_ms = std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  }
  if (const RankWork* work = calls.work()) {
    rec.rank_grad_digests = work->rank_grad_digests;
    rec.allreduce_calls = work->stats.calls;
    rec.allreduce_bytes = work->stats.bytes;
    rec.timings.allreduce_ms = records::Timings::whole_ns(work->stats.ms);
    // Every rank's RNG digest in the trace (its dropout masks are its own): each rank's own, from
    // its step. Not one of the step's counted collectives.
    if (with_digests && p.digest_version >= 2) rec.rank_rng_digests = gather_digests(work->ranks, rec.rng_digest);
  }
  return out;
}

}  // namespace retrace::train
