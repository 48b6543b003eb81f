// Subcommands of the retrace CLI. register_commands binds every option to fields of CliArgs (owned
// by main); run_selected calls into the library for the chosen subcommand and returns the exit code.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "train/numerics.h"

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
  int64_t interrupt_at = 0;
  std::vector<int64_t> checkpoint_at;
  bool verify_resume = false;
  std::string inject;
  int64_t world_size = 1;
  std::vector<int64_t> accum_grid;
};

struct ResumeArgs {
  std::string run;
  bool plain = false;
  int64_t interrupt_at = 0;
  int64_t world_size = 1;
};

struct InspectArgs {
  std::string trace;
  bool json = false;
  bool csv = false;
  std::string steps;
};

struct VerifyArgs {
  std::string dir;
  bool json = false;
  int64_t world_size = 0;
};

struct ReplayArgs {
  std::string run;
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
};

struct MemoryArgs {
  std::string config_path = "configs/char-gpt.toml";
  std::vector<std::string> sets;
  int64_t world_size = 8;
  int rounds = 2;
  int steps = 3;
};

struct CliArgs {
  MemoryArgs memory;
  ReplayArgs replay;
  DiffArgs diff;
  GoldenArgs golden;
  BisectArgs bisect;
  RecordArgs record;
  ResumeArgs resume;
  InspectArgs inspect;
  VerifyArgs verify;
};

void register_commands(CLI::App& app, CliArgs& args);
// The numerics profile the selected command trains under (the config it will run, a run's
// recorded config, the goldens' configs), or nullopt for commands that do not train. main hands it
// to train::prepare_process before the command runs. ConfigError when one command would need two.
std::optional<train::Numerics> numerics_for(CLI::App& app, const CliArgs& args);
// `argv` is the whole command line, which the local launcher hands to every rank.
int run_selected(CLI::App& app, const CliArgs& args, const std::vector<std::string>& argv);

}  // namespace retrace::cli
