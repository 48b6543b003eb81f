// The diff of two traces as one self-contained HTML page, built to show where two runs part:
//   - divergence charts: the absolute and relative difference of the loss and of the gradient norm
//     per common step on a log scale, with a zero line for steps whose values are equal, so the
//     step where the difference starts and how fast it grows are visible;
//   - a strip of digest agreement per step (parameters, optimizer, RNG, batch, training state, chain);
//   - charts of the loss and of the gradient norm before clipping of both runs on shared axes, with
//     markers for skipped steps, rollbacks and resumes;
//   - the first divergent step marked on every chart (class "divergence", data-step);
//   - the bisect result when there is one (module, phase, op), both runs' environment fingerprints
//     side by side with the differing fields highlighted, and the tables of the diff report.
// Every chart's svg carries data-x-min, data-x-max, data-plot-left and data-plot-width (SVG units),
// so a test can map a step to its position in a screenshot.
//
// Self-contained: inline CSS, inline SVG, no scripts, no fonts, no network references of any kind,
// so the file opens offline and can be attached to an issue. Every text from the traces (config
// values, messages, paths, labels) is HTML-escaped.
//
// Size: each series is downsampled to at most two points (min and max) per horizontal pixel and
// marker sets to one per pixel per kind, so a page for 100k-step traces stays a few hundred KB.
// Deterministic: the same report, traces and labels give the same bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "replay/diff.h"
#include "trace/trace_reader.h"

namespace retrace::replay {

// What bisection found, for the report (replay/bisect.h's BisectReport, without its dependencies).
struct ReportBisect {
  bool diverged = false;
  uint64_t step = 0;
  std::optional<uint32_t> rank;
  std::string module, module_type, phase, op, detail, summary;
  uint64_t replay_start_a = 0, replay_start_b = 0;
};

std::string render_html(const DiffReport& r, const trace::TraceReader& a, const trace::TraceReader& b,
                        const std::string& label_a, const std::string& label_b,
                        const std::optional<ReportBisect>& bisect = std::nullopt);

// Escapes & < > " ' for HTML text and attribute values.
std::string html_escape(const std::string& s);

}  // namespace retrace::replay
