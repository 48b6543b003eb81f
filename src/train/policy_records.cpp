#include "train/policy_records.h"

#include "core/error.h"
#include "core/parse_number.h"

namespace retrace::train {

std::set<std::pair<uint64_t, uint64_t>> parse_set_aside(const std::string& text) {
  std::set<std::pair<uint64_t, uint64_t>> out;
  for (const auto& item : split_list(text)) {
    const auto colon = item.find(':');
    RETRACE_CHECK(colon != std::string::npos, FormatError, "bad set-aside batch \"", item.substr(0, 64),
                  "\" in checkpoint: an entry is EPOCH:BATCH");
    const std::string what = "the set-aside batch \"" + item.substr(0, 64) + "\" in the checkpoint's data.set_aside";
    out.insert({parse_u64_field(item.substr(0, colon), what + ", its epoch"),
                parse_u64_field(item.substr(colon + 1), what + ", its batch")});
  }
  return out;
}

}  // namespace retrace::train
