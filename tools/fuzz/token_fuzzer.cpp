// libFuzzer target: an llm.c token file's header checked against its size (check_token_header,
// src/data/token_header.h), then every token read as the reader reads them. Any outcome but a
// retrace::Error or a header whose tokens fill the file exactly is a finding (and ASan checks that
// no token is read past the input).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"
#include "data/token_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const retrace::data::TokenHeader h = retrace::data::check_token_header(data, size, "fuzz.bin");
    const uint64_t header = retrace::data::kTokenHeaderInts * 4;
    if (h.width != 2 && h.width != 4) std::abort();
    if (h.tokens == 0 || header + h.width * h.tokens != size) std::abort();
    uint32_t top = 0;
    for (uint64_t i = 0; i < h.tokens; ++i) {
      uint32_t t = 0;
      std::memcpy(&t, data + header + i * h.width, h.width);
      top = t > top ? t : top;
    }
    if (h.width == 2 && top > 0xffff) std::abort();
  } catch (const retrace::Error&) {}
  return 0;
}
