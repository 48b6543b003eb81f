// The recorder for a user's own loop: retrace's trace and checkpoint formats without its loop. The
// tensor-level API (LoopState) is the core; the Module overloads fill a LoopState and call it, so a
// C++ loop and a Python one (python/retrace) digest the same tensors by the same code.
#include <torch/torch.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <cstring>
#include <filesystem>
#include <optional>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/train_state.h"
#include "core/digest.h"
#include "core/error.h"
#include "core/parse_number.h"
#include "core/tensor_digest.h"
#include "data/sampler.h"
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
#include "train/step_digests.h"

namespace retrace {
namespace {

constexpr int kZstdLevel = 3;
constexpr const char* kRecorderMark = "recorder";
constexpr const char* kUserPrefix = "x.user.";

// The optimizer kinds whose state retrace can name tensor by tensor.
std::optional<train::OptimizerKind> kind_of(torch::optim::Optimizer& opt) {
  if (dynamic_cast<torch::optim::AdamW*>(&opt)) return train::OptimizerKind::kAdamW;
  if (dynamic_cast<torch::optim::SGD*>(&opt)) return train::OptimizerKind::kSgd;
  return std::nullopt;
}

std::optional<train::OptimizerKind> kind_of(const std::string& name) {
  if (name == train::optimizer_name(train::OptimizerKind::kAdamW)) return train::OptimizerKind::kAdamW;
  if (name == train::optimizer_name(train::OptimizerKind::kSgd)) return train::OptimizerKind::kSgd;
  RETRACE_CHECK(name.empty(), ConfigError, "Recorder: optimizer kind \"", name,
                "\" is none of adamw, sgd or \"\" (another optimizer)");
  return std::nullopt;
}

LoopState state_of(const torch::nn::Module& m, torch::optim::Optimizer* opt) {
  LoopState s;
  for (const auto& item : m.named_parameters()) s.parameters.emplace_back(item.key(), item.value());
  for (const auto& item : m.named_buffers()) s.buffers.emplace_back(item.key(), item.value());
  if (opt)
    if (auto kind = kind_of(*opt)) {
      s.optimizer_kind = train::optimizer_name(*kind);
      s.optimizer = train::optimizer_state(*opt, m, *kind);
    }
  s.cuda_device = train::cuda_index(m);
  return s;
}

NamedTensors model_tensors(const LoopState& s) {
  NamedTensors out = s.parameters;
  out.insert(out.end(), s.buffers.begin(), s.buffers.end());
  return out;
}

train::RuntimeConfig runtime_now() {
  train::RuntimeConfig r;
  r.numerics = train::Numerics::kNative;  // a user's loop runs under the numerics it set itself
  r.threads = at::get_num_threads();
  r.blas_threads = r.threads;
  return r;
}

std::string rng_bytes(uint64_t seed, const LoopState& s) {
  rng::RngState st = rng::capture_torch(seed, s.cuda_device);
  st.cursor.epoch = s.epoch;
  st.cursor.batch_in_epoch = s.batch_in_epoch;
  st.generators = s.generators;
  std::sort(st.generators.begin(), st.generators.end());
  for (size_t i = 1; i < st.generators.size(); ++i)
    RETRACE_CHECK(st.generators[i - 1].first != st.generators[i].first, ConfigError, "Recorder: generator \"",
                  st.generators[i].first, "\" is given twice");
  for (const auto& [name, state] : st.generators)
    RETRACE_CHECK(!name.empty(), ConfigError, "Recorder: a generator without a name");
  return st.serialize();
}

// The recorder's own settings, recorded after the caller's config text.
std::string settings_toml(const RecorderOptions& o) {
  return "\n# retrace::Recorder's settings\n[recorder]\ndigest_version = " + std::to_string(o.digest_version) +
         "\nmodule_digests = " + (o.module_digests ? "true" : "false") +
         "\noptimizer_digest_every = " + std::to_string(o.optimizer_digest_every) + "\n";
}

// Those settings read back from a run's config text (a run from before them: version 1, no module
// digests, the optimizer every step).
RecorderOptions settings_of(const std::string& config_text) {
  RecorderOptions o;
  o.digest_version = 1;
  o.module_digests = false;
  const auto entries = train::config_entries(config_text);
  auto number = [&](const char* key, uint64_t fallback) -> uint64_t {
    auto it = entries.find(key);
    if (it == entries.end()) return fallback;
    const std::string v = it->second.substr(0, it->second.find_first_of(" #"));
    RETRACE_CHECK(!v.empty() && v.find_first_not_of("0123456789") == std::string::npos && v.size() < 10, FormatError,
                  "the run's config records ", key, " = ", it->second, "; expected a whole number");
    return *parse_decimal_u64(v);  // checked above: fewer than 10 digits
  };
  o.digest_version = static_cast<int>(number("recorder.digest_version", 1));
  RETRACE_CHECK(o.digest_version >= 1 && o.digest_version <= 4, FormatError,
                "the run's config records recorder.digest_version = ", o.digest_version,
                "; this retrace knows versions 1 to 4");
  auto it = entries.find("recorder.module_digests");
  o.module_digests = it != entries.end() && it->second.rfind("true", 0) == 0;
  o.optimizer_digest_every = static_cast<uint32_t>(number("recorder.optimizer_digest_every", 1));
  return o;
}

void check_user_key(const std::string& key) {
  RETRACE_CHECK(!key.empty() && key.size() <= 128 &&
                    key.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") ==
                        std::string::npos,
                ConfigError, "Recorder: user entry key \"", key, "\" must be 1 to 128 characters of A-Z a-z 0-9 _ . -");
}

}  // namespace

struct Recorder::Impl {
  run::RunLock lock;  // the run directory's, held until close() or the end (released last)
  std::string dir;
  uint64_t seed = 0;
  uint32_t keep_last = 5;
  RecorderOptions settings;
  std::string config_hash;
  std::vector<records::ParamInfo> params;  // the header's: every step's tensors are checked against them
  train::ModuleIndex modules;              // of those tensors, for the per-module digests
  std::optional<trace::TraceWriter> writer;
  uint64_t last_step = 0;
  uint64_t epoch = 0;

  // Overlapped digests (RecorderOptions::overlap_digests): one worker thread runs one step's
  // digests and appends its record while the loop goes on; every other use of the writer, and the
  // next step, waits for it first (wait()). The worker finishes a pending job before it stops.
  std::thread worker;
  std::mutex mu;
  std::condition_variable cv;
  std::function<void()> job;
  bool busy = false;
  bool stop = false;
  std::exception_ptr error;

  void run_worker() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [this] { return job || stop; });
      if (!job) return;
      std::function<void()> j = std::move(job);
      job = nullptr;
      lock.unlock();
      std::exception_ptr e;
      try {
        j();
      } catch (...) {
        e = std::current_exception();
      }
      lock.lock();
      if (e && !error) error = e;
      busy = false;
      cv.notify_all();
    }
  }
  void submit(std::function<void()> j) {
    wait();
    if (!worker.joinable()) worker = std::thread([this] { run_worker(); });
    std::lock_guard<std::mutex> lock(mu);
    job = std::move(j);
    busy = true;
    cv.notify_all();
  }
  // The writer, open: ConfigError after close().
  trace::TraceWriter& open_writer(const char* call) {
    RETRACE_CHECK(writer.has_value(), ConfigError, "Recorder::", call, ": the recorder of ", dir,
                  " was closed; continue the run with Recorder::resume");
    return *writer;
  }
  // Waits for the pending job; rethrows what it threw (once).
  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [this] { return !busy; });
    if (error) {
      std::exception_ptr e = error;
      error = nullptr;
      std::rethrow_exception(e);
    }
  }
  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    if (worker.joinable()) worker.join();  // a pending record is still appended; its error is lost (call sync())
  }
};

Recorder::Recorder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Recorder::~Recorder() = default;
void Recorder::wait() { impl_->wait(); }
void Recorder::overlap_digests(bool on) {
  impl_->wait();
  impl_->settings.overlap_digests = on;
}
Recorder::Recorder(Recorder&&) noexcept = default;
Recorder& Recorder::operator=(Recorder&&) noexcept = default;
uint64_t Recorder::last_step() const { return impl_->last_step; }
const std::string& Recorder::dir() const { return impl_->dir; }

Recorder Recorder::create(const std::string& dir, const torch::nn::Module& module, const RecorderOptions& o) {
  RecorderOptions with_name = o;
  if (with_name.description.empty()) with_name.description = module.name();
  return create(dir, state_of(module, nullptr), with_name);
}

Recorder Recorder::create(const std::string& dir, const LoopState& state, const RecorderOptions& o) {
  RETRACE_CHECK(o.keep_last >= 1, ConfigError, "RecorderOptions::keep_last must be at least 1");
  RETRACE_CHECK(o.digest_version >= 1 && o.digest_version <= 4, ConfigError, "RecorderOptions::digest_version is ",
                o.digest_version, "; use 1 to 4 (4: retrace's current digests)");
  run::HeaderParts h;
  const NamedTensors model = model_tensors(state);
  for (const auto& [name, t] : model)
    RETRACE_CHECK(t.defined(), ConfigError, "Recorder: tensor ", name, " is undefined");
  h.params = train::param_info(model);
  for (const auto& path : o.data_files) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    RETRACE_CHECK(!ec, IoError, "Recorder: data file ", path, " cannot be read: ", ec.message());
    h.data_files.push_back({path, static_cast<uint64_t>(size), sha256_file_hex(path)});
  }
  // The text recorded as the run's config: the caller's, marked as a recorder run, and the
  // recorder's own settings.
  const std::string config_text = "# recorded by retrace::Recorder (a user's own loop)\n" + o.config_toml +
                                  (o.config_toml.empty() || o.config_toml.back() == '\n' ? "" : "\n") +
                                  settings_toml(o);
  run::RunLock lock = run::create_run_dir(dir, o.force, /*scratch=*/false, config_text, "Recorder (a user's loop)");
  auto impl = std::make_unique<Impl>();
  impl->lock = std::move(lock);
  impl->dir = dir;
  impl->seed = o.seed;
  impl->keep_last = o.keep_last;
  impl->settings = o;
  impl->config_hash = train::config_hash(config_text);
  impl->params = h.params;
  impl->modules = train::index_modules(h.params);
  h.config_toml = config_text;
  h.config_hash = impl->config_hash;
  h.seed = o.seed;
  h.fingerprint = train::fingerprint(runtime_now(), 1);
  h.model_description = o.description.empty() ? "a user's model" : o.description;
  impl->writer.emplace(trace::TraceWriter::create(run::trace_path(dir), run::trace_header(std::move(h)), kZstdLevel));
  return Recorder(std::move(impl));
}

void Recorder::step(uint64_t step, double loss, const torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                    const StepInfo& info) {
  this->step(step, loss, state_of(module, &optimizer), info);
}

void Recorder::step(uint64_t step, double loss, const LoopState& state, const StepInfo& info) {
  impl_->open_writer("step");
  RETRACE_CHECK(step > impl_->last_step, ConfigError, "Recorder::step: step ", step, " after step ", impl_->last_step,
                "; steps must increase");
  const NamedTensors model = model_tensors(state);
  RETRACE_CHECK(model.size() == impl_->params.size(), ConfigError, "Recorder::step: the model has ", model.size(),
                " parameters and buffers, the run was created with ", impl_->params.size());
  for (size_t i = 0; i < model.size(); ++i) {
    const auto& [name, t] = model[i];
    const auto& p = impl_->params[i];
    RETRACE_CHECK(t.defined() && name == p.name && std::vector<int64_t>(t.sizes().begin(), t.sizes().end()) == p.shape,
                  ConfigError, "Recorder::step: tensor ", i, " is ", name, ", the run was created with ", p.name,
                  " (the same names and shapes, in the same order, every step)");
  }
  const std::optional<train::OptimizerKind> kind = kind_of(state.optimizer_kind);
  records::StepRecord r;
  r.step = step;
  r.epoch = info.epoch >= 0 ? static_cast<uint64_t>(info.epoch) : state.epoch;
  r.batch_in_epoch = info.batch_in_epoch >= 0 ? static_cast<uint64_t>(info.batch_in_epoch) : state.batch_in_epoch;
  r.batch_size = info.batch_size;
  if (!info.sample_indices.empty() || !info.batch.defined()) r.sample_digest = digest_indices(info.sample_indices);
  else r.sample_digest = digest_named({{"batch", info.batch}}, DigestKind::kMixed4);  // summed where it lives
  r.loss = loss;
  const float f = static_cast<float>(loss);
  std::memcpy(&r.loss_bits, &f, sizeof f);
  r.grad_norm_pre = info.grad_norm;
  r.grad_norm_post = info.grad_norm_clipped != 0 ? info.grad_norm_clipped : info.grad_norm;
  r.lr = info.lr;
  r.outcome = info.skipped ? records::Outcome::kSkip : records::Outcome::kStep;
  r.skip_reason = info.skip_reason;
  if (info.batch_size > 0) {  // one micro-batch: the batch (as `retrace record` records a step without accumulation)
    r.micro_batch_sizes = {info.batch_size};
    r.micro_losses = {loss};
  }

  // The generators now: the loop's next forward draws from them.
  const std::string rng = rng_bytes(impl_->seed, state);
  r.rng_digest = train::rng_digest(rng);

  const RecorderOptions& o = impl_->settings;
  const DigestKind digest = digest_kind_of(o.digest_version);
  const bool with_optimizer = kind && o.optimizer_digest_every > 0 && step % o.optimizer_digest_every == 0;
  train::StepTensors tensors;
  tensors.model = model;
  if (is_mixed(digest))
    for (const auto& [name, p] : state.parameters) tensors.grads.emplace_back(name, p.grad());
  tensors.with_optimizer = with_optimizer;
  if (with_optimizer) tensors.optim = state.optimizer;
  // The digests and the append: here, or on the worker while the loop goes on (the tensors are
  // held by reference; the loop's next change to them waits for it, see overlap_digests). The
  // model's tensors are the header's, in its order (checked above), as the module index needs.
  auto finish = [r = std::move(r), tensors = std::move(tensors), digest,
                 modules = o.module_digests ? &impl_->modules : nullptr, writer = &*impl_->writer]() mutable {
    train::digest_step_tensors(tensors, digest, nullptr, modules, r);
    writer->append_step(r);
  };
  if (o.overlap_digests) {
    impl_->submit(std::move(finish));
  } else {
    impl_->wait();
    finish();
  }
  impl_->last_step = step;
  impl_->epoch = state.epoch;
}

std::string Recorder::checkpoint(uint64_t step, const torch::nn::Module& module, torch::optim::Optimizer& optimizer) {
  return checkpoint(step, state_of(module, &optimizer));  // another optimizer: kind "", refused there
}

std::string Recorder::checkpoint(uint64_t step, const LoopState& state) {
  const std::optional<train::OptimizerKind> kind = kind_of(state.optimizer_kind);
  RETRACE_CHECK(kind.has_value(), ConfigError,
                "Recorder::checkpoint: the optimizer is not AdamW or SGD, whose state "
                "retrace can store tensor by tensor; use one of them, or checkpoint the optimizer yourself");
  for (const auto& [key, value] : state.user) check_user_key(key);
  // What the loop hands over is checked as a checkpoint's is on loading: a checkpoint that could
  // not be resumed is not written.
  train::check_optimizer_state(state.optimizer, state.parameters, *kind, "Recorder::checkpoint");
  impl_->open_writer("checkpoint");
  impl_->wait();
  impl_->writer->sync();  // the checkpoint points into the trace: that prefix must be durable
  ckpt::TracePosition pos{impl_->writer->bytes_written(), impl_->writer->last_chain()};
  ckpt::StateSnapshot snap;
  snap.step = step;
  snap.model = model_tensors(state);
  snap.optim = state.optimizer;
  snap.rng = rng_bytes(impl_->seed, state);
  snap.config_hash = impl_->config_hash;
  snap.metadata["optim"] = train::optimizer_name(*kind);
  snap.metadata["samples_seen"] = std::to_string(state.samples_seen);
  snap.metadata["x.source"] = kRecorderMark;
  for (const auto& [key, value] : state.user) snap.metadata[kUserPrefix + key] = value;
  return ckpt::save_snapshot(snap, run::checkpoint_root(impl_->dir), pos, impl_->keep_last);
}

Recorder Recorder::resume(const std::string& dir, torch::nn::Module& module, torch::optim::Optimizer& optimizer) {
  auto kind = kind_of(optimizer);
  RETRACE_CHECK(kind.has_value(), ConfigError, "Recorder::resume: the optimizer is not AdamW or SGD");
  LoopState restored;
  Recorder rec = resume(dir, state_of(module, &optimizer), restored);
  train::load_optimizer_state(optimizer, module, *kind, restored.optimizer);
  return rec;
}

namespace {

// The newest checkpoint of `dir` that this loop can continue: every value of it checked against
// this model, optimizer and LibTorch before any of it is applied (the validation layer; one that
// fails gives way to an older one, as a verification failure does), and its trace position
// judged on its manifest, before its shard is read, against the run's trace (`before`, when there
// is one: a checkpoint past the intact trace, or of another trace, gives way too).
ckpt::NewestSnapshot choose_checkpoint(const std::string& dir, const LoopState& current, train::OptimizerKind kind,
                                       const std::optional<trace::TraceReader>& before) {
  const NamedTensors mine = model_tensors(current);
  const auto same_optimizer = [&](const ckpt::LoadedSnapshot& s) {
    auto it = s.metadata.find("optim");
    return it != s.metadata.end() && it->second == train::optimizer_name(kind);
  };
  const ckpt::ManifestCheck continues_trace = [&](const ckpt::Manifest& m) {
    if (before)
      before->check_continues(m.trace_position, parse_digest_hex(m.trace_chain_hex, "the manifest", "trace_chain_hex"));
  };
  const auto check = [&](const ckpt::LoadedSnapshot& s) {
    if (!same_optimizer(s)) return;  // the loop's choice, not damage: a config error below
    train::check_model_state(mine, s.model, s.where);
    train::check_optimizer_state(s.optim, current.parameters, kind, s.where);
    rng::check_restorable(rng::RngState::deserialize(s.rng), current.cuda_device, s.where);
    ckpt::metadata_u64(s, "samples_seen");
  };
  std::vector<std::pair<std::string, std::string>> skipped;
  auto pick = ckpt::load_newest_snapshot(run::checkpoint_root(dir), 1, 0, &skipped, {}, check, nullptr,
                                         continues_trace);  // own shard hashed once
  RETRACE_CHECK(pick.has_value(), IntegrityError, "Recorder::resume: no checkpoint of ", dir, " verifies",
                skipped.empty() ? " (there is none)" : ": " + skipped.front().first + ": " + skipped.front().second,
                "; start the run again with Recorder::create");
  const ckpt::LoadedSnapshot& snap = pick->snapshot;
  auto opt_it = snap.metadata.find("optim");
  RETRACE_CHECK(same_optimizer(snap), ConfigError, "checkpoint ", pick->dir, " holds ",
                opt_it == snap.metadata.end() ? "no" : opt_it->second.c_str(), " optimizer state, the loop uses ",
                train::optimizer_name(kind), "; resume with the optimizer the run was recorded with");
  RETRACE_CHECK(before.has_value(), IntegrityError, "Recorder::resume: ", run::trace_path(dir),
                " is missing; the checkpoints are kept, but the run's record cannot continue without it");
  return std::move(*pick);
}

// The checked snapshot into the loop: the model's tensors and torch's generators now, and the
// rest (optimizer state, the loop's generators and counters, the user's entries) as the loop
// state the caller restores.
LoopState restore_loop(ckpt::LoadedSnapshot& snap, const LoopState& current, train::OptimizerKind kind) {
  const int cuda = current.cuda_device;
  const rng::RngState rng = rng::RngState::deserialize(snap.rng);
  {
    std::map<std::string, torch::Tensor> by_name(snap.model.begin(), snap.model.end());
    torch::NoGradGuard no_grad;
    for (const auto& [name, t] : model_tensors(current)) t.copy_(by_name.at(name));
  }
  rng::restore_torch(rng, cuda);
  LoopState restored;
  restored.optimizer = std::move(snap.optim);
  restored.optimizer_kind = train::optimizer_name(kind);
  restored.cuda_device = cuda;
  restored.generators = rng.generators;
  restored.epoch = rng.cursor.epoch;
  restored.batch_in_epoch = rng.cursor.batch_in_epoch;
  restored.samples_seen = ckpt::metadata_u64(snap, "samples_seen");
  for (const auto& [key, value] : snap.metadata)
    if (key.rfind(kUserPrefix, 0) == 0) restored.user[key.substr(std::strlen(kUserPrefix))] = value;
  return restored;
}

}  // namespace

Recorder Recorder::resume(const std::string& dir, const LoopState& current, LoopState& restored) {
  const std::optional<train::OptimizerKind> kind = kind_of(current.optimizer_kind);
  RETRACE_CHECK(kind.has_value(), ConfigError, "Recorder::resume: the optimizer is not AdamW or SGD");
  // One writer: the lock first, before anything of the run is read (a directory that is not
  // there is reported below as a run without checkpoints).
  run::RunLock lock;
  if (std::filesystem::is_directory(dir)) lock = run::RunLock::acquire(dir, "Recorder::resume (a user's loop)");
  std::optional<trace::TraceReader> before;
  if (std::filesystem::exists(run::trace_path(dir))) before.emplace(trace::TraceReader::open(run::trace_path(dir)));
  ckpt::NewestSnapshot pick = choose_checkpoint(dir, current, *kind, before);
  ckpt::LoadedSnapshot& snap = pick.snapshot;
  const RecorderOptions settings = settings_of(before->header().config_toml);
  restored = restore_loop(snap, current, *kind);

  // The trace reopened at the checkpoint's position (what follows it is set aside).
  auto impl = std::make_unique<Impl>();
  impl->lock = std::move(lock);
  impl->dir = dir;
  impl->seed = before->header().seed;
  impl->settings = settings;
  impl->config_hash = before->header().config_hash;
  impl->params = before->header().params;
  before.reset();
  impl->modules = train::index_modules(impl->params);
  impl->last_step = snap.manifest.step;
  impl->epoch = restored.epoch;
  impl->writer.emplace(trace::TraceWriter::resume(run::trace_path(dir), snap.position.bytes, snap.position.chain,
                                                  snap.manifest.step, run::set_aside_path(dir), kZstdLevel));
  impl->writer->append_event(
      {snap.manifest.step, "resume",
       "resumed by retrace::Recorder from " + pick.dir + " at step " + std::to_string(snap.manifest.step)});
  return Recorder(std::move(impl));
}

void Recorder::evaluate(uint64_t step, double loss, double accuracy, uint64_t samples, uint64_t tokens,
                        uint64_t batches) {
  records::EvalRecord e;
  e.step = step;
  e.epoch = impl_->epoch;
  e.samples = samples;
  e.loss = loss;
  e.accuracy = accuracy;
  e.tokens = tokens;
  e.batches = batches;
  impl_->open_writer("evaluate");
  impl_->wait();
  impl_->writer->append_eval(e);
}

void Recorder::event(uint64_t step, const std::string& kind, const std::string& message) {
  RETRACE_CHECK(!kind.empty() && kind.size() <= 64 && kind.find_first_of(" \t\n") == std::string::npos, ConfigError,
                "Recorder::event: kind \"", kind, "\" must be one word of 1 to 64 characters");
  RETRACE_CHECK(!records::is_process_event({step, kind, message}), ConfigError, "Recorder::event: kind \"", kind,
                "\" is retrace's own; name your event otherwise");
  impl_->wait();
  impl_->open_writer("event");
  impl_->writer->append_event({step, kind, message});
}

void Recorder::sync() {
  impl_->open_writer("sync");
  impl_->wait();
  impl_->writer->sync();
}

void Recorder::close() {
  if (!impl_ || !impl_->writer) return;  // closed already, or moved from
  impl_->wait();
  impl_->writer->sync();
  impl_->writer.reset();
  impl_->lock.release();
}

std::vector<int64_t> data_order(uint64_t seed, uint64_t num_samples, uint64_t epoch, const std::string& order) {
  RETRACE_CHECK(order == "feistel" || order == "shuffle", ConfigError, "data order \"", order,
                "\" is neither feistel nor shuffle");
  RETRACE_CHECK(num_samples > 0, ConfigError, "data_order: no samples");
  const data::Sampler sampler(seed, num_samples, 1, data::LastBatch::kKeep, 0, 1,
                              order == "feistel" ? data::Order::kFeistel : data::Order::kShuffle);
  return sampler.permutation(epoch);
}

}  // namespace retrace
