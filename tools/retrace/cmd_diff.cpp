#include "cli.h"

#include <cstdio>
#include <iostream>

#include "common.h"
#include "ckpt/strict_json.h"
#include "core/error.h"
#include "core/file_util.h"
#include "replay/diff.h"
#include "run/layout.h"
#include "replay/html_report.h"
#include "trace/trace_reader.h"

namespace retrace::cli {
void add_diff(CLI::App& app, DiffArgs& args) {
  auto* dif = app.add_subcommand("diff", "compare two traces step by step (any configs or machines)");
  dif->add_option("a", args.a, "first run directory or its trace.rtrace")->required();
  dif->add_option("b", args.b, "second run directory or its trace.rtrace")->required();
  dif->add_option("--html", args.html, "also write a self-contained HTML report with loss and grad-norm curves");
  dif->add_flag("--json", args.json, "JSON output");
  dif->footer("Exit 0 when identical, 1 when they differ.\nExample:\n  retrace diff runA runB --html report.html");
}

std::optional<train::Numerics> numerics_diff(DiffArgs& args) {
  (void)args;
  return std::nullopt;
}

int run_diff(const DiffArgs& a, const Context&) {
  trace::TraceReader ra = trace::TraceReader::open(run::trace_of(a.a));
  trace::TraceReader rb = trace::TraceReader::open(run::trace_of(a.b));
  replay::DiffReport rep = replay::diff_traces(ra, rb);
  if (a.json) std::cout << ckpt::json_text(replay::to_json(rep), 2) << "\n";
  else std::cout << replay::render_text(rep);
  if (!a.html.empty()) {
    fs::write_file_atomic(a.html, replay::render_html(rep, ra, rb, a.a, a.b));
    if (!a.json) std::printf("HTML report: %s\n", a.html.c_str());
  }
  return rep.identical() ? 0 : static_cast<int>(ExitCode::kVerificationFailed);
}

}  // namespace retrace::cli
