#include "trace/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <boost/crc.hpp>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <set>
#include <iostream>
#include <system_error>

#include "core/error.h"
#include "core/file_util.h"
#include "core/le.h"
#include "trace/fd_io.h"
#include "tensorboard_event.pb.h"  // generated from tensorboard_event.proto

namespace retrace::trace {
namespace {

namespace stdfs = std::filesystem;
namespace pb = retrace::tensorboard;

constexpr const char* kFilePrefix = "events.out.tfevents.";

// TensorBoard's record framing checksums: CRC32C (Castagnoli), masked so that a CRC of data that
// holds CRCs is not itself trivially structured.
uint32_t masked_crc32c(const void* data, size_t n) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, n);
  const uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// Appends one framed record holding `ev` to `out`.
void frame_event(const pb::Event& ev, std::string& out) {
  const std::string data = ev.SerializeAsString();
  uint8_t len[8];
  put_u64(len, data.size());
  uint8_t crc[4];
  out.append(reinterpret_cast<const char*>(len), 8);
  put_u32(crc, masked_crc32c(len, 8));
  out.append(reinterpret_cast<const char*>(crc), 4);
  out += data;
  put_u32(crc, masked_crc32c(data.data(), data.size()));
  out.append(reinterpret_cast<const char*>(crc), 4);
}

// Builds the events of records: one Event per record, its values under the stable tags.
class EventEncoder {
 public:
  // Appends the file's first event.
  void file_version(double wall, std::string& out) {
    pb::Event ev;
    ev.set_wall_time(wall);
    ev.set_file_version("brain.Event:2");
    frame_event(ev, out);
  }
  void header(const records::TraceHeader& h, double wall, std::string& out) {
    Batch b(*this, 0, wall);
    b.text("run/config", "```\n" + h.config_toml + "```");
    std::string fp;
    for (const auto& kv : h.fingerprint) fp += "    " + kv.key + " = " + kv.value + "\n";
    b.text("run/fingerprint", fp);
    b.write(out);
  }
  void step(const records::StepRecord& r, double wall, std::string& out) {
    Batch b(*this, r.step, wall);
    const bool skip = r.outcome == records::Outcome::kSkip;
    b.scalar("train/loss", r.loss);
    b.scalar("train/learning_rate", r.lr);
    b.scalar("train/grad_norm_pre_clip", r.grad_norm_pre);
    b.scalar("train/grad_norm_post_clip", r.grad_norm_post);
    b.scalar("train/loss_scale", r.loss_scale);
    b.scalar("train/skipped", skip ? 1.0 : 0.0);
    if (skip) b.text("train/skip_reason", r.skip_reason);
    const records::Timings& t = r.timings;
    b.scalar("time/step_ms", t.step_ms());
    b.scalar("time/data_ms", t.data_ms);
    b.scalar("time/forward_ms", t.forward_ms);
    b.scalar("time/backward_ms", t.backward_ms);
    b.scalar("time/optimizer_ms", t.optimizer_ms);
    b.scalar("time/trace_ms", t.trace_ms);
    b.scalar("time/allreduce_ms", t.allreduce_ms);
    b.scalar("time/checkpoint_ms", t.checkpoint_ms);
    b.write(out);
  }
  void eval(const records::EvalRecord& e, double wall, std::string& out) {
    Batch b(*this, e.step, wall);
    b.scalar("eval/loss", e.loss);
    if (e.accuracy >= 0) b.scalar("eval/accuracy", e.accuracy);  // none for a language model
    if (e.language_model()) b.scalar("eval/perplexity", e.perplexity());
    b.write(out);
  }
  void event(const records::EventRecord& e, double wall, std::string& out) {
    Batch b(*this, e.step, wall);
    b.scalar("markers/" + e.kind, 1.0);
    b.text("events/" + e.kind, e.message);
    b.write(out);
  }
  uint64_t events() const { return events_; }
  uint64_t scalars() const { return scalars_; }

 private:
  // One Event: a step, a wall time and the values added to it.
  class Batch {
   public:
    Batch(EventEncoder& enc, uint64_t step, double wall) : enc_(enc) {
      ev_.set_wall_time(wall);
      ev_.set_step(static_cast<int64_t>(step));
    }
    void scalar(const std::string& tag, double v) {
      pb::Summary::Value* val = value(tag, "scalars", pb::SummaryMetadata::DATA_CLASS_SCALAR);
      val->mutable_tensor()->set_dtype(pb::DT_DOUBLE);
      val->mutable_tensor()->mutable_tensor_shape();
      val->mutable_tensor()->add_double_val(v);
      ++enc_.scalars_;
    }
    void text(const std::string& tag, const std::string& s) {
      pb::Summary::Value* val = value(tag, "text", pb::SummaryMetadata::DATA_CLASS_TENSOR);
      val->mutable_tensor()->set_dtype(pb::DT_STRING);
      val->mutable_tensor()->mutable_tensor_shape();
      val->mutable_tensor()->add_string_val(s);
    }
    void write(std::string& out) {
      frame_event(ev_, out);
      ++enc_.events_;
    }

   private:
    pb::Summary::Value* value(const std::string& tag, const char* plugin, pb::SummaryMetadata::DataClass cls) {
      pb::Summary::Value* val = ev_.mutable_summary()->add_value();
      val->set_tag(tag);
      // TensorBoard reads a tag's plugin from the first value it sees with that tag.
      if (enc_.described_.insert(tag).second) {
        val->mutable_metadata()->mutable_plugin_data()->set_plugin_name(plugin);
        val->mutable_metadata()->set_data_class(cls);
      }
      return val;
    }
    EventEncoder& enc_;
    pb::Event ev_;
  };

  std::set<std::string> described_;
  uint64_t events_ = 0, scalars_ = 0;
};

// created_utc ("2026-12-01T14:26:20Z") as seconds since the epoch; 0 when it does not parse.
double epoch_seconds(const std::string& utc) {
  std::tm tm{};
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0;
  if (std::sscanf(utc.c_str(), "%d-%d-%dT%d:%d:%d", &y, &mo, &d, &h, &mi, &s) != 6) return 0;
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = s;
  return static_cast<double>(timegm(&tm));
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool is_event_file(const stdfs::path& p) { return p.filename().string().rfind(kFilePrefix, 0) == 0; }

class LiveSink final : public RecordSink {
 public:
  LiveSink(std::string path, UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {}
  void start(const records::TraceHeader& h) {
    std::string out;
    enc_.file_version(now_seconds(), out);
    enc_.header(h, now_seconds(), out);
    write(out);
  }
  void on_step(const records::StepRecord& r) noexcept override {
    emit([&](std::string& out) { enc_.step(r, now_seconds(), out); });
  }
  void on_eval(const records::EvalRecord& e) noexcept override {
    emit([&](std::string& out) { enc_.eval(e, now_seconds(), out); });
  }
  void on_event(const records::EventRecord& e) noexcept override {
    emit([&](std::string& out) { enc_.event(e, now_seconds(), out); });
  }

 private:
  template <typename F>
  void emit(F&& f) noexcept {
    if (failed_) return;
    try {
      std::string out;
      f(out);
      write(out);
    } catch (const std::exception& e) {
      failed_ = true;
      std::cerr << "warning: the live TensorBoard view stops here (the run and its trace go on): " << e.what() << "\n";
    }
  }
  void write(const std::string& bytes) { write_full(fd_.get(), bytes.data(), bytes.size(), path_); }

  std::string path_;
  UniqueFd fd_;
  EventEncoder enc_;
  bool failed_ = false;
};

}  // namespace

std::vector<std::string> tensorboard_tags() {
  return {"train/loss",
          "train/learning_rate",
          "train/grad_norm_pre_clip",
          "train/grad_norm_post_clip",
          "train/loss_scale",
          "train/skipped",
          "train/skip_reason",
          "time/step_ms",
          "time/data_ms",
          "time/forward_ms",
          "time/backward_ms",
          "time/optimizer_ms",
          "time/trace_ms",
          "time/allreduce_ms",
          "time/checkpoint_ms",
          "eval/loss",
          "eval/accuracy",
          "eval/perplexity",
          "run/config",
          "run/fingerprint",
          "markers/KIND",
          "events/KIND"};
}

void check_tensorboard_dir(const std::string& dir, bool fresh, bool force) {
  std::error_code ec;
  const stdfs::path p(dir);
  if (stdfs::exists(p, ec) && !stdfs::is_directory(p, ec))
    RETRACE_FAIL(ConfigError, "--tensorboard ", dir, " exists and is not a directory; name a directory");
  if (stdfs::is_directory(p, ec) && fresh && !stdfs::is_empty(p, ec))
    RETRACE_CHECK(force, ConfigError, "--tensorboard ", dir,
                  " is not empty; TensorBoard would show its files and these as one run. Name an empty or new "
                  "directory, or add --force to replace the event files in it (other files are left alone)");
}

void prepare_tensorboard_dir(const std::string& dir, bool fresh, bool force) {
  check_tensorboard_dir(dir, fresh, force);
  std::error_code ec;
  const stdfs::path p(dir);
  if (stdfs::is_directory(p, ec) && fresh && !stdfs::is_empty(p, ec)) {
    for (const auto& entry : stdfs::directory_iterator(p, ec))
      if (entry.is_regular_file() && is_event_file(entry.path())) stdfs::remove(entry.path(), ec);
  }
  fs::make_writable_dir(dir);
}

TensorBoardExport export_tensorboard(const TraceReader& reader, const std::string& dir, bool force) {
  // Every record is read before the directory is touched: a trace that fails to read changes nothing.
  const std::vector<records::StepRecord> steps = reader.steps();
  const std::vector<records::EvalRecord> evals = reader.evals();
  const std::vector<records::EventRecord> events = reader.events();
  prepare_tensorboard_dir(dir, true, force);
  const records::TraceHeader& h = reader.header();
  const double start = epoch_seconds(h.created_utc);
  EventEncoder enc;
  std::string out;
  enc.file_version(start, out);
  enc.header(h, start, out);
  // Records in file order, each at the wall time of the steps recorded before it.
  size_t si = 0, vi = 0, ei = 0;
  double elapsed_ms = 0;
  for (const FrameIndexEntry& e : reader.index()) {
    const double wall = start + elapsed_ms / 1000.0;
    switch (e.kind) {
      case FrameKind::kHeader: break;
      case FrameKind::kStep: {
        const records::StepRecord& r = steps.at(si++);
        elapsed_ms += r.timings.step_ms();
        enc.step(r, start + elapsed_ms / 1000.0, out);
        break;
      }
      case FrameKind::kEval: enc.eval(evals.at(vi++), wall, out); break;
      case FrameKind::kEvent: enc.event(events.at(ei++), wall, out); break;
    }
  }
  char name[96];
  std::snprintf(name, sizeof name, "%s%010lld.retrace", kFilePrefix, static_cast<long long>(start));
  TensorBoardExport result;
  result.file = (stdfs::path(dir) / name).string();
  result.events = enc.events();
  result.scalars = enc.scalars();
  fs::write_file_atomic(result.file, out);
  return result;
}

std::unique_ptr<RecordSink> tensorboard_sink(const std::string& dir, const records::TraceHeader& header) {
  char host[256] = "host";
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "host");
  char name[400];
  std::snprintf(name, sizeof name, "%s%010lld.%s.%ld.retrace", kFilePrefix, static_cast<long long>(now_seconds()), host,
                static_cast<long>(getpid()));
  const std::string path = (stdfs::path(dir) / name).string();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  RETRACE_CHECK(fd >= 0, IoError, "cannot create TensorBoard event file ", path, ": ", fs::errno_text(errno),
                "; check that --tensorboard names a writable directory");
  auto sink = std::make_unique<LiveSink>(path, UniqueFd(fd));
  sink->start(header);
  return sink;
}

}  // namespace retrace::trace
