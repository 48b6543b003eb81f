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

TrainState initial_state(const Config& c, const data::Dataset& data, const Registry& registry) {
  rng::seed_cpu_and_device(static_cast<uint64_t>(c.seed), cuda_index(c.runtime));
  model::ModelHandle model = registry.model(c.model.kind)(ModelContext{c, data});
  auto optimizer = make_optimizer(c.optim, *model.module);
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

uint64_t rank_seed(uint64_t seed, uint32_t rank) {
  if (rank == 0) return seed;
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (static_cast<uint64_t>(rank) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  // torch's CPU generator takes any 64-bit seed; keep it within the config's range for messages.
  return (z ^ (z >> 31)) & ((1ull << 53) - 1);
}

Trainer::Trainer(const Config& config, const data::Dataset& data, const Registry& registry, Collective* ranks)
    : Trainer(resolved(config), data, registry, ranks) {}

Trainer::Trainer(const ResolvedConfig& resolved_config, const data::Dataset& data, const Registry& registry,
                 Collective* ranks)
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
      state_(initial_state(config_.config, data, registry)) {
  const Config& config = config_.config;
  check_model_fits(config, state_.model, policies_.loss, data);
  if (rank_ > 0)
    rng::seed_cpu_and_device(rank_seed(static_cast<uint64_t>(config.seed), rank_), cuda_index(config.runtime));
  // The optimizer was built on the CPU parameters; moving the module moves them in place.
  state_.model.module->to(device());
  if (config.runtime.zero_stage == 1) {
    // ZeRO: the optimizer steps views of this rank's range of the (moved) parameters.
    state_.zero = std::make_shared<ZeroShard>(state_.model.module->parameters(), rank_, world_size_);
    state_.optimizer = make_optimizer(config.optim, state_.zero->views());
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

NamedTensors Trainer::optimizer_state(std::vector<SliceOf>* slices) {
  if (slices) slices->clear();
  if (!state_.zero) return train::optimizer_state(*state_.optimizer, *state_.model.module, config_.config.optim.name);
  std::vector<SliceOf> mine;
  NamedTensors out = zero_optimizer_state(*state_.optimizer, *state_.zero, *state_.model.module,
                                          config_.config.optim.name, mine);
  if (slices) *slices = std::move(mine);
  return out;
}

Digest128 Trainer::rng_digest() const {
  const std::string bytes = rng_state().serialize();
  return xxh3_128(bytes.data(), bytes.size());
}

void Trainer::restore_position(uint64_t step, const rng::RngState& rng, uint64_t samples_seen) {
  RETRACE_CHECK(rng.cursor.batch_in_epoch < sampler_.batches_per_epoch(), FormatError,
                "the checkpoint's data cursor (epoch ", rng.cursor.epoch, ", batch ", rng.cursor.batch_in_epoch,
                ") is past the end of an epoch of ", sampler_.batches_per_epoch(),
                " batches: was it made with another batch size?");
  const uint64_t per_step = static_cast<uint64_t>(config_.config.data.batch_size * config_.config.train.accum_steps) *
                            world_size_;
  RETRACE_CHECK(step <= (uint64_t(1) << 40) && samples_seen <= step * per_step, FormatError, "the checkpoint of step ",
                step, " says ", samples_seen, " samples were seen, more than ", step, " steps of ", per_step,
                " can see; its state was edited or belongs to another config");
  state_.step = step;
  state_.samples_seen = samples_seen;
  state_.cursor = rng.cursor;
  rng::restore_torch(rng, cuda_index(config_.config.runtime));
}

void Trainer::load_optimizer_state(const NamedTensors& state) {
  if (state_.zero)
    return zero_load_optimizer_state(*state_.optimizer, *state_.zero, *state_.model.module, config_.config.optim.name,
                                     state);
  train::load_optimizer_state(*state_.optimizer, *state_.model.module, config_.config.optim.name, state);
}

}  // namespace retrace::train
