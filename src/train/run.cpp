#include "train/run.h"

#include <torch/torch.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <optional>

#include "core/digest.h"
#include "core/error.h"
#include "core/file_util.h"
#include "data/fashion_mnist.h"
#include "trace/trace_writer.h"
#include "train/environment.h"
#include "train/trainer.h"

namespace retrace::train {
namespace {
using Clock = std::chrono::steady_clock;
namespace stdfs = std::filesystem;

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

void prepare_run_dir(const std::string& dir, bool force) {
  std::error_code ec;
  if (stdfs::exists(dir, ec)) {
    RETRACE_CHECK(stdfs::is_directory(dir, ec), ConfigError, "output path ", dir,
                  " exists and is not a directory; choose another --out");
    bool empty = stdfs::is_empty(dir, ec);
    if (!empty) {
      RETRACE_CHECK(force, ConfigError, "run directory ", dir,
                    " already exists; pass --force to replace it, `retrace resume ", dir,
                    "` to continue it, or choose another --out");
      for (const auto& entry : stdfs::directory_iterator(dir)) stdfs::remove_all(entry.path(), ec);
      RETRACE_CHECK(!ec, IoError, "cannot clear run directory ", dir, ": ", ec.message());
    }
  }
  fs::make_writable_dir(dir);
}
}  // namespace

RunSummary record(Config config, const RecordOptions& options, const RunCallbacks& cb) {
  resolve_threads(config.runtime);
  apply_environment(config.runtime);
  const std::string config_text = to_toml(config);

  // Everything that can fail on bad input happens before the run directory is touched.
  data::FashionMnist data = data::load_fashion_mnist(config.data.dir);
  Trainer trainer(config, data);
  {
    // Fail early on an unwritable parent rather than after training.
    stdfs::path parent = stdfs::absolute(options.out_dir).parent_path();
    RETRACE_CHECK(stdfs::exists(parent), IoError, "cannot create run directory ", options.out_dir,
                  ": parent directory ", parent.string(), " does not exist");
  }
  prepare_run_dir(options.out_dir, options.force);
  fs::write_file_atomic((stdfs::path(options.out_dir) / "config.toml").string(), config_text);

  RunSummary summary;
  summary.run_dir = options.out_dir;
  summary.trace_path = (stdfs::path(options.out_dir) / "trace.rtrace").string();

  std::optional<trace::TraceWriter> writer;
  if (config.trace.enabled) {
    trace::TraceHeader h;
    h.retrace_version = retrace_version();
    h.config_toml = config_text;
    h.config_hash = sha256_hex(config_text.data(), config_text.size());
    h.seed = static_cast<uint64_t>(config.seed);
    h.fingerprint = fingerprint(config.runtime, 1);
    h.model_description = trainer.model()->describe();
    h.params = trainer.param_info();
    h.data_files = data.files;
    h.total_steps = trainer.total_steps();
    h.world_size = 1;
    h.created_utc = utc_now();
    writer.emplace(trace::TraceWriter::create(summary.trace_path, h, static_cast<int>(config.trace.zstd_level)));
  }

  const auto start = Clock::now();
  double last_trace_ms = 0;
  bool evaluated_at_end = false;
  while (trainer.step() < trainer.total_steps()) {
    const uint64_t epoch_before = trainer.cursor().epoch;
    trace::StepRecord rec = trainer.run_step(config.trace.enabled && config.trace.digests);
    // trace_ms: digests of this step plus writing the previous frame (this frame's own write
    // time is known only after it is written).
    rec.timings.trace_ms += last_trace_ms;
    if (writer) {
      auto t = Clock::now();
      writer->append_step(rec);
      last_trace_ms = std::chrono::duration<double, std::milli>(Clock::now() - t).count();
    }
    summary.steps += 1;
    summary.skipped += rec.outcome == trace::Outcome::kSkip ? 1 : 0;
    summary.final_loss = rec.loss;
    summary.data_ms += rec.timings.data_ms;
    summary.forward_ms += rec.timings.forward_ms;
    summary.backward_ms += rec.timings.backward_ms;
    summary.optimizer_ms += rec.timings.optimizer_ms;
    summary.trace_ms += rec.timings.trace_ms;
    if (cb.on_step) cb.on_step(rec, trainer.total_steps());

    const bool epoch_done = trainer.cursor().epoch != epoch_before;
    const bool last = trainer.step() == trainer.total_steps();
    if ((epoch_done && config.train.eval_each_epoch) || last) {
      trace::EvalRecord e = trainer.evaluate();
      if (writer) writer->append_eval(e);
      summary.test_accuracy = e.accuracy;
      if (cb.on_eval) cb.on_eval(e);
      evaluated_at_end = last;
    }
  }
  (void)evaluated_at_end;
  if (writer) {
    writer->sync();
    summary.trace_bytes = writer->bytes_written();
  }
  summary.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  summary.steps_per_second = summary.wall_seconds > 0 ? summary.steps / summary.wall_seconds : 0;
  return summary;
}

}  // namespace retrace::train
