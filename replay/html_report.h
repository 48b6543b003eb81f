// The diff of two traces as one self-contained HTML page: SVG charts of the loss and of the
// gradient norm before clipping of both runs on shared axes, with markers for skipped steps,
// rollbacks, resumes and the first divergence, followed by the tables of the diff report.
//
// Self-contained: inline CSS, inline SVG, no scripts, no fonts, no network references of any kind,
// so the file opens offline and can be attached to an issue. Every text from the traces (config
// values, messages, paths, labels) is HTML-escaped.
//
// Size: each series is downsampled to at most two points (min and max) per horizontal pixel and
// marker sets to one per pixel per kind, so a page for 100k-step traces stays a few hundred KB.
// Deterministic: the same report, traces and labels give the same bytes.
#pragma once

#include <string>

#include "replay/diff.h"
#include "trace/trace_reader.h"

namespace retrace::replay {

std::string render_html(const DiffReport& r, const trace::TraceReader& a, const trace::TraceReader& b,
                        const std::string& label_a, const std::string& label_b);

// Escapes & < > " ' for HTML text and attribute values.
std::string html_escape(const std::string& s);

}  // namespace retrace::replay
