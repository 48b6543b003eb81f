// The SVG charts of the HTML diff report (replay/html_report.h): both runs' curves with their
// markers, the divergence charts on a log scale and the digest agreement strip, and the series
// they draw. Every chart shares the step axis of step_range. Internal to the report's files.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "replay/diff.h"
#include "trace/trace_reader.h"

namespace retrace::replay::html {

using records::StepRecord;

constexpr const char* kColorAbs = "#6a3d9a";  // absolute difference
constexpr const char* kColorRel = "#1b9e77";  // relative difference

struct Point {
  uint64_t step;
  double value;
};

// A run's values of one field, in step order.
std::vector<Point> series(const std::map<uint64_t, const StepRecord*>& steps, double StepRecord::*field);

struct Marker {
  uint64_t step;
  std::string title;
};

// What one run contributes to a chart besides its line.
struct RunMarks {
  std::vector<Marker> skips, rollbacks, resumes;
};

// A run's skipped steps, rollbacks and resumes, each titled with `label`.
RunMarks run_marks(const std::map<uint64_t, const StepRecord*>& steps, const trace::TraceReader& reader,
                   const std::string& label);

struct ChartInput {
  std::string title;
  std::string y_label;
  std::vector<Point> a, b;
};

// Both runs' values of one field on shared axes, with their markers and the first divergence.
std::string render_chart(const ChartInput& in, const RunMarks& ma, const RunMarks& mb, const DiffReport& r,
                         const std::string& label_a, const std::string& label_b);

// The steps both runs have, in order, with their records (the later record of a step number).
struct CommonStep {
  uint64_t step;
  const StepRecord* a;
  const StepRecord* b;
};

std::vector<CommonStep> common_steps(const std::map<uint64_t, const StepRecord*>& ma,
                                     const std::map<uint64_t, const StepRecord*>& mb);

// The step range of every chart of the page.
std::pair<uint64_t, uint64_t> step_range(const std::map<uint64_t, const StepRecord*>& ma,
                                         const std::map<uint64_t, const StepRecord*>& mb);

struct DiffSeries {
  std::string name;
  const char* color;
  const char* dash;
  std::vector<Point> pts;  // >= 0, 0 = equal; not finite = the difference is not a number
};

// |a - b| and |a - b| / |a| of one field over the common steps.
std::pair<std::vector<Point>, std::vector<Point>> differences(const std::vector<CommonStep>& steps,
                                                              double StepRecord::*field);

// A divergence chart: the series on a log scale, equal steps on a zero line under it.
std::string render_difference_chart(const std::string& title, const std::vector<DiffSeries>& series, uint64_t x_min,
                                    uint64_t x_max, const DiffReport& r, const char* kind);

// Digest agreement per step, one row per digest.
std::string render_digest_strip(const std::map<uint64_t, const StepRecord*>& ma,
                                const std::map<uint64_t, const StepRecord*>& mb, uint64_t x_min, uint64_t x_max,
                                const DiffReport& r);

}  // namespace retrace::replay::html
