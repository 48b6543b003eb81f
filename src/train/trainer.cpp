#include "train/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cstdlib>

#include "core/error.h"
#include "train/environment.h"
#include "train/optimizer.h"
#include "train/zero.h"

namespace retrace::train {
namespace {
using Clock = std::chrono::steady_clock;

TrainState initial_state(const Config& c, const data::Dataset& data, const Registry& registry, bool initialize) {
  rng::seed_cpu_and_device(static_cast<uint64_t>(c.seed), cuda_index(c.runtime));
  model::ModelHandle model = registry.model(c.model.kind)(ModelContext{c, data, initialize});
  auto optimizer = make_optimizer(c.optim, *model.module, numerics_version(c.runtime) == 2);
  return TrainState{std::move(model),
                    std::move(optimizer),
                    LossScaler(c.amp, scaler_enabled(c)),
                    SkipRateGuard(c.guards.skip_window, c.guards.skip_warn_rate),
                    SpikeGuard(c.guards.spike_factor, c.guards.spike_window),
                    {},
                    {},
                    0,
                    0,
                    {}};
}
}  // namespace

Trainer::Trainer(const Config& config, const data::Dataset& data, const Registry& registry, Collective* ranks)
    : Trainer(resolved(config), data, registry, ranks) {}

Trainer::Trainer(const ResolvedConfig& resolved_config, const data::Dataset& data, const Registry& registry,
                 Collective* ranks, ModelStart start)
    : config_(resolved_config),
      data_(data),
      ranks_(ranks),
      rank_(ranks ? ranks->rank() : 0),
      world_size_(ranks ? ranks->world_size() : 1),
      sampler_(static_cast<uint64_t>(config_.config.seed), static_cast<uint64_t>(data.train.size()),
               static_cast<uint64_t>(config_.config.data.batch_size * config_.config.train.accum_steps),
               config_.config.data.last_batch, rank_, world_size_, config_.config.data.order),
      total_steps_(total_steps_for(config_.config, sampler_.batches_per_epoch())),
      policies_(make_policies(config_.config, registry, total_steps_)),
      state_(initial_state(config_.config, data, registry, start.initialize)) {
  const Config& config = config_.config;
  check_model_fits(config, state_.model, policies_.loss, data, start.check_fit);
  if (rank_ > 0)
    rng::seed_cpu_and_device(rank_seed(static_cast<uint64_t>(config.seed), rank_), cuda_index(config.runtime));
  // The optimizer was built on the CPU parameters; moving the module moves them in place.
  state_.model.module->to(device());
  if (config.runtime.zero_stage == 1) {
    // ZeRO: the optimizer steps views of this rank's range of the (moved) parameters.
    state_.zero = std::make_shared<ZeroShard>(state_.model.module->parameters(), rank_, world_size_);
    state_.optimizer = make_optimizer(config.optim, state_.zero->views(), numerics_version(config.runtime) == 2);
    std::vector<uint64_t> first;
    for (const ZeroShard::Part& part : state_.zero->mine()) first.push_back(static_cast<uint64_t>(part.begin));
    set_sum_positions(*state_.optimizer, state_.zero->views(), first);
  }
  // The digests' sums taken inside the fused AdamW's pass (optimizer.h).
  const bool digests = config.trace.enabled && config.trace.digests;
  keep_sums(*state_.optimizer, !digests                                        ? KeptSums::kNone
                               : policies_.digest_version >= 4                 ? KeptSums::kMixed4
                               : policies_.digest_version == 3                 ? KeptSums::kMixed
                               : policies_.digest_version == 2 && !state_.zero ? KeptSums::kLanes
                                                                               : KeptSums::kNone);
  for (const auto& f : policies_.faults.faults()) {
    if (f.kind != FaultKind::kPerturbParam && !(f.kind == FaultKind::kInfGrad && !f.arg.empty())) continue;
    bool found = false;
    std::string names;
    for (const auto& item : state_.model.module->named_parameters()) {
      found = found || item.key() == f.arg;
      names += (names.empty() ? "" : ", ") + item.key();
    }
    RETRACE_CHECK(found, ConfigError, "bad fault ", f.id, ":", f.arg, ": no parameter named \"", f.arg,
                  "\"; parameters: ", names);
  }
}

torch::Device Trainer::device() const {
  // One device per rank: LOCAL_RANK is rank within the host; world size 1 uses device 0.
  const int index = cuda_index(config_.config.runtime);
  return index < 0 ? torch::Device(torch::kCPU) : torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

std::optional<std::string> Trainer::crash_due(uint64_t step) const {
  auto f = policies_.faults.due(FaultKind::kCrash, step, state_.fired);
  if (!f) return std::nullopt;
  return (*f)->arg;
}

Batch Trainer::next_batch() {
  auto t0 = Clock::now();
  Batch b;
  b.at = state_.cursor;
  while (state_.set_aside.count({b.at.epoch, b.at.batch_in_epoch})) b.at = sampler_.next(b.at);
  b.indices = sampler_.batch(b.at);
  data::Samples s = data_.train.gather(b.indices);
  b.inputs = s.inputs.to(device());
  b.targets = s.targets.to(device());
  b.next = sampler_.next(b.at);
  if (world_size_ > 1) {
    b.global_samples = sampler_.global_batch_samples(b.at);
    b.global_offset = sampler_.rank_offset(b.at);
  }
  b.data_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  return b;
}

records::StepRecord Trainer::run_step(bool with_digests) {
  StepOutput out = step_state(state_, next_batch(), policies_, ranks_, probe_, with_digests);
  for (auto& e : out.events) events_.push_back(std::move(e));
  return out.record;
}

std::vector<std::pair<std::string, std::string>> Trainer::take_events() {
  std::vector<std::pair<std::string, std::string>> out;
  out.swap(events_);
  return out;
}

records::EvalRecord Trainer::evaluate(const std::function<void(int64_t)>& after_batch) {
  torch::NoGradGuard no_grad;
  // The last step's gradients are dead (the next step starts from none): freed, an evaluation
  // between steps holds the weights and optimizer state but not a gradient of every parameter.
  for (auto& p : state_.model.module->parameters()) p.mutable_grad() = torch::Tensor();
  state_.model.module->eval();
  const data::Split& test = data_.test;
  const EvalPlan plan = eval_plan(config_.config, test.size());
  double loss_sum = 0;
  int64_t correct = 0, items = 0;
  bool classification = true;
  for (int64_t start = 0; start < plan.samples; start += plan.batch_size) {
    const int64_t end = std::min(plan.samples, start + plan.batch_size);
    data::Samples batch = test.range(start, end);
    torch::Tensor x = batch.inputs.to(device());
    torch::Tensor y = batch.targets.to(device());
    // Accuracy where it has a meaning: class indices against one score per class. Runs recorded
    // before [eval] existed also counted a language model's next-token hits, and replay so.
    classification = !c10::isFloatingType(y.scalar_type()) && (y.dim() == 1 || config_.config.eval.legacy_keys);
    torch::Tensor outputs = state_.model.forward(x);
    loss_sum += policies_.loss(outputs, y).item<double>();
    if (classification) {
      torch::Tensor flat = outputs.reshape({-1, outputs.size(-1)});
      correct += flat.argmax(1).eq(y.reshape({-1})).sum().item<int64_t>();
    }
    items += y.numel();
    if (after_batch) after_batch(start / plan.batch_size);
  }
  state_.model.module->train();
  records::EvalRecord e;
  e.step = state_.step;
  e.epoch = state_.cursor.batch_in_epoch == 0 && state_.cursor.epoch > 0 ? state_.cursor.epoch - 1
                                                                         : state_.cursor.epoch;
  e.samples = static_cast<uint64_t>(plan.samples);
  e.loss = items ? loss_sum / static_cast<double>(items) : 0;
  e.accuracy = items ? static_cast<double>(correct) / static_cast<double>(items) : 0;
  if (!classification) {
    e.accuracy = -1;  // none: the targets are not one class per sample
    e.tokens = static_cast<uint64_t>(items);
  }
  e.batches = static_cast<uint64_t>(plan.batches);
  return e;
}

StateContext Trainer::state_context() const {
  StateContext c;
  c.rank = rank_;
  c.world_size = world_size_;
  c.seed = policies_.seed;
  c.optimizer = config_.config.optim.name;
  c.cuda_device = cuda_index(config_.config.runtime);
  c.config_hash = config_.hash;
  c.batches_per_epoch = sampler_.batches_per_epoch();
  c.samples_per_step = static_cast<uint64_t>(config_.config.data.batch_size * config_.config.train.accum_steps) *
                       world_size_;
  c.invariant = policies_.invariance_chunk > 0;
  return c;
}

}  // namespace retrace::train
