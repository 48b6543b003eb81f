// Subcommands of the retrace CLI. register_commands binds every option to fields of CliArgs (owned
// by main); run_selected calls into the library for the chosen subcommand and returns the exit code.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace retrace::cli {

struct RecordArgs {
  std::string config_path;
  std::vector<std::string> sets;
  std::string out = "run";
  int64_t steps = -1;
  bool force = false;
  bool plain = false;
  bool print_config = false;
  int64_t interrupt_at = 0;
  std::vector<int64_t> checkpoint_at;
  bool verify_resume = false;
  std::string inject;
};

struct ResumeArgs {
  std::string run;
  bool plain = false;
  int64_t interrupt_at = 0;
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

struct CliArgs {
  RecordArgs record;
  ResumeArgs resume;
  InspectArgs inspect;
  VerifyArgs verify;
};

void register_commands(CLI::App& app, CliArgs& args);
int run_selected(CLI::App& app, const CliArgs& args);

}  // namespace retrace::cli
