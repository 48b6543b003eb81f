// The retrace command line: parse, call the library, map errors to exit codes (README "Exit
// codes"). No training logic lives here.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "cli_commands.h"
#include "core/error.h"

// A live progress line (a terminal only) has no newline yet: end it before the error, so that the
// message starts a line of its own; piped output gets no blank line.
const char* end_progress_line() { return isatty(STDOUT_FILENO) ? "\n" : ""; }

int main(int argc, char** argv) {
  CLI::App app{"retrace: deterministic, recorded, replayable training on LibTorch"};
  app.require_subcommand(1);
  app.footer(
      "Example:\n  retrace record --steps 20\n  retrace inspect run/trace.rtrace --steps 1:5\n"
      "Exit codes: 0 ok, 1 verification failed or divergence, 2 usage or config error,\n"
      "            3 corrupt or unreadable input, 4 environment problem (data set, directory, device)");
  retrace::cli::CliArgs args;
  retrace::cli::register_commands(app, args);
  try {
    app.parse(argc, argv);
    // The launcher stage of the numerics profile: OpenBLAS picks its kernel when it loads, so a
    // portable run re-executes this binary once with the pins in the environment (numerics.h).
    if (auto numerics = retrace::cli::numerics_for(app, args)) retrace::train::prepare_process(*numerics, argv);
    return retrace::cli::run_selected(app, args, std::vector<std::string>(argv + 1, argv + argc));
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : static_cast<int>(retrace::ExitCode::kUsage);
  } catch (const retrace::Error& e) {
    std::fflush(stdout);
    std::cerr << end_progress_line() << "retrace: " << e.kind() << ": " << e.what() << "\n";
    return static_cast<int>(e.exit_code());
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::cerr << end_progress_line() << "retrace: internal error: " << e.what()
              << "\n(this is a bug in retrace or LibTorch; please report it with the command line)\n";
    return static_cast<int>(retrace::ExitCode::kInternal);
  }
}
