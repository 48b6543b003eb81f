#include "core/strict_json.h"

#include <set>
#include <vector>

#include "core/error.h"

namespace retrace::jsonfmt {

using nlohmann::json;

nlohmann::json parse_strict_json(std::string_view text, const std::string& what, int max_depth) {
  // One key set per open object; the parser callback sees keys in document order.
  std::vector<std::set<std::string>> open_objects;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) -> bool {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        RETRACE_CHECK(depth < max_depth, FormatError, what, ": JSON nests deeper than ", max_depth,
                      " levels; expected a flat header");
        if (event == json::parse_event_t::object_start) open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!open_objects.empty()) {
          RETRACE_CHECK(open_objects.back().insert(key).second, FormatError, what, ": duplicate key \"", key,
                        "\"; each key may appear once");
        }
        break;
      }
      default: break;
    }
    return true;
  };
  // nlohmann's lexer takes a NUL byte for the end of the input: bytes after it (zeros a power loss
  // left after the document, or anything else) would pass unseen.
  if (auto nul = text.find('\0'); nul != std::string_view::npos)
    RETRACE_FAIL(FormatError, what, ": not valid JSON (a NUL byte at offset ", nul, " of ", text.size(),
                 "); the file was damaged or extended after it was written");
  try {
    return json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true,
                       /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    RETRACE_FAIL(FormatError, what, ": not valid JSON (", e.what(), ")");
  }
}

const char* json_type_text(const nlohmann::json& value) {
  switch (value.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer: return "a signed integer";
    case json::value_t::number_unsigned: return "an unsigned integer";
    case json::value_t::number_float: return "a floating-point number";
    case json::value_t::binary: return "binary data";
    default: return "an invalid value";
  }
}

}  // namespace retrace::jsonfmt
