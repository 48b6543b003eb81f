#include "cli.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <iostream>
#include <new>
#include <string>

#include "core/error.h"
#include "core/hash_ahead.h"
#include "train/environment.h"

namespace retrace::cli {
namespace {
constexpr const char* kOutOfMemoryAdvice =
    "The step or the evaluation needs more memory than the machine has: lower data.batch_size (and "
    "train.accum_steps to keep the global batch) or eval.batch_size, or use model.checkpoint = \"full\"; "
    "`retrace memory --config ...` estimates what a GPT needs. The run directory keeps every checkpoint "
    "written so far: `retrace resume` continues from the newest";
}  // namespace
namespace {

// A live progress line (a terminal only) has no newline yet: end it before the error, so that the
// message starts a line of its own; piped output gets no blank line.
const char* end_progress_line() { return isatty(STDOUT_FILENO) ? "\n" : ""; }

// One error is one write(2): the ranks of a launcher share one stderr, and a message written in
// pieces (std::cerr flushes each <<) interleaves with the other ranks' messages mid-line. A pipe
// keeps a write of up to PIPE_BUF (4096) bytes whole; a longer one is written in as few as it takes.
void print_error(const std::string& message) {
  const std::string line = end_progress_line() + message + "\n";
  std::size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stderr is gone: there is no one left to tell
    done += static_cast<std::size_t>(n);
  }
}

struct CliArgs {
  RecordArgs record;
  ResumeArgs resume;
  InspectArgs inspect;
  VerifyArgs verify;
  WeightsArgs weights;
  ReplayArgs replay;
  DiffArgs diff;
  BisectArgs bisect;
  MemoryArgs memory;
  GoldenArgs golden;
  ExportArgs exported;
  ProbeArgs probe;
};

// Calls fn(name, args, numerics_of, run) for every command, in --help order.
template <typename F>
void for_each_command(CliArgs& a, F&& fn) {
  fn("record", a.record, add_record, numerics_record, run_record);
  fn("resume", a.resume, add_resume, numerics_resume, run_resume);
  fn("inspect", a.inspect, add_inspect, numerics_inspect, run_inspect);
  fn("export", a.exported, add_export, numerics_export, run_export);
  fn("verify", a.verify, add_verify, numerics_verify, run_verify);
  fn("weights", a.weights, add_weights, numerics_weights, run_weights);
  fn("replay", a.replay, add_replay, numerics_replay, run_replay);
  fn("diff", a.diff, add_diff, numerics_diff, run_diff);
  fn("bisect", a.bisect, add_bisect, numerics_bisect, run_bisect);
  fn("memory", a.memory, add_memory, numerics_memory, run_memory);
  fn("golden", a.golden, add_golden, numerics_golden, run_golden);
  fn("probe-step", a.probe, add_probe, numerics_probe, run_probe);
}

}  // namespace

int run_cli(int argc, char** argv, const train::Registry& registry) {
  hash_ahead::adopt();  // before anything can start a process that would inherit the launcher's pipe
  CLI::App app{"retrace: deterministic, recorded, replayable training on LibTorch"};
  app.require_subcommand(1);
  app.set_version_flag(
      "--version", [] { return train::build_description(); }, "the version, its LibTorch and BLAS");
  app.footer(
      "Example:\n  retrace record --steps 20\n  retrace inspect run/trace.rtrace --steps 1:5\n"
      "Exit codes: 0 ok, 1 verification failed or divergence, 2 usage or config error,\n"
      "            3 corrupt or unreadable input, 4 environment problem (data set, directory, device)");
  CliArgs args;
  for_each_command(args, [&app](const char*, auto& a, auto add, auto, auto) { add(app, a); });
  const std::vector<std::string> rest(argv + 1, argv + argc);
  try {
    app.parse(argc, argv);
    int rc = -1;
    for_each_command(args, [&](const char* name, auto& a, auto, auto numerics_of, auto run) {
      if (rc != -1 || !app.got_subcommand(name)) return;
      // The launcher stage of the numerics profile: OpenBLAS picks its kernel when it loads, so a
      // portable run re-executes this binary once with the pins in the environment (numerics.h).
      if (auto numerics = numerics_of(a)) train::prepare_process(*numerics, argv);
      rc = run(a, Context{registry, rest});
    });
    RETRACE_CHECK(rc != -1, ConfigError, "no command given; see ", argv[0], " --help");
    return rc;
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : static_cast<int>(ExitCode::kUsage);
  } catch (const Error& e) {
    std::fflush(stdout);
    print_error(std::string("retrace: ") + e.kind() + ": " + e.what());
    return static_cast<int>(e.exit_code());
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    print_error(std::string("retrace: environment error: out of memory. ") + kOutOfMemoryAdvice);
    return static_cast<int>(ExitCode::kEnvironment);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    // LibTorch's allocators say so in their message (c10::Error, no type of its own in 1.13).
    const std::string what = e.what();
    if (what.find("can't allocate memory") != std::string::npos || what.find("out of memory") != std::string::npos) {
      print_error("retrace: environment error: out of memory: " + what.substr(0, what.find('\n')) + ". " +
                  kOutOfMemoryAdvice);
      return static_cast<int>(ExitCode::kEnvironment);
    }
    print_error(std::string("retrace: internal error: ") + e.what() +
                "\n(this is a bug in retrace or LibTorch; please report it with the command line)");
    return static_cast<int>(ExitCode::kInternal);
  }
}

}  // namespace retrace::cli
