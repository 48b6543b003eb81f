// libFuzzer target: parse_shard on arbitrary bytes. Any outcome but a retrace::Error or a shard
// whose tensors lie inside its bytes is a finding.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ckpt/shard.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    retrace::ckpt::ShardData d = retrace::ckpt::parse_shard(std::string(reinterpret_cast<const char*>(data), size),
                                                            "fuzz");
    uint64_t total = 0;
    uint8_t sum = 0;
    for (const auto& e : d.tensors) {
      total += e.nbytes;
      const uint8_t* p = static_cast<const uint8_t*>(d.data(e));
      for (uint64_t i = 0; i < e.nbytes; i += 64) sum ^= p[i];  // touch the bytes: ASan checks bounds
    }
    if (d.data_start + total != d.bytes.size()) std::abort();
    if (sum == 0xff && d.tensors.empty()) std::abort();  // unreachable; keeps `sum` alive
  } catch (const retrace::Error&) {}
  return 0;
}
