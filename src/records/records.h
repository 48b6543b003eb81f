// The records a trace holds, as plain C++ values. The trace module converts them to and from the
// Cap'n Proto schema in trace.capnp; nothing outside src/trace sees Cap'n Proto.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/digest.h"

namespace retrace::records {

// Bumped whenever trace.capnp or the framing changes in a way old readers cannot read.
inline constexpr const char* kTraceSchema = "retrace.trace.v1";

enum class Outcome : uint8_t { kStep = 0, kSkip = 1 };

// Why retrace skipped a step. The trace holds the text (skip_text), so a user's loop may record
// a reason of its own through the Recorder; skip_reason_of reads any text back, kOther for a
// text retrace does not write itself.
enum class SkipReason : uint8_t { kNone, kNonFiniteLoss, kNonFiniteGrad, kLossSpike, kOther };
// "", "non_finite_loss", "non_finite_grad", "loss_spike"; kOther has no text of its own ("other").
const char* skip_text(SkipReason reason);
SkipReason skip_reason_of(const std::string& text);

struct KeyValue {
  std::string key;
  std::string value;
  bool operator==(const KeyValue& o) const { return key == o.key && value == o.value; }
  bool operator!=(const KeyValue& o) const { return !(*this == o); }
};

// The environment fingerprint of a trace header is a list of KeyValues in two parts. Numerics
// fields change bits; two runs promise equal bits only when these are equal. Information fields
// ("info.*") never count; neither do the keys that traces made before the numerics profile
// recorded without the prefix although they change no bits: "allocator", "cuda_device_count" and
// the raw environment variables "env.*" (their effect is in blas_core and aten_cpu_capability).
bool is_numerics_key(const std::string& key);
std::vector<KeyValue> numerics_fields(const std::vector<KeyValue>& fingerprint);
// The numerics keys whose values differ or that one side lacks, sorted by key.
std::vector<std::string> numerics_differences(const std::vector<KeyValue>& a, const std::vector<KeyValue>& b);

struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;  // "float32", ...
};

struct FileInfo {
  std::string path;
  uint64_t size = 0;
  std::string sha256;  // hex
};

struct Fault {
  std::string kind;  // "nan-loss", "inf-grad", "spike", "crash", "perturb-param"
  uint64_t step = 0;
  std::string arg;
};

struct TraceHeader {
  std::string schema = kTraceSchema;
  std::string retrace_version;
  std::string config_toml;  // the resolved config, exactly as written to run/config.toml
  std::string config_hash;  // sha256 hex of the config's canonical text (train/resolved_config.h), not of config_toml
  uint64_t seed = 0;
  std::vector<KeyValue> fingerprint;  // environment: libtorch version, BLAS, threads, ...
  std::string model_description;
  std::vector<ParamInfo> params;
  std::vector<FileInfo> data_files;
  std::vector<Fault> faults;
  uint64_t total_steps = 0;
  uint32_t world_size = 1;
  uint64_t effective_batch = 0;  // data.batch_size x train.accum_steps x world size
  std::string created_utc;       // ISO 8601; informational, not compared
  // Format 2 traces: the zstd raw-content dictionary of their step frames (see trace/framing.h);
  // made by the writer, empty in format 1 traces. Not part of any digest.
  std::string step_dictionary;
};

// Wall time of one step, split by phase, in milliseconds. Never part of any digest.
struct Timings {
  double data_ms = 0, forward_ms = 0, backward_ms = 0, optimizer_ms = 0, trace_ms = 0;
  double allreduce_ms = 0;  // part of backward_ms: data-parallel collectives
  // The loop's time on checkpoints after the previous step: a synchronous save, a background
  // save's staging copy, and waits for one in flight (a frame cannot hold the time spent after
  // it, as trace_ms). 0 in traces written before it existed.
  double checkpoint_ms = 0;
  // The whole step: its phases (the collectives are inside backward_ms).
  double step_ms() const { return data_ms + forward_ms + backward_ms + optimizer_ms + trace_ms + checkpoint_ms; }
  // A sum of measured durations rounded to the whole nanoseconds the clock counts (the doubles'
  // own rounding drifts by an ulp or so per addition): the trace then stores them as integers.
  static double whole_ns(double ms) { return ms >= 0 && ms < 9e9 ? std::round(ms * 1e6) / 1e6 : ms; }
};

// One module's share of a step's digests (a recorder run's; trace.digest_version 3 or 4): its own
// parameters and buffers (those named "<module>.<leaf>"), their gradients and their optimizer
// state, by the same mixed sums as the step's whole digests. "" names the model's own tensors.
struct ModuleDigest {
  std::string module;
  Digest128 param;
  Digest128 grad;
  Digest128 optim;  // zero when the step recorded no optimizer digest
  bool operator==(const ModuleDigest& o) const {
    return module == o.module && param == o.param && grad == o.grad && optim == o.optim;
  }
  bool operator!=(const ModuleDigest& o) const { return !(*this == o); }
};

struct StepRecord {
  uint64_t step = 0;  // 1-based optimizer step
  uint64_t epoch = 0;
  uint64_t batch_in_epoch = 0;
  uint32_t batch_size = 0;
  Digest128 sample_digest;    // xxh3-128 of the sample indices (int64 little-endian, in order)
  double loss = 0;            // mean loss of the effective batch
  uint32_t loss_bits = 0;     // exact float32 bits of the loss as computed
  double grad_norm_pre = 0;   // global L2 norm before clipping (after unscale)
  double grad_norm_post = 0;  // after clipping
  double lr = 0;
  double loss_scale = 1;
  Outcome outcome = Outcome::kStep;
  std::string skip_reason;  // "" for STEP; skip_text(SkipReason), or a Recorder user's own text
  Digest128 param_digest;   // all parameters and buffers, canonical (sorted by name) order
  Digest128 optim_digest;   // optimizer state in the same order, every trace.optimizer_digest_every
                            // steps (zero in between)
  Digest128 rng_digest;     // serialized RngState after the step
  // The rest of the state a later step depends on, after the step (trace.digest_version 2): loss
  // scaler, skip and spike guard windows, fired faults, batches set aside, samples seen and the
  // step of the rollback anchor. Zero when not recorded (runs from before the key existed).
  Digest128 state_digest;
  // The gradients as the optimizer used them (reduced, unscaled, clipped), every step, by their
  // mixed sums (trace.digest_version 3; a ZeRO run's ranks add their ranges' sums). Zero when not
  // recorded (versions 1 and 2).
  Digest128 grad_digest;
  std::vector<uint32_t> micro_batch_sizes;
  std::vector<double> micro_losses;
  std::vector<Digest128> rank_grad_digests;  // per rank, local gradients before any reduction
  std::vector<Digest128> rank_rng_digests;   // per rank (data parallelism), each rank's RngState after the step
  // Per module, in the model's order (a recorder run's; empty otherwise): where a divergence lies
  // without re-executing either run.
  std::vector<ModuleDigest> module_digests;
  // Filled by the trace writer: content digest over every field above except timings, and the
  // chain digest = xxh3_128(previous chain || content). Agreement at step N => equal prefixes.
  Digest128 content_digest;
  Digest128 chain_digest;
  Timings timings;
  // Collectives of this step under data parallelism (gradient buckets and the loss): like the
  // timings, informational and outside the content digest.
  uint32_t allreduce_calls = 0;
  uint64_t allreduce_bytes = 0;
};

struct EvalRecord {
  uint64_t step = 0;
  uint64_t epoch = 0;
  uint64_t samples = 0;
  double loss = 0;       // mean over the target elements (tokens, for a language model)
  double accuracy = 0;   // classifiers; -1: none (a language model)
  uint64_t tokens = 0;   // language models: target tokens evaluated (0: a classifier, or an older trace)
  uint64_t batches = 0;  // batches evaluated (0 in older traces)
  bool language_model() const { return tokens > 0; }
  // Validation perplexity exp(loss) of a language model; 0 for a classifier.
  double perplexity() const { return language_model() ? std::exp(loss) : 0; }
};

// Anything that is not a step but must not be silent: warnings, resumes, rollbacks, faults.
struct EventRecord {
  uint64_t step = 0;
  std::string kind;  // "warning", "resume", "rollback", "fault", ...
  std::string message;
};

// Whether an event describes the process rather than the training: a resume and what it noticed,
// a crash, a checkpoint note. Two runs of one config agree on every other event (training events:
// faults, guard warnings, rollbacks), whatever interrupted them.
bool is_process_event(const EventRecord& e);

// Content digest of a step: every field except timings, content_digest and chain_digest, in a
// fixed order with fixed-width little-endian encodings. state_digest and rank_rng_digests enter
// only when recorded (non-zero, non-empty), so traces from before they existed keep their chain.
Digest128 content_digest(const StepRecord& r);
Digest128 chain_digest(const Digest128& previous_chain, const Digest128& content);

}  // namespace retrace::records
