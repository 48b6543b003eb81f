#include "cli.h"

#include <cstdio>
#include <iostream>
#include <sstream>

#include "common.h"
#include "core/error.h"
#include "core/file_util.h"
#include "run/layout.h"
#include "trace/inspect.h"
#include "trace/tensorboard.h"
#include "trace/trace_reader.h"

namespace retrace::cli {

void add_export(CLI::App& app, ExportArgs& args) {
  auto* ex = app.add_subcommand("export", "write a run's trace as JSON lines, CSV or TensorBoard event files");
  ex->add_option("run", args.run, "run directory or its trace.rtrace")->required();
  ex->add_flag("--jsonl", args.jsonl,
               "one JSON object per line: the header, then every step (all fields) with the evaluations and "
               "events after it");
  ex->add_flag("--csv", args.csv, "one row per step with every scalar field");
  ex->add_option("--tensorboard", args.tensorboard,
                 "TensorBoard event files into this directory (created; a non-empty one needs --force): loss, "
                 "learning rate, gradient norms, loss scale, skips, step times per phase, evaluations and events "
                 "under stable tags (see docs/traces.md)");
  ex->add_flag("--force", args.force, "with --tensorboard: replace the event files in a non-empty directory");
  ex->add_option("--out", args.out, "write to this file (atomically) instead of standard output");
  ex->add_option("--steps", args.steps, "step range A:B (inclusive)");
  ex->footer(
      "Exit 0; 2 for bad usage (also a non-empty --tensorboard directory without --force); 3 for a "
      "damaged trace; 4 for a missing one.\nExamples:\n  retrace export run --jsonl --out run/metrics.jsonl\n"
      "  retrace export run --tensorboard tb && tensorboard --logdir tb\n"
      "  retrace export run --csv > steps.csv\n"
      "  python3 -c \"import pandas; print(pandas.read_json('run/metrics.jsonl', lines=True))\"");
}

std::optional<train::Numerics> numerics_export(ExportArgs&) { return std::nullopt; }

int run_export(const ExportArgs& a, const Context&) {
  const int formats = int(a.jsonl) + int(a.csv) + int(!a.tensorboard.empty());
  RETRACE_CHECK(formats == 1, ConfigError, "retrace export needs exactly one of --jsonl, --csv and --tensorboard DIR");
  RETRACE_CHECK(!a.force || !a.tensorboard.empty(), ConfigError,
                "--force belongs with --tensorboard DIR (--out files are always replaced atomically)");
  auto [first, last] = parse_range(a.steps);
  if (!a.tensorboard.empty()) {
    RETRACE_CHECK(a.steps.empty() && a.out.empty(), ConfigError,
                  "--tensorboard writes every record of the trace into its directory; --steps and --out are for "
                  "--jsonl and --csv");
    // The directory is checked before the trace is read, and written only once the trace has read whole.
    trace::check_tensorboard_dir(a.tensorboard, true, a.force);
  }
  const trace::TraceReader reader = trace::TraceReader::open(run::trace_of(a.run));
  if (auto w = reader.tail_warning()) std::cerr << "warning: " << *w << "\n";
  if (!a.tensorboard.empty()) {
    const trace::TensorBoardExport ex = trace::export_tensorboard(reader, a.tensorboard, a.force);
    std::printf("wrote %llu events (%llu scalars) to %s\n", static_cast<ull>(ex.events), static_cast<ull>(ex.scalars),
                ex.file.c_str());
    return 0;
  }
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
