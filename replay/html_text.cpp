#include "replay/html_text.h"

#include <cmath>
#include <cstdio>

#include "replay/html_report.h"

namespace retrace::replay {
namespace html {

std::string num(double v, const char* spec) {
  char buf[64];
  std::snprintf(buf, sizeof buf, spec, v);
  return buf;
}

std::string value_text(double v) {
  return std::isfinite(v) ? num(v, "%.6g") : (std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf"));
}

}  // namespace html

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += ch;
    }
  }
  return out;
}

}  // namespace retrace::replay
