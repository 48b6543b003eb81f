#include "trace/framing.h"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#include <zstd.h>

#include <cstring>
#include <memory>

#include "core/error.h"
#include "core/le.h"

namespace retrace::trace {

bool is_known_kind(uint8_t kind) { return kind >= 1 && kind <= 4; }

const char* kind_name(uint8_t kind) {
  switch (kind) {
    case 1: return "header";
    case 2: return "step";
    case 3: return "eval";
    case 4: return "event";
    default: return "unknown";
  }
}

void encode_file_header(uint8_t* out) {
  std::memset(out, 0, kFileHeaderSize);
  std::memcpy(out, kFileMagic, sizeof(kFileMagic));
  put_u16(out + 6, kFormatVersion);
}

uint16_t compute_header_check(const uint8_t* in) {
  // Bytes 6..7 hold the check itself, so it covers the rest of the first 24 bytes.
  uint8_t buf[22];
  std::memcpy(buf, in, 6);
  std::memcpy(buf + 6, in + 8, 16);
  return static_cast<uint16_t>(XXH3_64bits(buf, sizeof(buf)) & 0xffff);
}

uint64_t compute_frame_checksum(const uint8_t* header, const uint8_t* payload, size_t payload_len) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, header, 24);
  if (payload_len > 0) XXH3_64bits_update(&state, payload, payload_len);
  return XXH3_64bits_digest(&state);
}

void encode_frame_header(const FrameHeader& h, const uint8_t* payload, uint8_t* out) {
  put_u32(out, kFrameMagic);
  out[4] = h.kind;
  out[5] = h.flags;
  put_u16(out + 6, 0);
  put_u64(out + 8, h.step);
  put_u32(out + 16, h.compressed_len);
  put_u32(out + 20, h.raw_len);
  put_u16(out + 6, compute_header_check(out));
  put_u64(out + 24, compute_frame_checksum(out, payload, h.compressed_len));
}

uint32_t frame_magic(const uint8_t* in) { return get_u32(in); }

FrameHeader decode_frame_header(const uint8_t* in) {
  FrameHeader h;
  h.kind = in[4];
  h.flags = in[5];
  h.header_check = get_u16(in + 6);
  h.step = get_u64(in + 8);
  h.compressed_len = get_u32(in + 16);
  h.raw_len = get_u32(in + 20);
  h.checksum = get_u64(in + 24);
  return h;
}

std::string encode_frame(FrameKind kind, uint64_t step, std::string_view raw, int zstd_level) {
  RETRACE_CHECK(raw.size() <= kMaxPayloadLen, InvariantError, "frame payload of ", raw.size(),
                " bytes exceeds the limit of ", kMaxPayloadLen);
  size_t bound = ZSTD_compressBound(raw.size());
  std::string out(kFrameHeaderSize + bound, '\0');
  auto* base = reinterpret_cast<uint8_t*>(out.data());
  size_t n = ZSTD_compress(base + kFrameHeaderSize, bound, raw.data(), raw.size(), zstd_level);
  RETRACE_CHECK(!ZSTD_isError(n), InvariantError, "zstd compression failed: ",
                ZSTD_getErrorName(n));
  RETRACE_CHECK(n <= kMaxPayloadLen, InvariantError, "compressed payload of ", n,
                " bytes exceeds the limit of ", kMaxPayloadLen);
  FrameHeader h;
  h.kind = static_cast<uint8_t>(kind);
  h.step = step;
  h.compressed_len = static_cast<uint32_t>(n);
  h.raw_len = static_cast<uint32_t>(raw.size());
  encode_frame_header(h, base + kFrameHeaderSize, base);
  out.resize(kFrameHeaderSize + n);
  return out;
}

}  // namespace retrace::trace
