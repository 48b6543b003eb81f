// The loop: `record` trains a fresh run into a run directory (layout.h),
// `resume` continues one from its newest checkpoint that verifies. The loop is thin: it calls the
// trainer, the trace writer and the checkpointer, and reports through callbacks.
// The directory layout is in layout.h.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>

#include "data/dataset.h"
#include "run/layout.h"
#include "run/run_dir.h"
#include "records/records.h"
#include "train/config.h"
#include "train/resolved_config.h"
#include "train/registry.h"

namespace retrace::distributed {
class ProcessGroup;
}

namespace retrace::run {

struct RunCallbacks {
  std::function<void(const records::StepRecord&, uint64_t total_steps)> on_step;
  std::function<void(const records::EvalRecord&)> on_eval;
  std::function<void(const std::string&)> on_message;
  // Long work other than training steps (bisection's re-execution, memory measurement): `what` is
  // at `done` of `total` units.
  std::function<void(const std::string& what, uint64_t done, uint64_t total)> on_progress;
};

// Deliberate bugs for the negative controls of the edge tests (tests/run/edges_test.sh), which
// must catch them: a rollback to the newest checkpoint on disk (what retrace once did), and rank 1
// left with its fresh generators on resume. The CLI sets one from RETRACE_TEST_SABOTAGE
// ("rollback-newest-checkpoint", "rank1-rng-restore"); nothing else does.
enum class Sabotage : uint8_t { kNone, kRollbackNewestCheckpoint, kRank1RngRestore };

// How the "resume" event of `resume --reshard` begins ("resharded from 4 ranks x ..."): the resume
// verdict recognises a resharded trace by it.
inline constexpr const char* kReshardEventPrefix = "resharded from ";

struct LoopControl {
  // Stop right after this step, its evaluation (when one is due) and its checkpoint, as if the
  // process were killed there. 0: run to the end.
  uint64_t interrupt_at = 0;
  // Extra steps to checkpoint at, besides the config's cadence.
  std::set<uint64_t> checkpoint_at;
  // Whether stopping at interrupt_at writes a checkpoint first (replay stops without one).
  bool checkpoint_on_interrupt = true;
  // Once-only faults to treat as already fired ("crash@17"), e.g. when replaying a crashed run.
  std::set<std::string> fired;
  // resume: continue although a data or model file's sha256 is not the trace header's (the
  // change is recorded as a warning event); otherwise that is an IntegrityError.
  bool accept_changed_inputs = false;
  // resume: continue with another LibTorch than the one the trace header records (a warning
  // event says so; the later steps compare within a tolerance only); otherwise that is an IoError.
  bool accept_other_torch = false;
  Sabotage sabotage = Sabotage::kNone;
  // resume on another world size than the checkpoint's (`resume --world-size M --reshard`): the
  // global batch stays, data.batch_size becomes the checkpoint's x its world size / M (the run's
  // config.toml is rewritten with it), and the trace gets a "resume" event saying so. Bitwise
  // under runtime.invariance = "batch", within rounding otherwise (a warning says which).
  bool reshard = false;
  // resume at another runtime.zero_stage than the run's (`resume --zero-stage N`): the checkpoint
  // holds whole tensors, so either stage loads it; the run's config.toml is rewritten with it and a
  // "resume" event says so. The same bits either way (train/zero.h). nullopt: as recorded.
  std::optional<int64_t> zero_stage;
  // The live TensorBoard view: every record the trace gets also goes, as it is appended, to a new
  // event file in this directory (trace/tensorboard.h; created when missing). "": none. The
  // caller checks the directory first (trace::check_tensorboard_dir); a record readies it with the
  // run's force, so a non-empty one loses its old event files only once the run has started.
  std::string tensorboard_dir;
  // resume: the caller already holds the run directory's lock (run_lock.h), e.g. a replay that
  // laid out its scratch directory under it; otherwise resume takes it.
  bool run_locked = false;
};

struct RecordOptions {
  std::string out_dir = "run";
  bool force = false;  // replace an existing run directory
  // The run is a scratch run (replay, golden check, resume verification, accumulation grid): its
  // directory is claimed with claim_scratch_dir, so an existing one is replaced only when retrace
  // made it as a scratch directory, or with force.
  bool scratch = false;
  LoopControl control;
  distributed::ProcessGroup* process_group = nullptr;  // data parallelism: this process is one rank
  // What model.kind, data.kind and train.loss may name; nullptr: the built-ins.
  const train::Registry* registry = nullptr;
  // Replay: the inputs the recorded trace's header lists. The data set and model files must be
  // those (checked as they are loaded: one read), else IntegrityError "<inputs_what>: ..." unless
  // control.accept_changed_inputs; the changes accepted are in RunSummary::input_changes.
  const std::vector<records::FileInfo>* expected_inputs = nullptr;
  std::string inputs_what;
};

struct RunSummary {
  std::string run_dir;
  std::string trace_path;
  uint64_t first_step = 0;  // first step this process ran
  uint64_t steps = 0;       // steps this process ran
  uint64_t last_step = 0;
  uint64_t total_steps = 0;
  uint64_t skipped = 0;
  bool interrupted = false;
  double final_loss = 0;
  double test_accuracy = -1;   // -1 when no evaluation ran, or a language model's
  double eval_loss = -1;       // the last evaluation's loss; -1 when none ran
  double eval_perplexity = 0;  // the last evaluation's perplexity (language models), else 0
  double wall_seconds = 0;
  double steps_per_second = 0;
  uint64_t trace_bytes = 0;
  uint64_t checkpoints = 0;
  std::string resumed_from;                // checkpoint directory, for resume
  std::vector<std::string> input_changes;  // inputs accepted although changed (RecordOptions)
  double data_ms = 0, forward_ms = 0, backward_ms = 0, optimizer_ms = 0, trace_ms = 0, checkpoint_ms = 0;  // totals
  // Counts one step this process ran into the totals.
  void add(const records::StepRecord& step);
};

// Trains `config` (resolved on this machine: train::resolve_here) into options.out_dir. Validates
// everything (config, data set, output directory) before creating anything, so a failure never
// leaves a half-written run. An existing non-empty directory is refused (ConfigError) unless
// options.force.
RunSummary record(const train::ResolvedConfig& config, const RecordOptions& options, const RunCallbacks& callbacks);

// Continues the run in run_dir from its newest checkpoint that verifies (falling back past torn or
// corrupt ones, each reported through on_message), truncating the trace to the checkpoint's
// position after setting the frames beyond it aside, and appending a "resume" event.
RunSummary resume(const std::string& run_dir, const LoopControl& control, const RunCallbacks& callbacks,
                  distributed::ProcessGroup* process_group = nullptr,
                  const train::Registry& registry = train::builtin_registry());

// A run directory's config.toml must be there (`verb` "resume"): IoError when the directory holds
// no run at all, IntegrityError (exit 3) when the trace or checkpoints are there without it, with
// the command that writes the header's config back.
void check_config_present(const std::string& run_dir, const std::string& verb);

// A run recorded with one LibTorch continues or replays as the same bits only with the same one:
// IoError (exit 4) naming both versions and what to do when the header's libtorch_version is not
// this binary's, unless `accept` (--accept-other-torch). `verb` is "resume" or "replay".
void check_same_libtorch(const std::vector<records::KeyValue>& recorded, const std::string& trace,
                         const std::string& verb, bool accept);

// The time now as ISO 8601 UTC ("2026-12-01T14:26:20Z"): a trace header's created_utc.
std::string utc_now();

// What every trace header says of its run, whoever writes it (`retrace record` or a user's loop
// through the Recorder).
struct HeaderParts {
  std::string config_toml;  // the text RUN/config.toml holds
  std::string config_hash;  // the hash checkpoints and resumes compare (config.h's rule for a config)
  uint64_t seed = 0;
  std::vector<records::KeyValue> fingerprint;
  std::string model_description;
  std::vector<records::ParamInfo> params;
  std::vector<records::FileInfo> data_files;
};
// The one place a trace header is made: the parts, this binary's version and the time now. The
// caller adds what only a full run knows (faults, totals, ranks).
records::TraceHeader trace_header(HeaderParts parts);

// The environment fingerprint of a run's trace header: the runtime's (train/environment.h) and the
// model's own numerics settings (a TorchScript model's executor); with ranks, the process group's
// backend (on CUDA), this rank's endpoint, its peers and its launcher as information.
std::vector<records::KeyValue> run_fingerprint(const train::Config& config, const model::ModelHandle& model,
                                               uint32_t world_size, const distributed::ProcessGroup* pg = nullptr);

}  // namespace retrace::run
