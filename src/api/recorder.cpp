// The recorder for a user's own loop: retrace's trace and checkpoint formats without its loop.
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <optional>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/train_state.h"
#include "core/digest.h"
#include "core/error.h"
#include "core/tensor_digest.h"
#include "retrace/retrace.h"
#include "rng/rng_state.h"
#include "run/layout.h"
#include "run/run_dir.h"
#include "run/run.h"
#include "trace/trace_reader.h"
#include "trace/trace_writer.h"
#include "train/config.h"
#include "train/environment.h"
#include "train/optimizer.h"
#include "train/state.h"

namespace retrace {
namespace {

constexpr int kZstdLevel = 3;
constexpr const char* kRecorderMark = "recorder";

NamedTensors module_state(const torch::nn::Module& m) { return train::module_tensors(m); }

// The optimizer kinds whose state retrace can name tensor by tensor.
std::optional<train::OptimizerKind> kind_of(torch::optim::Optimizer& opt) {
  if (dynamic_cast<torch::optim::AdamW*>(&opt)) return train::OptimizerKind::kAdamW;
  if (dynamic_cast<torch::optim::SGD*>(&opt)) return train::OptimizerKind::kSgd;
  return std::nullopt;
}

train::RuntimeConfig runtime_now() {
  train::RuntimeConfig r;
  r.numerics = train::Numerics::kNative;  // a user's loop runs under the numerics it set itself
  r.threads = at::get_num_threads();
  r.blas_threads = r.threads;
  return r;
}

}  // namespace

struct Recorder::Impl {
  std::string dir;
  uint64_t seed = 0;
  uint32_t keep_last = 5;
  std::string config_hash;
  std::optional<trace::TraceWriter> writer;
  uint64_t last_step = 0;
};

Recorder::Recorder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Recorder::~Recorder() = default;
Recorder::Recorder(Recorder&&) noexcept = default;
Recorder& Recorder::operator=(Recorder&&) noexcept = default;
uint64_t Recorder::last_step() const { return impl_->last_step; }

Recorder Recorder::create(const std::string& dir, const torch::nn::Module& module, const RecorderOptions& o) {
  RETRACE_CHECK(o.keep_last >= 1, ConfigError, "RecorderOptions::keep_last must be at least 1");
  records::TraceHeader h;
  for (const auto& path : o.data_files) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    RETRACE_CHECK(!ec, IoError, "Recorder: data file ", path, " cannot be read: ", ec.message());
    h.data_files.push_back({path, static_cast<uint64_t>(size), sha256_file_hex(path)});
  }
  // The text recorded as the run's config: the caller's, marked as a recorder run.
  const std::string config_text = "# recorded by retrace::Recorder (a user's own loop)\n" + o.config_toml +
                                  (o.config_toml.empty() || o.config_toml.back() == '\n' ? "" : "\n");
  run::create_run_dir(dir, o.force, /*scratch=*/false, config_text);
  auto impl = std::make_unique<Impl>();
  impl->dir = dir;
  impl->seed = o.seed;
  impl->keep_last = o.keep_last;
  impl->config_hash = ckpt::config_hash(config_text);
  h.retrace_version = train::retrace_version();
  h.config_toml = config_text;
  h.config_hash = impl->config_hash;
  h.seed = o.seed;
  h.fingerprint = train::fingerprint(runtime_now(), 1);
  h.model_description = o.description.empty() ? module.name() : o.description;
  h.params = train::param_info(module);
  h.created_utc = run::utc_now();
  impl->writer.emplace(trace::TraceWriter::create(run::trace_path(dir), h, kZstdLevel));
  return Recorder(std::move(impl));
}

void Recorder::step(uint64_t step, double loss, const torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                    const StepInfo& info) {
  RETRACE_CHECK(step > impl_->last_step, ConfigError, "Recorder::step: step ", step, " after step ", impl_->last_step,
                "; steps must increase");
  records::StepRecord r;
  r.step = step;
  r.batch_size = info.batch_size;
  r.sample_digest = digest_indices(info.sample_indices);
  r.loss = loss;
  const float f = static_cast<float>(loss);
  std::memcpy(&r.loss_bits, &f, sizeof f);
  r.grad_norm_pre = info.grad_norm;
  r.grad_norm_post = info.grad_norm_clipped != 0 ? info.grad_norm_clipped : info.grad_norm;
  r.lr = info.lr;
  r.outcome = info.skipped ? records::Outcome::kSkip : records::Outcome::kStep;
  r.skip_reason = info.skip_reason;
  r.param_digest = digest_named(module_state(module));
  if (auto kind = kind_of(optimizer)) r.optim_digest = digest_named(train::optimizer_state(optimizer, module, *kind));
  const std::string rng = rng::capture_torch(impl_->seed, train::cuda_index(module)).serialize();
  r.rng_digest = xxh3_128(rng.data(), rng.size());
  impl_->writer->append_step(r);
  impl_->last_step = step;
}

std::string Recorder::checkpoint(uint64_t step, const torch::nn::Module& module, torch::optim::Optimizer& optimizer) {
  auto kind = kind_of(optimizer);
  RETRACE_CHECK(kind.has_value(), ConfigError, "Recorder::checkpoint: the optimizer is not AdamW or SGD, whose state "
                "retrace can store tensor by tensor; use one of them, or checkpoint the optimizer yourself");
  impl_->writer->sync();  // the checkpoint points into the trace: that prefix must be durable
  ckpt::TracePosition pos{impl_->writer->bytes_written(), impl_->writer->last_chain()};
  ckpt::StateSnapshot snap;
  snap.step = step;
  snap.model = module_state(module);
  snap.optim = train::optimizer_state(optimizer, module, *kind);
  snap.rng = rng::capture_torch(impl_->seed, train::cuda_index(module)).serialize();
  snap.config_hash = impl_->config_hash;
  snap.metadata["optim"] = train::optimizer_name(*kind);
  snap.metadata["samples_seen"] = "0";
  snap.metadata["x.source"] = kRecorderMark;
  return ckpt::save_snapshot(snap, run::checkpoint_root(impl_->dir), pos, impl_->keep_last);
}

Recorder Recorder::resume(const std::string& dir, torch::nn::Module& module, torch::optim::Optimizer& optimizer) {
  auto kind = kind_of(optimizer);
  RETRACE_CHECK(kind.has_value(), ConfigError, "Recorder::resume: the optimizer is not AdamW or SGD");
  const int cuda = train::cuda_index(module);
  const NamedTensors mine = module_state(module);
  // The validation layer: every value of a checkpoint against this module, optimizer and LibTorch
  // before any of it is applied; a checkpoint that fails is skipped for an older one, as a
  // verification failure is, and the module is not touched until one passes.
  const auto same_optimizer = [&](const ckpt::LoadedSnapshot& s) {
    auto it = s.metadata.find("optim");
    return it != s.metadata.end() && it->second == train::optimizer_name(*kind);
  };
  const auto check = [&](const ckpt::LoadedSnapshot& s) {
    if (!same_optimizer(s)) return;  // the loop's choice, not damage: a config error below
    train::check_model_state(mine, s.model, s.where);
    train::check_optimizer_state(s.optim, module, *kind, s.where);
    rng::check_restorable(rng::RngState::deserialize(s.rng), cuda, s.where);
  };
  std::vector<std::pair<std::string, std::string>> skipped;
  auto pick = ckpt::load_newest_snapshot(run::checkpoint_root(dir), 1, 0, &skipped, {}, check);  // own shard hashed once
  RETRACE_CHECK(pick.has_value(), IntegrityError, "Recorder::resume: no checkpoint of ", dir, " verifies",
                skipped.empty() ? " (there is none)" : ": " + skipped.front().first + ": " + skipped.front().second,
                "; start the run again with Recorder::create");
  ckpt::LoadedSnapshot snap = std::move(pick->snapshot);
  auto opt_it = snap.metadata.find("optim");
  RETRACE_CHECK(same_optimizer(snap), ConfigError, "checkpoint ", pick->dir, " holds ",
                opt_it == snap.metadata.end() ? "no" : opt_it->second.c_str(), " optimizer state, the loop uses ",
                train::optimizer_name(*kind), "; resume with the optimizer the run was recorded with");
  {
    std::map<std::string, torch::Tensor> by_name(snap.model.begin(), snap.model.end());
    torch::NoGradGuard no_grad;
    for (const auto& [name, t] : mine) t.copy_(by_name.at(name));
  }
  train::load_optimizer_state(optimizer, module, *kind, snap.optim);
  rng::restore_torch(rng::RngState::deserialize(snap.rng), cuda);

  const trace::TraceReader before = trace::TraceReader::open(run::trace_path(dir));
  const auto chain = before.chain_at(snap.position.bytes);
  RETRACE_CHECK(chain && *chain == snap.position.chain, IntegrityError, "checkpoint ", pick->dir,
                " does not sit on the trace's hash chain at byte ", snap.position.bytes,
                "; it does not belong to this trace");
  auto impl = std::make_unique<Impl>();
  impl->dir = dir;
  impl->seed = before.header().seed;
  impl->config_hash = before.header().config_hash;
  impl->last_step = snap.manifest.step;
  impl->writer.emplace(trace::TraceWriter::resume(run::trace_path(dir), snap.position.bytes, snap.position.chain,
                                                  snap.manifest.step, run::set_aside_path(dir), kZstdLevel));
  impl->writer->append_event({snap.manifest.step, "resume",
                              "resumed by retrace::Recorder from " + pick->dir + " at step " +
                                  std::to_string(snap.manifest.step)});
  return Recorder(std::move(impl));
}

void Recorder::sync() { impl_->writer->sync(); }

}  // namespace retrace
