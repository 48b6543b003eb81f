#include "cli.h"

#include <filesystem>
#include <iostream>

#include "common.h"
#include "core/error.h"
#include "run/layout.h"
#include "run/run_lock.h"
#include "trace/inspect.h"
#include "trace/trace_reader.h"

namespace retrace::cli {
void add_inspect(CLI::App& app, InspectArgs& args) {
  auto* ins = app.add_subcommand("inspect", "print a trace's header and step table");
  ins->add_option("trace", args.trace, "a run directory or its trace file (run/trace.rtrace)")->required();
  ins->add_flag("--json", args.json, "JSON output");
  ins->add_flag("--csv", args.csv, "CSV output (one row per step)");
  ins->add_option("--steps", args.steps, "step range A:B (inclusive)");
  ins->add_flag("--config", args.config,
                "print only the config the trace header records, as the run began (e.g. to write back a lost "
                "RUN/config.toml)");
  ins->footer(
      "Examples:\n  retrace inspect run --steps 1:20\n  retrace inspect run/trace.rtrace --csv > steps.csv\n"
      "  retrace inspect run --config > run/config.toml");
}

std::optional<train::Numerics> numerics_inspect(InspectArgs& args) {
  (void)args;
  return std::nullopt;
}

int run_inspect(const InspectArgs& a, const Context&) {
  RETRACE_CHECK(int(a.json) + int(a.csv) + int(a.config) <= 1, ConfigError, "choose one of --json, --csv and --config");
  auto [first, last] = parse_range(a.steps);
  const std::string path = run::trace_of(a.trace);
  trace::TraceReader reader = trace::TraceReader::open(path);
  if (a.config) {
    std::cout << reader.header().config_toml;
    return 0;
  }
  if (auto w = reader.tail_warning()) {
    // A run being written ends inside the frame its writer is appending: not damage.
    if (auto who = run::RunLock::holder(std::filesystem::path(path).parent_path().string()))
      std::cerr << "note: the run is being written (" << *who << "); its last frame is not complete yet\n";
    else std::cerr << "warning: " << *w << "\n";
  }
  trace::InspectFormat fmt = a.json  ? trace::InspectFormat::kJson
                             : a.csv ? trace::InspectFormat::kCsv
                                     : trace::InspectFormat::kTable;
  trace::print_inspect(reader, fmt, first, last, std::cout);
  return 0;
}

}  // namespace retrace::cli
