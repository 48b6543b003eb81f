// libFuzzer target: the record decoder on arbitrary message bytes (what a frame decompresses to).
// The first byte picks the record kind; the rest, padded to whole words, is the message. Any
// outcome but a retrace::Error is a finding; so is a decode that takes more memory than the
// traversal limit allows (libFuzzer's -rss_limit_mb catches that).
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "trace/record_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::vector<uint64_t> words((size - 1 + 7) / 8, 0);
  if (size > 1) std::memcpy(words.data(), data + 1, size - 1);
  namespace t = retrace::trace;
  try {
    switch (data[0] % 4) {
      case 0: t::parse_header(words.data(), words.size(), "fuzz"); break;
      case 1: t::parse_step(words.data(), words.size(), "fuzz"); break;
      case 2: t::parse_eval(words.data(), words.size(), "fuzz"); break;
      default: t::parse_event(words.data(), words.size(), "fuzz"); break;
    }
  } catch (const retrace::Error&) {}
  return 0;
}
