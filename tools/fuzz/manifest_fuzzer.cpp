// libFuzzer target: parse_manifest on arbitrary bytes. A manifest that parses must serialize and
// parse back to the same content; anything but a retrace::Error from the first parse is a finding.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ckpt/manifest.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  retrace::ckpt::Manifest m;
  try {
    m = retrace::ckpt::parse_manifest(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  } catch (const retrace::Error&) {
    return 0;
  }
  // Not caught: serialize_manifest refusing a manifest that parse accepted is a bug.
  const std::string text = retrace::ckpt::serialize_manifest(m);
  retrace::ckpt::Manifest again = retrace::ckpt::parse_manifest(text, "fuzz (re-serialized)");
  if (again.step != m.step || again.world_size != m.world_size || again.shards.size() != m.shards.size() ||
      again.versions != m.versions || again.extra != m.extra || again.config_hash != m.config_hash ||
      again.trace_chain_hex != m.trace_chain_hex || retrace::ckpt::serialize_manifest(again) != text)
    std::abort();
  return 0;
}
