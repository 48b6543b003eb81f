// Small text helpers of the HTML diff report (replay/html_report.h, which declares html_escape):
// numbers as the page's charts and tables print them. Internal to the report's files.
#pragma once

#include <string>

namespace retrace::replay::html {

// `v` formatted with a printf conversion for one double.
std::string num(double v, const char* spec = "%.1f");

// A value as the tables print it: %.6g, or nan, inf, -inf.
std::string value_text(double v);

}  // namespace retrace::replay::html
