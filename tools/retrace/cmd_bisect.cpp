#include "cli.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>

#include "common.h"
#include "ckpt/strict_json.h"
#include "core/error.h"
#include "replay/bisect.h"
#include "run/layout.h"
#include "trace/trace_reader.h"
#include "core/file_util.h"
#include "replay/html_report.h"
#include "replay/diff.h"
#include "train/registry.h"

namespace retrace::cli {
void add_bisect(CLI::App& app, BisectArgs& args) {
  auto* bis = app.add_subcommand("bisect", "find where two runs diverge: step, rank, module, phase, op");
  bis->add_option("a", args.a, "first run directory")->required();
  bis->add_option("b", args.b, "second run directory")->required();
  bis->add_flag("--json", args.json, "JSON output");
  bis->add_option("--html", args.html,
                  "also write the divergence report (retrace diff --html) with the bisect result in it");
  bis->footer(
      "Exit 0 when the runs do not diverge, 1 with the first divergence.\nExample:\n"
      "  retrace record --steps 80 --out a && retrace record --steps 80 --out b --inject "
      "perturb-param@57:layers.0.weight\n"
      "  retrace bisect a b");
}

std::optional<train::Numerics> numerics_bisect(BisectArgs& args) {
  // Bisection re-executes both runs in this process; runs of another profile are refused there.
  auto c = recorded_config(args.a);
  return c ? std::optional(c->runtime.numerics) : std::nullopt;
}

int run_bisect(const BisectArgs& a, const Context& ctx) {
  auto progress = std::make_shared<Progress>(!a.json && isatty(STDOUT_FILENO), "steps");
  run::RunCallbacks cb;
  if (!a.json) {
    cb.on_message = [progress](const std::string& m) {
      progress->clear();
      std::printf("%s\n", m.c_str());
      std::fflush(stdout);
    };
    cb.on_progress = [progress](const std::string& what, uint64_t done, uint64_t total) {
      progress->update(what, done, total);
    };
  }
  replay::BisectReport r = replay::bisect_runs(a.a, a.b, cb, ctx.registry);
  progress->clear();
  if (a.json) {
    nlohmann::json j = {{"diverged", r.diverged},
                        {"common_steps", r.common_steps},
                        {"search_probes", r.search_probes},
                        {"step", r.step},
                        {"rank", r.rank ? static_cast<int64_t>(*r.rank) : -1},
                        {"module", r.module},
                        {"module_type", r.module_type},
                        {"phase", r.phase},
                        {"what", r.what},
                        {"op", r.op},
                        {"detail", r.detail},
                        {"replay_start_a", r.replay_start_a},
                        {"replay_start_b", r.replay_start_b},
                        {"notes", r.notes},
                        {"summary", r.summary()}};
    std::cout << ckpt::json_text(j, 2) << "\n";
  } else {
    for (const auto& n : r.notes) std::printf("note: %s\n", n.c_str());
    if (r.diverged)
      std::printf("re-executed from step %llu (run A) and %llu (run B)\n", static_cast<ull>(r.replay_start_a),
                  static_cast<ull>(r.replay_start_b));
    std::printf("%s\n", r.summary().c_str());
    if (!r.detail.empty()) std::printf("  %s\n", r.detail.c_str());
  }
  if (!a.html.empty()) {
    const trace::TraceReader ta = trace::TraceReader::open(run::trace_of(a.a));
    const trace::TraceReader tb = trace::TraceReader::open(run::trace_of(a.b));
    replay::ReportBisect view;
    view.diverged = r.diverged;
    view.step = r.step;
    view.rank = r.rank;
    view.module = r.module;
    view.module_type = r.module_type;
    view.phase = r.phase;
    view.op = r.op;
    view.detail = r.detail;
    view.summary = r.summary();
    view.replay_start_a = r.replay_start_a;
    view.replay_start_b = r.replay_start_b;
    fs::write_file_atomic(a.html, replay::render_html(replay::diff_traces(ta, tb), ta, tb, a.a, a.b, view));
    if (!a.json) std::printf("HTML report: %s\n", a.html.c_str());
  }
  return r.diverged ? static_cast<int>(ExitCode::kVerificationFailed) : 0;
}

}  // namespace retrace::cli
