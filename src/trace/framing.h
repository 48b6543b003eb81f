// The byte layout of a trace file (run/trace.rtrace), shared by the writer and the reader. The
// layout itself is described in one place, src/trace/frame_layout.json: the build generates
// trace/frame_layout.h (the sizes, offsets, magics and limits used here) from it, and the Python
// reader (python/retrace_trace.py) reads the same file. In short, all integers little-endian:
//
//   file header (16 bytes): magic "RTRACE", u16 format version (1 or 2), 8 reserved zero bytes
//   frame (32-byte frame header, then compressed_len bytes of payload)
//     0  u32 frame magic   4  u8 kind (FrameKind)   5  u8 flags (bit 0, format 2 step frames only:
//        compressed with the header record's step dictionary; every other bit zero)
//     6  u16 header check: low 16 bits of xxh3_64 over bytes 0..5 and 8..23 of this header
//     8  u64 step          16 u32 compressed_len     20 u32 raw_len (a multiple of 8)
//    24  u64 checksum: xxh3_64 over bytes 0..23 of this header followed by the payload
//    32  payload: a zstd frame holding one Cap'n Proto flat-array message (trace.capnp) whose root
//        is Header, Step, Eval or Event according to kind.
//
// The first frame is always the header frame; then steps, evals and events in the order they
// happened. Both lengths are at most kMaxPayloadLen, raw_len at most max_raw_len(compressed_len),
// and both are checked before anything is allocated.
//
// The header check exists so that a reader can tell a frame cut short by a crash (its header is
// intact and the file ends inside it: an incomplete tail, the frames before it are kept) from a
// frame whose length field was damaged (a corrupt frame: IntegrityError). The checksum covers
// everything else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "trace/frame_layout.h"

namespace retrace::trace {

// The event that starts each block of frames in a set-aside file (RUN/trace.set-aside.rtrace): the
// step frames after it continue the chain of the trace they were moved from. A reader honours it
// only in a file whose name ends with kSetAsideSuffix, so that it cannot hide a break in a trace.
inline constexpr const char* kSetAsideEvent = "set-aside";
inline constexpr const char* kSetAsideSuffix = ".set-aside.rtrace";

inline constexpr size_t kFileMagicSize = sizeof(layout::kFileMagic) - 1;  // "RTRACE", no terminator
inline constexpr const char* kFileMagic = layout::kFileMagic;
inline constexpr uint16_t kFormatVersion = layout::kFormatVersion;
inline constexpr size_t kFileHeaderSize = layout::kFileHeaderSize;

inline constexpr uint32_t kFrameMagic = layout::kFrameMagic;  // "RTRF" in file byte order
inline constexpr size_t kFrameHeaderSize = layout::kFrameHeaderSize;
inline constexpr uint32_t kMaxPayloadLen = layout::kMaxPayloadLen;  // 64 MiB, compressed and raw
// A frame's raw length is also bounded by its compressed length: zstd turns a few bytes into
// megabytes of zeros, and a reader allocates raw_len. The writer's frames compress 2-6x (step
// frames about 3x); 32x plus 64 KiB leaves room for any record it writes.
inline constexpr uint64_t max_raw_len(uint64_t compressed_len) {
  return layout::kMaxRawFactor * compressed_len + layout::kMaxRawSlack;
}
static_assert(kFrameMagic == 0x46525452, "frame magic is the bytes RTRF");
static_assert(layout::kFrameCheckedBytes + 8 == kFrameHeaderSize, "the checksum is the header's last field");

enum class FrameKind : uint8_t {
  kHeader = layout::kKind_Header,
  kStep = layout::kKind_Step,
  kEval = layout::kKind_Eval,
  kEvent = layout::kKind_Event
};

// True for the four kinds above.
bool is_known_kind(uint8_t kind);
// "header", "step", "eval", "event" or "unknown".
const char* kind_name(uint8_t kind);

struct FrameHeader {
  uint8_t kind = 0;
  uint8_t flags = 0;
  uint16_t header_check = 0;
  uint64_t step = 0;
  uint32_t compressed_len = 0;
  uint32_t raw_len = 0;
  uint64_t checksum = 0;
};

// Writes the 16-byte file header.
void encode_file_header(uint8_t* out);

// Writes the 32-byte frame header for `h` and `payload` into out, computing the header check and
// the checksum (the values of those two fields in `h` are ignored).
void encode_frame_header(const FrameHeader& h, const uint8_t* payload, uint8_t* out);

// Reads a 32-byte frame header as stored; checks nothing. The magic is read by frame_magic().
FrameHeader decode_frame_header(const uint8_t* in);
uint32_t frame_magic(const uint8_t* in);

// The header check over a 32-byte frame header as stored (see the layout above).
uint16_t compute_header_check(const uint8_t* in);
// The checksum over the first 24 bytes of a frame header and its payload.
uint64_t compute_frame_checksum(const uint8_t* header, const uint8_t* payload, size_t payload_len);

// One whole frame (header and zstd-compressed raw payload) as bytes. Allocates a compression
// context per call: for tests and tools; the writer uses its own reused buffers.
std::string encode_frame(FrameKind kind, uint64_t step, std::string_view raw, int zstd_level);

}  // namespace retrace::trace
