// What a run can be made of: models, data sets and losses by name. The built-in registry has
// retrace's own (model.kind mlp, gpt, torchscript; data.kind fashion-mnist, text, tensors, tokens;
// train.loss cross_entropy); a user's binary adds its own through include/retrace/retrace.h and
// hands the registry to the CLI, which passes it to every run it makes (record, resume, replay,
// bisect, golden). There is no global registry: whoever builds a run says what it may use.
//
// Determinism: a factory must build the same model (same parameter names, shapes and, drawing
// only from torch's CPU generator, which retrace seeds first, the same initial values) from the
// same config every time; a data factory must return the same tensors for the same config.
#pragma once

#include <torch/types.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "model/gpt.h"
#include "model/model.h"
#include "train/config.h"

namespace retrace::train {

// What a model factory is given: the resolved config (its [user] table included) and the loaded
// data set (its sample shape and classes decide the model's input and output sizes).
struct ModelContext {
  const Config& config;
  const data::Dataset& data;
  // false: the parameters' values do not matter (a resume loads every one from a checkpoint), so
  // a built-in model skips its own initialization draws (torch::nn's constructors still draw).
  bool initialize = true;
};

using ModelFactory = std::function<model::ModelHandle(const ModelContext&)>;
using DataFactory = std::function<data::Dataset(const Config&)>;
// outputs and targets of a (micro-)batch -> the SUM of the per-item losses, a float scalar. retrace
// divides by the item count (targets.numel()) of the whole effective batch, so accumulation and
// data parallelism give the large-batch mean.
using LossFn = std::function<torch::Tensor(const torch::Tensor& outputs, const torch::Tensor& targets)>;

class Registry {
 public:
  // mlp, gpt, torchscript; auto, fashion-mnist, text, tensors, tokens; cross_entropy.
  static Registry builtin();

  // ConfigError when the name is empty or already registered (the built-ins included).
  void add_model(const std::string& kind, ModelFactory factory);
  void add_data(const std::string& kind, DataFactory factory);
  void add_loss(const std::string& name, LossFn loss);

  // ConfigError naming the config key and listing what is registered when `name` is not.
  const ModelFactory& model(const std::string& kind) const;
  const DataFactory& data(const std::string& kind) const;
  const LossFn& loss(const std::string& name) const;

  // Checks model.kind, data.kind and train.loss against this registry (ConfigError).
  void check(const Config& config) const;
  // Loads the data set config.data.kind names.
  data::Dataset load_data(const Config& config) const;

 private:
  std::map<std::string, ModelFactory> models_;
  std::map<std::string, DataFactory> data_;
  std::map<std::string, LossFn> losses_;
};

// The GPT's options as the config gives them (model.kind = "gpt"), for a vocabulary of vocab_size.
model::GptOptions gpt_options(const Config& config, int64_t vocab_size);

// Registry::builtin(), built once and never changed: the default of the functions that take a
// registry. A user's binary builds its own from Registry::builtin() and passes it explicitly.
const Registry& builtin_registry();

// The built-in loss: cross entropy over the last dimension of the outputs (in float32), summed
// over every target element.
torch::Tensor cross_entropy_sum(const torch::Tensor& logits, const torch::Tensor& targets);

// Every parameter and buffer of `module` is of a dtype a checkpoint stores and a digest reads (a
// model file, a TorchScript one, may hold any): ConfigError naming the tensor, its dtype and
// `model_path` (when not empty) otherwise. check_model_fits runs it first.
void check_state_dtypes(const torch::nn::Module& module, const std::string& model_path);

// Runs the model on the first two training samples (eval mode, no gradients, the RNG state put
// back afterwards) and the loss on its outputs, so that a model that does not fit the data or the
// loss fails before anything is written: ConfigError naming model.kind, train.loss, the shapes and
// LibTorch's message.
// `forward` false: the dtype check alone (a resume that may skip the forward, Trainer::ModelStart).
void check_model_fits(const Config& config, const model::ModelHandle& model, const LossFn& loss,
                      const data::Dataset& data, bool forward = true);

}  // namespace retrace::train
