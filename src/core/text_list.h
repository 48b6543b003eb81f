// Comma-separated lists in config values, environment variables and checkpoint metadata.
#pragma once

#include <sstream>
#include <string>
#include <vector>

namespace retrace {

// The non-empty items of a comma-separated list, in order.
inline std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace retrace
