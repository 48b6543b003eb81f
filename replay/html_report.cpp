#include "replay/html_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <functional>
#include <map>
#include <set>
#include <sstream>

namespace retrace::replay {
namespace {

using records::StepRecord;

// Geometry of one chart, in SVG user units (= CSS pixels at 100% zoom).
constexpr double kWidth = 1100;
constexpr double kHeight = 360;
constexpr double kLeft = 80, kRight = 24;
constexpr double kLegendY = 16;             // baseline of the legend row
constexpr double kLaneA = 40, kLaneB = 56;  // centre lines of the marker lanes of run a and b
constexpr double kTop = 70;                 // top of the plot area
constexpr double kBottom = 50;              // space under the plot area for ticks and the axis label
constexpr const char* kColorA = "#1f5fbf";
constexpr const char* kColorB = "#e07b00";
constexpr const char* kColorDiv = "#c8102e";
constexpr size_t kTableLimit = 500;  // rows per HTML table; the JSON report has everything

std::string num(double v, const char* spec = "%.1f") {
  char buf[64];
  std::snprintf(buf, sizeof buf, spec, v);
  return buf;
}

std::string value_text(double v) {
  return std::isfinite(v) ? num(v, "%.6g") : (std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf"));
}

// A "nice" tick spacing (1, 2 or 5 times a power of ten) giving about `target` intervals.
double nice_step(double range, int target) {
  if (!(range > 0)) return 1;
  const double raw = range / target;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * p) return m * p;
  return 10 * p;
}

std::string tick_label(double v, double step) {
  if (std::fabs(v) < step * 1e-9) v = 0;
  const double a = std::fabs(v);
  if (a >= 1e6 || (a > 0 && a < 1e-4)) return num(v, "%.3g");
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  char spec[16];
  std::snprintf(spec, sizeof spec, "%%.%df", decimals);
  return num(v, spec);
}

struct Point {
  uint64_t step;
  double value;
};

// A run's series: one value per step number, the later record winning (as in the comparison).
std::vector<Point> series(const std::map<uint64_t, const StepRecord*>& steps, double StepRecord::*field) {
  std::vector<Point> out;
  out.reserve(steps.size());
  for (const auto& [s, r] : steps) out.push_back({s, r->*field});
  return out;
}

struct Marker {
  uint64_t step;
  std::string title;
};

// The step axis every chart of the page shares: steps x_min..x_max across the plot width.
double step_x(double step, uint64_t x_min, uint64_t x_max) {
  return kLeft + (step - static_cast<double>(x_min)) / static_cast<double>(x_max - x_min) * (kWidth - kLeft - kRight);
}

// The step axis's tick labels, `label_dy` under `bottom`, with tick marks when `marks`.
void step_ticks(std::ostringstream& out, uint64_t x_min, uint64_t x_max, double bottom, bool marks, double label_dy) {
  const double xs = std::max(1.0, std::round(nice_step(static_cast<double>(x_max - x_min), 10)));
  for (double s = std::ceil(static_cast<double>(x_min) / xs) * xs; s <= static_cast<double>(x_max); s += xs) {
    const double px = step_x(s, x_min, x_max);
    if (marks)
      out << "<line x1=\"" << num(px) << "\" x2=\"" << num(px) << "\" y1=\"" << num(bottom) << "\" y2=\""
          << num(bottom + 5) << "\" class=\"axis\"/>";
    out << "<text x=\"" << num(px) << "\" y=\"" << num(bottom + label_dy) << "\" text-anchor=\"middle\">"
        << tick_label(s, xs) << "</text>\n";
  }
}

// The first divergence, when there is one: a dashed line from y1 to y2 with the step and field as
// its tooltip and, when label_y > 0, as a label inside the plot on the side with more room.
void divergence_mark(std::ostringstream& out, const DiffReport& r, uint64_t x_min, uint64_t x_max, double y1,
                     double y2, double label_y) {
  if (!r.steps.first_diff) return;
  const double px = step_x(static_cast<double>(r.steps.first_diff->step), x_min, x_max);
  const std::string t =
      "first divergence: step " + std::to_string(r.steps.first_diff->step) + " (" + r.steps.first_diff->field + ")";
  out << "<g class=\"divergence\" data-step=\"" << r.steps.first_diff->step << "\"><title>" << html_escape(t)
      << "</title><line x1=\"" << num(px) << "\" x2=\"" << num(px) << "\" y1=\"" << num(y1) << "\" y2=\"" << num(y2)
      << "\" stroke=\"" << kColorDiv << "\" stroke-width=\"2\" stroke-dasharray=\"5,3\"/>";
  if (label_y > 0) {
    const bool right_side = px < kLeft + (kWidth - kLeft - kRight) / 2;
    const double tw = 6.0 * static_cast<double>(t.size());  // about 6 px per glyph at 12 px
    const double tx = right_side ? px + 6 : px - 6;
    out << "<rect x=\"" << num(right_side ? tx - 2 : tx - tw - 2) << "\" y=\"" << num(label_y - 12)
        << "\" width=\"" << num(tw + 4) << "\" height=\"16\" fill=\"white\" fill-opacity=\"0.85\"/>";
    out << "<text x=\"" << num(tx) << "\" y=\"" << num(label_y) << "\" text-anchor=\""
        << (right_side ? "start" : "end") << "\" fill=\"" << kColorDiv << "\">" << html_escape(t) << "</text>";
  }
  out << "</g>\n";
}

class Chart {
 public:
  Chart(uint64_t x_min, uint64_t x_max, double y_min, double y_max)
      : x_min_(x_min), x_max_(std::max(x_max, x_min + 1)), y_min_(y_min), y_max_(y_max) {}

  double x(double step) const { return step_x(step, x_min_, x_max_); }
  double y(double v) const { return kTop + (y_max_ - v) / (y_max_ - y_min_) * plot_h(); }
  static double plot_w() { return kWidth - kLeft - kRight; }
  static double plot_h() { return kHeight - kTop - kBottom; }
  uint64_t x_min() const { return x_min_; }
  uint64_t x_max() const { return x_max_; }

  // The polyline of one series: every point when there are few, else the first, min, max and last
  // value of each pixel column (in step order), which keeps spikes visible. Non-finite values
  // break the line.
  std::string path(const std::vector<Point>& pts) const {
    std::ostringstream d;
    bool pen_down = false;
    auto emit = [&](double px, double v) {
      d << (pen_down ? "L" : "M") << num(px) << "," << num(y(v));
      pen_down = true;
    };
    if (pts.size() <= 2 * static_cast<size_t>(plot_w())) {
      for (const auto& p : pts) {
        if (!std::isfinite(p.value)) {
          pen_down = false;
          continue;
        }
        emit(x(static_cast<double>(p.step)), p.value);
      }
      return d.str();
    }
    size_t i = 0;
    while (i < pts.size()) {
      const long col = std::lround(x(static_cast<double>(pts[i].step)));
      std::vector<double> bucket;
      for (; i < pts.size() && std::lround(x(static_cast<double>(pts[i].step))) == col; ++i)
        if (std::isfinite(pts[i].value)) bucket.push_back(pts[i].value);
      if (bucket.empty()) {
        pen_down = false;
        continue;
      }
      const auto [lo, hi] = std::minmax_element(bucket.begin(), bucket.end());
      const bool min_first = lo < hi;
      emit(col, bucket.front());
      emit(col, min_first ? *lo : *hi);
      emit(col, min_first ? *hi : *lo);
      emit(col, bucket.back());
    }
    return d.str();
  }

  void axes(std::ostringstream& out, const std::string& y_label) const {
    const double top = kTop, bottom = kHeight - kBottom, left = kLeft, right = kWidth - kRight;
    out << "<rect x=\"" << num(left) << "\" y=\"" << num(top) << "\" width=\"" << num(plot_w())
        << "\" height=\"" << num(plot_h()) << "\" class=\"plot\"/>\n";
    const double ys = nice_step(y_max_ - y_min_, 5);
    for (double v = std::ceil(y_min_ / ys) * ys; v <= y_max_ + ys * 1e-9; v += ys) {
      const double py = y(v);
      out << "<line x1=\"" << num(left) << "\" x2=\"" << num(right) << "\" y1=\"" << num(py) << "\" y2=\""
          << num(py) << "\" class=\"grid\"/>";
      out << "<line x1=\"" << num(left - 5) << "\" x2=\"" << num(left) << "\" y1=\"" << num(py) << "\" y2=\""
          << num(py) << "\" class=\"axis\"/>";
      out << "<text x=\"" << num(left - 8) << "\" y=\"" << num(py + 4) << "\" text-anchor=\"end\">"
          << tick_label(v, ys) << "</text>\n";
    }
    step_ticks(out, x_min_, x_max_, bottom, true, 19);
    out << "<line x1=\"" << num(left) << "\" x2=\"" << num(right) << "\" y1=\"" << num(bottom) << "\" y2=\""
        << num(bottom) << "\" class=\"axis\"/>";
    out << "<line x1=\"" << num(left) << "\" x2=\"" << num(left) << "\" y1=\"" << num(top) << "\" y2=\""
        << num(bottom) << "\" class=\"axis\"/>\n";
    out << "<text x=\"" << num(left + plot_w() / 2) << "\" y=\"" << num(kHeight - 8)
        << "\" text-anchor=\"middle\" class=\"label\">step</text>\n";
    const double cy = top + plot_h() / 2;
    out << "<text x=\"16\" y=\"" << num(cy)
        << "\" text-anchor=\"middle\" class=\"label\" transform=\"rotate(-90 16 " << num(cy) << ")\">"
        << html_escape(y_label) << "</text>\n";
  }

  // One marker per pixel column; `shape` draws it centred at (px, cy).
  void markers(std::ostringstream& out, const std::vector<Marker>& ms, double cy, const char* color,
               const std::function<void(std::ostringstream&, double, double, const char*)>& shape) const {
    std::set<long> used;
    for (const auto& m : ms) {
      if (m.step < x_min_ || m.step > x_max_) continue;
      const double px = x(static_cast<double>(m.step));
      if (!used.insert(std::lround(px)).second) continue;
      out << "<g><title>" << html_escape(m.title) << "</title>";
      shape(out, px, cy, color);
      out << "</g>";
    }
    out << "\n";
  }

 private:
  uint64_t x_min_, x_max_;
  double y_min_, y_max_;
};

// The opening tag of a chart's svg, with the geometry a test needs to map steps to positions.
std::string svg_open(const std::string& title, double height, uint64_t x_min, uint64_t x_max, const char* kind) {
  std::ostringstream out;
  out << "<svg viewBox=\"0 0 " << num(kWidth, "%.0f") << " " << num(height, "%.0f") << "\" width=\""
      << num(kWidth, "%.0f") << "\" height=\"" << num(height, "%.0f") << "\" fill=\"#333\" role=\"img\" aria-label=\""
      << html_escape(title) << "\" data-chart=\"" << kind << "\" data-x-min=\"" << x_min << "\" data-x-max=\""
      << std::max(x_max, x_min + 1) << "\" data-plot-left=\"" << num(kLeft) << "\" data-plot-width=\""
      << num(kWidth - kLeft - kRight) << "\">\n";
  return out.str();
}

void skip_shape(std::ostringstream& out, double px, double cy, const char* color) {
  out << "<line x1=\"" << num(px) << "\" x2=\"" << num(px) << "\" y1=\"" << num(cy - 5) << "\" y2=\""
      << num(cy + 5) << "\" stroke=\"" << color << "\" stroke-width=\"2\"/>";
}
void rollback_shape(std::ostringstream& out, double px, double cy, const char* color) {
  out << "<path d=\"M" << num(px - 5) << "," << num(cy - 5) << "L" << num(px + 5) << "," << num(cy - 5) << "L"
      << num(px) << "," << num(cy + 5) << "Z\" fill=\"" << color
      << "\" stroke=\"#222\" stroke-width=\"0.6\"/>";
}
void resume_shape(std::ostringstream& out, double px, double cy, const char* color) {
  out << "<path d=\"M" << num(px) << "," << num(cy - 6) << "L" << num(px + 5) << "," << num(cy) << "L"
      << num(px) << "," << num(cy + 6) << "L" << num(px - 5) << "," << num(cy)
      << "Z\" fill=\"white\" stroke=\"" << color << "\" stroke-width=\"2\"/>";
}

// What one run contributes to a chart besides its line.
struct RunMarks {
  std::vector<Marker> skips, rollbacks, resumes;
};

RunMarks run_marks(const std::map<uint64_t, const StepRecord*>& steps, const trace::TraceReader& reader,
                   const std::string& label) {
  RunMarks m;
  for (const auto& [s, r] : steps)
    if (r->outcome == records::Outcome::kSkip)
      m.skips.push_back({s, label + ": SKIP at step " + std::to_string(s) +
                                (r->skip_reason.empty() ? "" : " (" + r->skip_reason + ")")});
  for (const auto& e : reader.events()) {
    const std::string t = label + ": " + e.kind + " at step " + std::to_string(e.step) + ": " + e.message;
    if (e.kind == "rollback") m.rollbacks.push_back({e.step, t});
    if (e.kind == "resume") m.resumes.push_back({e.step, t});
  }
  return m;
}

struct ChartInput {
  std::string title;
  std::string y_label;
  std::vector<Point> a, b;
};

std::string render_chart(const ChartInput& in, const RunMarks& ma, const RunMarks& mb, const DiffReport& r,
                         const std::string& label_a, const std::string& label_b) {
  uint64_t x_min = UINT64_MAX, x_max = 0;
  double y_min = INFINITY, y_max = -INFINITY;
  for (const auto* pts : {&in.a, &in.b})
    for (const auto& p : *pts) {
      x_min = std::min(x_min, p.step);
      x_max = std::max(x_max, p.step);
      if (std::isfinite(p.value)) {
        y_min = std::min(y_min, p.value);
        y_max = std::max(y_max, p.value);
      }
    }
  if (x_min > x_max) x_min = 0, x_max = 1;
  if (!(y_min <= y_max)) y_min = 0, y_max = 1;
  const double pad = y_max > y_min ? (y_max - y_min) * 0.05 : std::max(std::fabs(y_max) * 0.1, 1.0);
  y_min -= pad;
  y_max += pad;
  // Loss and norms are not negative: keep the axis at zero instead of padding below it.
  if (y_min < 0 && y_min + pad >= 0) y_min = 0;
  Chart c(x_min, x_max, y_min, y_max);

  std::ostringstream out;
  out << "<figure><figcaption>" << html_escape(in.title) << "</figcaption>\n";
  out << svg_open(in.title, kHeight, c.x_min(), c.x_max(), "values");

  // Legend: the two runs, then the marker kinds.
  double lx = kLeft;
  auto legend_text = [&](const std::string& t) {
    out << "<text x=\"" << num(lx) << "\" y=\"" << num(kLegendY + 4) << "\">" << html_escape(t) << "</text>";
    lx += 7.0 * static_cast<double>(std::min<size_t>(t.size(), 40)) + 22;
  };
  auto legend_line = [&](const char* color, const std::string& t, const char* dash) {
    out << "<line x1=\"" << num(lx) << "\" x2=\"" << num(lx + 22) << "\" y1=\"" << num(kLegendY) << "\" y2=\""
        << num(kLegendY) << "\" stroke=\"" << color << "\" stroke-width=\"2.5\"" << dash << "/>";
    lx += 28;
    legend_text(t.size() > 40 ? t.substr(0, 37) + "..." : t);
  };
  legend_line(kColorA, "a: " + label_a, "");
  legend_line(kColorB, "b: " + label_b, "");
  skip_shape(out, lx + 4, kLegendY, "#555");
  lx += 14;
  legend_text("skip");
  rollback_shape(out, lx + 4, kLegendY, "#555");
  lx += 14;
  legend_text("rollback");
  resume_shape(out, lx + 4, kLegendY, "#555");
  lx += 14;
  legend_text("resume");
  if (r.steps.first_diff) legend_line(kColorDiv, "first divergence", " stroke-dasharray=\"5,3\"");
  out << "\n";

  // Marker lanes above the plot, one per run.
  out << "<text x=\"" << num(kLeft - 8) << "\" y=\"" << num(kLaneA + 4) << "\" text-anchor=\"end\" fill=\""
      << kColorA << "\">a</text>";
  out << "<text x=\"" << num(kLeft - 8) << "\" y=\"" << num(kLaneB + 4) << "\" text-anchor=\"end\" fill=\""
      << kColorB << "\">b</text>";
  out << "<line x1=\"" << num(kLeft) << "\" x2=\"" << num(kWidth - kRight) << "\" y1=\"" << num(kLaneA)
      << "\" y2=\"" << num(kLaneA) << "\" class=\"lane\"/>";
  out << "<line x1=\"" << num(kLeft) << "\" x2=\"" << num(kWidth - kRight) << "\" y1=\"" << num(kLaneB)
      << "\" y2=\"" << num(kLaneB) << "\" class=\"lane\"/>\n";

  c.axes(out, in.y_label);

  out << "<path d=\"" << c.path(in.a) << "\" fill=\"none\" stroke=\"" << kColorA
      << "\" stroke-width=\"2.2\" stroke-linejoin=\"round\" class=\"run-a\"/>\n";
  out << "<path d=\"" << c.path(in.b) << "\" fill=\"none\" stroke=\"" << kColorB
      << "\" stroke-width=\"1.4\" stroke-linejoin=\"round\" class=\"run-b\"/>\n";

  c.markers(out, ma.skips, kLaneA, kColorA, skip_shape);
  c.markers(out, mb.skips, kLaneB, kColorB, skip_shape);
  c.markers(out, ma.resumes, kLaneA, kColorA, resume_shape);
  c.markers(out, mb.resumes, kLaneB, kColorB, resume_shape);
  c.markers(out, ma.rollbacks, kLaneA, kColorA, rollback_shape);
  c.markers(out, mb.rollbacks, kLaneB, kColorB, rollback_shape);

  divergence_mark(out, r, c.x_min(), c.x_max(), kLaneA - 8, kHeight - kBottom, kTop + 16);
  out << "</svg></figure>\n";
  return out.str();
}

std::string cell(const std::optional<std::string>& v) {
  return v ? "<td class=\"v\">" + html_escape(*v) + "</td>" : "<td class=\"absent\">absent</td>";
}

std::string td(const std::string& v, const char* cls = nullptr) {
  return std::string("<td") + (cls ? std::string(" class=\"") + cls + "\"" : "") + ">" + html_escape(v) +
         "</td>";
}

std::string more_rows(size_t total, size_t columns) {
  if (total <= kTableLimit) return "";
  return "<tr><td colspan=\"" + std::to_string(columns) + "\" class=\"absent\">... " +
         std::to_string(total - kTableLimit) + " more rows (see the JSON report)</td></tr>\n";
}

std::string span_text(const std::optional<StepSpan>& s) {
  if (!s) return "no steps";
  return "steps " + std::to_string(s->first) + ".." + std::to_string(s->last) + " (" +
         std::to_string(s->count) + " steps)";
}

std::string spans_text(const std::vector<StepSpan>& v) {
  std::string t;
  for (size_t i = 0; i < v.size() && i < 8; ++i)
    t += (i ? ", " : "") + std::to_string(v[i].first) +
         (v[i].first == v[i].last ? "" : ".." + std::to_string(v[i].last));
  if (v.size() > 8) t += ", ...";
  return t;
}

// The steps both runs have, in order, with their records (the later record of a step number).
struct CommonStep {
  uint64_t step;
  const StepRecord* a;
  const StepRecord* b;
};

std::vector<CommonStep> common_steps(const std::map<uint64_t, const StepRecord*>& ma,
                                     const std::map<uint64_t, const StepRecord*>& mb) {
  std::vector<CommonStep> out;
  for (const auto& [s, ra] : ma) {
    auto it = mb.find(s);
    if (it != mb.end()) out.push_back({s, ra, it->second});
  }
  return out;
}

// The step range every chart of the page shares: the union of both runs' steps.
std::pair<uint64_t, uint64_t> step_range(const std::map<uint64_t, const StepRecord*>& ma,
                                         const std::map<uint64_t, const StepRecord*>& mb) {
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const auto* m : {&ma, &mb})
    if (!m->empty()) {
      lo = std::min(lo, m->begin()->first);
      hi = std::max(hi, m->rbegin()->first);
    }
  if (lo > hi) return {0, 1};
  return {lo, std::max(hi, lo + 1)};
}

constexpr const char* kColorAbs = "#6a3d9a";  // absolute difference
constexpr const char* kColorRel = "#1b9e77";  // relative difference
constexpr const char* kDiffPlotFill = "#fdfbf3";  // the divergence charts' plot area

struct DiffSeries {
  std::string name;
  const char* color;
  const char* dash;
  std::vector<Point> pts;  // >= 0, 0 = equal; not finite = the difference is not a number
};

// |a - b| and |a - b| / |a| of one field over the common steps; a non-finite value on either side
// gives a non-finite difference unless both sides hold the same bits.
std::pair<std::vector<Point>, std::vector<Point>> differences(const std::vector<CommonStep>& steps,
                                                              double StepRecord::*field) {
  std::vector<Point> abs_d, rel_d;
  for (const auto& c : steps) {
    const double va = c.a->*field, vb = c.b->*field;
    double d = 0;
    if (std::memcmp(&va, &vb, sizeof va) != 0) d = std::fabs(va - vb);
    if (std::isnan(d)) d = INFINITY;
    abs_d.push_back({c.step, d});
    const double denom = std::fabs(va);
    rel_d.push_back({c.step, d == 0 ? 0 : (denom > 0 && std::isfinite(denom) ? d / denom : INFINITY)});
  }
  return {abs_d, rel_d};
}

// A divergence chart: the series on a log scale, a zero line under it for equal steps, a marker
// above for steps whose difference is not finite, and the first divergence.
std::string render_difference_chart(const std::string& title, const std::vector<DiffSeries>& series,
                                    uint64_t x_min, uint64_t x_max, const DiffReport& r, const char* kind) {
  constexpr double kH = 300, kT = 36, kB = 46;           // geometry of this chart
  constexpr double kZeroGap = 22;                        // the zero line sits this far under the log axis
  const double log_bottom = kH - kB - kZeroGap, zero_y = kH - kB - 6;
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& s : series)
    for (const auto& p : s.pts)
      if (p.value > 0 && std::isfinite(p.value)) {
        lo = std::min(lo, p.value);
        hi = std::max(hi, p.value);
      }
  int dlo = std::isfinite(lo) ? static_cast<int>(std::floor(std::log10(lo))) : -8;
  int dhi = std::isfinite(hi) ? static_cast<int>(std::ceil(std::log10(hi))) : 0;
  if (dhi <= dlo) dhi = dlo + 1;
  const double left = kLeft, right = kWidth - kRight, pw = right - left;
  auto x = [&](double step) { return step_x(step, x_min, x_max); };
  auto y = [&](double v) {
    if (v == 0) return zero_y;
    const double t = (std::log10(v) - dlo) / (dhi - dlo);
    return log_bottom - t * (log_bottom - kT);
  };

  std::ostringstream out;
  out << "<figure><figcaption>" << html_escape(title) << "</figcaption>\n" << svg_open(title, kH, x_min, x_max, kind);
  out << "<rect x=\"" << num(left) << "\" y=\"" << num(kT) << "\" width=\"" << num(pw) << "\" height=\""
      << num(kH - kB - kT) << "\" fill=\"" << kDiffPlotFill << "\" class=\"diff-plot\"/>\n";
  for (int d = dlo; d <= dhi; ++d) {
    const double py = y(std::pow(10.0, d));
    out << "<line x1=\"" << num(left) << "\" x2=\"" << num(right) << "\" y1=\"" << num(py) << "\" y2=\"" << num(py)
        << "\" class=\"grid\"/><text x=\"" << num(left - 8) << "\" y=\"" << num(py + 4)
        << "\" text-anchor=\"end\">1e" << d << "</text>\n";
  }
  out << "<line x1=\"" << num(left) << "\" x2=\"" << num(right) << "\" y1=\"" << num(zero_y) << "\" y2=\""
      << num(zero_y) << "\" class=\"zero\"/><text x=\"" << num(left - 8) << "\" y=\"" << num(zero_y + 4)
      << "\" text-anchor=\"end\">0</text>\n";
  step_ticks(out, x_min, x_max, kH - kB, true, 19);
  out << "<line x1=\"" << num(left) << "\" x2=\"" << num(right) << "\" y1=\"" << num(kH - kB) << "\" y2=\""
      << num(kH - kB) << "\" class=\"axis\"/><text x=\"" << num(left + pw / 2) << "\" y=\"" << num(kH - 8)
      << "\" text-anchor=\"middle\" class=\"label\">step</text>\n";

  // Legend.
  double lx = left;
  for (const auto& s : series) {
    out << "<line x1=\"" << num(lx) << "\" x2=\"" << num(lx + 22) << "\" y1=\"16\" y2=\"16\" stroke=\"" << s.color
        << "\" stroke-width=\"2.5\"" << s.dash << "/><text x=\"" << num(lx + 28) << "\" y=\"20\">"
        << html_escape(s.name) << "</text>";
    lx += 28 + 7.0 * static_cast<double>(s.name.size()) + 24;
  }
  out << "\n";

  // The series: one point per common step (or the first, min, max and last of each pixel column),
  // a break at a non-finite difference, which is marked on top instead. The first series is drawn
  // last, on top.
  std::set<long> nonfinite_all;
  for (auto it = series.rbegin(); it != series.rend(); ++it) {
    const DiffSeries& s = *it;
    // Points of the path; a horizontal run keeps only its two ends, so long equal stretches (the
    // zero line) cost two points.
    std::vector<std::vector<std::pair<double, double>>> pieces(1);
    std::set<long> nonfinite_cols;
    bool pen = false;
    auto emit = [&](double px, double v) {
      if (!pen && !pieces.back().empty()) pieces.emplace_back();
      pen = true;
      auto& pts = pieces.back();
      const double py = y(v);
      if (pts.size() >= 2 && pts[pts.size() - 1].second == py && pts[pts.size() - 2].second == py)
        pts.back().first = px;
      else if (pts.empty() || pts.back() != std::make_pair(px, py))
        pts.emplace_back(px, py);
    };
    const bool dense = s.pts.size() > 2 * static_cast<size_t>(pw);
    for (size_t i = 0; i < s.pts.size();) {
      const long col = std::lround(x(static_cast<double>(s.pts[i].step)));
      std::vector<double> bucket;  // this point, or every point of this pixel column when dense
      bool nonfinite = false;
      do {
        if (std::isfinite(s.pts[i].value)) bucket.push_back(s.pts[i].value);
        else nonfinite = true;
        ++i;
      } while (dense && i < s.pts.size() && std::lround(x(static_cast<double>(s.pts[i].step))) == col);
      if (nonfinite) {
        nonfinite_cols.insert(col);
        pen = false;
      }
      if (bucket.empty()) continue;
      const double px = dense ? static_cast<double>(col) : x(static_cast<double>(s.pts[i - 1].step));
      const auto [mn, mx] = std::minmax_element(bucket.begin(), bucket.end());
      emit(px, bucket.front());
      if (bucket.size() > 1) {
        emit(px, *mn);
        emit(px, *mx);
        emit(px, bucket.back());
      }
    }
    std::ostringstream d;
    for (const auto& piece : pieces)
      for (size_t k = 0; k < piece.size(); ++k) d << (k ? "L" : "M") << num(piece[k].first) << "," << num(piece[k].second);
    out << "<path d=\"" << d.str() << "\" fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"2\"" << s.dash
        << " stroke-linejoin=\"round\" class=\"series\" data-series=\"" << html_escape(s.name) << "\"/>\n";
    nonfinite_all.insert(nonfinite_cols.begin(), nonfinite_cols.end());
  }
  // Steps whose difference is not a number (a NaN or an infinity on one side): a band above the
  // plot, one rect per run of adjacent pixel columns.
  for (auto it = nonfinite_all.begin(); it != nonfinite_all.end();) {
    long first_col = *it, last_col = *it;
    while (++it != nonfinite_all.end() && *it == last_col + 1) last_col = *it;
    out << "<rect x=\"" << first_col - 1 << "\" y=\"" << num(kT - 8) << "\" width=\"" << last_col - first_col + 3
        << "\" height=\"6\" fill=\"#555\" class=\"nonfinite\"><title>difference not finite</title></rect>";
  }
  out << "\n";
  divergence_mark(out, r, x_min, x_max, kT, kH - kB, kT + 16);
  out << "</svg></figure>\n";
  return out.str();
}

// One row per digest, one cell per pixel column: green where every step in the column agrees, red
// where one differs, grey where only one run has the step.
std::string render_digest_strip(const std::map<uint64_t, const StepRecord*>& ma,
                                const std::map<uint64_t, const StepRecord*>& mb, uint64_t x_min, uint64_t x_max,
                                const DiffReport& r) {
  struct Row {
    const char* name;
    Digest128 StepRecord::*field;
  };
  const Row rows[] = {{"params", &StepRecord::param_digest}, {"optimizer", &StepRecord::optim_digest},
                      {"RNG", &StepRecord::rng_digest},      {"batch", &StepRecord::sample_digest},
                      {"state", &StepRecord::state_digest},  {"chain", &StepRecord::chain_digest}};
  constexpr double kRowH = 16, kT = 8;
  const double height = kT + kRowH * static_cast<double>(std::size(rows)) + 40;
  const double left = kLeft, pw = kWidth - kLeft - kRight;
  auto x = [&](uint64_t step) { return step_x(static_cast<double>(step), x_min, x_max); };
  // Each step owns the pixels from its position to the next step's (at least one).
  const double cell_w = std::max(1.0, pw / static_cast<double>(x_max - x_min + 1));
  std::ostringstream out;
  out << "<figure><figcaption>Digest agreement per step</figcaption>\n"
      << svg_open("Digest agreement per step", height, x_min, x_max, "digests");
  std::set<uint64_t> steps;
  for (const auto& [s, _] : ma) steps.insert(s);
  for (const auto& [s, _] : mb) steps.insert(s);
  for (size_t ri = 0; ri < std::size(rows); ++ri) {
    const double y0 = kT + kRowH * static_cast<double>(ri);
    out << "<text x=\"" << num(left - 8) << "\" y=\"" << num(y0 + 12) << "\" text-anchor=\"end\">" << rows[ri].name
        << "</text>";
    // state per pixel column: 1 agree, 2 one side only, 3 differ (the worst wins)
    std::map<long, int> cols;
    for (uint64_t s : steps) {
      auto ia = ma.find(s), ib = mb.find(s);
      const int state = ia == ma.end() || ib == mb.end()        ? 2
                        : ia->second->*rows[ri].field == ib->second->*rows[ri].field ? 1
                                                                                     : 3;
      // The step's cell covers [x - w/2, x + w/2): neighbours share at most a column, the worse state wins.
      const long c0 = std::lround(std::floor(x(s) - cell_w / 2)), c1 = std::lround(std::ceil(x(s) + cell_w / 2)) - 1;
      for (long c = c0; c <= std::max(c0, c1); ++c) cols[c] = std::max(cols[c], state);
    }
    static const char* kFill[] = {"", "#8fd19e", "#d0d0d0", "#e5484d"};
    auto it = cols.begin();
    while (it != cols.end()) {
      auto run_end = it;
      long last = it->first;
      while (std::next(run_end) != cols.end() && std::next(run_end)->first == last + 1 &&
             std::next(run_end)->second == it->second) {
        ++run_end;
        last = run_end->first;
      }
      out << "<rect x=\"" << it->first << "\" y=\"" << num(y0 + 2) << "\" width=\"" << last - it->first + 1
          << "\" height=\"" << num(kRowH - 4) << "\" fill=\"" << kFill[it->second] << "\"/>";
      it = std::next(run_end);
    }
    out << "\n";
  }
  const double bottom = kT + kRowH * static_cast<double>(std::size(rows));
  step_ticks(out, x_min, x_max, bottom, false, 16);
  out << "<text x=\"" << num(left) << "\" y=\"" << num(bottom + 32)
      << "\" class=\"note-svg\">green: equal bits; red: they differ; grey: the step is in one run only</text>\n";
  divergence_mark(out, r, x_min, x_max, kT - 4, bottom + 2, 0);
  out << "</svg></figure>\n<p class=\"note\">params, optimizer and RNG: the digests after the step; batch: the "
         "samples it trained on; state: loss scaler, guards, fired faults and counters; chain: the hash chain up to "
         "the step.</p>\n";
  return out.str();
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
        << td(records::is_numerics_key(k) ? "numerics" : "information") << cell(v.first) << cell(v.second)
        << "</tr>\n";
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
  row("re-executed from", "step " + std::to_string(b->replay_start_a) + " (a), step " +
                              std::to_string(b->replay_start_b) + " (b)");
  out << "</table>\n<p>" << html_escape(b->summary) << "</p>\n";
  return out.str();
}

constexpr const char* kStyle = R"(
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: #1d1d1f;
       margin: 24px; max-width: 1160px; }
h1 { font-size: 22px; margin: 0 0 12px; }
h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
figure { margin: 12px 0 20px; }
figcaption { font-weight: 600; margin-bottom: 2px; }
svg { font-size: 12px; font-family: inherit; display: block; max-width: 100%; height: auto; }
svg .plot { fill: #fcfcfd; stroke: none; }
svg .grid { stroke: #e6e6e6; stroke-width: 1; }
svg .axis { stroke: #555; stroke-width: 1; }
svg .lane { stroke: #eee; stroke-width: 1; }
svg .label { font-weight: 600; }
svg .zero { stroke: #999; stroke-width: 1; stroke-dasharray: 2,2; }
svg .note-svg { fill: #666; }
table { border-collapse: collapse; margin: 6px 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f4f6; font-weight: 600; }
td.v { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12.5px;
       word-break: break-all; max-width: 420px; }
td.num { text-align: right; font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; }
td.absent { color: #888; font-style: italic; }
tr.differs td { background: #fff4e5; }
.verdict-ok { color: #1a7f37; font-weight: 600; }
.verdict-bad { color: #c8102e; font-weight: 600; }
.note { color: #555; }
.swatch-a { color: #1f5fbf; font-weight: 600; }
.swatch-b { color: #e07b00; font-weight: 600; }
)";

}  // namespace

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

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
  out << "<h1>retrace diff: <span class=\"swatch-a\">" << html_escape(label_a)
      << "</span> vs <span class=\"swatch-b\">" << html_escape(label_b) << "</span></h1>\n";

  // Summary.
  out << "<table class=\"summary\">\n";
  auto row = [&](const std::string& k, const std::string& v_html) {
    out << "<tr><th>" << html_escape(k) << "</th><td>" << v_html << "</td></tr>\n";
  };
  row("a", "<span class=\"swatch-a\">" + html_escape(label_a) + "</span> " + html_escape(r.path_a) +
               " &mdash; " + html_escape(span_text(r.span_a)));
  row("b", "<span class=\"swatch-b\">" + html_escape(label_b) + "</span> " + html_escape(r.path_b) +
               " &mdash; " + html_escape(span_text(r.span_b)));
  if (r.tail_warning_a) row("warning a", html_escape(*r.tail_warning_a));
  if (r.tail_warning_b) row("warning b", html_escape(*r.tail_warning_b));
  row("common", html_escape(r.common ? span_text(r.common) : std::string("no common steps")));
  if (!r.only_in_a.empty()) row("only in a", html_escape(spans_text(r.only_in_a)));
  if (!r.only_in_b.empty()) row("only in b", html_escape(spans_text(r.only_in_b)));
  if (r.identical()) {
    row("verdict", "<span class=\"verdict-ok\">IDENTICAL (bitwise)</span>");
  } else if (r.steps.first_diff) {
    row("verdict", "<span class=\"verdict-bad\">DIVERGED at step " +
                       std::to_string(r.steps.first_diff->step) + " (" +
                       html_escape(r.steps.first_diff->field) + ")</span>");
  } else {
    row("verdict", "<span class=\"verdict-bad\">common steps equal; other differences below</span>");
  }
  if (r.where) row("where", html_escape(divergence_text(*r.where)));
  if (r.steps.compared > 0)
    row("loss difference", "max " + value_text(r.steps.max_loss_diff) + " at step " +
                               std::to_string(r.steps.max_loss_diff_step) + ", final " +
                               value_text(r.steps.final_loss_diff));
  row("environment",
      r.environment_differs() ? "differs: bitwise differences are expected (see below)" : "equal");
  if (r.models_differ()) row("model", "<span class=\"verdict-bad\">models differ (see below)</span>");
  if (bisect && bisect->diverged) row("bisect", html_escape(bisect->summary));
  out << "</table>\n";

  // Where the runs part: differences on a log scale, digest agreement, the bisect result.
  const auto [x_min, x_max] = step_range(ma, mb);
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
  out << render_digest_strip(ma, mb, x_min, x_max, r);
  out << "<h2>Bisection</h2>\n" << render_bisect(bisect);

  out << "<h2>Curves</h2>\n";
  out << render_chart({"Loss", "loss", series(ma, &StepRecord::loss), series(mb, &StepRecord::loss)}, marks_a,
                      marks_b, r, label_a, label_b);
  out << render_chart({"Gradient norm (before clipping)", "grad norm", series(ma, &StepRecord::grad_norm_pre),
                       series(mb, &StepRecord::grad_norm_pre)},
                      marks_a, marks_b, r, label_a, label_b);

  out << "<h2>Environment fingerprints</h2>\n" << render_fingerprints(a.header(), b.header());

  // Header differences.
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
      out << "<tr>" << td(std::to_string(s.step), "num") << td(text(s.a, s.reason_a))
          << td(text(s.b, s.reason_b)) << "</tr>\n";
    }
    out << more_rows(r.skips.size(), 3) << "</table>\n";
  }

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
          << td(acc(e.a), "num") << td(acc(e.b), "num") << td(d, "num") << td(loss(e.a), "num")
          << td(loss(e.b), "num") << "</tr>\n";
    }
    out << more_rows(r.evals.size(), 6) << "</table>\n";
  }
  out << "<p class=\"note\">Generated by retrace diff. Step comparison is bitwise; a later record of a step "
         "number (after a rollback) replaces the earlier one.</p>\n";
  out << "</body>\n</html>\n";
  return out.str();
}

}  // namespace retrace::replay
