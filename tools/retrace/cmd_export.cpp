#include "cli.h"

#include <iostream>
#include <sstream>

#include "common.h"
#include "core/error.h"
#include "core/file_util.h"
#include "run/layout.h"
#include "trace/inspect.h"
#include "trace/trace_reader.h"

namespace retrace::cli {

void add_export(CLI::App& app, ExportArgs& args) {
  auto* ex = app.add_subcommand("export", "write a run's trace as JSON lines or CSV for other tools");
  ex->add_option("run", args.run, "run directory or its trace.rtrace")->required();
  ex->add_flag("--jsonl", args.jsonl,
               "one JSON object per line: the header, then every step (all fields) with the evaluations and "
               "events after it");
  ex->add_flag("--csv", args.csv, "one row per step with every scalar field");
  ex->add_option("--out", args.out, "write to this file (atomically) instead of standard output");
  ex->add_option("--steps", args.steps, "step range A:B (inclusive)");
  ex->footer("Exit 0, or 3 for a damaged trace.\nExamples:\n  retrace export run --jsonl --out run/metrics.jsonl\n"
             "  retrace export run --csv > steps.csv\n"
             "  python3 -c \"import pandas; print(pandas.read_json('run/metrics.jsonl', lines=True))\"");
}

std::optional<train::Numerics> numerics_export(const ExportArgs&) { return std::nullopt; }

int run_export(const ExportArgs& a, const Context&) {
  RETRACE_CHECK(a.jsonl != a.csv, ConfigError, "retrace export needs exactly one of --jsonl and --csv");
  auto [first, last] = parse_range(a.steps);
  const trace::TraceReader reader = trace::TraceReader::open(run::trace_of(a.run));
  if (auto w = reader.tail_warning()) std::cerr << "warning: " << *w << "\n";
  const auto format = a.jsonl ? trace::InspectFormat::kJsonl : trace::InspectFormat::kCsv;
  if (a.out.empty()) {
    trace::print_inspect(reader, format, first, last, std::cout);
    return 0;
  }
  std::ostringstream text;
  trace::print_inspect(reader, format, first, last, text);
  fs::write_file_atomic(a.out, text.str());
  return 0;
}

}  // namespace retrace::cli
