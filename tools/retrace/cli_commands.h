// Subcommands of the retrace CLI. Each registers its options on the CLI11 app and, when selected,
// calls into the library and returns the process exit code.
#pragma once

#include <CLI/CLI.hpp>

namespace retrace::cli {

void register_commands(CLI::App& app);
int run_selected(CLI::App& app);

}  // namespace retrace::cli
