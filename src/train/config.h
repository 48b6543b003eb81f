// The run configuration: parsed once from TOML (plus `--set key=value` overrides) into typed
// structs; the rest of the code never looks an option up by string. Every key, its type, default,
// valid range or choices and meaning is in the table of config.cpp; `retrace record --help-config`
// prints it. Unknown keys and bad values are ConfigErrors naming the key and the valid choices.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace retrace::train {

struct DataConfig {
  std::string dir = "/usr/share/datasets/fashion-mnist";
  int64_t batch_size = 128;
  std::string last_batch = "drop";  // drop | keep
  int64_t eval_batch_size = 1000;
  int64_t context = 128;        // gpt: tokens per sample
  double test_fraction = 0.1;   // gpt: share of the corpus held out for evaluation
};

struct ModelConfig {
  std::string kind = "mlp";  // mlp | gpt
  std::vector<int64_t> hidden = {512, 256};  // mlp
  std::string activation = "relu";  // mlp: relu | gelu | tanh
  double dropout = 0.1;
  std::string dropout_impl = "philox";  // philox | torch (how CPU dropout masks are drawn)
  int64_t d_model = 128;     // gpt
  int64_t n_layers = 8;      // gpt
  int64_t n_heads = 4;       // gpt
  std::string checkpoint = "none";  // gpt activation checkpointing: none | full | sqrt | selective
  int64_t checkpoint_every = 4;     // gpt: layers per segment with "full"
};

struct OptimConfig {
  std::string name = "adamw";  // adamw | sgd
  double lr = 1e-3;
  double weight_decay = 0.01;
  double momentum = 0.9;  // sgd
  bool nesterov = false;  // sgd
  double beta1 = 0.9;     // adamw
  double beta2 = 0.999;   // adamw
  double eps = 1e-8;      // adamw
  bool fused = true;      // adamw: one pass per parameter on CPU float32 (same bits as LibTorch's)
};

struct ScheduleConfig {
  std::string kind = "cosine";  // cosine | constant
  int64_t warmup_steps = 100;
  double min_lr_ratio = 0.05;
};

struct TrainConfig {
  int64_t epochs = 3;
  int64_t steps = 0;  // 0: epochs * batches per epoch
  int64_t accum_steps = 1;  // micro-batches per optimizer step (data.batch_size each)
  double max_norm = 1.0;  // 0 disables clipping
  bool eval_each_epoch = true;
};

struct AmpConfig {
  std::string mode = "off";     // off | bf16 | fp16 (fp16 needs CUDA)
  std::string scaler = "auto";  // auto (on for fp16 only) | on | off
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

struct GuardConfig {
  int64_t skip_window = 1000;
  double skip_warn_rate = 0.05;
  double spike_factor = 2.0;       // 0: off
  int64_t spike_window = 20;
  int64_t spike_skip_batches = 1;  // batches skipped after a rollback, ending at the spiking one
};

struct FaultConfig {
  std::string inject;  // "KIND@STEP[:ARG],..." (see faults.h)
};

struct RuntimeConfig {
  std::string device = "cpu";  // cpu | cuda
  std::string numerics = "portable";  // portable | native (train/numerics.h)
  int64_t threads = 0;          // torch intra-op threads; 0 = auto (resolved and recorded)
  int64_t blas_threads = 0;     // OpenBLAS threads; 0 = auto (portable: 2; native: the core count, at most 8)
  int64_t interop_threads = 1;
  bool deterministic = true;
  double collective_timeout_s = 120;  // data parallelism: rendezvous and collective timeout
  double bucket_mb = 25;              // data parallelism: gradient all-reduce bucket size
};

struct TraceConfig {
  bool enabled = true;
  bool digests = true;
  int64_t optimizer_digest_every = 10;  // steps between optimizer-state digests (1: every step)
  int64_t zstd_level = 3;
};

struct CheckpointConfig {
  int64_t every_steps = 200;  // 0: none by step count
  double every_seconds = 0;   // 0: none by time
  int64_t keep_last = 5;
  bool at_end = true;
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
};

// Where a config's text comes from. kUser: a file or text a person wrote; a missing key takes the
// current default. kRecorded: text retrace wrote (RUN/config.toml, a trace header, a golden run);
// a missing key that was added later takes the value that reproduces retrace before that key
// existed (e.g. model.dropout_impl = "torch"), so older runs replay and resume unchanged.
enum class ConfigSource { kUser, kRecorded };

// Parses TOML text (`origin` names it in errors) on top of the defaults, then applies overrides
// ("key=value", dotted keys, values in TOML syntax or bare strings), then validates.
Config parse_config(const std::string& toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides, ConfigSource source = ConfigSource::kUser);
// Reads and parses a config file; IoError if it cannot be read.
Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                   ConfigSource source = ConfigSource::kUser);
// The resolved config as TOML in a fixed order (stable across runs): every key, except a key added
// later while it holds its legacy value (see ConfigSource), which is left out so that the text,
// and the config hash in checkpoints, stay what older binaries wrote.
std::string to_toml(const Config& c);
// The entries of a resolved config as to_toml writes it (lines "key = value" under "[section]"
// lines, '#' comments) by dotted key; values are kept as written, trimmed. Lines that are neither
// are ignored. The diff compares configs of two traces with it.
std::map<std::string, std::string> config_entries(const std::string& toml_text);
// One line per key: name, type, default, choices, meaning.
std::string describe_keys();

}  // namespace retrace::train
