// The retrace command line, as a library: the `retrace` binary and a user's own binary
// (include/retrace/retrace.h, retrace::run_cli) run the same commands. One file per command
// (cmd_*.cpp): it adds its options, parses, calls one library function and prints. main maps error
// kinds to exit codes (docs/reliability.md, "Exit codes").
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "train/numerics.h"

namespace retrace::train {
class Registry;
struct Config;
}  // namespace retrace::train

namespace retrace::cli {

struct RecordArgs {
  std::string config_path;
  std::vector<std::string> sets;
  std::string out = "run";
  int64_t steps = -1;
  bool force = false;
  bool scratch = false;
  bool plain = false;
  bool print_config = false;
  bool help_config = false;  // print the config reference (Markdown) and exit
  int64_t interrupt_at = 0;
  std::vector<int64_t> checkpoint_at;
  bool verify_resume = false;
  std::string inject;
  int64_t world_size = 1;
  int64_t resume_world_size = 0;  // --verify-resume: resume on this many ranks (0: world_size)
  std::vector<int64_t> accum_grid;
  std::string tensorboard;                      // the live TensorBoard view's directory
  std::shared_ptr<const train::Config> config;  // as the numerics stage parsed it
};

struct ResumeArgs {
  std::string run;
  bool accept_changed_inputs = false;
  bool accept_other_torch = false;
  bool plain = false;
  int64_t interrupt_at = 0;
  int64_t world_size = 1;
  bool reshard = false;
  int64_t zero_stage = -1;  // -1: as recorded
  std::string tensorboard;
};

struct InspectArgs {
  std::string trace;
  bool json = false;
  bool csv = false;
  bool config = false;  // print the config the header records (to write back a lost RUN/config.toml)
  std::string steps;
};

struct VerifyArgs {
  std::string dir;
  bool json = false;
  int64_t world_size = 0;
};

struct WeightsArgs {
  std::string ckpt;  // a step directory, a run directory or a checkpoints root
  std::string out;
  bool force = false;
};

struct ReplayArgs {
  std::string run;
  bool accept_changed_inputs = false;
  bool accept_other_torch = false;
  int64_t from_checkpoint = -1;
  std::string steps;
  double tolerance = -1;
  bool bitwise = false;
  std::string out;
  bool force = false;
  bool plain = false;
  bool quiet = false;
};

struct DiffArgs {
  std::string a, b;
  std::string html;
  bool json = false;
};

struct GoldenArgs {
  bool update = false;  // `golden update` (else `golden check`)
  std::vector<std::string> names;
  std::string dir = "golden";
  std::vector<std::string> sets;
  std::string inject;
  std::string reason;
  int64_t interrupt_at = -1;
  std::string scratch;
};

struct BisectArgs {
  std::string a, b;
  bool json = false;
  std::string html;  // also write the divergence report with the result
};

struct ProbeArgs {  // probe-step, bisect's hidden worker
  std::string run;
  int64_t step = 0;
  std::string numerics;
  std::string out;
};

struct MemoryArgs {
  std::string config_path = "configs/char-gpt.toml";
  std::vector<std::string> sets;
  int64_t world_size = 8;
  int rounds = 2;
  int steps = 3;
  std::shared_ptr<const train::Config> config;  // as the numerics stage parsed it
};

struct ExportArgs {
  std::string run;
  bool jsonl = false;
  bool csv = false;
  std::string out;          // default: standard output
  std::string steps;        // A:B
  bool evals = true;        // jsonl: evaluation and event rows too
  std::string tensorboard;  // event files into this directory
  bool force = false;
};

// What every command is run with: the registry its runs may use (model.kind, data.kind,
// train.loss) and the whole command line, which the local launcher hands to every rank.
struct Context {
  const train::Registry& registry;
  const std::vector<std::string>& argv;
};

// add_ adds the command's options; numerics_ is the launcher stage, before torch computes anything:
// the profile the command trains under, from the config it reads (which it may keep in its args
// for run_, so that a command reads and resolves its config once); run_ runs it.
#define RETRACE_COMMAND(name, Args)                           \
  void add_##name(CLI::App& app, Args& args);                 \
  std::optional<train::Numerics> numerics_##name(Args& args); \
  int run_##name(const Args& args, const Context& ctx)

RETRACE_COMMAND(record, RecordArgs);
RETRACE_COMMAND(resume, ResumeArgs);
RETRACE_COMMAND(inspect, InspectArgs);
RETRACE_COMMAND(verify, VerifyArgs);
RETRACE_COMMAND(weights, WeightsArgs);
RETRACE_COMMAND(replay, ReplayArgs);
RETRACE_COMMAND(diff, DiffArgs);
RETRACE_COMMAND(bisect, BisectArgs);
RETRACE_COMMAND(memory, MemoryArgs);
RETRACE_COMMAND(golden, GoldenArgs);
RETRACE_COMMAND(export, ExportArgs);
RETRACE_COMMAND(probe, ProbeArgs);
#undef RETRACE_COMMAND

// Parses argv, re-executes under the numerics profile the command trains under (numerics.h),
// runs the command and returns its exit code; every retrace::Error becomes its documented code.
int run_cli(int argc, char** argv, const train::Registry& registry);

}  // namespace retrace::cli
