#include "replay/html_report.h"

#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "replay/html_text.h"
#include "replay/report_chart.h"
#include "replay/report_style.h"

namespace retrace::replay {
namespace {

using html::common_steps;
using html::CommonStep;
using html::differences;
using html::kColorAbs;
using html::kColorRel;
using html::kStyle;
using html::num;
using html::render_chart;
using html::render_difference_chart;
using html::render_digest_strip;
using html::run_marks;
using html::RunMarks;
using html::series;
using html::step_range;
using html::value_text;
using records::StepRecord;

constexpr size_t kTableLimit = 500;  // rows per HTML table; the JSON report has everything

std::string cell(const std::optional<std::string>& v) {
  return v ? "<td class=\"v\">" + html_escape(*v) + "</td>" : "<td class=\"absent\">absent</td>";
}

std::string td(const std::string& v, const char* cls = nullptr) {
  return std::string("<td") + (cls ? std::string(" class=\"") + cls + "\"" : "") + ">" + html_escape(v) + "</td>";
}

std::string more_rows(size_t total, size_t columns) {
  if (total <= kTableLimit) return "";
  return "<tr><td colspan=\"" + std::to_string(columns) + "\" class=\"absent\">... " +
         std::to_string(total - kTableLimit) + " more rows (see the JSON report)</td></tr>\n";
}

std::string span_text(const std::optional<StepSpan>& s) {
  if (!s) return "no steps";
  return "steps " + std::to_string(s->first) + ".." + std::to_string(s->last) + " (" + std::to_string(s->count) +
         " steps)";
}

std::string spans_text(const std::vector<StepSpan>& v) {
  std::string t;
  for (size_t i = 0; i < v.size() && i < 8; ++i)
    t += (i ? ", " : "") + std::to_string(v[i].first) +
         (v[i].first == v[i].last ? "" : ".." + std::to_string(v[i].last));
  if (v.size() > 8) t += ", ...";
  return t;
}

// Both fingerprints side by side: every key of either, the differing rows highlighted; numerics
// fields (bitwise agreement depends on them) apart from information fields.
std::string render_fingerprints(const records::TraceHeader& ha, const records::TraceHeader& hb) {
  std::map<std::string, std::pair<std::optional<std::string>, std::optional<std::string>>> keys;
  for (const auto& kv : ha.fingerprint) keys[kv.key].first = kv.value;
  for (const auto& kv : hb.fingerprint) keys[kv.key].second = kv.value;
  std::ostringstream out;
  size_t differ = 0;
  for (const auto& [k, v] : keys) differ += v.first != v.second ? 1 : 0;
  out << "<p class=\"note\">" << keys.size() << " fields, " << differ
      << " differ. Numerics fields decide whether equal bits can be expected; information fields "
         "(info.*) are recorded for people and never compared.</p>\n";
  out << "<table class=\"fingerprints\"><tr><th>field</th><th>kind</th><th>a</th><th>b</th></tr>\n";
  for (const auto& [k, v] : keys) {
    const bool d = v.first != v.second;
    out << "<tr" << (d ? " class=\"differs\"" : "") << ">" << td(k, "v")
        << td(records::is_numerics_key(k) ? "numerics" : "information") << cell(v.first) << cell(v.second) << "</tr>\n";
  }
  out << "</table>\n";
  return out.str();
}

std::string render_bisect(const std::optional<ReportBisect>& b) {
  std::ostringstream out;
  if (!b) {
    out << "<p class=\"note\">not run for this report: <code>retrace bisect A B --html FILE</code> writes this page "
           "with the module, phase and operator where the runs part.</p>\n";
    return out.str();
  }
  if (!b->diverged) {
    out << "<p class=\"note\">" << html_escape(b->summary) << "</p>\n";
    return out.str();
  }
  out << "<table class=\"bisect\">\n";
  auto row = [&](const char* k, const std::string& v) {
    if (!v.empty()) out << "<tr><th>" << k << "</th>" << td(v, "v") << "</tr>\n";
  };
  row("step", std::to_string(b->step));
  if (b->rank) row("rank", std::to_string(*b->rank));
  row("module", b->module + (b->module_type.empty() ? "" : " (" + b->module_type + ")"));
  row("phase", b->phase);
  row("op", b->op);
  row("detail", b->detail);
  row("re-executed from",
      "step " + std::to_string(b->replay_start_a) + " (a), step " + std::to_string(b->replay_start_b) + " (b)");
  out << "</table>\n<p>" << html_escape(b->summary) << "</p>\n";
  return out.str();
}

}  // namespace

namespace {

// The summary table: the runs, their spans, the verdict, where they part, the loss difference.
void write_summary(std::ostringstream& out, const DiffReport& r, const std::string& label_a, const std::string& label_b,
                   const std::optional<ReportBisect>& bisect) {
  out << "<table class=\"summary\">\n";
  auto row = [&](const std::string& k, const std::string& v_html) {
    out << "<tr><th>" << html_escape(k) << "</th><td>" << v_html << "</td></tr>\n";
  };
  row("a", "<span class=\"swatch-a\">" + html_escape(label_a) + "</span> " + html_escape(r.path_a) + " &mdash; " +
               html_escape(span_text(r.span_a)));
  row("b", "<span class=\"swatch-b\">" + html_escape(label_b) + "</span> " + html_escape(r.path_b) + " &mdash; " +
               html_escape(span_text(r.span_b)));
  if (r.tail_warning_a) row("warning a", html_escape(*r.tail_warning_a));
  if (r.tail_warning_b) row("warning b", html_escape(*r.tail_warning_b));
  row("common", html_escape(r.common ? span_text(r.common) : std::string("no common steps")));
  if (!r.only_in_a.empty()) row("only in a", html_escape(spans_text(r.only_in_a)));
  if (!r.only_in_b.empty()) row("only in b", html_escape(spans_text(r.only_in_b)));
  if (r.identical()) {
    row("verdict", "<span class=\"verdict-ok\">IDENTICAL (bitwise)</span>");
  } else if (r.steps.first_diff) {
    row("verdict", "<span class=\"verdict-bad\">DIVERGED at step " + std::to_string(r.steps.first_diff->step) + " (" +
                       html_escape(r.steps.first_diff->field) + ")</span>");
  } else {
    row("verdict", "<span class=\"verdict-bad\">common steps equal; other differences below</span>");
  }
  if (r.where) row("where", html_escape(divergence_text(*r.where)));
  if (r.steps.compared > 0)
    row("loss difference", "max " + value_text(r.steps.max_loss_diff) + " at step " +
                               std::to_string(r.steps.max_loss_diff_step) + ", final " +
                               value_text(r.steps.final_loss_diff));
  row("environment", r.environment_differs() ? "differs: bitwise differences are expected (see below)" : "equal");
  if (r.models_differ()) row("model", "<span class=\"verdict-bad\">models differ (see below)</span>");
  if (bisect && bisect->diverged) row("bisect", html_escape(bisect->summary));
  out << "</table>\n";
}

// The difference charts (loss and gradient norm, log scale) over the steps both runs have.
void write_differences(std::ostringstream& out, const DiffReport& r, const std::map<uint64_t, const StepRecord*>& ma,
                       const std::map<uint64_t, const StepRecord*>& mb, uint64_t x_min, uint64_t x_max) {
  const std::vector<CommonStep> common = common_steps(ma, mb);
  out << "<h2>Where the runs part</h2>\n";
  out << "<p class=\"note\">Differences b &minus; a on the steps both runs have, on a log scale; equal bits sit "
         "on the 0 line. Relative: |a &minus; b| / |a|.</p>\n";
  {
    auto [abs_loss, rel_loss] = differences(common, &StepRecord::loss);
    out << render_difference_chart("Loss difference",
                                   {{"|loss a - loss b|", kColorAbs, "", std::move(abs_loss)},
                                    {"relative", kColorRel, " stroke-dasharray=\"6,3\"", std::move(rel_loss)}},
                                   x_min, x_max, r, "loss-difference");
    auto [abs_g, rel_g] = differences(common, &StepRecord::grad_norm_pre);
    out << render_difference_chart("Gradient norm difference (before clipping)",
                                   {{"|grad a - grad b|", kColorAbs, "", std::move(abs_g)},
                                    {"relative", kColorRel, " stroke-dasharray=\"6,3\"", std::move(rel_g)}},
                                   x_min, x_max, r, "grad-difference");
  }
}

void write_header_diffs(std::ostringstream& out, const DiffReport& r) {
  out << "<h2>Header differences</h2>\n";
  if (r.header.empty()) {
    out << "<p class=\"note\">none (config, environment, model, data files and faults are equal)</p>\n";
  } else {
    out << "<table><tr><th>part</th><th>key</th><th>a</th><th>b</th></tr>\n";
    for_each_header_diff(r.header, [&](const char* part, const ValueDiff& d) {
      out << "<tr>" << td(part) << td(d.key, "v") << cell(d.a) << cell(d.b) << "</tr>\n";
    });
    out << "</table>\n";
  }
}

void write_field_divergence(std::ostringstream& out, const DiffReport& r) {
  out << "<h2>First divergence per field</h2>\n";
  if (r.first_by_field.empty()) {
    out << "<p class=\"note\">no field differs on the common steps</p>\n";
  } else {
    out << "<table><tr><th>step</th><th>field</th><th>a</th><th>b</th></tr>\n";
    for (const auto* f : fields_by_step(r))
      out << "<tr>" << td(std::to_string(f->step), "num") << td(f->field) << td(f->a, "v") << td(f->b, "v")
          << "</tr>\n";
    out << "</table>\n";
  }
}

void write_skips(std::ostringstream& out, const DiffReport& r) {
  out << "<h2>Skipped-step differences</h2>\n";
  if (r.skips.empty()) {
    out << "<p class=\"note\">none: every common step has the same outcome</p>\n";
  } else {
    out << "<table><tr><th>step</th><th>a</th><th>b</th></tr>\n";
    for (size_t i = 0; i < r.skips.size() && i < kTableLimit; ++i) {
      const auto& s = r.skips[i];
      auto text = [](records::Outcome o, const std::string& reason) {
        return std::string(outcome_name(o)) + (reason.empty() ? "" : " (" + reason + ")");
      };
      out << "<tr>" << td(std::to_string(s.step), "num") << td(text(s.a, s.reason_a)) << td(text(s.b, s.reason_b))
          << "</tr>\n";
    }
    out << more_rows(r.skips.size(), 3) << "</table>\n";
  }
}

void write_events(std::ostringstream& out, const DiffReport& r) {
  out << "<h2>Event differences</h2>\n";
  if (r.events.empty()) {
    out << "<p class=\"note\">none</p>\n";
  } else {
    out << "<table><tr><th>step</th><th>kind</th><th>a</th><th>b</th></tr>\n";
    auto msgs = [](const std::vector<std::string>& v) {
      if (v.empty()) return std::string("<td class=\"absent\">none</td>");
      std::string s = "<td class=\"v\">";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? "<br>" : "") + html_escape(v[i]);
      return s + "</td>";
    };
    for (size_t i = 0; i < r.events.size() && i < kTableLimit; ++i) {
      const auto& e = r.events[i];
      out << "<tr>" << td(std::to_string(e.step), "num") << td(e.kind) << msgs(e.a) << msgs(e.b) << "</tr>\n";
    }
    out << more_rows(r.events.size(), 4) << "</table>\n";
  }
}

void write_evals(std::ostringstream& out, const DiffReport& r) {
  out << "<h2>Evaluations</h2>\n";
  if (r.evals.empty()) {
    out << "<p class=\"note\">neither trace has evaluations</p>\n";
  } else {
    out << "<table><tr><th>step</th><th>accuracy a</th><th>accuracy b</th><th>difference</th><th>loss a</th>"
           "<th>loss b</th></tr>\n";
    for (size_t i = 0; i < r.evals.size() && i < kTableLimit; ++i) {
      const auto& e = r.evals[i];
      auto acc = [](const std::optional<records::EvalRecord>& x) {
        return x ? num(x->accuracy, "%.4f") : std::string("-");
      };
      auto loss = [](const std::optional<records::EvalRecord>& x) {
        return x ? value_text(x->loss) : std::string("-");
      };
      const std::string d = e.a && e.b ? num(e.b->accuracy - e.a->accuracy, "%+.4f") : std::string("-");
      out << "<tr" << (e.differs() ? " class=\"differs\"" : "") << ">" << td(std::to_string(e.step), "num")
          << td(acc(e.a), "num") << td(acc(e.b), "num") << td(d, "num") << td(loss(e.a), "num") << td(loss(e.b), "num")
          << "</tr>\n";
    }
    out << more_rows(r.evals.size(), 6) << "</table>\n";
  }
}

}  // namespace

std::string render_html(const DiffReport& r, const trace::TraceReader& a, const trace::TraceReader& b,
                        const std::string& label_a, const std::string& label_b,
                        const std::optional<ReportBisect>& bisect) {
  const std::vector<StepRecord> steps_a = a.steps(), steps_b = b.steps();
  std::map<uint64_t, const StepRecord*> ma, mb;
  for (const auto& s : steps_a) ma[s.step] = &s;
  for (const auto& s : steps_b) mb[s.step] = &s;
  const RunMarks marks_a = run_marks(ma, a, "a"), marks_b = run_marks(mb, b, "b");

  std::ostringstream out;
  out << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      << "<title>retrace diff: " << html_escape(label_a) << " vs " << html_escape(label_b) << "</title>\n"
      << "<style>" << kStyle << "</style>\n</head>\n<body>\n";
  out << "<h1>retrace diff: <span class=\"swatch-a\">" << html_escape(label_a) << "</span> vs <span class=\"swatch-b\">"
      << html_escape(label_b) << "</span></h1>\n";

  write_summary(out, r, label_a, label_b, bisect);

  // Where the runs part: differences on a log scale, digest agreement, the bisect result.
  const auto [x_min, x_max] = step_range(ma, mb);
  write_differences(out, r, ma, mb, x_min, x_max);
  out << render_digest_strip(ma, mb, x_min, x_max, r);
  out << "<h2>Bisection</h2>\n" << render_bisect(bisect);

  out << "<h2>Curves</h2>\n";
  out << render_chart({"Loss", "loss", series(ma, &StepRecord::loss), series(mb, &StepRecord::loss)}, marks_a, marks_b,
                      r, label_a, label_b);
  out << render_chart({"Gradient norm (before clipping)", "grad norm", series(ma, &StepRecord::grad_norm_pre),
                       series(mb, &StepRecord::grad_norm_pre)},
                      marks_a, marks_b, r, label_a, label_b);

  out << "<h2>Environment fingerprints</h2>\n" << render_fingerprints(a.header(), b.header());

  write_header_diffs(out, r);
  write_field_divergence(out, r);
  write_skips(out, r);
  write_events(out, r);
  write_evals(out, r);
  out << "<p class=\"note\">Generated by retrace diff. Step comparison is bitwise; a later record of a step "
         "number (after a rollback) replaces the earlier one.</p>\n";
  out << "</body>\n</html>\n";
  return out.str();
}

}  // namespace retrace::replay
