#include "cli.h"

#include <iostream>

#include "common.h"
#include "core/error.h"
#include "run/layout.h"
#include "trace/inspect.h"
#include "trace/trace_reader.h"

namespace retrace::cli {
void add_inspect(CLI::App& app, InspectArgs& args) {
  auto* ins = app.add_subcommand("inspect", "print a trace's header and step table");
  ins->add_option("trace", args.trace, "a run directory or its trace file (run/trace.rtrace)")->required();
  ins->add_flag("--json", args.json, "JSON output");
  ins->add_flag("--csv", args.csv, "CSV output (one row per step)");
  ins->add_option("--steps", args.steps, "step range A:B (inclusive)");
  ins->footer("Examples:\n  retrace inspect run --steps 1:20\n  retrace inspect run/trace.rtrace --csv > steps.csv");

}

std::optional<train::Numerics> numerics_inspect(const InspectArgs& args) {
  (void)args;
  return std::nullopt;
}

int run_inspect(const InspectArgs& a, const Context&) {
  RETRACE_CHECK(!(a.json && a.csv), ConfigError, "choose one of --json and --csv");
  auto [first, last] = parse_range(a.steps);
  trace::TraceReader reader = trace::TraceReader::open(run::trace_of(a.trace));
  if (auto w = reader.tail_warning()) std::cerr << "warning: " << *w << "\n";
  trace::InspectFormat fmt = a.json  ? trace::InspectFormat::kJson
                             : a.csv ? trace::InspectFormat::kCsv
                                     : trace::InspectFormat::kTable;
  trace::print_inspect(reader, fmt, first, last, std::cout);
  return 0;
}

}  // namespace retrace::cli
