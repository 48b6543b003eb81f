// libFuzzer target: the policy records a checkpoint's shard metadata carries as text, the set-aside
// batches ("data.set_aside"), the fired faults ("faults.fired") and the skip and spike guards'
// windows (src/train/policy_records.h, guards.h), read from arbitrary text. The input is lines
// "key=value" forming the metadata map. Any outcome but loaded state or a retrace::Error is a
// finding, and so is loaded state that, written again, does not read back the same.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>

#include "core/error.h"
#include "train/guards.h"
#include "train/policy_records.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, std::string> meta;
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) meta[line.substr(0, eq)] = line.substr(eq + 1);
  }
  auto get = [&](const char* key) {
    auto it = meta.find(key);
    return it == meta.end() ? std::string() : it->second;
  };
  try {
    const auto batches = retrace::train::parse_set_aside(get("data.set_aside"));
    std::string again;
    for (const auto& [e, b] : batches) again += (again.empty() ? "" : ",") + std::to_string(e) + ":" + std::to_string(b);
    if (retrace::train::parse_set_aside(again) != batches) std::abort();
  } catch (const retrace::Error&) {
  }
  for (const auto& item : retrace::split_list(get("faults.fired")))
    if (item.empty() || item.find(',') != std::string::npos) std::abort();
  try {
    retrace::train::SkipRateGuard skip(64, 0.5);
    skip.load_state(meta);
    retrace::train::SkipRateGuard back(64, 0.5);
    back.load_state(skip.state());
    if (back.state() != skip.state()) std::abort();
  } catch (const retrace::Error&) {
  }
  try {
    retrace::train::SpikeGuard spike(3.0, 16);
    spike.load_state(meta);
    retrace::train::SpikeGuard back(3.0, 16);
    back.load_state(spike.state());
    if (back.state() != spike.state()) std::abort();
  } catch (const retrace::Error&) {
  }
  return 0;
}
