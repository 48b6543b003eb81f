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
    for (const auto& [e, b] : batches)
      again += (again.empty() ? "" : ",") + std::to_string(e) + ":" + std::to_string(b);
    if (retrace::train::parse_set_aside(again) != batches) std::abort();
  } catch (const retrace::Error&) {}
  for (const auto& item : retrace::split_list(get("faults.fired")))
    if (item.empty() || item.find(',') != std::string::npos) std::abort();
  // Each guard loads the metadata; what it loaded must write and read back the same.
  auto round_trip = [&meta](auto loaded, auto back) {
    try {
      loaded.load_state(meta);
      back.load_state(loaded.state());
      if (back.state() != loaded.state()) std::abort();
    } catch (const retrace::Error&) {}
  };
  round_trip(retrace::train::SkipRateGuard(64, 0.5), retrace::train::SkipRateGuard(64, 0.5));
  round_trip(retrace::train::SpikeGuard(3.0, 16), retrace::train::SpikeGuard(3.0, 16));
  return 0;
}
