// Strict JSON parsing for files we did not write ourselves (checkpoint headers and manifests).
//
// nlohmann::json keeps the last of two equal keys and nests without bound; a hostile or damaged
// file must not be able to do either unnoticed. parse_strict_json rejects duplicate keys at any
// level, nesting deeper than max_depth, and invalid UTF-8, and reports every problem as a
// FormatError that starts with `what` (e.g. "shard header of /x/shard-rank00000.safetensors").
// Thread-safe (no shared state).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace retrace::jsonfmt {

nlohmann::json parse_strict_json(std::string_view text, const std::string& what, int max_depth = 8);

// A short, printable description of a JSON value's type for error messages ("a string", ...).
const char* json_type_text(const nlohmann::json& value);

// The text of a JSON value for output and messages. Strings that are not valid UTF-8 (a value
// read from a damaged file, a path with Latin-1 bytes) come out with U+FFFD in place of each bad
// byte instead of throwing: text for people must never turn bad input into an internal error.
inline std::string json_text(const nlohmann::json& value, int indent = -1) {
  return value.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace retrace::jsonfmt
