// retrace's public API: train your own LibTorch model on your own data with retrace's CLI (record,
// resume, replay, bisect, golden, export, ...) from your own binary, or keep your own loop and get
// retrace's traces and verified checkpoints from a Recorder.
//
//   #include <retrace/retrace.h>
//
//   int main(int argc, char** argv) {
//     retrace::Registry registry;                       // the built-ins: mlp, gpt, torchscript, ...
//     registry.add_model("tiny-cnn", [](const retrace::ModelContext& ctx) {
//       return retrace::model_of(TinyCnn(ctx.classes, ctx.options.get_int("width", 16)));
//     });
//     registry.add_data("blobs", [](const retrace::DataContext& ctx) { return make_blobs(ctx.dir); });
//     return retrace::run_cli(argc, argv, registry);   // `my_trainer record --set model.kind=tiny-cnn ...`
//   }
//
// Contracts (what makes a registered component reproducible):
//   - A model factory builds the same parameters (names, shapes, and initial values drawn only from
//     torch's default CPU generator, which retrace seeds from `seed` before calling it) from the
//     same context every time. Its forward draws random numbers (dropout) only from torch's
//     default generators, which retrace captures, checkpoints and restores.
//   - A data factory returns the same tensors for the same context; samples are indexed along
//     dimension 0, so the sampler's order stays a pure function of (seed, epoch).
//   - A loss returns the SUM of the per-item losses of a batch as a float scalar; retrace divides
//     by the item count (targets.numel()) of the effective batch, so gradient accumulation and data
//     parallelism give the large-batch mean.
//   - Registries are values, passed explicitly: there is no global registration.
// Errors: throw retrace::ConfigError (exit 2), FormatError (3) or IoError (4) from retrace/error.h
// for bad input; the CLI prints the message and exits with the documented code.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "retrace/error.h"

namespace retrace {

// The [user] table of a run's config: your own keys, recorded in config.toml and the trace header
// (so they are part of the config hash), e.g. `--set user.width=64`. Values are TOML text.
class Options {
 public:
  explicit Options(std::map<std::string, std::string> values) : values_(std::move(values)) {}
  bool has(const std::string& key) const { return values_.count(key) != 0; }
  // The value of `key`, or `fallback` when absent; ConfigError naming user.KEY for a value of
  // another type.
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  const std::map<std::string, std::string>& values() const { return values_; }

 private:
  std::map<std::string, std::string> values_;
};

// A model: any torch::nn::Module with a forward from a batch of inputs to outputs.
struct Model {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::string description;  // one line for the trace header; default: the module's name
};

// A Model from a TORCH_MODULE holder (or a shared_ptr to a module) whose forward takes one tensor.
template <typename Holder>
Model model_of(Holder holder, std::string description = "") {
  auto ptr = holder.ptr();
  return Model{ptr, [ptr](const torch::Tensor& x) { return ptr->forward(x); }, std::move(description)};
}

struct DataSplit {
  torch::Tensor inputs;   // [N, ...]
  torch::Tensor targets;  // [N, ...]; class indices (int64) for cross_entropy
};

struct Dataset {
  DataSplit train;
  DataSplit test;                  // may be empty (no evaluation)
  std::vector<std::string> files;  // what it was read from: retrace records each file's size and sha256
  std::string description;
  int64_t classes = 0;  // classes of the targets (the model's output size), 0 if none
};

// What a model factory is given.
struct ModelContext {
  const Options& options;             // [user]
  std::vector<int64_t> sample_shape;  // one training input's shape (inputs.sizes() without dim 0)
  int64_t classes = 0;                // the data set's classes
  std::string kind;                   // model.kind
};

// What a data factory is given.
struct DataContext {
  const Options& options;  // [user]
  std::string dir;         // data.dir
  int64_t context = 0;     // data.context (tokens per sample, for language models)
  std::string kind;        // data.kind
};

using ModelFactory = std::function<Model(const ModelContext&)>;
using DataFactory = std::function<Dataset(const DataContext&)>;
// outputs, targets -> the sum of the per-item losses (a float scalar).
using Loss = std::function<torch::Tensor(const torch::Tensor& outputs, const torch::Tensor& targets)>;

// Models (model.kind), data sets (data.kind) and losses (train.loss) by name. Starts with the
// built-ins; add_* throws ConfigError for a name that is taken.
class Registry {
 public:
  Registry();
  ~Registry();
  Registry(Registry&&) noexcept;
  Registry& operator=(Registry&&) noexcept;

  Registry& add_model(const std::string& kind, ModelFactory factory);
  Registry& add_data(const std::string& kind, DataFactory factory);
  Registry& add_loss(const std::string& name, Loss loss);

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// retrace's command line over `registry`: what `retrace ARGS...` does, with your components.
// Returns the exit code (docs/reliability.md, "Exit codes"); a command that trains re-executes the binary once
// to pin the numerics profile, so call it first in main, before any other work.
int run_cli(int argc, char** argv, const Registry& registry);

// The sample order of epoch `epoch` over `num_samples` samples as `retrace record` draws it with
// seed `seed` and data.order `order` ("feistel", the default, or "shuffle"): a loop of your own
// that takes its batches from it in turn (batch b: positions b x batch_size ...) sees the same
// data in the same order as a retrace run of that seed. ConfigError for another order name.
std::vector<int64_t> data_order(uint64_t seed, uint64_t num_samples, uint64_t epoch,
                                const std::string& order = "feistel");

// ---- A recorder for your own training loop ------------------------------------------------------
//
//   retrace::Recorder rec = retrace::Recorder::create("runs/mine", model, {/*seed=*/7});
//   for (step = 1; ...) {
//     ... your forward, backward, optimizer.step() ...
//     rec.step(step, loss.item<double>(), model, optimizer, {lr, grad_norm});
//     if (step % 100 == 0) rec.checkpoint(step, model, optimizer);
//   }
//   // after a crash: auto rec = retrace::Recorder::resume("runs/mine", model, optimizer);
//   //                for (step = rec.last_step() + 1; ...) ...
//
// The run directory is laid out like retrace's own (config.toml, trace.rtrace, checkpoints/), so
// `retrace inspect`, `diff`, `export` and `verify` work on it; two runs of a deterministic loop give
// traces that `retrace diff` finds identical, and the first step where they differ otherwise.

struct RecorderOptions {
  uint64_t seed = 0;                    // recorded in the header; your loop seeds its own generators
  std::string config_toml;              // your run's settings, as you want them recorded (any text)
  std::string description;              // model description for the header
  std::vector<std::string> data_files;  // recorded with size and sha256
  bool force = false;                   // replace an existing directory
  uint32_t keep_last = 5;               // checkpoints kept by rotation
  // The digests' version (trace.digest_version, 1 to 4): 3 and 4 add the gradients' digest and
  // per-module digests, 4 is retrace's current one (the same fields as `retrace record` with
  // trace.digest_version = 4). Recorded in the run's config text under [recorder].
  int digest_version = 4;
  bool module_digests = true;           // per-module digests (versions 3 and 4): `retrace diff` names the module
  uint32_t optimizer_digest_every = 1;  // the optimizer state's digest every N steps (0: never)
  // The digests of a step (and its record's append) on a worker thread while the loop goes on, so
  // their cost overlaps the next step's forward and backward. The tensors are read where they
  // are, so nothing may change them before wait(): call it before optimizer.step(), before
  // gradients are zeroed in place or accumulated into, and before any other change to parameters,
  // buffers or optimizer state (the Python package does so with hooks). Every other call waits by
  // itself. Off by default. Not recorded (the trace is the same bits either way): after
  // Recorder::resume, turn it on with overlap_digests(true).
  bool overlap_digests = false;
};

// ---- The recorder at the level of tensors ----------------------------------------------------
//
// For loops whose model is not a torch::nn::Module (retrace's Python package is built on it): the
// state as named tensors. The Module overloads below fill one from the module and optimizer, so
// both give the same digests for the same tensors.
using NamedTensorList = std::vector<std::pair<std::string, torch::Tensor>>;

struct LoopState {
  NamedTensorList parameters;  // the model's, in its order; their gradients are read from them
  NamedTensorList buffers;
  // The optimizer's state as "<parameter>/<field>": AdamW's "step" (an int64 scalar), "exp_avg"
  // and "exp_avg_sq"; SGD's "momentum_buffer"; parameters without state yet are absent.
  NamedTensorList optimizer;
  std::string optimizer_kind;  // "adamw", "sgd", or "" for another (no optimizer digest, no checkpoint)
  int cuda_device = -1;        // the model's CUDA device (-1: the CPU): whose generator is captured
  // Generators outside torch, as opaque states by name (Python's "python.random", "numpy.global"):
  // captured with torch's in the RNG digest and the checkpoint.
  std::vector<std::pair<std::string, std::string>> generators;
  uint64_t epoch = 0;  // the data position after the step
  uint64_t batch_in_epoch = 0;
  uint64_t samples_seen = 0;
  std::map<std::string, std::string> user;  // checkpointed as given (e.g. a sampler's state); keys [A-Za-z0-9_.-]
};

struct StepInfo {
  double lr = 0;
  double grad_norm = 0;          // before clipping, if you clip
  double grad_norm_clipped = 0;  // after clipping (default: grad_norm)
  bool skipped = false;          // the step was not applied (e.g. a non-finite loss)
  std::string skip_reason;
  uint32_t batch_size = 0;
  std::vector<int64_t> sample_indices;  // the batch's sample indices, digested (optional)
  torch::Tensor batch;                  // or the batch itself, digested by content (when no indices)
  // The batch's own position in the data (as `retrace record` records it); -1: the state's
  // position (LoopState::epoch and batch_in_epoch, the position after the step).
  int64_t epoch = -1;
  int64_t batch_in_epoch = -1;
};

class Recorder {
 public:
  // Creates `dir` with config.toml and a trace whose header describes `module`'s parameters and
  // this process's numerics fingerprint. ConfigError when `dir` exists and is not empty (unless
  // options.force). A run directory has one writer: the recorder holds its lock (RUN/.retrace-lock)
  // until close() or its end, and create or resume of a directory another live recorder or
  // `retrace` process writes is an IoError (exit 4) naming that process.
  static Recorder create(const std::string& dir, const torch::nn::Module& module, const RecorderOptions& options = {});
  ~Recorder();
  Recorder(Recorder&&) noexcept;
  Recorder& operator=(Recorder&&) noexcept;

  // Appends step `step` (1, 2, ...: strictly increasing) with digests of every parameter and
  // buffer, the optimizer's state (AdamW and SGD; other optimizers: zero) and torch's CPU
  // generator, hash-chained to the previous step.
  void step(uint64_t step, double loss, const torch::nn::Module& module, torch::optim::Optimizer& optimizer,
            const StepInfo& info = {});
  // Writes a verified checkpoint of the module, the optimizer and torch's generators after step
  // `step` (atomic, manifest with sha256, rotation); returns its directory.
  std::string checkpoint(uint64_t step, const torch::nn::Module& module, torch::optim::Optimizer& optimizer);
  // Continues the run in `dir` from its newest checkpoint that verifies (torn or corrupt ones are
  // skipped): loads the module's parameters and buffers, the optimizer's state and torch's
  // generators, truncates the trace at the checkpoint (frames after it are set aside in
  // trace.set-aside.rtrace, nothing is lost) and returns the recorder; last_step() is the
  // checkpoint's step, so your loop continues at last_step() + 1. Every value is checked against
  // `module`, `optimizer` and this LibTorch (names, shapes, dtypes, optimizer state, generator
  // sizes) before any is applied: a checkpoint that fails is skipped like a damaged one, and the
  // module and optimizer are untouched unless one passes. IntegrityError (exit 3) when no
  // checkpoint verifies; ConfigError (exit 2) when the run was recorded with another optimizer.
  static Recorder resume(const std::string& dir, torch::nn::Module& module, torch::optim::Optimizer& optimizer);

  // The same at the level of tensors (LoopState). resume checks each checkpoint against `current`
  // (tensor names, dtypes and shapes; the optimizer state against the parameters and
  // current.optimizer_kind; generator sizes), copies the parameters and buffers into current's
  // tensors, restores torch's generators, and fills `restored` with what the loop installs itself:
  // the optimizer state, the other generators, the data position, samples seen and user entries.
  static Recorder create(const std::string& dir, const LoopState& state, const RecorderOptions& options = {});
  void step(uint64_t step, double loss, const LoopState& state, const StepInfo& info = {});
  std::string checkpoint(uint64_t step, const LoopState& state);
  static Recorder resume(const std::string& dir, const LoopState& current, LoopState& restored);
  // A training evaluation after step `step` (the trace's eval record, which export and the report show).
  void evaluate(uint64_t step, double loss, double accuracy = -1, uint64_t samples = 0, uint64_t tokens = 0,
                uint64_t batches = 0);
  // A free-form event at step `step` (kind: a short word, e.g. "note").
  void event(uint64_t step, const std::string& kind, const std::string& message);
  // The run directory.
  const std::string& dir() const;
  // Waits for the last step's overlapped digests (RecorderOptions::overlap_digests); rethrows
  // the error its append met, if any. Without overlap_digests there is nothing to wait for.
  void wait();
  // Turns overlapped digests on or off from the next step (RecorderOptions::overlap_digests).
  void overlap_digests(bool on);
  // The last step appended (or resumed from).
  uint64_t last_step() const;
  // Flushes and fsyncs the trace.
  void sync();
  // Ends the recording: waits for overlapped digests, syncs and closes the trace, and releases the
  // run directory's lock, so that another process (or Recorder::resume in this one) may continue
  // the run. The destructor does the same. Later calls but dir() and last_step() are ConfigErrors;
  // close() again does nothing.
  void close();

 private:
  struct Impl;
  explicit Recorder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace retrace
