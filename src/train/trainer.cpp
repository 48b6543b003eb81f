#include "train/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>

#include "core/error.h"
#include "model/gpt.h"
#include "model/mlp.h"
#include "rng/philox.h"
#include "train/faults.h"
#include "train/optimizer.h"

namespace retrace::train {
namespace {
using Clock = std::chrono::steady_clock;
constexpr uint64_t kFaultPurpose = 0x6661756c74733031ull;  // "faults01"

model::ModelHandle build_model(const Config& c, const data::Dataset& data, const Registry& registry) {
  rng::seed_all(static_cast<uint64_t>(c.seed));
  return registry.model(c.model.kind)(ModelContext{c, data});
}

std::string fault_id(const std::string& kind, uint64_t step) { return kind + "@" + std::to_string(step); }
}  // namespace

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

Trainer::Trainer(const Config& config, const data::Dataset& data, const Registry& registry, uint32_t rank,
                 uint32_t world_size)
    : config_(config),
      data_(data),
      rank_(rank),
      world_size_(world_size),
      sampler_(static_cast<uint64_t>(config.seed), static_cast<uint64_t>(data.train.size()),
               static_cast<uint64_t>(config.data.batch_size * config.train.accum_steps), config.data.last_batch,
               rank, world_size),
      model_(build_model(config, data, registry)),
      optimizer_(make_optimizer(config.optim, *model_.module)),
      schedule_(config.schedule, config.optim.lr, total_steps_for(config, sampler_.batches_per_epoch())),
      scaler_(config.amp, scaler_enabled(config)),
      skip_guard_(config.guards.skip_window, config.guards.skip_warn_rate),
      spike_guard_(config.guards.spike_factor, config.guards.spike_window),
      faults_(config.faults.parsed),
      loss_(registry.loss(config.train.loss)),
      total_steps_(total_steps_for(config, sampler_.batches_per_epoch())) {
  check_model_fits(config, model_, loss_, data);
  model_.module->to(device());
  // The optimizer was built on the CPU parameters; moving the module moves them in place.
  for (const auto& f : faults_) {
    if (f.kind != "perturb-param" && !(f.kind == "inf-grad" && !f.arg.empty())) continue;
    bool found = false;
    std::string names;
    for (const auto& item : model_.module->named_parameters()) {
      found = found || item.key() == f.arg;
      names += (names.empty() ? "" : ", ") + item.key();
    }
    RETRACE_CHECK(found, ConfigError, "bad fault ", f.kind, "@", f.step, ":", f.arg, ": no parameter named \"",
                  f.arg, "\"; parameters: ", names);
  }
}

torch::Device Trainer::device() const {
  if (config_.runtime.device != DeviceKind::kCuda) return torch::kCPU;
  // One device per rank: LOCAL_RANK is rank within the host; world size 1 uses device 0.
  const char* local = std::getenv("LOCAL_RANK");
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local ? std::atoi(local) : 0));
}

bool Trainer::fault_due(const std::string& kind, uint64_t step, std::string* arg) const {
  for (const auto& f : faults_) {
    if (f.kind != kind || f.step != step) continue;
    if ((kind == "spike" || kind == "crash") && fired_.count(fault_id(kind, step))) continue;
    if (arg) *arg = f.arg;
    return true;
  }
  return false;
}

StepFaults Trainer::faults_for(uint64_t step) {
  StepFaults f;
  std::string arg;
  if (fault_due("nan-loss", step)) {
    f.nan_loss = true;
    events_.emplace_back("fault", "injected nan-loss at step " + std::to_string(step));
  }
  if (fault_due("spike", step, &arg)) {
    f.loss_factor = arg.empty() ? 10.0 : std::stod(arg);
    fired_.insert(fault_id("spike", step));
    events_.emplace_back("fault", "injected spike x" + std::to_string(f.loss_factor) + " at step " + std::to_string(step));
  }
  if (fault_due("inf-grad", step, &arg)) {
    if (arg.empty()) {
      // A parameter chosen by a Philox draw keyed by (seed, step): a pure function, no state.
      auto named = model_.module->named_parameters();
      rng::PhiloxStream s(rng::mix_key(rng::mix_key(static_cast<uint64_t>(config_.seed), kFaultPurpose), step));
      arg = named[static_cast<size_t>(s.next_below(named.size()))].key();
    }
    f.inf_grad = arg;
    events_.emplace_back("fault", "injected inf-grad in " + arg + " at step " + std::to_string(step));
  }
  return f;
}

void Trainer::apply_perturbation(uint64_t step) {
  std::string name;
  if (!fault_due("perturb-param", step, &name)) return;
  torch::NoGradGuard no_grad;
  for (const auto& item : model_.module->named_parameters()) {
    if (item.key() != name) continue;
    torch::Tensor flat = item.value().view({-1});
    RETRACE_CHECK(flat.scalar_type() == torch::kFloat32, ConfigError, "perturb-param supports float32 parameters");
    float v = flat[0].item<float>();
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    bits ^= 1u;
    std::memcpy(&v, &bits, sizeof v);
    flat[0].fill_(v);
    events_.emplace_back("fault", "injected perturb-param: flipped the lowest bit of " + name + "[0] before step " +
                                      std::to_string(step));
  }
}

records::StepRecord Trainer::run_step(bool with_digests) {
  records::StepRecord rec;
  auto t0 = Clock::now();
  while (skip_batches_.count({cursor_.epoch, cursor_.batch_in_epoch})) cursor_ = sampler_.next(cursor_);
  const std::vector<int64_t> idx = sampler_.batch(cursor_);
  torch::Tensor index = torch::from_blob(const_cast<int64_t*>(idx.data()), {static_cast<int64_t>(idx.size())},
                                         torch::kInt64);
  torch::Tensor x = data_.train.inputs.index_select(0, index).to(device());
  torch::Tensor y = data_.train.targets.index_select(0, index).to(device());
  // Split the rank's batch into accum_steps micro-batches, as evenly as possible (a kept last
  // batch can be ragged): piece j holds samples [j*n/a, (j+1)*n/a).
  std::vector<MicroBatch> micro;
  const int64_t n = static_cast<int64_t>(idx.size());
  const int64_t a = std::min<int64_t>(config_.train.accum_steps, n);
  for (int64_t j = 0; j < a; ++j) {
    int64_t lo = j * n / a, hi = (j + 1) * n / a;
    micro.push_back({x.slice(0, lo, hi), y.slice(0, lo, hi)});
  }
  rec.timings.data_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();

  rec.step = step_ + 1;
  rec.epoch = cursor_.epoch;
  rec.batch_in_epoch = cursor_.batch_in_epoch;
  rec.batch_size = static_cast<uint32_t>(idx.size());
  rec.sample_digest = digest_indices(idx);
  rec.lr = schedule_.lr_at(rec.step);
  rec.loss_scale = scaler_.scale();

  apply_perturbation(rec.step);
  set_lr(*optimizer_, rec.lr);
  model_.module->train();
  StepPolicy policy;
  policy.max_norm = config_.train.max_norm;
  policy.device = config_.runtime.device == DeviceKind::kCuda ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  policy.autocast_dtype = autocast_dtype(config_);
  policy.scaler = &scaler_;
  policy.spike = &spike_guard_;
  // Under data parallelism each rank divides by the loss items of the whole global batch, so the
  // summed gradients are the large-batch mean.
  if (world_size_ > 1)
    policy.global_count = static_cast<int64_t>(sampler_.global_batch_samples(cursor_)) * (y.numel() / std::max<int64_t>(1, y.size(0)));
  policy.reduce_loss = reduce_loss_;
  policy.after_last_backward = after_last_backward_;
  policy.probe = probe_;
  policy.loss = loss_;
  StepResult r = train_step(*model_.module, model_.forward, *optimizer_, micro, policy, faults_for(rec.step));

  rec.loss = static_cast<double>(r.loss);
  std::memcpy(&rec.loss_bits, &r.loss, sizeof r.loss);
  rec.grad_norm_pre = r.grad_norm_pre;
  rec.grad_norm_post = r.grad_norm_post;
  rec.outcome = r.skipped ? records::Outcome::kSkip : records::Outcome::kStep;
  rec.skip_reason = r.skip_reason;
  rec.micro_batch_sizes = r.micro_sizes;
  rec.micro_losses = r.micro_losses;
  rec.timings.forward_ms = r.forward_ms;
  rec.timings.backward_ms = r.backward_ms;
  rec.timings.optimizer_ms = r.optimizer_ms;

  if (!r.skipped) spike_guard_.record(rec.loss);
  if (auto warning = skip_guard_.record(r.skipped, rec.step)) events_.emplace_back("warning", *warning);

  step_ += 1;
  samples_seen_ += idx.size();
  cursor_ = sampler_.next(cursor_);
  if (with_digests) {
    auto t = Clock::now();
    rec.param_digest = param_digest();
    // The optimizer state is twice the parameters (AdamW): digesting it every step would cost
    // about 2 % of the MLP step on its own. Every K steps, and zero in between (README, "The trace").
    if (rec.step % static_cast<uint64_t>(config_.trace.optimizer_digest_every) == 0) rec.optim_digest = optimizer_digest();
    rec.rng_digest = rng_digest();
    rec.timings.trace_ms = std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  }
  return rec;
}

std::vector<std::pair<std::string, std::string>> Trainer::take_events() {
  std::vector<std::pair<std::string, std::string>> out;
  out.swap(events_);
  return out;
}

records::EvalRecord Trainer::evaluate() {
  torch::NoGradGuard no_grad;
  model_.module->eval();
  const auto& test = data_.test;
  const int64_t n = test.size();
  const int64_t bs = config_.data.eval_batch_size;
  const bool classification = !c10::isFloatingType(test.targets.scalar_type());
  double loss_sum = 0;
  int64_t correct = 0, items = 0;
  for (int64_t start = 0; start < n; start += bs) {
    int64_t end = std::min(n, start + bs);
    torch::Tensor x = test.inputs.slice(0, start, end).to(device());
    torch::Tensor y = test.targets.slice(0, start, end).to(device());
    torch::Tensor outputs = model_.forward(x);
    loss_sum += loss_(outputs, y).item<double>();
    // Accuracy where it has a meaning: class indices against one score per class.
    if (classification) {
      torch::Tensor flat = outputs.reshape({-1, outputs.size(-1)});
      correct += flat.argmax(1).eq(y.reshape({-1})).sum().item<int64_t>();
    }
    items += y.numel();
  }
  model_.module->train();
  records::EvalRecord e;
  e.step = step_;
  e.epoch = cursor_.batch_in_epoch == 0 && cursor_.epoch > 0 ? cursor_.epoch - 1 : cursor_.epoch;
  e.samples = static_cast<uint64_t>(n);
  e.loss = items ? loss_sum / static_cast<double>(items) : 0;
  e.accuracy = items ? static_cast<double>(correct) / static_cast<double>(items) : 0;
  if (!classification) e.accuracy = -1;  // none: the targets are not classes
  return e;
}

NamedTensors Trainer::model_state() const {
  NamedTensors out;
  for (const auto& item : model_.module->named_parameters()) out.emplace_back(item.key(), item.value());
  for (const auto& item : model_.module->named_buffers()) out.emplace_back(item.key(), item.value());
  return out;
}

NamedTensors Trainer::optimizer_state() {
  return train::optimizer_state(*optimizer_, *model_.module, config_.optim.name);
}

rng::RngState Trainer::rng_state() const {
  rng::RngState s = rng::capture_torch(static_cast<uint64_t>(config_.seed));
  s.cursor = cursor_;
  return s;
}

Digest128 Trainer::param_digest() const { return digest_named(model_state()); }
Digest128 Trainer::optimizer_digest() { return digest_named(optimizer_state()); }
Digest128 Trainer::rng_digest() const {
  const std::string bytes = rng_state().serialize();
  return xxh3_128(bytes.data(), bytes.size());
}

std::vector<records::ParamInfo> Trainer::param_info() const {
  std::vector<records::ParamInfo> out;
  for (const auto& [name, t] : model_state()) {
    records::ParamInfo p;
    p.name = name;
    p.shape.assign(t.sizes().begin(), t.sizes().end());
    p.dtype = std::string(c10::toString(t.scalar_type()));
    out.push_back(std::move(p));
  }
  return out;
}

std::map<std::string, std::string> Trainer::policy_state() const {
  std::map<std::string, std::string> s = scaler_.state();
  for (auto& kv : skip_guard_.state()) s.insert(kv);
  for (auto& kv : spike_guard_.state()) s.insert(kv);
  std::string fired, aside;
  for (const auto& f : fired_) fired += (fired.empty() ? "" : ",") + f;
  for (const auto& [e, b] : skip_batches_) aside += (aside.empty() ? "" : ",") + std::to_string(e) + ":" + std::to_string(b);
  s["faults.fired"] = fired;
  s["data.set_aside"] = aside;
  return s;
}

void Trainer::load_policy_state(const std::map<std::string, std::string>& state) {
  scaler_.load_state(state);
  skip_guard_.load_state(state);
  spike_guard_.load_state(state);
  auto split = [](const std::string& s) {
    std::vector<std::string> out;
    std::stringstream in(s);
    std::string item;
    while (std::getline(in, item, ',')) if (!item.empty()) out.push_back(item);
    return out;
  };
  auto it = state.find("faults.fired");
  if (it != state.end())
    for (const auto& f : split(it->second)) fired_.insert(f);
  it = state.find("data.set_aside");
  if (it != state.end()) {
    for (const auto& item : split(it->second)) {
      auto colon = item.find(':');
      RETRACE_CHECK(colon != std::string::npos, FormatError, "bad set-aside batch \"", item, "\" in checkpoint");
      skip_batches_.insert({std::stoull(item.substr(0, colon)), std::stoull(item.substr(colon + 1))});
    }
  }
}

void Trainer::set_aside_batches(const data::Cursor& spike, int64_t count) {
  data::Cursor c = spike;
  for (int64_t i = 0; i < count; ++i) {
    skip_batches_.insert({c.epoch, c.batch_in_epoch});
    if (c.batch_in_epoch > 0) {
      c.batch_in_epoch -= 1;
    } else if (c.epoch > 0) {
      c.epoch -= 1;
      c.batch_in_epoch = sampler_.batches_per_epoch() - 1;
    } else {
      break;
    }
  }
}

void Trainer::restore_position(uint64_t step, const rng::RngState& rng, uint64_t samples_seen) {
  RETRACE_CHECK(rng.cursor.batch_in_epoch < sampler_.batches_per_epoch(), FormatError,
                "the checkpoint's data cursor (epoch ", rng.cursor.epoch, ", batch ", rng.cursor.batch_in_epoch,
                ") is past the end of an epoch of ", sampler_.batches_per_epoch(),
                " batches: was it made with another batch size?");
  const uint64_t per_step = static_cast<uint64_t>(config_.data.batch_size * config_.train.accum_steps) * world_size_;
  RETRACE_CHECK(step <= (uint64_t(1) << 40) && samples_seen <= step * per_step, FormatError, "the checkpoint of step ",
                step, " says ", samples_seen, " samples were seen, more than ", step, " steps of ", per_step,
                " can see; its state was edited or belongs to another config");
  step_ = step;
  samples_seen_ = samples_seen;
  cursor_ = rng.cursor;
  rng::restore_torch(rng);
}

void Trainer::load_model_state(const NamedTensors& state) {
  std::map<std::string, torch::Tensor> by_name(state.begin(), state.end());
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : model_state()) {
    auto it = by_name.find(name);
    RETRACE_CHECK(it != by_name.end(), FormatError, "model tensor ", name, " is missing from the checkpoint");
    RETRACE_CHECK(it->second.sizes() == t.sizes() && it->second.scalar_type() == t.scalar_type(), FormatError,
                  "model tensor ", name, " has shape ", it->second.sizes(), " ",
                  c10::toString(it->second.scalar_type()), " in the checkpoint, the model expects ", t.sizes(), " ",
                  c10::toString(t.scalar_type()));
    t.copy_(it->second);
  }
}

void Trainer::load_optimizer_state(const NamedTensors& state) {
  train::load_optimizer_state(*optimizer_, *model_.module, config_.optim.name, state);
}

}  // namespace retrace::train
