#include "run/inputs.h"

#include <filesystem>
#include <map>
#include <set>

#include "core/digest.h"
#include "core/error.h"

namespace retrace::run {

std::vector<InputChange> changed_inputs(const std::vector<records::FileInfo>& recorded,
                                        const std::vector<records::FileInfo>& loaded) {
  std::vector<InputChange> out;
  std::map<std::string, std::string> known;
  for (const auto& f : loaded) known[f.path] = f.sha256;
  std::set<std::string> listed;
  for (const auto& f : recorded) {
    listed.insert(f.path);
    std::error_code ec;
    std::string now;
    if (const auto it = known.find(f.path); it != known.end()) {
      now = it->second;
    } else if (std::filesystem::is_regular_file(f.path, ec)) {
      try {
        now = sha256_file_hex(f.path);
      } catch (const IoError&) {
        now.clear();  // unreadable: reported as missing
      }
    }
    if (now != f.sha256) out.push_back({f.path, f.sha256, now});
  }
  for (const auto& f : loaded)
    if (!listed.count(f.path)) out.push_back({f.path, "", f.sha256});
  return out;
}

std::string describe_changes(const std::vector<InputChange>& changes) {
  std::string s;
  for (const auto& c : changes) {
    if (!s.empty()) s += "; ";
    if (c.recorded.empty()) {
      s += "input file " + c.path +
           " was added to the data set since the run was recorded (the trace header "
           "does not list it)";
      continue;
    }
    s += "input file " + c.path +
         (c.now.empty() ? " is missing or unreadable" : " changed since the run was recorded") + " (sha256 " +
         c.recorded.substr(0, 16) + "... in the trace header, " +
         (c.now.empty() ? std::string("none") : c.now.substr(0, 16) + "...") + " now)";
  }
  return s;
}

}  // namespace retrace::run
