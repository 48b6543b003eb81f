#include "trace/frame_scanner.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "trace/fd_io.h"
#include "core/le.h"

namespace retrace::trace {
namespace {

// Reads ahead in blocks of this size so that a scan costs few system calls.
constexpr size_t kReadBlock = size_t(1) << 20;

std::string hex64(uint64_t v) {
  static const char* kDigits = "0123456789abcdef";
  std::string s = "0x";
  for (int i = 15; i >= 0; --i) s.push_back(kDigits[(v >> (4 * i)) & 15]);
  return s;
}

}  // namespace

uint16_t check_file_header(int fd, const std::string& path, uint64_t size) {
  RETRACE_CHECK(size >= kFileHeaderSize, FormatError, path, " is not a retrace trace: it is ", size,
                " bytes long, shorter than the ", kFileHeaderSize, "-byte file header");
  uint8_t h[kFileHeaderSize];
  pread_full(fd, h, kFileHeaderSize, 0, path);
  RETRACE_CHECK(std::memcmp(h + layout::kFile_magic, kFileMagic, kFileMagicSize) == 0, FormatError, path,
                " is not a retrace trace: its first bytes are not the magic \"RTRACE\"");
  uint16_t version = get_u16(h + layout::kFile_version);
  RETRACE_CHECK(version >= layout::kOldestFormatVersion && version <= kFormatVersion, FormatError, path,
                " has trace format version ", version, " but this binary reads versions ", layout::kOldestFormatVersion,
                " to ", kFormatVersion, "; read it with the retrace version that wrote it");
  for (size_t i = layout::kFile_reserved; i < kFileHeaderSize; ++i)
    RETRACE_CHECK(h[i] == 0, FormatError, path, ": the file header's reserved bytes ", layout::kFile_reserved, " to ",
                  kFileHeaderSize - 1, " are not zero (byte ", i, " is ", static_cast<unsigned>(h[i]),
                  "); this is not a trace retrace wrote, or its header was damaged");
  return version;
}

FrameScanner::FrameScanner(int fd, std::string path, uint64_t start, uint64_t end, uint64_t first_number)
    : fd_(fd), path_(std::move(path)), pos_(start), end_(end), number_(first_number) {}

const uint8_t* FrameScanner::window(uint64_t offset, size_t n, size_t* available) {
  uint64_t in_range = offset >= end_ ? 0 : end_ - offset;
  size_t want = static_cast<size_t>(std::min<uint64_t>(n, in_range));
  if (offset < buf_offset_ || offset + want > buf_offset_ + buf_len_) {
    size_t block = static_cast<size_t>(std::min<uint64_t>(std::max(want, kReadBlock), in_range));
    if (buf_.size() < block) buf_.resize(block);
    buf_offset_ = offset;
    buf_len_ = pread_full(fd_, buf_.data(), block, offset, path_);
    want = std::min(want, buf_len_);
  }
  *available = want;
  return buf_.data() + (offset - buf_offset_);
}

bool FrameScanner::frame_at(uint64_t offset) {
  size_t have = 0;
  const uint8_t* p = window(offset, kFrameHeaderSize, &have);
  if (have < kFrameHeaderSize || frame_magic(p) != kFrameMagic) return false;
  FrameHeader h = decode_frame_header(p);
  if (compute_header_check(p) != h.header_check || !is_known_kind(h.kind) || h.compressed_len > kMaxPayloadLen ||
      h.raw_len > kMaxPayloadLen)
    return false;
  const uint64_t size = kFrameHeaderSize + uint64_t(h.compressed_len);
  p = window(offset, static_cast<size_t>(size), &have);
  return have == size && compute_frame_checksum(p, p + kFrameHeaderSize, h.compressed_len) == h.checksum;
}

bool FrameScanner::any_frame_after(uint64_t offset) {
  // Candidates are the positions of the magic's first byte; each is checked in full.
  const uint8_t first = static_cast<uint8_t>(kFrameMagic & 0xff);
  for (uint64_t at = offset; at + kFrameHeaderSize <= end_;) {
    size_t have = 0;
    const uint8_t* p = window(at, kReadBlock, &have);
    const void* hit = std::memchr(p, first, have);
    if (hit == nullptr) {
      at += have;
      continue;
    }
    const uint64_t cand = at + static_cast<uint64_t>(static_cast<const uint8_t*>(hit) - p);
    if (frame_at(cand)) return true;
    at = cand + 1;
  }
  return false;
}

std::optional<FrameScanner::Frame> FrameScanner::next() {
  tail_bytes_ = 0;
  garbage_tail_ = false;
  if (pos_ >= end_) return std::nullopt;
  // A damaged frame that no complete frame follows is the end of the file as a crash or a power
  // loss leaves it (a cut write, zero-filled or stale blocks): a tail, not corruption of the data.
  auto damaged = [&](auto&& fail) {
    if (any_frame_after(pos_ + 1)) fail();
    tail_bytes_ = end_ - pos_;
    garbage_tail_ = true;
  };
  size_t have = 0;
  const uint8_t* p = window(pos_, kFrameHeaderSize, &have);
  if (have >= 4) {
    uint32_t magic = frame_magic(p);
    if (magic != kFrameMagic) {
      damaged([&] {
        RETRACE_FAIL(FormatError, "bad frame magic ", hex64(magic), " at offset ", pos_, " of ", path_, " (frame #",
                     number_, "), expected ", hex64(kFrameMagic), "; the file is damaged or is not a retrace trace");
      });
      return std::nullopt;
    }
  }
  if (have < kFrameHeaderSize) {
    tail_bytes_ = have;
    return std::nullopt;
  }
  FrameHeader h = decode_frame_header(p);
  uint16_t check = compute_header_check(p);
  if (check != h.header_check) {
    damaged([&] {
      RETRACE_FAIL(IntegrityError, "corrupt frame checksum at offset ", pos_, " of ", path_, " (frame #", number_,
                   ", step field ", h.step, "): the frame header is damaged (header check ", h.header_check,
                   ", computed ", check, "). Restore the file from a copy, or truncate it to ", pos_,
                   " bytes to keep the frames before it");
    });
    return std::nullopt;
  }
  RETRACE_CHECK(is_known_kind(h.kind), FormatError, "unknown frame kind ", int(h.kind), " at offset ", pos_, " of ",
                path_, " (frame #", number_, "); the file was written by a newer retrace, read it with that version");
  RETRACE_CHECK(h.compressed_len <= kMaxPayloadLen && h.raw_len <= kMaxPayloadLen, FormatError, "frame at offset ",
                pos_, " of ", path_, " (frame #", number_, ") claims a payload of ", h.compressed_len, " compressed / ",
                h.raw_len, " raw bytes, over the limit of ", kMaxPayloadLen);
  RETRACE_CHECK(h.raw_len <= max_raw_len(h.compressed_len), FormatError, "frame at offset ", pos_, " of ", path_,
                " (frame #", number_, ") claims ", h.raw_len, " raw bytes from ", h.compressed_len,
                " compressed ones, more than a trace writer ever produces (at most ", max_raw_len(h.compressed_len),
                "); the file was not written by retrace");
  uint64_t size = kFrameHeaderSize + uint64_t(h.compressed_len);
  p = window(pos_, static_cast<size_t>(size), &have);
  if (have < size) {
    tail_bytes_ = have;
    return std::nullopt;
  }
  uint64_t sum = compute_frame_checksum(p, p + kFrameHeaderSize, h.compressed_len);
  if (sum != h.checksum) {
    damaged([&] {
      RETRACE_FAIL(IntegrityError, "corrupt frame checksum at offset ", pos_, " of ", path_, " (frame #", number_, ", ",
                   kind_name(h.kind), " step ", h.step, "): stored ", hex64(h.checksum), ", computed ", hex64(sum),
                   ". The bytes were damaged after they were written; restore the file from a copy, "
                   "or truncate it to ",
                   pos_, " bytes to keep the frames before it");
    });
    return std::nullopt;
  }
  Frame f{h, pos_, number_, p, size};
  pos_ += size;
  ++number_;
  return f;
}

}  // namespace retrace::trace
