#include "run/inputs.h"

#include <filesystem>

#include "core/digest.h"
#include "core/error.h"

namespace retrace::run {

std::vector<InputChange> changed_inputs(const std::vector<records::FileInfo>& recorded) {
  std::vector<InputChange> out;
  for (const auto& f : recorded) {
    std::error_code ec;
    std::string now;
    if (std::filesystem::is_regular_file(f.path, ec)) {
      try {
        now = sha256_file_hex(f.path);
      } catch (const IoError&) {
        now.clear();  // unreadable: reported as missing
      }
    }
    if (now != f.sha256) out.push_back({f.path, f.sha256, now});
  }
  return out;
}

std::string describe_changes(const std::vector<InputChange>& changes) {
  std::string s;
  for (const auto& c : changes) {
    if (!s.empty()) s += "; ";
    s += "input file " + c.path + (c.now.empty() ? " is missing or unreadable" : " changed since the run was recorded") +
         " (sha256 " + c.recorded.substr(0, 16) + "... in the trace header, " +
         (c.now.empty() ? std::string("none") : c.now.substr(0, 16) + "...") + " now)";
  }
  return s;
}

}  // namespace retrace::run
