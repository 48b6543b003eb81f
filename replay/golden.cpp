#include "replay/golden.h"

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <sstream>
#include <toml++/toml.h>

#include "core/error.h"
#include "core/file_util.h"
#include "replay/replay.h"
#include "trace/trace_reader.h"
#include "train/config.h"
#include "train/environment.h"

namespace retrace::replay {
namespace stdfs = std::filesystem;
namespace {

struct GoldenSpec {
  int64_t interrupt_at = 0;
  ToleranceRule tolerance = kCrossNumericsRule;
  std::string tolerance_text;  // the [tolerance] table, verbatim TOML, when the file has one
  std::string history;         // the [[history]] tables, verbatim TOML
};

std::string spec_path(const std::string& dir, const std::string& name) {
  return (stdfs::path(dir) / name / "golden.toml").string();
}

// `autocast`: the golden trains under BF16/FP16 autocast, whose roundings differ more between
// kernels (unit roundoff 2^-8 instead of 2^-24), so the default absolute tolerance is 10x wider.
GoldenSpec read_spec(const std::string& dir, const std::string& name, bool autocast = false) {
  const std::string path = spec_path(dir, name);
  GoldenSpec s;
  if (autocast) s.tolerance.abs = kCrossNumericsAutocastAbs;
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    RETRACE_FAIL(FormatError, "cannot parse ", path, ": ", e.description());
  }
  s.interrupt_at = t["interrupt_at"].value_or<int64_t>(0);
  s.tolerance.abs = t["tolerance"]["abs"].value_or(s.tolerance.abs);
  s.tolerance.horizon = static_cast<uint64_t>(
      t["tolerance"]["horizon"].value_or(static_cast<int64_t>(s.tolerance.horizon)));
  s.tolerance.late_rel = t["tolerance"]["late_rel"].value_or(s.tolerance.late_rel);
  RETRACE_CHECK(s.tolerance.abs >= 0 && s.tolerance.late_rel >= 0, ConfigError, "bad [tolerance] in ", path,
                ": abs and late_rel must be >= 0");
  std::string text = fs::read_file(path, 1 << 20);
  auto pos = text.find("[[history]]");
  if (pos != std::string::npos) s.history = text.substr(pos);
  if (auto tol = text.find("[tolerance]"); tol != std::string::npos && tol < pos)
    s.tolerance_text = text.substr(tol, pos - tol);
  return s;
}

// Records the run into `out` (interrupted at spec.interrupt_at and resumed when set).
void run_into(const train::Config& config, int64_t interrupt_at, const std::string& out, const run::RunCallbacks& cb,
              const train::Registry& registry) {
  run::RecordOptions o;
  o.registry = &registry;
  o.out_dir = out;
  o.scratch = true;
  o.control.interrupt_at = static_cast<uint64_t>(std::max<int64_t>(0, interrupt_at));
  run::record(train::resolve_here(config), o, cb);
  if (interrupt_at > 0) run::resume(out, {}, cb, nullptr, registry);
}

std::string today() {
  std::time_t t = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}
}  // namespace

std::vector<std::string> list_goldens(const std::string& golden_dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : stdfs::directory_iterator(golden_dir, ec))
    if (e.is_directory() && stdfs::exists(e.path() / "golden.toml")) names.push_back(e.path().filename().string());
  RETRACE_CHECK(!ec, IoError, "cannot list golden directory ", golden_dir, ": ", ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

GoldenResult check_golden(const std::string& golden_dir, const std::string& name,
                          const std::vector<std::string>& overrides, const std::string& scratch_root,
                          const run::RunCallbacks& cb, const train::Registry& registry) {
  const stdfs::path dir = stdfs::path(golden_dir) / name;
  RETRACE_CHECK(stdfs::exists(dir / "golden.toml"), IoError, "no golden named ", name, " in ", golden_dir,
                "; known: ", [&] {
                  std::string s;
                  for (const auto& n : list_goldens(golden_dir)) s += (s.empty() ? "" : ", ") + n;
                  return s;
                }());
  train::Config config = train::load_config(run::config_path(dir.string()), overrides, train::ConfigSource::kRecorded);
  GoldenSpec spec = read_spec(golden_dir, name, config.amp.mode != train::AmpMode::kOff);
  GoldenResult r;
  r.name = name;
  r.scratch_dir = (stdfs::path(scratch_root) / name).string();
  fs::make_writable_dir(scratch_root);
  run_into(config, spec.interrupt_at, r.scratch_dir, cb, registry);

  trace::TraceReader golden = trace::TraceReader::open(run::trace_path(dir.string()));
  trace::TraceReader now = trace::TraceReader::open(run::trace_path(r.scratch_dir));
  r.fingerprint_diffs = records::numerics_differences(golden.header().fingerprint, now.header().fingerprint);
  r.numerics = records::numerics_fields(now.header().fingerprint);
  r.mode = r.fingerprint_diffs.empty() ? CompareMode::kBitwise : CompareMode::kTolerance;
  r.tolerance = spec.tolerance;
  r.report = compare_steps(golden.steps(), now.steps(), r.mode, r.tolerance);
  r.passed = r.report.equal() && r.report.compared > 0;
  return r;
}

void update_golden(const std::string& golden_dir, const std::string& name, const std::string& reason,
                   const std::vector<std::string>& overrides, int64_t interrupt_at, const run::RunCallbacks& cb,
                   const train::Registry& registry) {
  RETRACE_CHECK(!reason.empty(), ConfigError, "golden update needs --reason \"why the golden trace changes\"");
  const stdfs::path dir = stdfs::path(golden_dir) / name;
  // One writer: an existing golden directory is locked before it is read (a new one once it is
  // made, below); the lock file goes when the update ends.
  run::RunLock lock;
  if (stdfs::is_directory(dir)) lock = run::RunLock::acquire(dir.string(), "golden update");
  const bool exists = stdfs::exists(run::config_path(dir.string()));
  train::Config config = exists ? train::load_config(run::config_path(dir.string()), overrides,
                                                     train::ConfigSource::kRecorded)
                                : train::parse_config("", "built-in default", overrides);
  GoldenSpec spec;
  if (stdfs::exists(dir / "golden.toml")) spec = read_spec(golden_dir, name);
  if (interrupt_at >= 0) spec.interrupt_at = interrupt_at;

  const std::string scratch = (stdfs::temp_directory_path() / ("retrace-golden-" + name)).string();
  run_into(config, spec.interrupt_at, scratch, cb, registry);
  fs::make_writable_dir(dir.string());
  if (!lock.held()) lock = run::RunLock::acquire(dir.string(), "golden update");
  fs::write_file_atomic(run::trace_path(dir.string()), fs::read_file(run::trace_path(scratch)));
  fs::write_file_atomic(run::config_path(dir.string()), fs::read_file(run::config_path(scratch)));
  std::ostringstream meta;
  meta << "# How `retrace golden check " << name << "` re-runs this golden trace; see golden/README.md.\n"
       << "interrupt_at = " << spec.interrupt_at << "\n\n"
       << spec.tolerance_text << spec.history << (spec.history.empty() || spec.history.back() == '\n' ? "" : "\n")
       << "[[history]]\ndate = " << toml::value<std::string>(today())
       << "\nreason = " << toml::value<std::string>(reason) << "\n";
  fs::write_file_atomic((dir / "golden.toml").string(), meta.str());
  run::remove_scratch_dir(scratch);
}

}  // namespace retrace::replay
