// Walks the frames of a trace file in file order, checking each one as it goes (magic, header
// check, kind, length limits, checksum). Shared by the reader (to build its index) and by the
// writer (to move the frames after a checkpoint's trace position into a side file). Internal to
// src/trace. Not thread-safe.
//
// Errors: a frame with a bad magic or an unknown kind or an over-limit length throws FormatError;
// a frame whose header check or checksum does not match throws IntegrityError whose message
// contains "corrupt frame checksum at offset N". Neither is an error at the end of the file: a
// file that ends inside a frame, or whose damaged bytes no complete frame follows (what a crash or
// a power loss leaves: a cut write, zero-filled or stale blocks), makes next() return nullopt;
// tail_bytes() says how many bytes that tail has and garbage_tail() whether it is damaged rather
// than cut short.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trace/framing.h"

namespace retrace::trace {

// Reads and checks the 16-byte file header of `path` (open as fd, `size` bytes long). Throws
// FormatError naming the path for a short file, a bad magic, or an unsupported version.
// Returns the file's format version (kOldestFormatVersion to kFormatVersion).
uint16_t check_file_header(int fd, const std::string& path, uint64_t size);

class FrameScanner {
 public:
  struct Frame {
    FrameHeader header;
    uint64_t offset = 0;             // of the frame header in the file
    uint64_t number = 0;             // 0-based frame number (counting from `first_number`)
    const uint8_t* bytes = nullptr;  // the whole frame; valid until the next call to next()
    uint64_t size = 0;               // kFrameHeaderSize + compressed_len
  };

  // Scans [start, end) of the file open as fd (owned by the caller). Frame numbers start at
  // first_number.
  FrameScanner(int fd, std::string path, uint64_t start, uint64_t end, uint64_t first_number = 0);

  // The next complete, checked frame, or nullopt at the end of the range or at an incomplete tail.
  std::optional<Frame> next();
  // Offset after the last complete frame returned.
  uint64_t position() const { return pos_; }
  // Bytes of an incomplete frame at position(); 0 when the range ended on a frame boundary.
  uint64_t tail_bytes() const { return tail_bytes_; }
  // The tail is not a cut frame but bytes that do not form one (and no frame follows them).
  bool garbage_tail() const { return garbage_tail_; }

 private:
  // Makes [offset, offset + n) available in buf_ (or as much as the range holds); returns a
  // pointer to offset and sets *available.
  const uint8_t* window(uint64_t offset, size_t n, size_t* available);
  // Whether a complete, checked frame starts at offset / anywhere in [offset, end).
  bool frame_at(uint64_t offset);
  bool any_frame_after(uint64_t offset);

  int fd_;
  std::string path_;
  uint64_t pos_;
  uint64_t end_;
  uint64_t number_;
  uint64_t tail_bytes_ = 0;
  bool garbage_tail_ = false;
  std::vector<uint8_t> buf_;
  uint64_t buf_offset_ = 0;
  size_t buf_len_ = 0;
};

}  // namespace retrace::trace
