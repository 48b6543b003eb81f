#include "replay/report_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <set>
#include <sstream>

#include "replay/html_report.h"
#include "replay/html_text.h"

namespace retrace::replay::html {
namespace {

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
constexpr const char* kDiffPlotFill = "#fdfbf3";  // the divergence charts' plot area

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
void divergence_mark(std::ostringstream& out, const DiffReport& r, uint64_t x_min, uint64_t x_max, double y1, double y2,
                     double label_y) {
  if (!r.steps.first_diff) return;
  const double px = step_x(static_cast<double>(r.steps.first_diff->step), x_min, x_max);
  const std::string t = "first divergence: step " + std::to_string(r.steps.first_diff->step) + " (" +
                        r.steps.first_diff->field + ")";
  out << "<g class=\"divergence\" data-step=\"" << r.steps.first_diff->step << "\"><title>" << html_escape(t)
      << "</title><line x1=\"" << num(px) << "\" x2=\"" << num(px) << "\" y1=\"" << num(y1) << "\" y2=\"" << num(y2)
      << "\" stroke=\"" << kColorDiv << "\" stroke-width=\"2\" stroke-dasharray=\"5,3\"/>";
  if (label_y > 0) {
    const bool right_side = px < kLeft + (kWidth - kLeft - kRight) / 2;
    const double tw = 6.0 * static_cast<double>(t.size());  // about 6 px per glyph at 12 px
    const double tx = right_side ? px + 6 : px - 6;
    out << "<rect x=\"" << num(right_side ? tx - 2 : tx - tw - 2) << "\" y=\"" << num(label_y - 12) << "\" width=\""
        << num(tw + 4) << "\" height=\"16\" fill=\"white\" fill-opacity=\"0.85\"/>";
    out << "<text x=\"" << num(tx) << "\" y=\"" << num(label_y) << "\" text-anchor=\"" << (right_side ? "start" : "end")
        << "\" fill=\"" << kColorDiv << "\">" << html_escape(t) << "</text>";
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
    out << "<rect x=\"" << num(left) << "\" y=\"" << num(top) << "\" width=\"" << num(plot_w()) << "\" height=\""
        << num(plot_h()) << "\" class=\"plot\"/>\n";
    const double ys = nice_step(y_max_ - y_min_, 5);
    for (double v = std::ceil(y_min_ / ys) * ys; v <= y_max_ + ys * 1e-9; v += ys) {
      const double py = y(v);
      out << "<line x1=\"" << num(left) << "\" x2=\"" << num(right) << "\" y1=\"" << num(py) << "\" y2=\"" << num(py)
          << "\" class=\"grid\"/>";
      out << "<line x1=\"" << num(left - 5) << "\" x2=\"" << num(left) << "\" y1=\"" << num(py) << "\" y2=\"" << num(py)
          << "\" class=\"axis\"/>";
      out << "<text x=\"" << num(left - 8) << "\" y=\"" << num(py + 4) << "\" text-anchor=\"end\">" << tick_label(v, ys)
          << "</text>\n";
    }
    step_ticks(out, x_min_, x_max_, bottom, true, 19);
    out << "<line x1=\"" << num(left) << "\" x2=\"" << num(right) << "\" y1=\"" << num(bottom) << "\" y2=\""
        << num(bottom) << "\" class=\"axis\"/>";
    out << "<line x1=\"" << num(left) << "\" x2=\"" << num(left) << "\" y1=\"" << num(top) << "\" y2=\"" << num(bottom)
        << "\" class=\"axis\"/>\n";
    out << "<text x=\"" << num(left + plot_w() / 2) << "\" y=\"" << num(kHeight - 8)
        << "\" text-anchor=\"middle\" class=\"label\">step</text>\n";
    const double cy = top + plot_h() / 2;
    out << "<text x=\"16\" y=\"" << num(cy) << "\" text-anchor=\"middle\" class=\"label\" transform=\"rotate(-90 16 "
        << num(cy) << ")\">" << html_escape(y_label) << "</text>\n";
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
  out << "<line x1=\"" << num(px) << "\" x2=\"" << num(px) << "\" y1=\"" << num(cy - 5) << "\" y2=\"" << num(cy + 5)
      << "\" stroke=\"" << color << "\" stroke-width=\"2\"/>";
}
void rollback_shape(std::ostringstream& out, double px, double cy, const char* color) {
  out << "<path d=\"M" << num(px - 5) << "," << num(cy - 5) << "L" << num(px + 5) << "," << num(cy - 5) << "L"
      << num(px) << "," << num(cy + 5) << "Z\" fill=\"" << color << "\" stroke=\"#222\" stroke-width=\"0.6\"/>";
}
void resume_shape(std::ostringstream& out, double px, double cy, const char* color) {
  out << "<path d=\"M" << num(px) << "," << num(cy - 6) << "L" << num(px + 5) << "," << num(cy) << "L" << num(px) << ","
      << num(cy + 6) << "L" << num(px - 5) << "," << num(cy) << "Z\" fill=\"white\" stroke=\"" << color
      << "\" stroke-width=\"2\"/>";
}

}  // namespace

// A run's series: one value per step number, the later record winning (as in the comparison).
std::vector<Point> series(const std::map<uint64_t, const StepRecord*>& steps, double StepRecord::*field) {
  std::vector<Point> out;
  out.reserve(steps.size());
  for (const auto& [s, r] : steps) out.push_back({s, r->*field});
  return out;
}

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
  out << "<text x=\"" << num(kLeft - 8) << "\" y=\"" << num(kLaneA + 4) << "\" text-anchor=\"end\" fill=\"" << kColorA
      << "\">a</text>";
  out << "<text x=\"" << num(kLeft - 8) << "\" y=\"" << num(kLaneB + 4) << "\" text-anchor=\"end\" fill=\"" << kColorB
      << "\">b</text>";
  out << "<line x1=\"" << num(kLeft) << "\" x2=\"" << num(kWidth - kRight) << "\" y1=\"" << num(kLaneA) << "\" y2=\""
      << num(kLaneA) << "\" class=\"lane\"/>";
  out << "<line x1=\"" << num(kLeft) << "\" x2=\"" << num(kWidth - kRight) << "\" y1=\"" << num(kLaneB) << "\" y2=\""
      << num(kLaneB) << "\" class=\"lane\"/>\n";

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

// One series of a difference chart as a path: one point per common step (or the first, min, max
// and last of each pixel column), a break at a non-finite difference, whose pixel column goes into
// `nonfinite_cols`. `x` and `y` place a step and a difference.
template <typename X, typename Y>
void write_diff_series(std::ostringstream& out, const DiffSeries& s, double pw, const X& x, const Y& y,
                       std::set<long>& nonfinite_cols) {
  // Points of the path; a horizontal run keeps only its two ends, so long equal stretches (the
  // zero line) cost two points.
  std::vector<std::vector<std::pair<double, double>>> pieces(1);
  bool pen = false;
  auto emit = [&](double px, double v) {
    if (!pen && !pieces.back().empty()) pieces.emplace_back();
    pen = true;
    auto& pts = pieces.back();
    const double py = y(v);
    if (pts.size() >= 2 && pts[pts.size() - 1].second == py && pts[pts.size() - 2].second == py) pts.back().first = px;
    else if (pts.empty() || pts.back() != std::make_pair(px, py)) pts.emplace_back(px, py);
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
    for (size_t k = 0; k < piece.size(); ++k)
      d << (k ? "L" : "M") << num(piece[k].first) << "," << num(piece[k].second);
  out << "<path d=\"" << d.str() << "\" fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"2\"" << s.dash
      << " stroke-linejoin=\"round\" class=\"series\" data-series=\"" << html_escape(s.name) << "\"/>\n";
}

// A divergence chart: the series on a log scale, a zero line under it for equal steps, a marker
// above for steps whose difference is not finite, and the first divergence.
std::string render_difference_chart(const std::string& title, const std::vector<DiffSeries>& series, uint64_t x_min,
                                    uint64_t x_max, const DiffReport& r, const char* kind) {
  constexpr double kH = 300, kT = 36, kB = 46;  // geometry of this chart
  constexpr double kZeroGap = 22;               // the zero line sits this far under the log axis
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
        << "\" class=\"grid\"/><text x=\"" << num(left - 8) << "\" y=\"" << num(py + 4) << "\" text-anchor=\"end\">1e"
        << d << "</text>\n";
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

  // The series (write_diff_series), a non-finite difference marked on top instead. The first
  // series is drawn last, on top.
  std::set<long> nonfinite_all;
  for (auto it = series.rbegin(); it != series.rend(); ++it) {
    write_diff_series(out, *it, pw, x, y, nonfinite_all);
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
      const int state = ia == ma.end() || ib == mb.end()                             ? 2
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

}  // namespace retrace::replay::html
