#include "run/run.h"

#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <sstream>
#include <filesystem>
#include <optional>
#include <set>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/train_state.h"
#include "core/digest.h"
#include "core/error.h"
#include "core/hash_ahead.h"
#include "core/torch_compat.h"
#include "core/file_util.h"
#include "core/tensor_digest.h"
#include "distributed/process_group.h"
#include "trace/tensorboard.h"
#include "trace/trace_reader.h"
#include "trace/trace_writer.h"
#include "train/environment.h"
#include "train/faults.h"
#include "train/trainer.h"
#include "run/inputs.h"
#include "run/layout.h"
#include "run/loop_parts.h"
#include "run/memory_report.h"
#include "run/run_dir.h"

namespace retrace::run {
using namespace train;  // the run drives the training part: its types read unqualified here
namespace {
using Clock = std::chrono::steady_clock;
namespace stdfs = std::filesystem;

// The live TensorBoard view, when asked for (LoopControl::tensorboard_dir).
// A new record starts the directory afresh (with force: its old event files go); a resume adds a file.
void attach_tensorboard(trace::TraceWriter& writer, const LoopControl& control, const records::TraceHeader& h,
                        bool fresh, bool force) {
  if (control.tensorboard_dir.empty()) return;
  trace::prepare_tensorboard_dir(control.tensorboard_dir, fresh, force);
  writer.set_sink(trace::tensorboard_sink(control.tensorboard_dir, h));
}

// The data set of `config`, and when `recorded` (a trace header's inputs) is given, what changed
// since: the data files' sha256 come from the load itself (one read of the data), other recorded
// files (a TorchScript model) are hashed here. A data set that no longer loads is first checked
// against the header by hashing, so that an edited file is reported as such (IntegrityError)
// rather than as whatever the edit broke. Changes are an IntegrityError unless `accept`.
data::Dataset load_checked_data(const Registry& registry, const Config& config,
                                const std::vector<records::FileInfo>* recorded, const std::string& what, bool accept,
                                const std::string& accept_note, std::vector<InputChange>& changes,
                                const std::function<void(const std::string&)>& on_message) {
  auto refuse = [&]() {
    RETRACE_FAIL(IntegrityError, what, ": ", describe_changes(changes),
                 ". Restore the files, or pass --accept-changed-inputs to go on with them", accept_note);
  };
  data::Dataset data;
  const auto start = Clock::now();
  try {
    data = registry.load_data(config);
  } catch (const Error&) {
    if (recorded && !(changes = changed_inputs(*recorded)).empty()) refuse();
    throw;
  }
  if (recorded) {
    changes = changed_inputs(*recorded, data.files);
    if (!changes.empty() && !accept) refuse();
  }
  uint64_t bytes = 0;
  for (const auto& f : data.files) bytes += f.size;
  if (on_message) on_message("data: " + data.description + " (" + bytes_and_speed(bytes, start) + ", hashed as read)");
  return data;
}

// Whether an evaluation follows step `step`: at an epoch's end (eval.each_epoch), every
// eval.every_steps steps, and after the last step.
bool evaluation_due(const Config& config, uint64_t step, bool epoch_done, bool last) {
  const int64_t every = config.eval.every_steps;
  return last || (epoch_done && config.eval.each_epoch) || (every > 0 && step % static_cast<uint64_t>(every) == 0);
}

void run_evaluation(Trainer& trainer, trace::TraceWriter* writer, const RunCallbacks& cb, RunSummary& summary,
                    const InjectedCrash& crash) {
  records::EvalRecord e = trainer.evaluate(crash.in_evaluation(trainer, writer, cb));
  if (writer) writer->append_eval(e);
  summary.test_accuracy = e.accuracy;
  summary.eval_loss = e.loss;
  summary.eval_perplexity = e.perplexity();
  if (cb.on_eval) cb.on_eval(e);
}

// Whether a save other than the last and the interrupt's (which run on the loop) can come.
bool saves_during_run(const Config& config, const LoopControl& control) {
  return config.checkpoint.every_steps > 0 || config.checkpoint.every_seconds > 0 || !control.checkpoint_at.empty();
}

// The group on which background saves' writer threads vote, on several ranks (made on every rank
// at the same point: it connects them); null where saves stay synchronous, none can go to the
// background, or there is one rank.
std::unique_ptr<distributed::ProcessGroup> save_group_for(const Config& config, const LoopControl& control,
                                                          distributed::ProcessGroup* pg,
                                                          const std::string& sync_reason) {
  if (!pg || pg->world_size() < 2 || !config.checkpoint.async_save || !sync_reason.empty() ||
      !saves_during_run(config, control))
    return nullptr;
  return pg->side_group("retrace/checkpoint/");
}

// The loop shared by record and resume: step, trace, checkpoint, evaluate.
void run_loop(Trainer& trainer, const Config& config, trace::TraceWriter* writer, const std::string& run_dir,
              const LoopControl& control, const RunCallbacks& cb, RunSummary& summary, distributed::ProcessGroup* pg,
              Anchor anchor, bool redo_evaluation = false) {
  const auto start = Clock::now();
  CheckpointCadence cadence(config.checkpoint, control, pg);
  // With ranks, a save is sharded: every rank writes its own, and the ranks agree on the commit;
  // a background save's writer threads agree on a second group, made here on every rank.
  const std::string sync_reason = background_save_unavailable(config);
  const auto save_group = save_group_for(config, control, pg, sync_reason);
  Checkpointer checkpointer(run_dir, config.checkpoint, pg, save_group.get(), sync_reason);
  if (!sync_reason.empty() && saves_during_run(config, control) && trainer.rank() == 0)
    emit(writer, cb, trainer.step(), "checkpoint",
         "saves are synchronous although checkpoint.async = true: " + sync_reason);
  Rollback rollback(config, run_dir, control.sabotage, std::move(anchor));
  const InjectedCrash crash(run_dir);
  double last_write_ms = 0;
  summary.first_step = trainer.step() + 1;
  summary.total_steps = trainer.total_steps();
  const bool digests = config.trace.enabled && config.trace.digests;
  for (const auto& id : control.fired) trainer.state().fired.insert(id);
  // A resume from a checkpoint whose step's evaluation was due redoes it first (killed during it,
  // or it ran and was set aside with the trace bytes after the checkpoint).
  if (redo_evaluation) run_evaluation(trainer, writer, cb, summary, crash);

  while (trainer.step() < trainer.total_steps()) {
    const uint64_t epoch_before = trainer.cursor().epoch;
    records::StepRecord rec = trainer.run_step(digests);
    // trace_ms: digests of this step plus writing the previous frame (a frame cannot hold the
    // time of its own write).
    rec.timings.trace_ms += last_write_ms;
    rec.timings.checkpoint_ms = records::Timings::whole_ns(checkpointer.take_loop_ms());
    if (writer) {
      auto t = Clock::now();
      writer->append_step(rec);
      last_write_ms = std::chrono::duration<double, std::milli>(Clock::now() - t).count();
    }
    summary.add(rec);
    if (cb.on_step) cb.on_step(rec, trainer.total_steps());
    for (const auto& [kind, text] : trainer.take_events()) emit(writer, cb, rec.step, kind, text);

    // A background save that finished is reported here; one in flight must land before a crash
    // (which falls between two saves) and before a rollback (which may load the newest checkpoint).
    const bool spike = records::skip_reason_of(rec.skip_reason) == records::SkipReason::kLossSpike;
    checkpointer.take_finished(writer, rec.step, cb, spike || trainer.crash_due(rec.step).has_value());
    if (rollback.after_step(trainer, rec, writer, cb)) continue;
    crash.after_step(trainer, rec.step, writer, cb);

    const uint64_t s = trainer.step();
    const bool last = s == trainer.total_steps();
    const bool interrupt = control.interrupt_at != 0 && s == control.interrupt_at;
    const bool epoch_done = trainer.cursor().epoch != epoch_before;
    const bool eval_due = evaluation_due(config, s, epoch_done, last);
    rollback.keep_anchor_if_due(trainer, s);

    if (cadence.due(s, last, interrupt)) {
      // The last save and the interrupt's are waited for anyway: they run on the loop.
      if (checkpointer.background() && !last && !interrupt)
        checkpointer.save_in_background(trainer, writer, rec, eval_due, rollback.anchor(), cb);
      else checkpointer.save(trainer, writer, s, eval_due, rollback.anchor(), cb);
      summary.checkpoints += 1;
      cadence.saved();
    }
    // An interrupt stops after the step's checkpoint and evaluation: an interrupted run's
    // evaluations are the uninterrupted run's.
    // An evaluation overlaps a background save; the injected crash in it lands after the save.
    if (eval_due && trainer.crash_in_eval_due(s)) checkpointer.take_finished(writer, s, cb, /*wait=*/true);
    if (eval_due) run_evaluation(trainer, writer, cb, summary, crash);
    if (interrupt) {
      summary.interrupted = true;
      break;
    }
  }
  checkpointer.take_finished(writer, trainer.step(), cb, /*wait=*/true);
  if (writer) {
    writer->sync();
    summary.trace_bytes = writer->bytes_written();
  }
  summary.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  summary.steps_per_second = summary.wall_seconds > 0 ? summary.steps / summary.wall_seconds : 0;
}
}  // namespace

namespace {
// A resume onto another layout: the config to continue under, the checkpoint's layout, and the note
// for the trace ("" when nothing changes).
struct ReshardPlan {
  ResolvedConfig next;
  ckpt::Reshard from;
  std::string note;
};

// `resume --reshard` onto `world` ranks: the checkpoint's world size (its newest manifest), the
// config it was written under (the run's config.toml is at the checkpoint's layout, or at this
// layout when an earlier reshard onto `world` stopped before its first checkpoint), and the next
// config: the recorded one at the same global batch on `world` ranks.
// `zero_stage` (resume --zero-stage): the ZeRO stage to continue at, and the candidates include
// the other stage (the run's config.toml is at the checkpoint's, or at this one's when an earlier
// switch stopped before its first checkpoint).
ReshardPlan plan_reshard(const ResolvedConfig& recorded, const std::string& root, uint32_t world,
                         std::optional<int64_t> zero_stage = std::nullopt, bool allow_reshard = true) {
  Config config = recorded.config;  // becomes the plan's next config
  std::string note;
  const std::optional<ckpt::Manifest> newest = ckpt::newest_checkpoint_manifest(root);
  RETRACE_CHECK(newest.has_value(), IntegrityError, "resume --reshard: no checkpoint with a readable manifest in ",
                root);
  const uint32_t n = newest->world_size;
  RETRACE_CHECK(allow_reshard || n == world, ConfigError, "the newest checkpoint in ", root, " was written by ", n,
                " ranks and this resume runs ", world, "; resume with --world-size ", n, " or add --reshard");
  // Candidates for the layout config.toml describes: the checkpoint's world, or this one.
  Config source = config;
  bool found = false;
  std::vector<int64_t> stages = {config.runtime.zero_stage};
  if (zero_stage && *zero_stage != config.runtime.zero_stage) stages.push_back(*zero_stage);
  for (uint32_t w : {n, world}) {
    const int64_t scaled = config.data.batch_size * static_cast<int64_t>(w);
    if (found || scaled % static_cast<int64_t>(n) != 0) continue;
    for (int64_t stage : stages) {
      Config c = config;
      c.data.batch_size = scaled / static_cast<int64_t>(n);
      c.runtime.zero_stage = stage;
      if (newest->config_hash == config_hash(to_toml(c))) {
        source = c;
        found = true;
        break;
      }
    }
  }
  if (zero_stage) {
    RETRACE_CHECK(*zero_stage == 1 || config.runtime.zero_reduce == ZeroReduce::kAllReduce, ConfigError,
                  "resume --zero-stage ", *zero_stage,
                  ": this run reduces its gradients by ZeRO ranges "
                  "(runtime.zero_reduce = \"reduce_scatter\"), which only stage 1 has, and a recorded run cannot "
                  "change how its gradients are summed. Resume without --zero-stage");
    config.runtime.zero_stage = *zero_stage;
    RETRACE_CHECK(*zero_stage == 0 || !config.trace.enabled || !config.trace.digests ||
                      config.trace.digest_version >= 3,
                  ConfigError, "resume --zero-stage 1: this run records trace.digest_version ",
                  config.trace.digest_version,
                  ", whose optimizer digests need every rank to hold all of the state; "
                  "ZeRO needs digests that add up over slices (trace.digest_version = 3 or 4), which a recorded run "
                  "cannot change. Resume without --zero-stage");
  }
  RETRACE_CHECK(found, ConfigError, "resume --reshard: the newest checkpoint in ", root, " (", n,
                " ranks) was made with another config than the run's config.toml at data.batch_size ",
                config.data.batch_size, " and train.accum_steps ", config.train.accum_steps,
                "; resume with the run directory's own config.toml");
  const int64_t global = source.data.batch_size * source.train.accum_steps * static_cast<int64_t>(n);
  const int64_t per_rank = source.data.batch_size * static_cast<int64_t>(n);
  RETRACE_CHECK(per_rank % static_cast<int64_t>(world) == 0, ConfigError, "resume --reshard: the global batch of ",
                global, " samples (data.batch_size ", source.data.batch_size, " x train.accum_steps ",
                source.train.accum_steps, " x ", n, " ranks) does not split into ", world,
                " ranks of whole micro-batches of train.accum_steps = ", source.train.accum_steps,
                "; choose a world size that divides ", per_rank);
  config.data.batch_size = per_rank / static_cast<int64_t>(world);
  // An evaluation at "the micro-batch" keeps the batch it had: its sums are grouped by it.
  if (config.eval.batch_size == 0) config.eval.batch_size = source.data.batch_size;
  if (config.runtime.invariance == Invariance::kBatch)
    RETRACE_CHECK(config.data.batch_size % config.runtime.invariance_chunk == 0, ConfigError, "resume --reshard onto ",
                  world, " ranks: micro-batches of data.batch_size = ", config.data.batch_size,
                  " samples do not split into whole chunks of runtime.invariance_chunk = ",
                  config.runtime.invariance_chunk, "; choose a world size whose micro-batch is a multiple of it");
  note = n == world && source.data.batch_size == config.data.batch_size
             ? std::string()
             : kReshardEventPrefix + std::to_string(n) + " ranks x data.batch_size " +
                   std::to_string(source.data.batch_size) + " to " + std::to_string(world) +
                   " ranks x data.batch_size " + std::to_string(config.data.batch_size) + " (train.accum_steps " +
                   std::to_string(config.train.accum_steps) + ", global batch " + std::to_string(global) + "): " +
                   (config.runtime.invariance == Invariance::kBatch
                        ? "bitwise (runtime.invariance = \"batch\")"
                        : "within rounding (runtime.invariance = \"none\")");
  // ZeRO changes where the optimizer state lives, not a bit of it (zero.h): the checkpoint holds
  // whole tensors in either layout.
  if (source.runtime.zero_stage != config.runtime.zero_stage)
    note += std::string(note.empty() ? "" : "; ") + "runtime.zero_stage " + std::to_string(source.runtime.zero_stage) +
            " -> " + std::to_string(config.runtime.zero_stage) +
            ": the same bits (only where the optimizer state lives changes)";
  return ReshardPlan{resolved(std::move(config)), ckpt::Reshard{n, config_hash(to_toml(source))}, std::move(note)};
}
}  // namespace

void check_config_present(const std::string& run_dir, const std::string& verb) {
  if (stdfs::exists(config_path(run_dir))) return;
  const bool has_trace = stdfs::exists(trace_path(run_dir));
  const size_t checkpoints = ckpt::list_step_dirs(checkpoint_root(run_dir)).size();
  RETRACE_CHECK(!has_trace && checkpoints == 0, IntegrityError, "cannot ", verb, " ", run_dir,
                ": its config.toml is "
                "missing, but its ",
                has_trace ? "trace" : "", has_trace && checkpoints ? " and " : "",
                checkpoints ? std::to_string(checkpoints) + " checkpoint director" + (checkpoints == 1 ? "y" : "ies")
                            : std::string(),
                " are there: the file was removed after the run began. Write back the config the run was recorded "
                "with: `retrace inspect ",
                trace_path(run_dir), " --config > ", config_path(run_dir),
                "` (a run resumed with --reshard or --zero-stage then needs those flags again)");
  RETRACE_FAIL(IoError, "cannot ", verb, " ", run_dir,
               ": no run was started there (it has no config.toml, the first "
               "file `retrace record` writes: the record was stopped before it began, or this is another directory); "
               "start the run with `retrace record --out ",
               run_dir,
               " --force` (--force replaces what the directory "
               "holds)");
}

void check_same_libtorch(const std::vector<records::KeyValue>& recorded, const std::string& trace,
                         const std::string& verb, bool accept) {
  std::string theirs;
  for (const auto& kv : recorded)
    if (kv.key == "libtorch_version") theirs = kv.value;
  const std::string ours = compat::libtorch_version();
  RETRACE_CHECK(theirs.empty() || theirs == ours || accept, IoError, "cannot ", verb, " ", trace,
                ": it was recorded with LibTorch ", theirs, " and this retrace is built against LibTorch ", ours,
                ", whose kernels give other bits. Use a retrace built against LibTorch ", theirs,
                ", or pass --accept-other-torch to ", verb, " anyway (the steps then compare within a tolerance only)");
}

std::vector<records::KeyValue> run_fingerprint(const Config& config, const model::ModelHandle& model,
                                               uint32_t world_size, const distributed::ProcessGroup* pg) {
  std::vector<records::KeyValue> f = fingerprint(config.runtime, world_size);
  f.insert(f.end(), model.numerics.begin(), model.numerics.end());
  if (owned_step(config, world_size)) {
    // Every kernel of the step is retrace's (portable version 2): the LibTorch build and its BLAS
    // do not change the bits, so they are information, and a run recorded on one build resumes,
    // replays and checks its goldens bitwise on the other.
    for (auto& kv : f)
      if (kv.key == "libtorch_version" || kv.key == "blas" || kv.key == "blas_core") kv.key = "info." + kv.key;
    f.push_back({"model_kernels", "owned"});
  }
  if (pg) {
    // NCCL picks its reduction algorithm by version and topology: numerics on CUDA. Gloo's ring
    // order is fixed by the world size, already a numerics field.
    if (config.runtime.device == DeviceKind::kCuda) f.push_back({"dist_backend", pg->backend()});
    f.push_back({"info.dist_endpoint", pg->endpoint().describe()});
    f.push_back({"info.dist_peers", pg->peers()});
    f.push_back({"info.launcher", pg->launcher().describe()});
    for (const char* var : {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "NCCL_ALGO", "NCCL_PROTO"}) {
      const char* v = std::getenv(var);
      f.push_back({std::string("info.env.") + var, v ? v : ""});
    }
  }
  return f;
}

RunSummary record(const ResolvedConfig& resolved_config, const RecordOptions& options, const RunCallbacks& cb) {
  const Config& config = resolved_config.config;
  apply_environment(config.runtime);
  const bool lead = !options.process_group || options.process_group->rank() == 0;
  if (lead) RunLock::refuse_if_held(options.out_dir, options.scratch ? "scratch run" : "record");
  if (cb.on_message && lead) cb.on_message(numerics_summary(config.runtime));
  // config.toml and the header hold every key (legacy-valued ones too, so that `record --config
  // RUN/config.toml` reproduces the run); the hash is of the canonical text (train/config.h).
  const std::string& config_text = resolved_config.complete_toml;

  // Everything that can fail on bad input happens before the run directory is touched.
  const Registry& registry = options.registry ? *options.registry : builtin_registry();
  registry.check(config);
  std::vector<InputChange> changes;
  data::Dataset data = load_checked_data(registry, config, options.expected_inputs, options.inputs_what,
                                         options.control.accept_changed_inputs, "", changes,
                                         lead ? cb.on_message : nullptr);
  check_memory_fits(config, data.vocab_size);
  distributed::ProcessGroup* pg = options.process_group;
  const uint32_t rank = pg ? pg->rank() : 0, world = pg ? pg->world_size() : 1;
  Trainer trainer(resolved_config, data, registry, pg);
  // Rank 0 holds the run directory's lock until the run ends: the one writer (run_lock.h).
  RunLock lock;
  if (rank == 0) lock = create_run_dir(options.out_dir, options.force, options.scratch, config_text);
  if (pg) pg->barrier();

  RunSummary summary;
  for (const auto& c : changes) summary.input_changes.push_back(c.path);
  summary.run_dir = options.out_dir;
  summary.trace_path = trace_path(options.out_dir);

  std::optional<trace::TraceWriter> writer;
  if (config.trace.enabled && rank == 0) {
    HeaderParts parts{config_text,
                      resolved_config.hash,
                      static_cast<uint64_t>(config.seed),
                      run_fingerprint(config, trainer.model(), world, pg),
                      trainer.model().description,
                      train::param_info(trainer.state()),
                      data.files};
    parts.data_files.insert(parts.data_files.end(), trainer.model().files.begin(), trainer.model().files.end());
    records::TraceHeader h = trace_header(std::move(parts));
    h.faults = config.faults.parsed;
    h.total_steps = trainer.total_steps();
    h.world_size = world;
    h.effective_batch = static_cast<uint64_t>(config.data.batch_size * config.train.accum_steps) * world;
    writer.emplace(trace::TraceWriter::create(summary.trace_path, h, static_cast<int>(config.trace.zstd_level),
                                              static_cast<uint32_t>(config.train.accum_steps)));
    attach_tensorboard(*writer, options.control, h, true, options.force);
  }
  run_loop(trainer, config, writer ? &*writer : nullptr, options.out_dir, options.control, cb, summary, pg, {});
  return summary;
}

namespace {

// What a resume reads and checks before it loads a checkpoint: the run's config (resharded when
// asked), the trace as it is on disk, and the data set, checked against the trace's inputs.
struct ResumeInputs {
  uint32_t rank = 0, world = 1;
  ResolvedConfig resolved;  // the run's config.toml resolved here (resharded when asked)
  // The trace as it is on disk, opened once: its header, and (rank 0, which writes it) the intact
  // frames that a checkpoint must continue.
  std::optional<trace::TraceReader> before;
  std::optional<ckpt::Reshard> reshard;
  std::string reshard_note;
  std::vector<InputChange> changes;  // inputs accepted although changed
  data::Dataset data;
  const Config& config() const { return resolved.config; }
  bool writes_trace() const { return config().trace.enabled && rank == 0; }
};

ResumeInputs check_resume_inputs(const std::string& run_dir, const LoopControl& control, const RunCallbacks& cb,
                                 distributed::ProcessGroup* pg, const Registry& registry) {
  ResumeInputs in;
  in.rank = pg ? pg->rank() : 0;
  in.world = pg ? pg->world_size() : 1;
  in.resolved = resolve_here(load_config(config_path(run_dir), {}, ConfigSource::kRecorded));
  const Config& config = in.resolved.config;  // the member: still it after a reshard plan replaces the value
  apply_environment(config.runtime);
  const bool speaks = cb.on_message && in.rank == 0;
  if (speaks) cb.on_message(numerics_summary(config.runtime));

  // Before anything is changed on disk: the inputs (data and model files) must be the ones the
  // trace was recorded with (checked as the data set is loaded, below).
  std::optional<std::vector<records::FileInfo>> recorded_inputs;
  if (stdfs::exists(trace_path(run_dir))) {
    in.before.emplace(trace::TraceReader::open(trace_path(run_dir)));
    check_same_libtorch(in.before->header().fingerprint, trace_path(run_dir), "resume", control.accept_other_torch);
    recorded_inputs = in.before->header().data_files;
  }
  if (control.reshard || control.zero_stage) {
    ReshardPlan plan = plan_reshard(in.resolved, checkpoint_root(run_dir), in.world, control.zero_stage,
                                    control.reshard);
    in.resolved = std::move(plan.next);
    in.reshard = std::move(plan.from);
    in.reshard_note = std::move(plan.note);
    if (speaks && !in.reshard_note.empty()) cb.on_message(in.reshard_note);
    if (control.reshard && config.runtime.invariance != Invariance::kBatch && speaks)
      cb.on_message(
          "warning: runtime.invariance is \"none\": the resharded run continues within float rounding of "
          "the uninterrupted one, not bitwise (record with --set runtime.invariance=batch for equal bits)");
  }
  registry.check(config);
  in.data = load_checked_data(registry, config, recorded_inputs ? &*recorded_inputs : nullptr,
                              "cannot resume " + run_dir, control.accept_changed_inputs,
                              " (the change is recorded in the trace)", in.changes,
                              in.rank == 0 ? cb.on_message : nullptr);
  check_memory_fits(config, in.data.vocab_size);
  RETRACE_CHECK(!in.writes_trace() || in.before.has_value(), IntegrityError, "cannot resume ", run_dir, ": its trace ",
                trace_path(run_dir),
                " is missing; the checkpoints are kept, but the run's record cannot continue "
                "without it. Restore the trace, or start again with `retrace record --force`");
  return in;
}

struct ChosenCheckpoint {
  ckpt::RestoredState restored;
  std::vector<std::pair<std::string, std::string>> skipped;  // newer ones passed over, and why
};

// The newest checkpoint that verifies, parses and continues the trace, loaded into `trainer`;
// this rank's shard is read and hashed once. Every rank continues from rank 0's choice.
ChosenCheckpoint choose_checkpoint(const std::string& run_dir, ResumeInputs& in, Trainer& trainer,
                                   const LoopControl& control, const RunCallbacks& cb, distributed::ProcessGroup* pg) {
  const rng::RngState fresh = trainer.rng_state();
  ChosenCheckpoint chosen;
  const auto load_start = Clock::now();
  // A checkpoint must sit on a frame boundary of the intact trace with the same chain digest
  // there; one that does not (the trace was cut short after it, or it belongs to another trace) is
  // skipped for an older one like a damaged checkpoint. Rank 0 judges, and the ranks agree.
  // It is judged on the manifest, before any shard is read (a checkpoint past a cut costs no
  // read of its bytes); every rank passes the check when the trace is on, for the ranks' round.
  const bool writes_trace = in.writes_trace();
  ckpt::ManifestCheck continues_trace;
  if (in.config().trace.enabled)
    continues_trace = [&before = in.before, writes_trace](const ckpt::Manifest& m) {
      if (writes_trace && before)
        before->check_continues(m.trace_position,
                                parse_digest_hex(m.trace_chain_hex, "the manifest", "trace_chain_hex"));
    };
  std::optional<ckpt::RestoredState> loaded = ckpt::load_newest_checkpoint(trainer.state(), trainer.state_context(),
                                                                           checkpoint_root(run_dir), &chosen.skipped,
                                                                           in.reshard ? &*in.reshard : nullptr, pg,
                                                                           continues_trace, /*in_place=*/true);
  if (!writes_trace) in.before.reset();  // only the trace's writer keeps it (not through the training loop)
  const bool speaks = cb.on_message && in.rank == 0;
  if (loaded && speaks)
    cb.on_message("loaded " + loaded->dir + " (" + (in.world > 1 ? "rank 0: " : "") +
                  bytes_and_speed(loaded->bytes_read, load_start) +
                  (in.world > 1 ? ", of the checkpoint's " + mb_text(directory_bytes(loaded->dir)) : std::string()) +
                  ", verified while read" +
                  (hash_ahead::stats().taken > 0 ? std::string(", its sha256 computed ahead by the launcher") : "") +
                  ")");
  for (const auto& [dir, why] : chosen.skipped)
    if (speaks) cb.on_message("skipped checkpoint " + dir + ": " + why);
  RETRACE_CHECK(loaded.has_value(), IntegrityError, "no complete checkpoint in ", checkpoint_root(run_dir),
                chosen.skipped.empty() ? " (there is none)" : " (all failed verification, see above)",
                "; start again with `retrace record --force`");
  chosen.restored = std::move(*loaded);
  if (pg) {
    // Every rank must continue from the same checkpoint: rank 0's wins.
    const auto picks = pg->allgather(chosen.restored.dir);
    RETRACE_CHECK(picks[0] == chosen.restored.dir, IntegrityError, "rank ", in.rank, " picked ", chosen.restored.dir,
                  " but rank 0 picked ", picks[0], "; are the ranks looking at the same run directory?");
  }
  if (in.rank == 1 && control.sabotage == Sabotage::kRank1RngRestore)
    rng::restore_torch(fresh, cuda_index(in.config().runtime));
  // The run directory's config is the resharded one from now on (its checkpoints will be).
  if (in.reshard && in.rank == 0) fs::write_file_atomic(config_path(run_dir), in.resolved.complete_toml);
  return chosen;
}

// Rank 0's trace, continued from the chosen checkpoint: the frames after its position set aside,
// and the resume, what it passed over, the changed inputs and other numerics said as events.
std::optional<trace::TraceWriter> reopen_trace(const std::string& run_dir, ResumeInputs& in,
                                               const ChosenCheckpoint& chosen, Trainer& trainer,
                                               const LoopControl& control, const RunCallbacks& cb,
                                               distributed::ProcessGroup* pg) {
  std::optional<trace::TraceWriter> writer;
  if (!in.writes_trace()) return writer;
  const ckpt::RestoredState& restored = chosen.restored;
  const auto& skipped = chosen.skipped;
  const std::string side = set_aside_path(run_dir), path = trace_path(run_dir);
  // The checkpoint continues the trace (checked while it was chosen): the frames after its
  // position are set aside, and an incomplete one at the end (a write cut short) is kept in
  // trace.set-aside.rtrace.tail-N (TraceWriter::resume).
  const records::TraceHeader header = in.before->header();
  const std::vector<records::KeyValue>& recorded = header.fingerprint;
  const uint64_t intact = in.before->valid_bytes(), on_disk = stdfs::file_size(path);
  in.before.reset();
  writer.emplace(trace::TraceWriter::resume(path, restored.position.bytes, restored.position.chain, trainer.step(),
                                            side, static_cast<int>(in.config().trace.zstd_level)));
  attach_tensorboard(*writer, control, header, false, false);
  std::string msg = "resumed from " + restored.dir + " at step " + std::to_string(trainer.step());
  if (intact > restored.position.bytes)
    msg += "; " + std::to_string(intact - restored.position.bytes) +
           " trace bytes written after that checkpoint were set aside in " + side;
  if (on_disk > intact)
    msg += "; the trace was cut short: its last " + std::to_string(on_disk - intact) +
           " bytes, an incomplete frame, were kept in " + side + ".tail-" + std::to_string(intact);
  if (!skipped.empty()) {
    msg += "; passed over newer checkpoint" + std::string(skipped.size() > 1 ? "s" : "") + " ";
    for (size_t i = 0; i < skipped.size(); ++i)
      msg += (i ? ", " : "") + stdfs::path(skipped[i].first).filename().string();
    msg += " (see the reasons above)";
  }
  writer->append_event({trainer.step(), "resume", msg});
  if (cb.on_message) cb.on_message((on_disk > intact || !skipped.empty() ? "warning: " : "") + msg);
  if (in.reshard && !in.reshard_note.empty()) writer->append_event({trainer.step(), "resume", in.reshard_note});
  if (!in.changes.empty()) {
    const std::string warn = "resumed with changed inputs (--accept-changed-inputs): " + describe_changes(in.changes);
    writer->append_event({trainer.step(), "resume", warn});
    if (cb.on_message) cb.on_message("warning: " + warn);
  }
  // The header's fingerprint is the first process's; a resume under other numerics (another
  // machine in native mode, another kernel set in the environment) is said and recorded.
  const auto now = run_fingerprint(in.config(), trainer.model(), in.world, pg);
  if (const auto keys = records::numerics_differences(recorded, now); !keys.empty()) {
    std::string what;
    for (const auto& k : keys) {
      auto value = [&](const std::vector<records::KeyValue>& f) {
        for (const auto& kv : f)
          if (kv.key == k) return kv.value;
        return std::string("(absent)");
      };
      what += (what.empty() ? "" : ", ") + k + " " + value(recorded) + " -> " + value(now);
    }
    const std::string warn = "resumed under other numerics than the trace header records (" + what + "): steps after " +
                             std::to_string(trainer.step()) + " compare bitwise only with runs under the new numerics";
    writer->append_event({trainer.step(), "resume", warn});
    if (cb.on_message) cb.on_message("warning: " + warn);
  }
  return writer;
}

}  // namespace

RunSummary resume(const std::string& run_dir, const LoopControl& control, const RunCallbacks& cb,
                  distributed::ProcessGroup* pg, const Registry& registry) {
  RETRACE_CHECK(stdfs::is_directory(run_dir), IoError, "cannot resume ", run_dir,
                ": there is no such directory; "
                "give the --out directory of a `retrace record` run");
  // Rank 0 holds the run directory's lock until the run ends, taken before anything is read that
  // another writer could be changing (run_lock.h).
  RunLock lock;
  const uint32_t rank = pg ? pg->rank() : 0;
  if (rank == 0 && !control.run_locked) lock = RunLock::acquire(run_dir, "resume");
  check_config_present(run_dir, "resume");
  ResumeInputs in = check_resume_inputs(run_dir, control, cb, pg, registry);
  // The checkpoint sets every parameter and generator: no initialization draws, and no fit forward
  // where the recording ran it over the same built-in model, loss and inputs.
  const bool builtin = (in.config().model.kind == "mlp" || in.config().model.kind == "gpt") &&
                       in.config().train.loss == "cross_entropy";
  Trainer trainer(in.resolved, in.data, registry, pg, ModelStart{false, !(builtin && in.changes.empty())});
  ChosenCheckpoint chosen = choose_checkpoint(run_dir, in, trainer, control, cb, pg);
  InjectedCrash(run_dir).load_fired(trainer);

  RunSummary summary;
  summary.run_dir = run_dir;
  summary.trace_path = trace_path(run_dir);
  summary.resumed_from = chosen.restored.dir;
  for (const auto& c : in.changes) summary.input_changes.push_back(c.path);
  std::optional<trace::TraceWriter> writer = reopen_trace(run_dir, in, chosen, trainer, control, cb, pg);
  const bool redo_evaluation = chosen.restored.extra.count(kEvalDueKey) > 0;
  run_loop(trainer, in.config(), writer ? &*writer : nullptr, run_dir, control, cb, summary, pg,
           std::move(chosen.restored.anchor), redo_evaluation);
  return summary;
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

records::TraceHeader trace_header(HeaderParts parts) {
  records::TraceHeader h;
  h.retrace_version = retrace_version();
  h.config_toml = std::move(parts.config_toml);
  h.config_hash = std::move(parts.config_hash);
  h.seed = parts.seed;
  h.fingerprint = std::move(parts.fingerprint);
  h.model_description = std::move(parts.model_description);
  h.params = std::move(parts.params);
  h.data_files = std::move(parts.data_files);
  h.created_utc = utc_now();
  return h;
}

}  // namespace retrace::run
