#include "train/config.h"

#include <cmath>
#include <map>
#include <sstream>
#include <toml++/toml.h>

#include "core/digest.h"
#include "core/error.h"
#include "core/parse_number.h"
#include "core/file_util.h"
#include "train/config_fields.h"

namespace retrace::train {
namespace {

using config_detail::Field;
using config_detail::field_text;
using config_detail::fields;
using config_detail::join;
using config_detail::Kind;
using config_detail::kind_name;
using config_detail::resolve_defaults;
using config_detail::validate;

std::string valid_keys_near(const std::vector<Field>& fs, const std::string& key) {
  std::string section = key.substr(0, key.find('.') == std::string::npos ? 0 : key.find('.'));
  std::ostringstream out;
  bool any = false;
  for (const auto& f : fs) {
    bool same_section = !section.empty() && f.key.rfind(section + ".", 0) == 0;
    if (section.empty() || same_section) {
      out << (any ? ", " : "") << f.key;
      any = true;
    }
  }
  if (!any)
    for (const auto& f : fs) out << (any ? ", " : "") << f.key, any = true;
  return out.str();
}

void check_range(const Field& f, double v, const std::string& where) {
  bool lo_ok = f.min_open ? v > f.min : v >= f.min;
  bool hi_ok = f.max_open ? v < f.max : v <= f.max;
  if (!(lo_ok && hi_ok) || std::isnan(v)) {
    std::ostringstream range;
    range << (f.min_open ? "(" : "[") << f.min << ", " << f.max << (f.max_open ? ")" : "]");
    RETRACE_FAIL(ConfigError, "bad value for ", f.key, " in ", where, ": ", v, " is outside ", range.str(), " (",
                 f.help, ")");
  }
}

// Assigns a TOML node to the field, checking type and bounds.
void assign(const Field& f, Config& c, const toml::node& node, const std::string& where) {
  void* p = f.ref(c);
  auto type_error = [&]() {
    std::ostringstream found;
    found << node.type();
    RETRACE_FAIL(ConfigError, "bad value for ", f.key, " in ", where, ": expected ", kind_name(f.kind),
                 f.kind == Kind::kChoice ? " (one of " + join(f.choices) + ")" : "", ", found ", found.str());
  };
  switch (f.kind) {
    case Kind::kInt: {
      // The type first: toml++ 3.3.0's value<int64_t>() of a float casts it unchecked (undefined
      // for 1e25; found by tools/fuzz/config_fuzzer.cpp).
      if (!node.is_integer()) type_error();
      auto v = node.value<int64_t>();
      if (!v) type_error();
      check_range(f, static_cast<double>(*v), where);
      *static_cast<int64_t*>(p) = *v;
      break;
    }
    case Kind::kFloat: {
      if (!node.is_number()) type_error();
      double v = *node.value<double>();
      check_range(f, v, where);
      *static_cast<double*>(p) = v;
      break;
    }
    case Kind::kBool: {
      if (!node.is_boolean()) type_error();
      *static_cast<bool*>(p) = *node.value<bool>();
      break;
    }
    case Kind::kString: {
      if (!node.is_string()) type_error();
      *static_cast<std::string*>(p) = *node.value<std::string>();
      break;
    }
    case Kind::kChoice: {
      if (!node.is_string()) type_error();
      std::string v = *node.value<std::string>();
      size_t index = f.choices.size();
      for (size_t i = 0; i < f.choices.size(); ++i)
        if (f.choices[i] == v) index = i;
      RETRACE_CHECK(index < f.choices.size(), ConfigError, "bad value for ", f.key, " in ", where, ": \"", v,
                    "\" is not one of ", join(f.choices));
      *static_cast<uint8_t*>(p) = static_cast<uint8_t>(index);
      break;
    }
    case Kind::kIntList: {
      const toml::array* arr = node.as_array();
      if (!arr) type_error();
      std::vector<int64_t> out;
      for (const auto& el : *arr) {
        if (!el.is_integer()) type_error();
        int64_t v = *el.value<int64_t>();
        check_range(f, static_cast<double>(v), where);
        out.push_back(v);
      }
      *static_cast<std::vector<int64_t>*>(p) = out;
      break;
    }
  }
}

const Field& find_field(const std::vector<Field>& fs, const std::string& key, const std::string& where) {
  for (const auto& f : fs)
    if (f.key == key) return f;
  RETRACE_FAIL(ConfigError, "unknown config key '", key, "' in ", where, "; valid keys: ", valid_keys_near(fs, key));
}

// The text of a TOML value as to_toml writes values ([user] keys keep it).
std::string value_text(const toml::node& node) {
  std::ostringstream out;
  node.visit([&out](const auto& v) { out << v; });
  return out.str();
}

// `s` with control bytes written as \xNN, for an error message.
std::string printable(const std::string& s) {
  std::string out;
  for (const char ch : s) {
    const auto b = static_cast<uint8_t>(ch);
    out += b >= 0x20 && b != 0x7f ? std::string(1, ch) : "\\x" + to_hex(&b, 1);
  }
  return out;
}

// A [user] key as to_toml writes it: bare TOML keys (letters, digits, '_', '-') joined by dots, so
// that the written text reads back as the same key (a quoted key such as "a b" would be written
// bare and read back as something else, or not at all).
void check_user_key(const std::string& key, const std::string& where) {
  bool ok = !key.empty() && key.front() != '.' && key.back() != '.' && key.find("..") == std::string::npos;
  for (const char ch : key)
    ok = ok && ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
                ch == '-' || ch == '.');
  RETRACE_CHECK(ok, ConfigError, "bad key user.", printable(key), " in ", where,
                ": keys of [user] are bare TOML keys (letters, digits, '_' and '-'), joined by dots");
}

void walk_user(const toml::table& t, const std::string& prefix, Config& c, const std::string& where) {
  for (const auto& [k, node] : t) {
    const std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    check_user_key(std::string(k.str()), where);
    if (const toml::table* sub = node.as_table()) walk_user(*sub, key, c, where);
    else c.user[key] = value_text(node);
  }
}

void walk(const toml::table& t, const std::string& prefix, const std::vector<Field>& fs, Config& c,
          const std::string& where) {
  for (const auto& [k, node] : t) {
    std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (prefix.empty() && key == "user") {
      const toml::table* sub = node.as_table();
      RETRACE_CHECK(sub, ConfigError, "bad value for user in ", where, ": expected a table [user] of your own keys");
      walk_user(*sub, "", c, where);
      continue;
    }
    if (const toml::table* sub = node.as_table()) {
      bool known_section = false;
      for (const auto& f : fs) known_section = known_section || f.key.rfind(key + ".", 0) == 0;
      RETRACE_CHECK(known_section, ConfigError, "unknown config section [", key, "] in ", where,
                    "; valid keys: ", valid_keys_near(fs, ""));
      walk(*sub, key, fs, c, where);
    } else {
      assign(find_field(fs, key, where), c, node, where);
    }
  }
}

std::string toml_string(const std::string& s) {
  std::ostringstream out;
  out << toml::value<std::string>(s);
  return out.str();
}

// A --set value that is not TOML, taken as a string. The config written back (to_toml) must read
// back as the same text, so the string must come back from toml++ as it went in; toml++ refuses
// text that is not UTF-8 (overlong forms, surrogates, code points past U+10FFFF), as TOML does.
toml::table bare_string(const std::string& value, const std::string& ov) {
  bool reads_back = false;
  try {
    const toml::table t = toml::parse("v = " + toml_string(value));
    const std::optional<std::string> back = t["v"].value<std::string>();
    reads_back = back && *back == value;
  } catch (const toml::parse_error&) {}
  RETRACE_CHECK(reads_back, ConfigError, "--set ", ov.substr(0, ov.find('=')),
                ": the value is not UTF-8 text; give it in UTF-8 (or quoted as a TOML string with escapes)");
  return toml::table{{"v", value}};
}

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

}  // namespace

namespace config_detail {

// The shortest decimal that reads back as the same double, so resolved configs stay readable
// and exact.
std::string number(double v) {
  std::string s;
  for (int precision = 6; precision <= 17; ++precision) {
    std::ostringstream out;
    out.precision(precision);
    out << v;
    s = out.str();
    if (parse_finite_double(s) == v) break;  // subnormals too (std::stod throws for them)
  }
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

// A field's value as TOML text, the way to_toml writes it.
std::string field_text(const Field& f, Config& c) {
  std::ostringstream value;
  void* p = f.ref(c);
  switch (f.kind) {
    case Kind::kInt: value << *static_cast<int64_t*>(p); break;
    case Kind::kFloat: value << number(*static_cast<double*>(p)); break;
    case Kind::kBool: value << (*static_cast<bool*>(p) ? "true" : "false"); break;
    case Kind::kString: value << toml_string(*static_cast<std::string*>(p)); break;
    case Kind::kChoice: value << toml_string(f.choices.at(*static_cast<uint8_t*>(p))); break;
    case Kind::kIntList: {
      value << "[";
      const auto& v = *static_cast<std::vector<int64_t>*>(p);
      for (size_t i = 0; i < v.size(); ++i) value << (i ? ", " : "") << v[i];
      value << "]";
      break;
    }
  }
  return value.str();
}

}  // namespace config_detail

Config parse_config(const std::string& toml_text, const std::string& origin, const std::vector<std::string>& overrides,
                    ConfigSource source) {
  const auto fs = fields();
  Config c;
  if (source == ConfigSource::kRecorded)
    for (const auto& f : fs)
      if (!f.legacy.empty()) assign(f, c, *toml::parse("v = " + f.legacy).get("v"), "legacy value");
  toml::table root;
  try {
    root = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream msg;
    msg << "cannot parse " << origin << " at line " << e.source().begin.line << ", column " << e.source().begin.column
        << ": " << e.description();
    throw ConfigError(msg.str());
  }
  walk(root, "", fs, c, origin);
  // A text that names a key by its old name keeps the old names when written back (Field::Era).
  for (const auto& f : fs) {
    if (f.era != Field::Era::kRetired || !root.at_path(f.key)) continue;
    RETRACE_CHECK(!root.at_path(f.counterpart), ConfigError, origin, " sets both ", f.key, " and ", f.counterpart,
                  ", which name the same value (", f.counterpart, " replaced ", f.key, "); keep only ", f.counterpart);
    c.eval.legacy_keys = true;
  }
  for (const auto& ov : overrides) {
    auto eq = ov.find('=');
    RETRACE_CHECK(eq != std::string::npos && eq > 0, ConfigError, "--set expects key=value, got '", ov, "'");
    std::string key = ov.substr(0, eq), value = ov.substr(eq + 1);
    toml::table t;
    if (key.rfind("user.", 0) == 0 && key.size() > 5) {
      check_user_key(key.substr(5), "--set");
      try {
        t = toml::parse("v = " + value);
      } catch (const toml::parse_error&) {
        t = bare_string(value, ov);
      }
      c.user[key.substr(5)] = value_text(*t.get("v"));
      continue;
    }
    const Field& f = find_field(fs, key, "--set " + ov);
    try {
      t = toml::parse("v = " + value);
    } catch (const toml::parse_error&) {
      // A bare word is taken as a string, so `--set optim.name=sgd` works without quotes.
      t = bare_string(value, ov);
    }
    assign(f, c, *t.get("v"), "--set " + ov);
  }
  // A default that follows from another key is chosen, not demanded: ZeRO-1 splits the optimizer
  // state among the ranks, which only digests that add up over slices describe, so a config that
  // does not set trace.digest_version gets version 4 with runtime.zero_stage = 1 (written into the
  // run's config like every value). A version set explicitly is kept: a conflicting one is still
  // the error in validate().
  bool version_given = root.at_path("trace.digest_version").node() != nullptr;
  for (const auto& ov : overrides) version_given = version_given || ov.rfind("trace.digest_version=", 0) == 0;
  if (!version_given && c.runtime.zero_stage == 1) c.trace.digest_version = 4;
  validate(c);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides, ConfigSource source) {
  std::string text;
  try {
    text = fs::read_file(path, 1 << 20);
  } catch (const IoError&) {
    RETRACE_FAIL(ConfigError, "cannot read config file ", path,
                 "; pass an existing file with --config (built-in configs are in configs/)");
  }
  return parse_config(text, path, overrides, source);
}

std::string to_toml(const Config& cfg, TomlForm form) {
  Config c = cfg;
  resolve_defaults(c);
  std::ostringstream out;
  std::string section;
  for (const auto& f : fields()) {
    if (f.era == Field::Era::kRetired && !c.eval.legacy_keys) continue;
    if (f.era == Field::Era::kSuccessor && c.eval.legacy_keys) continue;
    auto dot = f.key.find('.');
    std::string sec = dot == std::string::npos ? "" : f.key.substr(0, dot);
    std::string name = dot == std::string::npos ? f.key : f.key.substr(dot + 1);
    const std::string value = field_text(f, c);
    if (form == TomlForm::kCanonical && ((!f.legacy.empty() && value == f.legacy) || f.operational)) continue;
    // A section's header comes with its first key written: a section whose keys all hold their
    // legacy values ([eval] of an older run) adds nothing to the text.
    if (sec != section) {
      out << "\n[" << sec << "]\n";
      section = sec;
    }
    out << name << " = " << value << "\n";
  }
  // Users' keys last, sorted; a config without any writes no [user] section (older hashes stay).
  if (!c.user.empty()) {
    out << "\n[user]\n";
    for (const auto& [k, v] : c.user) out << k << " = " << v << "\n";
  }
  return out.str();
}

std::map<std::string, std::string> config_entries(const std::string& toml_text) {
  std::map<std::string, std::string> out;
  std::string section;
  std::istringstream in(toml_text);
  std::string line;
  while (std::getline(in, line)) {
    std::string t = trimmed(line);
    if (t.empty() || t[0] == '#') continue;
    if (t.front() == '[' && t.back() == ']') {
      // "[[x]]" (arrays of tables) does not occur in resolved configs; treated like "[x]".
      section = trimmed(t.substr(t.find_first_not_of('['), t.find_last_not_of(']') - t.find_first_not_of('[') + 1));
      continue;
    }
    auto eq = t.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    std::string key = trimmed(t.substr(0, eq));
    out[section.empty() ? key : section + "." + key] = trimmed(t.substr(eq + 1));
  }
  return out;
}

}  // namespace retrace::train
