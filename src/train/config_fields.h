// What the files of the config share (private to src/train; the public API is train/config.h):
// the key table (config_fields.cpp), reading and writing TOML (config_toml.cpp), the defaults and
// checks (config_validate.cpp) and the Markdown reference (config_reference.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "train/config.h"

namespace retrace::train::config_detail {

enum class Kind { kInt, kFloat, kBool, kString, kChoice, kIntList };

// One configuration key: where it lives in Config, its type, its bounds and its meaning.
struct Field {
  std::string key;
  Kind kind;
  std::string help;
  std::vector<std::string> choices;        // kChoice
  double min = -INFINITY, max = INFINITY;  // numeric bounds, inclusive unless open
  bool min_open = false, max_open = false;
  std::function<void*(Config&)> ref;
  // For a key added after configs were first recorded: the value that reproduces what retrace did
  // before the key existed, as TOML text the way to_toml writes it (strings in single quotes). A
  // recorded config without the key reads as this value, and to_toml leaves the key out while it
  // holds it, so older runs keep their text and config hash.
  std::string legacy = {};
  // A key that another replaced: kRetired (the old name) is read from any text and written back
  // only while the config keeps the old names (EvalConfig::legacy_keys); kSuccessor (the new name)
  // is written only while it does not. Both name the same value.
  enum class Era : uint8_t { kCurrent, kRetired, kSuccessor };
  Era era = Era::kCurrent;
  std::string counterpart = {};  // kRetired, kSuccessor: the other name
  // A key that says how the run does its work, not what it computes (checkpoint.async): left out of
  // the canonical text, so out of the config hash. A run directory's config.toml holds it, and a
  // checkpoint saved under one value resumes under the other.
  bool operational = false;
};

// Every configuration key, in the order to_toml writes them (config_fields.cpp).
std::vector<Field> fields();

// A kind's name for messages and the reference: "integer", "list of integers", ...
const char* kind_name(Kind k);

// Choices as "a", "b", ... for messages.
std::string join(const std::vector<std::string>& v);

// The shortest decimal that reads back as the same double (config_toml.cpp).
std::string number(double v);

// A field's value as TOML text, the way to_toml writes it (config_toml.cpp).
std::string field_text(const Field& f, Config& c);

// The defaults that depend on other keys (config_validate.cpp).
void resolve_defaults(Config& c);

// Resolves the defaults and checks what the keys' bounds cannot (config_validate.cpp).
void validate(Config& c);

}  // namespace retrace::train::config_detail
