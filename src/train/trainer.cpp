#include "train/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cstring>
#include <map>

#include "core/error.h"
#include "train/optimizer.h"
#include "train/step.h"

namespace retrace::train {
namespace {
using Clock = std::chrono::steady_clock;

data::LastBatch last_batch_of(const Config& c) {
  return c.data.last_batch == "keep" ? data::LastBatch::kKeep : data::LastBatch::kDrop;
}

model::MlpOptions mlp_options(const Config& c) {
  model::MlpOptions o;
  o.hidden = c.model.hidden;
  o.activation = c.model.activation;
  o.dropout = c.model.dropout;
  return o;
}

model::Mlp build_model(const Config& c) {
  rng::seed_all(static_cast<uint64_t>(c.seed));
  return model::Mlp(mlp_options(c));
}
}  // namespace

uint64_t total_steps_for(const Config& c, uint64_t batches_per_epoch) {
  return c.train.steps > 0 ? static_cast<uint64_t>(c.train.steps)
                           : static_cast<uint64_t>(c.train.epochs) * batches_per_epoch;
}

Trainer::Trainer(const Config& config, const data::FashionMnist& data, uint32_t rank,
                 uint32_t world_size)
    : config_(config),
      data_(data),
      sampler_(static_cast<uint64_t>(config.seed), static_cast<uint64_t>(data.train.size()),
               static_cast<uint64_t>(config.data.batch_size), last_batch_of(config), rank, world_size),
      model_(build_model(config)),
      optimizer_(make_optimizer(config.optim, *model_)),
      schedule_(config.schedule, config.optim.lr, total_steps_for(config, sampler_.batches_per_epoch())),
      total_steps_(total_steps_for(config, sampler_.batches_per_epoch())) {}

trace::StepRecord Trainer::run_step(bool with_digests) {
  trace::StepRecord rec;
  auto t0 = Clock::now();
  const std::vector<int64_t> idx = sampler_.batch(cursor_);
  torch::Tensor index = torch::from_blob(const_cast<int64_t*>(idx.data()),
                                         {static_cast<int64_t>(idx.size())}, torch::kInt64);
  torch::Tensor x = data_.train.images.index_select(0, index);
  torch::Tensor y = data_.train.labels.index_select(0, index);
  rec.timings.data_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();

  rec.step = step_ + 1;
  rec.epoch = cursor_.epoch;
  rec.batch_in_epoch = cursor_.batch_in_epoch;
  rec.batch_size = static_cast<uint32_t>(idx.size());
  rec.sample_digest = digest_indices(idx);
  rec.lr = schedule_.lr_at(rec.step);
  rec.loss_scale = 1.0;

  set_lr(*optimizer_, rec.lr);
  model_->train();
  StepResult r = train_step(
      *model_, [this](const torch::Tensor& in) { return model_->forward(in); }, *optimizer_, x, y,
      config_.train.max_norm);
  rec.loss = static_cast<double>(r.loss);
  std::memcpy(&rec.loss_bits, &r.loss, sizeof r.loss);
  rec.grad_norm_pre = r.grad_norm_pre;
  rec.grad_norm_post = r.grad_norm_post;
  rec.outcome = r.skipped ? trace::Outcome::kSkip : trace::Outcome::kStep;
  rec.skip_reason = r.skip_reason;
  rec.micro_batch_sizes = {rec.batch_size};
  rec.micro_losses = {rec.loss};
  rec.timings.forward_ms = r.forward_ms;
  rec.timings.backward_ms = r.backward_ms;
  rec.timings.optimizer_ms = r.optimizer_ms;

  step_ += 1;
  samples_seen_ += idx.size();
  cursor_ = sampler_.next(cursor_);
  if (with_digests) {
    auto t = Clock::now();
    rec.param_digest = param_digest();
    rec.optim_digest = optimizer_digest();
    rec.rng_digest = rng_digest();
    rec.timings.trace_ms = std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  }
  return rec;
}

trace::EvalRecord Trainer::evaluate() {
  torch::NoGradGuard no_grad;
  model_->eval();
  const auto& test = data_.test;
  const int64_t n = test.size();
  const int64_t bs = config_.data.eval_batch_size;
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t start = 0; start < n; start += bs) {
    int64_t end = std::min(n, start + bs);
    torch::Tensor x = test.images.slice(0, start, end);
    torch::Tensor y = test.labels.slice(0, start, end);
    torch::Tensor logits = model_->forward(x);
    loss_sum += torch::nn::functional::cross_entropy(
                    logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                    .item<double>();
    correct += logits.argmax(1).eq(y).sum().item<int64_t>();
  }
  model_->train();
  trace::EvalRecord e;
  e.step = step_;
  e.epoch = cursor_.batch_in_epoch == 0 && cursor_.epoch > 0 ? cursor_.epoch - 1 : cursor_.epoch;
  e.samples = static_cast<uint64_t>(n);
  e.loss = loss_sum / static_cast<double>(n);
  e.accuracy = static_cast<double>(correct) / static_cast<double>(n);
  return e;
}

NamedTensors Trainer::model_state() const {
  NamedTensors out;
  for (const auto& item : model_->named_parameters()) out.emplace_back(item.key(), item.value());
  for (const auto& item : model_->named_buffers()) out.emplace_back(item.key(), item.value());
  return out;
}

NamedTensors Trainer::optimizer_state() {
  return train::optimizer_state(*optimizer_, *model_, config_.optim.name);
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

std::vector<trace::ParamInfo> Trainer::param_info() const {
  std::vector<trace::ParamInfo> out;
  for (const auto& [name, t] : model_state()) {
    trace::ParamInfo p;
    p.name = name;
    p.shape.assign(t.sizes().begin(), t.sizes().end());
    p.dtype = std::string(c10::toString(t.scalar_type()));
    out.push_back(std::move(p));
  }
  return out;
}

void Trainer::restore_position(uint64_t step, const rng::RngState& rng, uint64_t samples_seen) {
  RETRACE_CHECK(rng.cursor.batch_in_epoch < sampler_.batches_per_epoch(), FormatError,
                "the checkpoint's data cursor (epoch ", rng.cursor.epoch, ", batch ",
                rng.cursor.batch_in_epoch, ") is past the end of an epoch of ",
                sampler_.batches_per_epoch(), " batches: was it made with another batch size?");
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
    RETRACE_CHECK(it->second.sizes() == t.sizes() && it->second.scalar_type() == t.scalar_type(),
                  FormatError, "model tensor ", name, " has shape ", it->second.sizes(), " ",
                  c10::toString(it->second.scalar_type()), " in the checkpoint, the model expects ",
                  t.sizes(), " ", c10::toString(t.scalar_type()));
    t.copy_(it->second);
  }
}

void Trainer::load_optimizer_state(const NamedTensors& state) {
  train::load_optimizer_state(*optimizer_, *model_, config_.optim.name, state);
}

}  // namespace retrace::train
