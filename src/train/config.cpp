#include "train/config.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <sstream>
#include <type_traits>
#include <toml++/toml.h>

#include "core/digest.h"
#include "core/error.h"
#include "core/parse_number.h"
#include "core/file_util.h"
#include "train/faults.h"

namespace retrace::train {
namespace {

// eval.max_batches for token data when the config does not say: llm.c's val_max_steps.
constexpr int64_t kTokenEvalMaxBatches = 20;

enum class Kind { kInt, kFloat, kBool, kString, kChoice, kIntList };

// One configuration key: where it lives in Config, its type, its bounds and its meaning.
struct Field {
  std::string key;
  Kind kind;
  std::string help;
  std::vector<std::string> choices;  // kChoice
  double min = -INFINITY, max = INFINITY;  // numeric bounds, inclusive unless open
  bool min_open = false, max_open = false;
  std::function<void*(Config&)> ref;
  // For a key added after configs were first recorded: the value that reproduces what retrace did
  // before the key existed, as TOML text the way to_toml writes it (strings in single quotes). A
  // recorded config without the key reads as this value, and to_toml leaves the key out while it
  // holds it, so older runs keep their text and config hash.
  std::string legacy = {};
  // A key that another replaced: kRetired (the old name) is read from any text and written back
  // only while the config keeps the old names (EvalConfig::legacy_keys); kSuccessor (the new name)
  // is written only while it does not. Both name the same value.
  enum class Era : uint8_t { kCurrent, kRetired, kSuccessor };
  Era era = Era::kCurrent;
  std::string counterpart = {};  // kRetired, kSuccessor: the other name
};

template <typename S, typename M>
std::function<void*(Config&)> at(S Config::*section, M S::*member) {
  // A choice is stored as an enum whose values follow the order of its names (assign, to_toml).
  if constexpr (std::is_enum_v<M>) static_assert(std::is_same_v<std::underlying_type_t<M>, uint8_t>);
  return [section, member](Config& c) -> void* { return &((c.*section).*member); };
}

std::vector<Field> fields() {
  using C = Config;
  std::vector<Field> f;
  f.push_back({"seed", Kind::kInt, "seed of every random stream (init, dropout, data order)", {}, 0,
               9.007199254740992e15, false, false, [](C& c) -> void* { return &c.seed; }});
  f.push_back({"data.kind", Kind::kString,
               "data set: auto (text for model.kind gpt, else fashion-mnist), fashion-mnist (IDX files), text "
               "(a text file or directory), tensors (train/test.safetensors with inputs and targets), tokens "
               "(llm.c train.bin/val.bin), or a kind your binary registers", {}, 0, 0, false, false,
               at(&C::data, &DataConfig::kind), "'auto'"});
  f.push_back({"data.dir", Kind::kString, "where the data set is: a directory (or, for text, a file)", {}, 0, 0,
               false, false, at(&C::data, &DataConfig::dir)});
  f.push_back({"data.batch_size", Kind::kInt, "samples per step per rank", {}, 1, 65536, false, false,
               at(&C::data, &DataConfig::batch_size)});
  f.push_back({"data.last_batch", Kind::kChoice, "the last partial batch of an epoch", {"drop", "keep"},
               0, 0, false, false, at(&C::data, &DataConfig::last_batch)});
  f.push_back({"data.order", Kind::kChoice,
               "the epoch's order: feistel (a keyed bijection computed per position, no permutation held, O(1) "
               "state at any data size) or shuffle (a Fisher-Yates shuffle of every index each epoch)",
               {"feistel", "shuffle"}, 0, 0, false, false, at(&C::data, &DataConfig::order), "'shuffle'"});
  f.push_back({"data.eval_batch_size", Kind::kInt, "replaced by eval.batch_size (still read)", {}, 0, 1 << 20,
               false, false, at(&C::eval, &EvalConfig::batch_size), {}, Field::Era::kRetired, "eval.batch_size"});
  f.push_back({"data.context", Kind::kInt, "gpt: tokens per sample", {}, 1, 1 << 16, false, false,
               at(&C::data, &DataConfig::context)});
  f.push_back({"data.vocab_size", Kind::kInt, "tokens: vocabulary size (0: the largest token + 1)", {}, 0,
               1 << 30, false, false, at(&C::data, &DataConfig::vocab_size), "0"});
  f.push_back({"data.test_fraction", Kind::kFloat, "gpt: share of the corpus held out for evaluation", {}, 0, 1,
               false, true, at(&C::data, &DataConfig::test_fraction)});
  f.push_back({"model.kind", Kind::kString,
               "model: mlp (Fashion-MNIST), gpt (character language model), torchscript (model.path), or a kind "
               "your binary registers", {}, 0, 0, false, false, at(&C::model, &ModelConfig::kind)});
  f.push_back({"model.path", Kind::kString, "torchscript: the file saved with torch.jit.save", {}, 0, 0, false,
               false, at(&C::model, &ModelConfig::path), "''"});
  f.push_back({"model.hidden", Kind::kIntList, "widths of the hidden layers", {}, 1, 1 << 16, false,
               false, at(&C::model, &ModelConfig::hidden)});
  f.push_back({"model.activation", Kind::kChoice, "activation between layers", {"relu", "gelu", "tanh"},
               0, 0, false, false, at(&C::model, &ModelConfig::activation)});
  f.push_back({"model.dropout", Kind::kFloat, "dropout probability after each hidden layer", {}, 0, 1,
               false, true, at(&C::model, &ModelConfig::dropout)});
  f.push_back({"model.dropout_impl", Kind::kChoice,
               "how dropout masks are drawn on CPU: philox (one draw of torch's CPU generator keys a Philox4x32 "
               "mask, about 10x faster) or torch (LibTorch's bernoulli, one generator call per element)",
               {"philox", "torch"}, 0, 0, false, false, at(&C::model, &ModelConfig::dropout_impl), "'torch'"});
  f.push_back({"model.gelu_impl", Kind::kChoice,
               "how GELU (gpt, and mlp with activation gelu) is computed on CPU float32: retrace (its own kernel, "
               "the same bits with every LibTorch and CPU, about 3x faster) or torch (LibTorch's, whose bits change "
               "with the LibTorch version)",
               {"retrace", "torch"}, 0, 0, false, false, at(&C::model, &ModelConfig::gelu_impl), "'torch'"});
  f.push_back({"model.attention_matmul", Kind::kChoice,
               "gpt: how attention's batched matmuls run on CPU float32: lanes (the batch split between the two "
               "lanes, each matrix one OpenBLAS call on one thread, about 1.7x faster) or blas (ATen's bmm, "
               "OpenBLAS on runtime.blas_threads; other bits)",
               {"lanes", "blas"}, 0, 0, false, false, at(&C::model, &ModelConfig::attention_matmul), "'blas'"});
  f.push_back({"model.d_model", Kind::kInt, "gpt: width", {}, 1, 1 << 16, false, false,
               at(&C::model, &ModelConfig::d_model)});
  f.push_back({"model.n_layers", Kind::kInt, "gpt: transformer blocks", {}, 1, 1024, false, false,
               at(&C::model, &ModelConfig::n_layers)});
  f.push_back({"model.n_heads", Kind::kInt, "gpt: attention heads (must divide d_model)", {}, 1, 1024, false, false,
               at(&C::model, &ModelConfig::n_heads)});
  f.push_back({"model.checkpoint", Kind::kChoice, "gpt: activation checkpointing policy",
               {"none", "full", "sqrt", "selective"}, 0, 0, false, false, at(&C::model, &ModelConfig::checkpoint)});
  f.push_back({"model.checkpoint_every", Kind::kInt, "gpt: layers per segment with checkpoint = \"full\"", {}, 1,
               1024, false, false, at(&C::model, &ModelConfig::checkpoint_every)});
  f.push_back({"model.tie_embeddings", Kind::kBool,
               "gpt: the output layer is the token embedding's weight, without a bias (as GPT-2; off: a Linear "
               "layer of its own)", {}, 0, 0, false, false, at(&C::model, &ModelConfig::tie_embeddings), "false"});
  f.push_back({"optim.name", Kind::kChoice, "optimizer", {"adamw", "sgd"}, 0, 0, false, false,
               at(&C::optim, &OptimConfig::name)});
  f.push_back({"optim.lr", Kind::kFloat, "peak learning rate", {}, 0, 1e3, true, false,
               at(&C::optim, &OptimConfig::lr)});
  f.push_back({"optim.weight_decay", Kind::kFloat, "decoupled (adamw) or L2 (sgd) weight decay", {}, 0,
               1e3, false, false, at(&C::optim, &OptimConfig::weight_decay)});
  f.push_back({"optim.momentum", Kind::kFloat, "sgd momentum", {}, 0, 1, false, true,
               at(&C::optim, &OptimConfig::momentum)});
  f.push_back({"optim.nesterov", Kind::kBool, "sgd Nesterov momentum", {}, 0, 0, false, false,
               at(&C::optim, &OptimConfig::nesterov)});
  f.push_back({"optim.beta1", Kind::kFloat, "adamw beta1", {}, 0, 1, false, true,
               at(&C::optim, &OptimConfig::beta1)});
  f.push_back({"optim.beta2", Kind::kFloat, "adamw beta2", {}, 0, 1, false, true,
               at(&C::optim, &OptimConfig::beta2)});
  f.push_back({"optim.eps", Kind::kFloat, "adamw epsilon", {}, 0, 1, true, false,
               at(&C::optim, &OptimConfig::eps)});
  f.push_back({"optim.fused", Kind::kBool,
               "adamw: update each CPU float32 parameter in one pass (same bits as LibTorch's AdamW)", {}, 0, 0,
               false, false, at(&C::optim, &OptimConfig::fused), "false"});
  f.push_back({"schedule.kind", Kind::kChoice, "learning-rate schedule after warmup",
               {"cosine", "constant"}, 0, 0, false, false, at(&C::schedule, &ScheduleConfig::kind)});
  f.push_back({"schedule.warmup_steps", Kind::kInt, "linear warmup steps", {}, 0, 1e12, false, false,
               at(&C::schedule, &ScheduleConfig::warmup_steps)});
  f.push_back({"schedule.min_lr_ratio", Kind::kFloat, "final lr of the cosine as a fraction of optim.lr",
               {}, 0, 1, false, false, at(&C::schedule, &ScheduleConfig::min_lr_ratio)});
  f.push_back({"train.epochs", Kind::kInt, "epochs to train when train.steps is 0", {}, 1, 1e6, false,
               false, at(&C::train, &TrainConfig::epochs)});
  f.push_back({"train.steps", Kind::kInt, "optimizer steps to train (0: train.epochs worth)", {}, 0, 1e12,
               false, false, at(&C::train, &TrainConfig::steps)});
  f.push_back({"train.accum_steps", Kind::kInt, "micro-batches of data.batch_size per optimizer step", {}, 1,
               1 << 16, false, false, at(&C::train, &TrainConfig::accum_steps)});
  f.push_back({"train.max_norm", Kind::kFloat, "clip the global gradient L2 norm to this (0: off)", {}, 0,
               1e12, false, false, at(&C::train, &TrainConfig::max_norm)});
  f.push_back({"train.eval_each_epoch", Kind::kBool, "replaced by eval.each_epoch (still read)", {}, 0, 0, false,
               false, at(&C::eval, &EvalConfig::each_epoch), {}, Field::Era::kRetired, "eval.each_epoch"});
  f.push_back({"train.loss", Kind::kString, "loss: cross_entropy, or a loss your binary registers", {}, 0, 0,
               false, false, at(&C::train, &TrainConfig::loss), "'cross_entropy'"});
  f.push_back({"amp.mode", Kind::kChoice, "autocast: off, bf16 (CPU or CUDA), fp16 (CUDA only)",
               {"off", "bf16", "fp16"}, 0, 0, false, false, at(&C::amp, &AmpConfig::mode)});
  f.push_back({"amp.scaler", Kind::kChoice, "loss scaler: auto (on for fp16), on (forced, e.g. to test it on CPU), off",
               {"auto", "on", "off"}, 0, 0, false, false, at(&C::amp, &AmpConfig::scaler)});
  f.push_back({"amp.init_scale", Kind::kFloat, "initial loss scale", {}, 0, 1e38, true, false,
               at(&C::amp, &AmpConfig::init_scale)});
  f.push_back({"amp.growth_factor", Kind::kFloat, "scale growth factor after growth_interval finite steps", {},
               1, 1e6, true, false, at(&C::amp, &AmpConfig::growth_factor)});
  f.push_back({"amp.backoff_factor", Kind::kFloat, "scale factor on a non-finite step", {}, 0, 1, true, true,
               at(&C::amp, &AmpConfig::backoff_factor)});
  f.push_back({"amp.growth_interval", Kind::kInt, "finite steps in a row before the scale grows", {}, 1, 1e12,
               false, false, at(&C::amp, &AmpConfig::growth_interval)});
  f.push_back({"guards.skip_window", Kind::kInt, "steps in the rolling skip-rate window", {}, 1, 1e9, false,
               false, at(&C::guards, &GuardConfig::skip_window)});
  f.push_back({"guards.skip_warn_rate", Kind::kFloat, "warn when the skip rate passes this", {}, 0, 1, false,
               false, at(&C::guards, &GuardConfig::skip_warn_rate)});
  f.push_back({"guards.spike_factor", Kind::kFloat,
               "roll back when the loss exceeds this times its recent median (0: off)", {}, 0, 1e9, false, false,
               at(&C::guards, &GuardConfig::spike_factor)});
  f.push_back({"guards.spike_window", Kind::kInt, "losses in the median that defines the recent level", {}, 1,
               1e6, false, false, at(&C::guards, &GuardConfig::spike_window)});
  f.push_back({"guards.spike_skip_batches", Kind::kInt, "batches skipped after a rollback, ending at the spike",
               {}, 1, 1e6, false, false, at(&C::guards, &GuardConfig::spike_skip_batches)});
  f.push_back({"faults.inject", Kind::kString, "faults to inject: KIND@STEP[:ARG],... (see --help)", {}, 0, 0,
               false, false, at(&C::faults, &FaultConfig::inject)});
  f.push_back({"runtime.device", Kind::kChoice, "device to train on", {"cpu", "cuda"}, 0, 0, false, false,
               at(&C::runtime, &RuntimeConfig::device)});
  f.push_back({"runtime.numerics", Kind::kChoice,
               "numerics profile: portable (pins the OpenBLAS kernel, ATen's CPU level, BF16 matmuls and thread "
               "counts so every x86-64-v3 machine gives the same bits) or native (the machine's own kernels, "
               "faster on some, bits of this machine only)",
               {"portable", "native"}, 0, 0, false, false, at(&C::runtime, &RuntimeConfig::numerics), "'native'"});
  f.push_back({"runtime.threads", Kind::kInt, "torch intra-op threads (0: auto, 1)", {},
               0, 1024, false, false, at(&C::runtime, &RuntimeConfig::threads)});
  f.push_back({"runtime.blas_threads", Kind::kInt, "OpenBLAS threads (0: auto; portable 2, native the core count up to 8)", {}, 0,
               1024, false, false, at(&C::runtime, &RuntimeConfig::blas_threads)});
  f.push_back({"runtime.interop_threads", Kind::kInt, "torch inter-op threads", {}, 1, 1024, false, false,
               at(&C::runtime, &RuntimeConfig::interop_threads)});
  f.push_back({"runtime.elementwise_threads", Kind::kInt,
               "threads for the GPT's elementwise work and dropout masks, 1 or 2 (0: auto; the bits are the "
               "same at 1 and 2)", {}, 0, 2, false, false, at(&C::runtime, &RuntimeConfig::elementwise_threads), "0"});
  f.push_back({"runtime.deterministic", Kind::kBool, "deterministic algorithms only", {}, 0, 0, false,
               false, at(&C::runtime, &RuntimeConfig::deterministic)});
  f.push_back({"runtime.collective_timeout_s", Kind::kFloat,
               "data parallelism: seconds to wait for the other ranks before failing", {}, 0, 86400, true, false,
               at(&C::runtime, &RuntimeConfig::collective_timeout_s)});
  f.push_back({"runtime.bucket_mb", Kind::kFloat, "data parallelism: gradient all-reduce bucket size in MiB", {}, 0,
               1e6, true, false, at(&C::runtime, &RuntimeConfig::bucket_mb)});
  f.push_back({"runtime.invariance", Kind::kChoice,
               "batch: the same bits for any train.accum_steps and world size that split the global batch into "
               "whole chunks of runtime.invariance_chunk samples (each chunk computed alone, gradients summed over "
               "chunks in global order, dropout masks keyed by step and chunk, so by sample); none: the fastest "
               "layout-dependent arithmetic", {"none", "batch"}, 0, 0, false, false,
               at(&C::runtime, &RuntimeConfig::invariance), "'none'"});
  f.push_back({"runtime.invariance_chunk", Kind::kInt,
               "invariance = batch: samples per chunk; data.batch_size must be a multiple of it", {}, 1, 65536, false,
               false, at(&C::runtime, &RuntimeConfig::invariance_chunk), "8"});
  f.push_back({"runtime.zero_stage", Kind::kInt,
               "1: ZeRO stage 1, each rank holds and updates the optimizer state of its own range of the "
               "parameters (about 1/world of it), then the ranks all-gather the parameters; the same bits as 0 "
               "(trace.digest_version is then 4 unless set; 3 or 4 when digests are on); 0: every rank holds all of it", {}, 0, 1, false,
               false, at(&C::runtime, &RuntimeConfig::zero_stage), "0"});
  f.push_back({"runtime.zero_reduce", Kind::kChoice,
               "zero_stage = 1 without invariance: how a rank gets the reduced gradients of its range. all_reduce: "
               "every rank sums all of them (the bits of zero_stage = 0); reduce_scatter: each rank receives its "
               "range's only, added in rank order, and the clip norm adds the ranks' parts (2/3 of the traffic of "
               "all_reduce plus the all-gather; the same bits run to run and on any backend, within float rounding "
               "of zero_stage = 0)",
               {"all_reduce", "reduce_scatter"}, 0, 0, false, false, at(&C::runtime, &RuntimeConfig::zero_reduce),
               "'all_reduce'"});
  f.push_back({"trace.enabled", Kind::kBool, "write the step trace", {}, 0, 0, false, false,
               at(&C::trace, &TraceConfig::enabled)});
  f.push_back({"trace.digests", Kind::kBool, "digest parameters, optimizer and RNG state every step", {},
               0, 0, false, false, at(&C::trace, &TraceConfig::digests)});
  f.push_back({"trace.optimizer_digest_every", Kind::kInt,
               "digest the optimizer state every N steps (parameters and RNG are digested every step)", {}, 1, 1e9,
               false, false, at(&C::trace, &TraceConfig::optimizer_digest_every)});
  f.push_back({"trace.digest_version", Kind::kInt,
               "4: as 3 with a cheaper mix (one 32 x 32-bit multiply per element where 3's fmix64 has two 64-bit "
               "ones; about a third of the cost); 3: as 2, the tensors by position-mixed sums that add up over slices (a ZeRO run's digests equal "
               "an unsharded run's; computed on the tensor's device), and the gradients the optimizer used, "
               "every step; 2: parameters and optimizer by lane "
               "checksums, plus the rest of the state (scaler, guard windows, fired faults, set-aside batches, "
               "samples seen) and every rank's RNG, every step; 1: xxh3 of parameters, optimizer and rank 0's RNG "
               "only", {}, 1, 4, false, false,
               at(&C::trace, &TraceConfig::digest_version), "1"});
  f.push_back({"trace.zstd_level", Kind::kInt, "zstd level of trace frames", {}, 1, 19, false, false,
               at(&C::trace, &TraceConfig::zstd_level)});
  f.push_back({"checkpoint.every_steps", Kind::kInt, "save a checkpoint every N steps (0: off)", {}, 0,
               1e12, false, false, at(&C::checkpoint, &CheckpointConfig::every_steps)});
  f.push_back({"checkpoint.every_seconds", Kind::kFloat, "save a checkpoint every S seconds (0: off)", {},
               0, 1e9, false, false, at(&C::checkpoint, &CheckpointConfig::every_seconds)});
  f.push_back({"checkpoint.keep_last", Kind::kInt, "complete checkpoints kept by rotation", {}, 1, 1e6,
               false, false, at(&C::checkpoint, &CheckpointConfig::keep_last)});
  f.push_back({"checkpoint.at_end", Kind::kBool, "save a checkpoint when the run ends", {}, 0, 0, false,
               false, at(&C::checkpoint, &CheckpointConfig::at_end)});
  f.push_back({"eval.every_steps", Kind::kInt,
               "evaluate after every N steps (0: only at epoch ends, when eval.each_epoch, and at the end)", {}, 0,
               1e12, false, false, at(&C::eval, &EvalConfig::every_steps), "0"});
  f.push_back({"eval.each_epoch", Kind::kBool, "evaluate at the end of every epoch", {}, 0, 0, false, false,
               at(&C::eval, &EvalConfig::each_epoch), {}, Field::Era::kSuccessor, "train.eval_each_epoch"});
  f.push_back({"eval.max_batches", Kind::kInt,
               "batches of the validation split evaluated, always the first ones in its order (0: all; default "
               "20 for data.kind \"tokens\", as llm.c's val_max_steps, else 0)", {}, 0, 1e9, false, false,
               at(&C::eval, &EvalConfig::max_batches), "0"});
  f.push_back({"eval.batch_size", Kind::kInt,
               "samples per evaluation batch (0: data.batch_size, the training micro-batch, so an evaluation needs "
               "no more memory than a step)", {}, 0, 1 << 20, false, false, at(&C::eval, &EvalConfig::batch_size), {},
               Field::Era::kSuccessor, "data.eval_batch_size"});
  return f;
}

std::string valid_keys_near(const std::vector<Field>& fs, const std::string& key) {
  std::string section = key.substr(0, key.find('.') == std::string::npos ? 0 : key.find('.'));
  std::ostringstream out;
  bool any = false;
  for (const auto& f : fs) {
    bool same_section = !section.empty() && f.key.rfind(section + ".", 0) == 0;
    if (section.empty() || same_section) {
      out << (any ? ", " : "") << f.key;
      any = true;
    }
  }
  if (!any)
    for (const auto& f : fs) out << (any ? ", " : "") << f.key, any = true;
  return out.str();
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kInt: return "integer";
    case Kind::kFloat: return "number";
    case Kind::kBool: return "boolean";
    case Kind::kString: return "string";
    case Kind::kChoice: return "choice";
    case Kind::kIntList: return "list of integers";
  }
  return "?";
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + std::string("\"") + x + "\"";
  return s;
}

void check_range(const Field& f, double v, const std::string& where) {
  bool lo_ok = f.min_open ? v > f.min : v >= f.min;
  bool hi_ok = f.max_open ? v < f.max : v <= f.max;
  if (!(lo_ok && hi_ok) || std::isnan(v)) {
    std::ostringstream range;
    range << (f.min_open ? "(" : "[") << f.min << ", " << f.max << (f.max_open ? ")" : "]");
    RETRACE_FAIL(ConfigError, "bad value for ", f.key, " in ", where, ": ", v, " is outside ",
                 range.str(), " (", f.help, ")");
  }
}

// Assigns a TOML node to the field, checking type and bounds.
void assign(const Field& f, Config& c, const toml::node& node, const std::string& where) {
  void* p = f.ref(c);
  auto type_error = [&]() {
    std::ostringstream found;
    found << node.type();
    RETRACE_FAIL(ConfigError, "bad value for ", f.key, " in ", where, ": expected ", kind_name(f.kind),
                 f.kind == Kind::kChoice ? " (one of " + join(f.choices) + ")" : "", ", found ",
                 found.str());
  };
  switch (f.kind) {
    case Kind::kInt: {
      // The type first: toml++ 3.3.0's value<int64_t>() of a float casts it unchecked (undefined
      // for 1e25; found by tools/fuzz/config_fuzzer.cpp).
      if (!node.is_integer()) type_error();
      auto v = node.value<int64_t>();
      if (!v) type_error();
      check_range(f, static_cast<double>(*v), where);
      *static_cast<int64_t*>(p) = *v;
      break;
    }
    case Kind::kFloat: {
      if (!node.is_number()) type_error();
      double v = *node.value<double>();
      check_range(f, v, where);
      *static_cast<double*>(p) = v;
      break;
    }
    case Kind::kBool: {
      if (!node.is_boolean()) type_error();
      *static_cast<bool*>(p) = *node.value<bool>();
      break;
    }
    case Kind::kString: {
      if (!node.is_string()) type_error();
      *static_cast<std::string*>(p) = *node.value<std::string>();
      break;
    }
    case Kind::kChoice: {
      if (!node.is_string()) type_error();
      std::string v = *node.value<std::string>();
      size_t index = f.choices.size();
      for (size_t i = 0; i < f.choices.size(); ++i)
        if (f.choices[i] == v) index = i;
      RETRACE_CHECK(index < f.choices.size(), ConfigError, "bad value for ", f.key, " in ", where, ": \"", v,
                    "\" is not one of ", join(f.choices));
      *static_cast<uint8_t*>(p) = static_cast<uint8_t>(index);
      break;
    }
    case Kind::kIntList: {
      const toml::array* arr = node.as_array();
      if (!arr) type_error();
      std::vector<int64_t> out;
      for (const auto& el : *arr) {
        if (!el.is_integer()) type_error();
        int64_t v = *el.value<int64_t>();
        check_range(f, static_cast<double>(v), where);
        out.push_back(v);
      }
      *static_cast<std::vector<int64_t>*>(p) = out;
      break;
    }
  }
}

const Field& find_field(const std::vector<Field>& fs, const std::string& key, const std::string& where) {
  for (const auto& f : fs)
    if (f.key == key) return f;
  RETRACE_FAIL(ConfigError, "unknown config key '", key, "' in ", where, "; valid keys: ",
               valid_keys_near(fs, key));
}

// The text of a TOML value as to_toml writes values ([user] keys keep it).
std::string value_text(const toml::node& node) {
  std::ostringstream out;
  node.visit([&out](const auto& v) { out << v; });
  return out.str();
}

// `s` with control bytes written as \xNN, for an error message.
std::string printable(const std::string& s) {
  std::string out;
  for (const char ch : s) {
    const auto b = static_cast<uint8_t>(ch);
    out += b >= 0x20 && b != 0x7f ? std::string(1, ch) : "\\x" + to_hex(&b, 1);
  }
  return out;
}

// A [user] key as to_toml writes it: bare TOML keys (letters, digits, '_', '-') joined by dots, so
// that the written text reads back as the same key (a quoted key such as "a b" would be written
// bare and read back as something else, or not at all).
void check_user_key(const std::string& key, const std::string& where) {
  bool ok = !key.empty() && key.front() != '.' && key.back() != '.' && key.find("..") == std::string::npos;
  for (const char ch : key)
    ok = ok && ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
                ch == '-' || ch == '.');
  RETRACE_CHECK(ok, ConfigError, "bad key user.", printable(key), " in ", where,
                ": keys of [user] are bare TOML keys (letters, digits, '_' and '-'), joined by dots");
}

void walk_user(const toml::table& t, const std::string& prefix, Config& c, const std::string& where) {
  for (const auto& [k, node] : t) {
    const std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    check_user_key(std::string(k.str()), where);
    if (const toml::table* sub = node.as_table()) walk_user(*sub, key, c, where);
    else c.user[key] = value_text(node);
  }
}

void walk(const toml::table& t, const std::string& prefix, const std::vector<Field>& fs, Config& c,
          const std::string& where) {
  for (const auto& [k, node] : t) {
    std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (prefix.empty() && key == "user") {
      const toml::table* sub = node.as_table();
      RETRACE_CHECK(sub, ConfigError, "bad value for user in ", where, ": expected a table [user] of your own keys");
      walk_user(*sub, "", c, where);
      continue;
    }
    if (const toml::table* sub = node.as_table()) {
      bool known_section = false;
      for (const auto& f : fs) known_section = known_section || f.key.rfind(key + ".", 0) == 0;
      RETRACE_CHECK(known_section, ConfigError, "unknown config section [", key, "] in ", where,
                    "; valid keys: ", valid_keys_near(fs, ""));
      walk(*sub, key, fs, c, where);
    } else {
      assign(find_field(fs, key, where), c, node, where);
    }
  }
}

// The defaults that depend on other keys, resolved once, so that the recorded text holds values.
void resolve_defaults(Config& c) {
  if (c.eval.max_batches < 0) c.eval.max_batches = c.data.kind == "tokens" ? kTokenEvalMaxBatches : 0;
}

void validate(Config& c) {
  resolve_defaults(c);
  RETRACE_CHECK(!c.model.hidden.empty(), ConfigError,
                "bad value for model.hidden: at least one hidden layer is needed");
  RETRACE_CHECK(!(c.amp.mode == AmpMode::kFp16 && c.runtime.device == DeviceKind::kCpu), ConfigError,
                "bad value for amp.mode: \"fp16\" autocast needs runtime.device = \"cuda\"; on CPU use \"bf16\"");
  c.faults.parsed = parse_faults(c.faults.inject);  // throws ConfigError naming the bad item
  if (c.runtime.invariance == Invariance::kBatch) {
    RETRACE_CHECK(c.data.batch_size % c.runtime.invariance_chunk == 0, ConfigError,
                  "runtime.invariance = \"batch\" computes whole chunks of runtime.invariance_chunk = ",
                  c.runtime.invariance_chunk, " samples, but data.batch_size = ", c.data.batch_size,
                  " (the micro-batch) is not a multiple of it; choose a data.batch_size that is, or a chunk that "
                  "divides it");
    RETRACE_CHECK(c.data.last_batch == data::LastBatch::kDrop, ConfigError,
                  "runtime.invariance = \"batch\" needs data.last_batch = \"drop\": a kept last batch is split "
                  "over the ranks unevenly, not into whole chunks");
  }
  RETRACE_CHECK(c.runtime.zero_stage == 0 || !c.trace.enabled || !c.trace.digests || c.trace.digest_version >= 3,
                ConfigError, "runtime.zero_stage = 1 splits the optimizer state among the ranks, and only digests "
                "that add up over slices describe it: set trace.digest_version = 3 or 4 (or trace.digests = false)");
  RETRACE_CHECK(c.runtime.zero_reduce == ZeroReduce::kAllReduce || c.runtime.zero_stage == 1, ConfigError,
                "runtime.zero_reduce = \"reduce_scatter\" gives each rank the gradients of its ZeRO range: set "
                "runtime.zero_stage = 1 with it, or leave zero_reduce at \"all_reduce\"");
  RETRACE_CHECK(c.runtime.zero_reduce == ZeroReduce::kAllReduce || c.runtime.invariance == Invariance::kNone,
                ConfigError, "runtime.zero_reduce = \"reduce_scatter\" is for the default mode: under "
                "runtime.invariance = \"batch\" each rank already folds one slice of the gradients in global chunk "
                "order (the bits of one rank); leave zero_reduce at \"all_reduce\"");
  RETRACE_CHECK(!c.model.kind.empty(), ConfigError, "bad value for model.kind: it is empty");
  RETRACE_CHECK(c.model.kind != "torchscript" || !c.model.path.empty(), ConfigError,
                "model.kind = \"torchscript\" needs model.path, the file saved with torch.jit.save "
                "(e.g. --set model.path=model.pt)");
}

std::string toml_string(const std::string& s) {
  std::ostringstream out;
  out << toml::value<std::string>(s);
  return out.str();
}

// A --set value that is not TOML, taken as a string. The config written back (to_toml) must read
// back as the same text, so the string must come back from toml++ as it went in; toml++ refuses
// text that is not UTF-8 (overlong forms, surrogates, code points past U+10FFFF), as TOML does.
toml::table bare_string(const std::string& value, const std::string& ov) {
  bool reads_back = false;
  try {
    const toml::table t = toml::parse("v = " + toml_string(value));
    const std::optional<std::string> back = t["v"].value<std::string>();
    reads_back = back && *back == value;
  } catch (const toml::parse_error&) {
  }
  RETRACE_CHECK(reads_back, ConfigError, "--set ", ov.substr(0, ov.find('=')),
                ": the value is not UTF-8 text; give it in UTF-8 (or quoted as a TOML string with escapes)");
  return toml::table{{"v", value}};
}

// The shortest decimal that reads back as the same double, so resolved configs stay readable
// and exact.
std::string number(double v) {
  std::string s;
  for (int precision = 6; precision <= 17; ++precision) {
    std::ostringstream out;
    out.precision(precision);
    out << v;
    s = out.str();
    if (parse_finite_double(s) == v) break;  // subnormals too (std::stod throws for them)
  }
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

}  // namespace

int64_t eval_batch_size(const Config& c) { return c.eval.batch_size > 0 ? c.eval.batch_size : c.data.batch_size; }

EvalPlan eval_plan(const Config& c, int64_t split_samples) {
  EvalPlan p;
  p.batch_size = eval_batch_size(c);
  p.batches = (split_samples + p.batch_size - 1) / p.batch_size;
  if (c.eval.max_batches > 0) p.batches = std::min(p.batches, c.eval.max_batches);
  p.samples = std::min(split_samples, p.batches * p.batch_size);
  return p;
}

const char* optimizer_name(OptimizerKind k) { return k == OptimizerKind::kSgd ? "sgd" : "adamw"; }
const char* amp_name(AmpMode m) { return m == AmpMode::kBf16 ? "bf16" : m == AmpMode::kFp16 ? "fp16" : "off"; }

Config parse_config(const std::string& toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides, ConfigSource source) {
  const auto fs = fields();
  Config c;
  if (source == ConfigSource::kRecorded)
    for (const auto& f : fs)
      if (!f.legacy.empty()) assign(f, c, *toml::parse("v = " + f.legacy).get("v"), "legacy value");
  toml::table root;
  try {
    root = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream msg;
    msg << "cannot parse " << origin << " at line " << e.source().begin.line << ", column "
        << e.source().begin.column << ": " << e.description();
    throw ConfigError(msg.str());
  }
  walk(root, "", fs, c, origin);
  // A text that names a key by its old name keeps the old names when written back (Field::Era).
  for (const auto& f : fs) {
    if (f.era != Field::Era::kRetired || !root.at_path(f.key)) continue;
    RETRACE_CHECK(!root.at_path(f.counterpart), ConfigError, origin, " sets both ", f.key, " and ", f.counterpart,
                  ", which name the same value (", f.counterpart, " replaced ", f.key, "); keep only ", f.counterpart);
    c.eval.legacy_keys = true;
  }
  for (const auto& ov : overrides) {
    auto eq = ov.find('=');
    RETRACE_CHECK(eq != std::string::npos && eq > 0, ConfigError, "--set expects key=value, got '", ov,
                  "'");
    std::string key = ov.substr(0, eq), value = ov.substr(eq + 1);
    toml::table t;
    if (key.rfind("user.", 0) == 0 && key.size() > 5) {
      check_user_key(key.substr(5), "--set");
      try {
        t = toml::parse("v = " + value);
      } catch (const toml::parse_error&) {
        t = bare_string(value, ov);
      }
      c.user[key.substr(5)] = value_text(*t.get("v"));
      continue;
    }
    const Field& f = find_field(fs, key, "--set " + ov);
    try {
      t = toml::parse("v = " + value);
    } catch (const toml::parse_error&) {
      // A bare word is taken as a string, so `--set optim.name=sgd` works without quotes.
      t = bare_string(value, ov);
    }
    assign(f, c, *t.get("v"), "--set " + ov);
  }
  // A default that follows from another key is chosen, not demanded: ZeRO-1 splits the optimizer
  // state among the ranks, which only digests that add up over slices describe, so a config that
  // does not set trace.digest_version gets version 4 with runtime.zero_stage = 1 (written into the
  // run's config like every value). A version set explicitly is kept: a conflicting one is still
  // the error in validate().
  bool version_given = root.at_path("trace.digest_version").node() != nullptr;
  for (const auto& ov : overrides) version_given = version_given || ov.rfind("trace.digest_version=", 0) == 0;
  if (!version_given && c.runtime.zero_stage == 1) c.trace.digest_version = 4;
  validate(c);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides, ConfigSource source) {
  std::string text;
  try {
    text = fs::read_file(path, 1 << 20);
  } catch (const IoError&) {
    RETRACE_FAIL(ConfigError, "cannot read config file ", path,
                 "; pass an existing file with --config (built-in configs are in configs/)");
  }
  return parse_config(text, path, overrides, source);
}

// A field's value as TOML text, the way to_toml writes it.
static std::string field_text(const Field& f, Config& c) {
  std::ostringstream value;
  void* p = f.ref(c);
  switch (f.kind) {
    case Kind::kInt: value << *static_cast<int64_t*>(p); break;
    case Kind::kFloat: value << number(*static_cast<double*>(p)); break;
    case Kind::kBool: value << (*static_cast<bool*>(p) ? "true" : "false"); break;
    case Kind::kString: value << toml_string(*static_cast<std::string*>(p)); break;
    case Kind::kChoice: value << toml_string(f.choices.at(*static_cast<uint8_t*>(p))); break;
    case Kind::kIntList: {
      value << "[";
      const auto& v = *static_cast<std::vector<int64_t>*>(p);
      for (size_t i = 0; i < v.size(); ++i) value << (i ? ", " : "") << v[i];
      value << "]";
      break;
    }
  }
  return value.str();
}

std::string to_toml(const Config& cfg, TomlForm form) {
  Config c = cfg;
  resolve_defaults(c);
  std::ostringstream out;
  std::string section;
  for (const auto& f : fields()) {
    if (f.era == Field::Era::kRetired && !c.eval.legacy_keys) continue;
    if (f.era == Field::Era::kSuccessor && c.eval.legacy_keys) continue;
    auto dot = f.key.find('.');
    std::string sec = dot == std::string::npos ? "" : f.key.substr(0, dot);
    std::string name = dot == std::string::npos ? f.key : f.key.substr(dot + 1);
    const std::string value = field_text(f, c);
    if (form == TomlForm::kCanonical && !f.legacy.empty() && value == f.legacy) continue;
    // A section's header comes with its first key written: a section whose keys all hold their
    // legacy values ([eval] of an older run) adds nothing to the text.
    if (sec != section) {
      out << "\n[" << sec << "]\n";
      section = sec;
    }
    out << name << " = " << value << "\n";
  }
  // Users' keys last, sorted; a config without any writes no [user] section (older hashes stay).
  if (!c.user.empty()) {
    out << "\n[user]\n";
    for (const auto& [k, v] : c.user) out << k << " = " << v << "\n";
  }
  return out.str();
}

std::string describe_keys() {
  Config c;
  std::ostringstream out;
  for (const auto& f : fields()) {
    out << "  " << f.key << " (" << kind_name(f.kind);
    if (!f.choices.empty()) out << ": " << join(f.choices);
    out << "): " << f.help << "\n";
  }
  (void)c;
  return out.str();
}

std::string config_reference() {
  Config c;  // the defaults a config file gets for the keys it leaves out
  std::ostringstream out;
  std::string section;
  bool first = true;
  auto cell = [](std::string text) {  // Markdown table cell: no bare '|'
    std::string o;
    for (char ch : text) o += ch == '|' ? std::string("\\|") : std::string(1, ch);
    return o;
  };
  for (const auto& f : fields()) {
    const auto dot = f.key.find('.');
    const std::string sec = dot == std::string::npos ? "" : f.key.substr(0, dot);
    if (first || sec != section) {
      out << (first ? "" : "\n") << (sec.empty() ? std::string("### Top level") : "### `[" + sec + "]`") << "\n\n"
          << "| key | type | default | meaning |\n|---|---|---|---|\n";
      section = sec;
      first = false;
    }
    std::string type = kind_name(f.kind);
    if (!f.choices.empty()) {
      type += ":";
      for (size_t i = 0; i < f.choices.size(); ++i) type += (i ? ", `" : " `") + f.choices[i] + "`";
    }
    const bool numeric = f.kind == Kind::kInt || f.kind == Kind::kFloat || f.kind == Kind::kIntList;
    if (numeric && (f.min != -INFINITY || f.max != INFINITY)) {
      std::ostringstream range;
      const bool integer = f.kind == Kind::kInt || f.kind == Kind::kIntList;
      auto bound = [&](double v) {
        if (std::isinf(v)) return std::string(v < 0 ? "-inf" : "inf");
        return integer ? std::to_string(static_cast<long long>(v)) : number(v);
      };
      range << ", in " << (f.min_open ? "(" : "[") << bound(f.min) << ", " << bound(f.max) << (f.max_open ? ")" : "]");
      type += range.str();
    }
    std::string meaning = f.help;
    if (!f.legacy.empty())
      meaning += ". A config retrace recorded without this key reads as `" + f.legacy + "` (what retrace did before it)";
    if (f.era == Field::Era::kRetired) meaning += ". Written back only in configs that use it";
    out << "| `" << f.key << "` | " << cell(type) << " | `" << cell(field_text(f, c)) << "` | " << cell(meaning)
        << " |\n";
  }
  out << "\n### `[user]`\n\nKeys of your own components (`user.NAME = value`, any TOML value; NAME is bare TOML keys, "
         "letters, digits, `_` and `-`, joined by dots): written back sorted, part of the config hash.\n";
  return out.str();
}

namespace {
std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}
}  // namespace

std::map<std::string, std::string> config_entries(const std::string& toml_text) {
  std::map<std::string, std::string> out;
  std::string section;
  std::istringstream in(toml_text);
  std::string line;
  while (std::getline(in, line)) {
    std::string t = trimmed(line);
    if (t.empty() || t[0] == '#') continue;
    if (t.front() == '[' && t.back() == ']') {
      // "[[x]]" (arrays of tables) does not occur in resolved configs; treated like "[x]".
      section =
          trimmed(t.substr(t.find_first_not_of('['), t.find_last_not_of(']') - t.find_first_not_of('[') + 1));
      continue;
    }
    auto eq = t.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    std::string key = trimmed(t.substr(0, eq));
    out[section.empty() ? key : section + "." + key] = trimmed(t.substr(eq + 1));
  }
  return out;
}

}  // namespace retrace::train
