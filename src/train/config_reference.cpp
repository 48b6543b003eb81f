#include "train/config.h"

#include <cmath>
#include <sstream>

#include "train/config_fields.h"

namespace retrace::train {
namespace {

using config_detail::Field;
using config_detail::field_text;
using config_detail::fields;
using config_detail::join;
using config_detail::Kind;
using config_detail::kind_name;
using config_detail::number;

}  // namespace

std::string describe_keys() {
  Config c;
  std::ostringstream out;
  for (const auto& f : fields()) {
    out << "  " << f.key << " (" << kind_name(f.kind);
    if (!f.choices.empty()) out << ": " << join(f.choices);
    out << "): " << f.help << "\n";
  }
  (void)c;
  return out.str();
}

std::string config_reference() {
  Config c;  // the defaults a config file gets for the keys it leaves out
  std::ostringstream out;
  std::string section;
  bool first = true;
  auto cell = [](std::string text) {  // Markdown table cell: no bare '|'
    std::string o;
    for (char ch : text) o += ch == '|' ? std::string("\\|") : std::string(1, ch);
    return o;
  };
  for (const auto& f : fields()) {
    const auto dot = f.key.find('.');
    const std::string sec = dot == std::string::npos ? "" : f.key.substr(0, dot);
    if (first || sec != section) {
      out << (first ? "" : "\n") << (sec.empty() ? std::string("### Top level") : "### `[" + sec + "]`") << "\n\n"
          << "| key | type | default | meaning |\n|---|---|---|---|\n";
      section = sec;
      first = false;
    }
    std::string type = kind_name(f.kind);
    if (!f.choices.empty()) {
      type += ":";
      for (size_t i = 0; i < f.choices.size(); ++i) type += (i ? ", `" : " `") + f.choices[i] + "`";
    }
    const bool numeric = f.kind == Kind::kInt || f.kind == Kind::kFloat || f.kind == Kind::kIntList;
    if (numeric && (f.min != -INFINITY || f.max != INFINITY)) {
      std::ostringstream range;
      const bool integer = f.kind == Kind::kInt || f.kind == Kind::kIntList;
      auto bound = [&](double v) {
        if (std::isinf(v)) return std::string(v < 0 ? "-inf" : "inf");
        return integer ? std::to_string(static_cast<long long>(v)) : number(v);
      };
      range << ", in " << (f.min_open ? "(" : "[") << bound(f.min) << ", " << bound(f.max) << (f.max_open ? ")" : "]");
      type += range.str();
    }
    std::string meaning = f.help;
    if (!f.legacy.empty())
      meaning += ". A config retrace recorded without this key reads as `" + f.legacy +
                 "` (what retrace did before it)";
    if (f.era == Field::Era::kRetired) meaning += ". Written back only in configs that use it";
    out << "| `" << f.key << "` | " << cell(type) << " | `" << cell(field_text(f, c)) << "` | " << cell(meaning)
        << " |\n";
  }
  out << "\n### `[user]`\n\nKeys of your own components (`user.NAME = value`, any TOML value; NAME is bare TOML keys, "
         "letters, digits, `_` and `-`, joined by dots): written back sorted, part of the config hash.\n";
  return out.str();
}

}  // namespace retrace::train
