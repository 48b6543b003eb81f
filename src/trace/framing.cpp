#include "trace/framing.h"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#include <zstd.h>

#include <cstring>
#include <memory>

#include "core/error.h"
#include "core/le.h"

namespace retrace::trace {

// The widths the code below reads and writes are the ones frame_layout.json states.
static_assert(layout::kFrame_magic_size == 4 && layout::kFrame_kind_size == 1 && layout::kFrame_flags_size == 1 &&
                  layout::kFrame_header_check_size == 2 && layout::kFrame_step_size == 8 &&
                  layout::kFrame_compressed_len_size == 4 && layout::kFrame_raw_len_size == 4 &&
                  layout::kFrame_checksum_size == 8,
              "frame_layout.json changed a field's width: change framing.cpp with it");

bool is_known_kind(uint8_t kind) {
  return kind == layout::kKind_Header || kind == layout::kKind_Step || kind == layout::kKind_Eval ||
         kind == layout::kKind_Event;
}

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
  std::memcpy(out + layout::kFile_magic, kFileMagic, kFileMagicSize);
  put_u16(out + layout::kFile_version, kFormatVersion);
}

uint16_t compute_header_check(const uint8_t* in) {
  // The check covers the checked bytes except its own two.
  constexpr size_t kAt = layout::kFrame_header_check;
  uint8_t buf[layout::kFrameCheckedBytes - 2];
  std::memcpy(buf, in, kAt);
  std::memcpy(buf + kAt, in + kAt + 2, layout::kFrameCheckedBytes - kAt - 2);
  return static_cast<uint16_t>(XXH3_64bits(buf, sizeof(buf)) & 0xffff);
}

uint64_t compute_frame_checksum(const uint8_t* header, const uint8_t* payload, size_t payload_len) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, header, layout::kFrameCheckedBytes);
  if (payload_len > 0) XXH3_64bits_update(&state, payload, payload_len);
  return XXH3_64bits_digest(&state);
}

void encode_frame_header(const FrameHeader& h, const uint8_t* payload, uint8_t* out) {
  using namespace layout;
  put_u32(out + kFrame_magic, layout::kFrameMagic);
  out[kFrame_kind] = h.kind;
  out[kFrame_flags] = h.flags;
  put_u16(out + kFrame_header_check, 0);
  put_u64(out + kFrame_step, h.step);
  put_u32(out + kFrame_compressed_len, h.compressed_len);
  put_u32(out + kFrame_raw_len, h.raw_len);
  put_u16(out + kFrame_header_check, compute_header_check(out));
  put_u64(out + kFrame_checksum, compute_frame_checksum(out, payload, h.compressed_len));
}

uint32_t frame_magic(const uint8_t* in) { return get_u32(in + layout::kFrame_magic); }

FrameHeader decode_frame_header(const uint8_t* in) {
  using namespace layout;
  FrameHeader h;
  h.kind = in[kFrame_kind];
  h.flags = in[kFrame_flags];
  h.header_check = get_u16(in + kFrame_header_check);
  h.step = get_u64(in + kFrame_step);
  h.compressed_len = get_u32(in + kFrame_compressed_len);
  h.raw_len = get_u32(in + kFrame_raw_len);
  h.checksum = get_u64(in + kFrame_checksum);
  return h;
}

std::string encode_frame(FrameKind kind, uint64_t step, std::string_view raw, int zstd_level) {
  RETRACE_CHECK(raw.size() <= kMaxPayloadLen, InvariantError, "frame payload of ", raw.size(),
                " bytes exceeds the limit of ", kMaxPayloadLen);
  size_t bound = ZSTD_compressBound(raw.size());
  std::string out(kFrameHeaderSize + bound, '\0');
  auto* base = reinterpret_cast<uint8_t*>(out.data());
  size_t n = ZSTD_compress(base + kFrameHeaderSize, bound, raw.data(), raw.size(), zstd_level);
  RETRACE_CHECK(!ZSTD_isError(n), InvariantError, "zstd compression failed: ", ZSTD_getErrorName(n));
  RETRACE_CHECK(n <= kMaxPayloadLen, InvariantError, "compressed payload of ", n, " bytes exceeds the limit of ",
                kMaxPayloadLen);
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
