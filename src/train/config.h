// The run configuration: parsed once from TOML (plus `--set key=value` overrides) into typed
// structs; the rest of the code never looks an option up by string. Every key, its type, default,
// valid range or choices and meaning is in the table of config_fields.cpp; `retrace record --help-config`
// prints it. Unknown keys and bad values are ConfigErrors naming the key and the valid choices.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "data/sampler.h"
#include "model/options.h"
#include "records/records.h"
#include "train/numerics.h"

namespace retrace::train {

// Choices of the config as enums, in the order of their names in config_fields.cpp's table (the TOML
// text keeps the names; the enums are what the code compares).
enum class OptimizerKind : uint8_t { kAdamW, kSgd };             // optim.name: adamw | sgd
enum class AdamwMoment : uint8_t { kMulAdd, kLerp };             // optim.adamw_moment: mul_add | lerp
enum class ScheduleKind : uint8_t { kCosine, kConstant };        // schedule.kind: cosine | constant
enum class AmpMode : uint8_t { kOff, kBf16, kFp16 };             // amp.mode: off | bf16 | fp16
enum class ScalerMode : uint8_t { kAuto, kOn, kOff };            // amp.scaler: auto | on | off
enum class DeviceKind : uint8_t { kCpu, kCuda };                 // runtime.device: cpu | cuda
enum class Invariance : uint8_t { kNone, kBatch };               // runtime.invariance: none | batch
enum class CkptOnError : uint8_t { kStop, kContinue };           // checkpoint.on_error: stop | continue
enum class ZeroReduce : uint8_t { kAllReduce, kReduceScatter };  // runtime.zero_reduce: all_reduce | reduce_scatter
const char* optimizer_name(OptimizerKind k);
const char* amp_name(AmpMode m);

struct DataConfig {
  // Which data set: a registered data kind, or "auto" (a text corpus for model.kind "gpt",
  // Fashion-MNIST otherwise). Built in: fashion-mnist, text, tensors (a directory of safetensors
  // files), tokens (llm.c token files).
  std::string kind = "auto";
  std::string dir = "/usr/share/datasets/fashion-mnist";
  int64_t batch_size = 128;
  data::LastBatch last_batch = data::LastBatch::kDrop;
  // The epoch's order (data/sampler.h): a keyed bijection computed per position (feistel), or a
  // Fisher-Yates shuffle of every index (shuffle: what runs recorded before the key used).
  data::Order order = data::Order::kFeistel;
  int64_t context = 128;       // gpt, tokens: tokens per sample
  int64_t vocab_size = 0;      // tokens: vocabulary (0: largest token + 1)
  double test_fraction = 0.1;  // gpt: share of the corpus held out for evaluation
};

struct ModelConfig {
  // A registered model kind. Built in: mlp, gpt, torchscript (model.path names the file).
  std::string kind = "mlp";
  std::string path;                                         // torchscript: the saved module
  std::vector<int64_t> hidden = {512, 256};                 // mlp
  model::Activation activation = model::Activation::kRelu;  // mlp
  double dropout = 0.1;
  model::DropoutImpl dropout_impl = model::DropoutImpl::kPhilox;             // how CPU dropout masks are drawn
  model::GeluImpl gelu_impl = model::GeluImpl::kRetrace;                     // how CPU float32 GELU is computed
  model::AttentionMatmul attention_matmul = model::AttentionMatmul::kLanes;  // gpt: attention's bmm
  int64_t d_model = 128;                                                     // gpt
  int64_t n_layers = 8;                                                      // gpt
  int64_t n_heads = 4;                                                       // gpt
  model::CheckpointPolicy checkpoint = model::CheckpointPolicy::kNone;       // gpt activation checkpointing
  int64_t checkpoint_every = 4;                                              // gpt: layers per segment with "full"
  bool tie_embeddings = false;  // gpt: the output layer is the token embedding (no bias), as GPT-2
};

struct OptimConfig {
  OptimizerKind name = OptimizerKind::kAdamW;
  double lr = 1e-3;
  double weight_decay = 0.01;
  double momentum = 0.9;  // sgd
  bool nesterov = false;  // sgd
  double beta1 = 0.9;     // adamw
  double beta2 = 0.999;   // adamw
  double eps = 1e-8;      // adamw
  bool fused = true;      // adamw: one pass per parameter on CPU float32 (same bits as LibTorch's)
  // adamw: the first moment as LibTorch's C++ AdamW computes it (exp_avg.mul_(beta1).add_(grad,
  // 1 - beta1)) or as PyTorch 2.x's Python AdamW does (exp_avg.lerp_(grad, 1 - beta1)): the twin of
  // a Python loop (optimizer.h's make_optimizer).
  AdamwMoment adamw_moment = AdamwMoment::kMulAdd;
};

struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::kCosine;
  int64_t warmup_steps = 100;
  double min_lr_ratio = 0.05;
};

struct TrainConfig {
  int64_t epochs = 3;
  int64_t steps = 0;        // 0: epochs * batches per epoch
  int64_t accum_steps = 1;  // micro-batches per optimizer step (data.batch_size each)
  double max_norm = 1.0;    // 0 disables clipping
  // A registered loss: outputs and targets of a batch -> the sum of per-item losses (retrace
  // divides by the item count of the effective batch). Built in: cross_entropy.
  std::string loss = "cross_entropy";
};

// Evaluation on the validation (test) split. The batches evaluated are the first max_batches
// batches of eval_batch_size(c) samples in the split's own order, so every evaluation of a run,
// and of every run on the same data, sees the same samples.
struct EvalConfig {
  int64_t every_steps = 0;  // evaluate after every N steps (0: only at epoch ends and at the end)
  bool each_epoch = true;   // evaluate at the end of every epoch
  // Batches evaluated (0: the whole split). -1 until the config is validated, which resolves it:
  // 20 for data.kind "tokens" (llm.c's val_max_steps), else 0.
  int64_t max_batches = -1;
  int64_t batch_size = 0;  // samples per batch (0: data.batch_size, the training micro-batch)
  // The text named the keys these replaced, data.eval_batch_size and train.eval_each_epoch (a run
  // recorded before [eval] existed): to_toml writes those again, so its config hash stays.
  bool legacy_keys = false;
};

struct AmpConfig {
  AmpMode mode = AmpMode::kOff;           // fp16 needs CUDA
  ScalerMode scaler = ScalerMode::kAuto;  // auto: on for fp16 only
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

struct GuardConfig {
  int64_t skip_window = 1000;
  double skip_warn_rate = 0.05;
  double spike_factor = 2.0;  // 0: off
  int64_t spike_window = 20;
  int64_t spike_skip_batches = 1;  // batches skipped after a rollback, ending at the spiking one
};

struct FaultConfig {
  std::string inject;                  // "KIND@STEP[:ARG],..." (see faults.h), as written
  std::vector<records::Fault> parsed;  // the same, parsed once when the config is
};

struct RuntimeConfig {
  DeviceKind device = DeviceKind::kCpu;
  Numerics numerics = Numerics::kPortable;  // train/numerics.h
  // Which portable numerics (train/numerics.h): 1, the pinned thread counts (every run recorded
  // before the key existed); 2, GEMMs retrace owns on BLIS, the same bits at any thread count.
  // 0 = auto, resolved as the config is read (config_detail::resolve_defaults): 2 under portable,
  // 1 under native, where the version does not apply.
  int64_t numerics_version = 0;
  // Version 1: torch intra-op threads; 0 = auto (resolved and recorded). Version 2: the threads of
  // retrace's kernels (GEMMs and lanes), information, not numerics; 0 = the cores this process may
  // use (core/cpu_budget.h), resolved when the process starts and never written into the config.
  int64_t threads = 0;
  int64_t blas_threads = 0;  // OpenBLAS threads; 0 = auto (portable: 2; native: the core count, at most 8)
  int64_t interop_threads = 1;
  // Threads for the GPT's elementwise work and dropout masks (model/lanes.h): 1 or 2; 0 = auto (2
  // when torch runs one intra-op thread and the machine has two cores per local rank). The bits
  // are the same at 1 and 2, so the count is information, not numerics.
  int64_t elementwise_threads = 0;
  bool deterministic = true;
  double collective_timeout_s = 120;  // data parallelism: rendezvous and collective timeout
  double bucket_mb = 25;              // data parallelism: gradient all-reduce bucket size
  // "batch": every step is computed as fixed chunks of invariance_chunk samples in global sample
  // order (train/step.h), so parameters, optimizer state, losses and digests are the same bits for
  // every accumulation count and world size that split the global batch into whole chunks.
  Invariance invariance = Invariance::kNone;
  int64_t invariance_chunk = 8;  // samples per chunk (batch mode)
  // 1: ZeRO stage 1 (train/zero.h): each rank holds the optimizer state of its range of the
  // parameters and updates that range; the parameters are then all-gathered. 0: replicated.
  int64_t zero_stage = 0;
  // How a ZeRO rank gets its range's reduced gradients in the default mode (train/zero.h):
  // all_reduce, every rank the whole sum (the bits of stage 0); reduce_scatter, its range's sums
  // only (an all-to-all added in rank order: 2/3 of the traffic, its own bits, within float
  // rounding of stage 0).
  ZeroReduce zero_reduce = ZeroReduce::kAllReduce;
};

// The portable numerics version a runtime config computes with: numerics_version, or while it is
// 0 (auto, a config not read through parse_config) what config_detail::resolve_defaults makes of it.
inline int64_t numerics_version(const RuntimeConfig& r) {
  if (r.numerics_version != 0) return r.numerics_version;
  return r.numerics == Numerics::kNative ? 1 : 2;
}

struct TraceConfig {
  bool enabled = true;
  bool digests = true;
  int64_t optimizer_digest_every = 1;  // steps between optimizer-state digests (1: every step)
  // What a step's digests are. 4: as 3 with DigestKind::kMixed4 (the cheaper mix). 3: as 2 with
  // DigestKind::kMixed (sums that add up over slices). 2: parameters and optimizer state by lane checksums
  // (DigestKind::kLanes), the rest of the state in StepRecord::state_digest, every rank's RNG
  // digest. 1 (what runs recorded before the key read as): xxh3 of the bytes, neither of the others.
  int64_t digest_version = 2;
  int64_t zstd_level = 3;
};

struct CheckpointConfig {
  int64_t every_steps = 200;  // 0: none by step count
  double every_seconds = 0;   // 0: none by time
  int64_t keep_last = 5;
  bool at_end = true;
  // A save's file work on a background thread after a copy of the state (src/run/async_save.h);
  // false: the loop waits for every save.
  bool async_save = true;
  // While a background save is written the step runs on one lane fewer, leaving that core to the
  // writer (model::LaneLoan): time only, never bits.
  bool lend_lane = true;
  // Shards written and read back past the page cache (O_DIRECT, safetensors::set_direct_writes):
  // time and CPU only, the same bytes.
  bool direct_io = true;
  CkptOnError on_error = CkptOnError::kStop;  // a background save that fails: stop the run, or go on
};

struct Config {
  int64_t seed = 1234;
  DataConfig data;
  ModelConfig model;
  OptimConfig optim;
  ScheduleConfig schedule;
  TrainConfig train;
  AmpConfig amp;
  GuardConfig guards;
  FaultConfig faults;
  RuntimeConfig runtime;
  TraceConfig trace;
  CheckpointConfig checkpoint;
  EvalConfig eval;
  // [user]: keys for users' own models, data sets and losses, free-form. Values are kept as TOML
  // text ("64", "'relu'", "[1, 2]"), written back sorted by key, and part of the config hash.
  std::map<std::string, std::string> user;
};

// The evaluation batch in samples: eval.batch_size, or data.batch_size for 0.
int64_t eval_batch_size(const Config& c);

// What one evaluation reads: the first `batches` batches of `batch_size` samples of the split
// (the last one may be shorter), `samples` in all.
struct EvalPlan {
  int64_t batch_size = 0;
  int64_t batches = 0;
  int64_t samples = 0;
};
EvalPlan eval_plan(const Config& c, int64_t split_samples);

// Where a config's text comes from. kUser: a file or text a person wrote; a missing key takes the
// current default. kRecorded: text retrace wrote (RUN/config.toml, a trace header, a golden run);
// a missing key that was added later takes the value that reproduces retrace before that key
// existed (e.g. model.dropout_impl = "torch"), so older runs replay and resume unchanged.
enum class ConfigSource { kUser, kRecorded };

// Parses TOML text (`origin` names it in errors) on top of the defaults, then applies overrides
// ("key=value", dotted keys, values in TOML syntax or bare strings), then validates.
Config parse_config(const std::string& toml_text, const std::string& origin, const std::vector<std::string>& overrides,
                    ConfigSource source = ConfigSource::kUser);
// Reads and parses a config file; IoError if it cannot be read.
Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                   ConfigSource source = ConfigSource::kUser);
// kCanonical: every key, except a key added later while it holds its legacy value (see
// ConfigSource), which is left out so that the text, and so the config hash in checkpoints and
// trace headers, stay what older binaries wrote. kComplete: every key, what a run directory's
// config.toml and a trace header hold, so that `record --config RUN/config.toml` (a user's file
// to the parser) reproduces the run, legacy-valued keys included. Both parse to the same Config
// as recorded text.
enum class TomlForm { kCanonical, kComplete };
// The resolved config as TOML in a fixed order (stable across runs).
std::string to_toml(const Config& c, TomlForm form = TomlForm::kCanonical);
// The entries of a resolved config as to_toml writes it (lines "key = value" under "[section]"
// lines, '#' comments) by dotted key; values are kept as written, trimmed. Lines that are neither
// are ignored. The diff compares configs of two traces with it.
std::map<std::string, std::string> config_entries(const std::string& toml_text);
// One line per key: name, type, default, choices, meaning.
std::string describe_keys();
// Every key as Markdown tables, one per section: type, choices and range, default, meaning, legacy
// value. `retrace record --help-config` prints it; docs/configuration.md holds it, checked by ctest
// `config_reference` (tools/docs/config_reference.py).
std::string config_reference();

}  // namespace retrace::train
