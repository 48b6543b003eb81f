// libFuzzer target: parse_manifest on arbitrary bytes. A manifest that parses must serialize and
// parse back to the same content; anything but a retrace::Error from the first parse is a finding.
#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "ckpt/manifest.h"
#include "core/digest.h"
#include "core/error.h"

namespace {

// Random bytes almost never carry a matching checksum; to reach the typed checks behind it, an
// input that is a JSON object is also tried with its "manifest_sha256" recomputed.
std::string resigned(const std::string& input) {
  nlohmann::json j = nlohmann::json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return {};
  j.erase("manifest_sha256");
  std::string canon;
  try {
    canon = j.dump();
  } catch (const nlohmann::json::exception&) {
    return {};
  }
  j["manifest_sha256"] = retrace::sha256_hex(canon.data(), canon.size());
  return j.dump();
}

void check(const std::string& input) {
  retrace::ckpt::Manifest m;
  try {
    m = retrace::ckpt::parse_manifest(input, "fuzz");
  } catch (const retrace::Error&) {
    return;
  }
  // Not caught: serialize_manifest refusing a manifest that parse accepted is a bug.
  const std::string text = retrace::ckpt::serialize_manifest(m);
  retrace::ckpt::Manifest again = retrace::ckpt::parse_manifest(text, "fuzz (re-serialized)");
  if (again.step != m.step || again.world_size != m.world_size || again.shards.size() != m.shards.size() ||
      again.versions != m.versions || again.extra != m.extra || again.config_hash != m.config_hash ||
      again.trace_chain_hex != m.trace_chain_hex || retrace::ckpt::serialize_manifest(again) != text)
    std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  check(input);
  const std::string again = resigned(input);
  if (!again.empty()) check(again);
  return 0;
}
