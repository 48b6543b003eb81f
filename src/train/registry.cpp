#include "train/registry.h"

#include <torch/torch.h>

#include "core/error.h"
#include "core/safetensors_torch.h"
#include "data/fashion_mnist.h"
#include "data/tensor_files.h"
#include "data/text_corpus.h"
#include "data/token_files.h"
#include "model/gpt.h"
#include "model/mlp.h"
#include "model/owned_linear.h"
#include "model/owned_loss.h"
#include "model/torchscript.h"
#include "rng/rng_state.h"
#include "train/environment.h"

namespace retrace::train {
namespace {

template <typename T>
std::string names_of(const std::map<std::string, T>& m) {
  std::string s;
  for (const auto& [name, _] : m) s += (s.empty() ? "" : ", ") + name;
  return s;
}

template <typename T>
void add(std::map<std::string, T>& m, const char* what, const std::string& name, T value) {
  RETRACE_CHECK(!name.empty(), ConfigError, "cannot register a ", what, " with an empty name");
  RETRACE_CHECK(!m.count(name), ConfigError, "cannot register ", what, " \"", name,
                "\": that name is already registered (registered: ", names_of(m), "); choose another name");
  RETRACE_CHECK(static_cast<bool>(value), ConfigError, "cannot register ", what, " \"", name, "\": it is empty");
  m.emplace(name, std::move(value));
}

template <typename T>
const T& find(const std::map<std::string, T>& m, const char* key, const std::string& name, const char* how) {
  auto it = m.find(name);
  RETRACE_CHECK(it != m.end(), ConfigError, "bad value for ", key, ": \"", name,
                "\" is not registered; registered: ", names_of(m), ". ", how);
  return it->second;
}

constexpr const char* kHowModel =
    "A model of your own is registered in your binary with retrace::Registry::add_model (docs/getting-started.md)";
constexpr const char* kHowData =
    "A data set of your own is registered with retrace::Registry::add_data (docs/getting-started.md)";
constexpr const char* kHowLoss = "A loss of your own is registered with retrace::Registry::add_loss";

std::string shape_text(const torch::Tensor& t) {
  std::ostringstream out;
  out << t.sizes() << " " << c10::toString(t.scalar_type());
  return out.str();
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }
// A TorchScript error ends with the message after the script's traceback.
std::string last_line(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s.substr(s.rfind('\n') == std::string::npos ? 0 : s.rfind('\n') + 1);
}

}  // namespace

model::GptOptions gpt_options(const Config& c, int64_t vocab_size) {
  model::GptOptions o;
  o.vocab_size = vocab_size;
  o.context = c.data.context;
  o.d_model = c.model.d_model;
  o.n_layers = c.model.n_layers;
  o.n_heads = c.model.n_heads;
  o.dropout = c.model.dropout;
  o.dropout_impl = c.model.dropout_impl;
  o.gelu_impl = c.model.gelu_impl;
  o.attention_matmul = c.model.attention_matmul;
  o.checkpoint = c.model.checkpoint;
  o.checkpoint_every = c.model.checkpoint_every;
  o.tie_embeddings = c.model.tie_embeddings;
  return o;
}

namespace {

model::ModelHandle make_mlp(const ModelContext& ctx) {
  const Config& c = ctx.config;
  const torch::Tensor sample = ctx.data.train.range(0, 1).inputs;
  RETRACE_CHECK(sample.dim() == 2 && c10::isFloatingType(sample.scalar_type()), ConfigError,
                "model.kind = \"mlp\" takes samples that are vectors of numbers, but ", ctx.data.description,
                " has inputs ", shape_text(sample), "; flatten them, or choose another model.kind (gpt for tokens)");
  model::MlpOptions o;
  o.inputs = sample.size(1);
  o.outputs = ctx.data.vocab_size > 0 ? ctx.data.vocab_size : 10;
  o.hidden = c.model.hidden;
  o.activation = c.model.activation;
  o.dropout = c.model.dropout;
  o.dropout_impl = c.model.dropout_impl;
  o.gelu_impl = c.model.gelu_impl;
  auto mlp = std::make_shared<model::MlpImpl>(o);
  return {mlp, [mlp](const torch::Tensor& x) { return mlp->forward(x); }, mlp->describe(),
          [mlp](model::ModuleProbe* p) { mlp->set_probe(p); }};
}

model::ModelHandle make_gpt(const ModelContext& ctx) {
  model::GptOptions options = gpt_options(ctx.config, ctx.data.vocab_size);
  options.initialize = ctx.initialize;
  auto gpt = std::make_shared<model::GptImpl>(options);
  return {gpt, [gpt](const torch::Tensor& x) { return gpt->forward(x); }, gpt->describe(), nullptr};
}

data::Dataset load_text(const Config& config) {
  data::TextCorpus corpus = data::load_text_corpus(config.data.dir, config.data.context, config.data.test_fraction);
  data::Dataset d;
  d.train = {corpus.train_inputs, corpus.train_targets};
  d.test = {corpus.test_inputs, corpus.test_targets};
  d.files = corpus.files;
  d.vocab_size = corpus.vocab_size;
  d.description = "text corpus " + config.data.dir + ", " + std::to_string(corpus.characters) +
                  " characters, vocabulary " + std::to_string(corpus.vocab_size);
  return d;
}

}  // namespace

torch::Tensor cross_entropy_sum(const torch::Tensor& logits, const torch::Tensor& targets) {
  // Portable numerics version 2: retrace's own, the same bits on both LibTorch builds.
  if (model::owned_kernels()) {
    const torch::Tensor rows = logits.reshape({-1, logits.size(-1)});
    const torch::Tensor ids = targets.reshape({-1});
    if (model::owned_cross_entropy_applies(rows, ids)) return model::owned_cross_entropy_sum(rows, ids);
  }
  return torch::nn::functional::cross_entropy(logits.to(torch::kFloat32).reshape({-1, logits.size(-1)}),
                                              targets.reshape({-1}),
                                              torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
}

Registry Registry::builtin() {
  Registry r;
  r.add_model("mlp", make_mlp);
  r.add_model("gpt", make_gpt);
  r.add_model("torchscript", [](const ModelContext& ctx) { return model::load_torchscript(ctx.config.model.path); });
  r.add_data("fashion-mnist", [](const Config& c) { return data::load_fashion_mnist(c.data.dir); });
  r.add_data("text", load_text);
  r.add_data("tensors", [](const Config& c) { return data::load_tensor_dir(c.data.dir); });
  r.add_data("tokens",
             [](const Config& c) { return data::load_token_files(c.data.dir, c.data.context, c.data.vocab_size); });
  r.add_loss("cross_entropy", cross_entropy_sum);
  return r;
}

const Registry& builtin_registry() {
  static const Registry r = Registry::builtin();
  return r;
}

void Registry::add_model(const std::string& kind, ModelFactory factory) {
  add(models_, "model", kind, std::move(factory));
}
void Registry::add_data(const std::string& kind, DataFactory factory) {
  RETRACE_CHECK(kind != "auto", ConfigError, "cannot register a data set called \"auto\": the name is reserved");
  add(data_, "data set", kind, std::move(factory));
}
void Registry::add_loss(const std::string& name, LossFn loss) { add(losses_, "loss", name, std::move(loss)); }

const ModelFactory& Registry::model(const std::string& kind) const {
  return find(models_, "model.kind", kind, kHowModel);
}
const DataFactory& Registry::data(const std::string& kind) const { return find(data_, "data.kind", kind, kHowData); }
const LossFn& Registry::loss(const std::string& name) const { return find(losses_, "train.loss", name, kHowLoss); }

namespace {
// "auto": what retrace chose before data.kind existed.
std::string data_kind(const Config& c) {
  if (c.data.kind != "auto") return c.data.kind;
  return c.model.kind == "gpt" ? "text" : "fashion-mnist";
}
}  // namespace

void Registry::check(const Config& config) const {
  model(config.model.kind);
  data(data_kind(config));
  loss(config.train.loss);
}

data::Dataset Registry::load_data(const Config& config) const {
  data::Dataset d = data(data_kind(config))(config);
  RETRACE_CHECK(d.train.size() > 0, ConfigError, "data set ", data_kind(config), " (", config.data.dir,
                ") has no training samples");
  RETRACE_CHECK(d.train.source || (d.train.inputs.defined() && d.train.inputs.size(0) == d.train.size()), ConfigError,
                "data set ", data_kind(config), " (", config.data.dir,
                "): ", d.train.inputs.defined() ? d.train.inputs.size(0) : 0, " training inputs but ", d.train.size(),
                " targets; every sample needs both");
  RETRACE_CHECK(d.test.source || !d.test.targets.defined() ||
                    (d.test.inputs.defined() && d.test.inputs.size(0) == d.test.size()),
                ConfigError, "data set ", data_kind(config), " (", config.data.dir, "): test inputs and targets ",
                "have different sample counts");
  return d;
}

void check_state_dtypes(const torch::nn::Module& module, const std::string& model_path) {
  auto stored = [&](const std::string& name, const torch::Tensor& t) {
    if (!t.defined()) return;
    RETRACE_CHECK(safetensors::dtype_of(t.scalar_type()).has_value(), ConfigError, "model tensor ", name, " is ",
                  t.scalar_type(),
                  ", a dtype retrace cannot checkpoint or digest (it stores F64, F32, F16, BF16, "
                  "I64, I32, I16, I8, U8 and BOOL)",
                  model_path.empty() ? "" : " (model.path = " + model_path + ")",
                  "; convert the model's tensors to one of these before saving it");
  };
  for (const auto& item : module.named_parameters()) stored(item.key(), item.value());
  for (const auto& item : module.named_buffers()) stored(item.key(), item.value());
}

void check_model_fits(const Config& config, const model::ModelHandle& model, const LossFn& loss,
                      const data::Dataset& data, bool forward) {
  check_state_dtypes(*model.module, config.model.path);
  if (!forward) return;
  const int64_t n = std::min<int64_t>(2, data.train.size());
  const data::Samples first = data.train.range(0, n);
  const torch::Tensor& x = first.inputs;
  const torch::Tensor& y = first.targets;
  const rng::RngState saved = rng::capture_torch(static_cast<uint64_t>(config.seed), cuda_index(config.runtime));
  const bool was_training = model.module->is_training();
  model.module->eval();
  std::string failure;
  torch::Tensor out;
  {
    torch::NoGradGuard no_grad;
    // LibTorch reports a shape mismatch as c10::Error, a TorchScript model as JITException (a
    // std::runtime_error); retrace's own errors pass through unchanged.
    try {
      out = model.forward(x);
    } catch (const Error&) {
      throw;
    } catch (const c10::Error& e) {
      failure = "its forward fails on inputs " + shape_text(x) + " (" + first_line(e.what_without_backtrace()) + ")";
    } catch (const std::exception& e) {
      failure = "its forward fails on inputs " + shape_text(x) + " (" + last_line(e.what()) + ")";
    }
    if (failure.empty()) {
      torch::Tensor value;
      try {
        value = loss(out, y);
      } catch (const Error&) {
        throw;
      } catch (const c10::Error& e) {
        failure = "loss \"" + config.train.loss + "\" cannot take its outputs " + shape_text(out) + " with targets " +
                  shape_text(y) + " (" + first_line(e.what_without_backtrace()) + ")";
      } catch (const std::exception& e) {
        failure = "loss \"" + config.train.loss + "\" cannot take its outputs " + shape_text(out) + " with targets " +
                  shape_text(y) + " (" + last_line(e.what()) + ")";
      }
      if (failure.empty() && (!value.defined() || value.numel() != 1))
        failure = "loss \"" + config.train.loss + "\" returns " + (value.defined() ? shape_text(value) : "nothing") +
                  " for outputs " + shape_text(out) + ", not one number (the sum over the batch)";
    }
  }
  model.module->train(was_training);
  rng::restore_torch(saved, cuda_index(config.runtime));
  RETRACE_CHECK(failure.empty(), ConfigError, "model.kind = \"", config.model.kind, "\" does not fit ",
                data.description, ": ", failure,
                ". Check the model's input and output sizes against the data "
                "set and train.loss");
}

}  // namespace retrace::train
