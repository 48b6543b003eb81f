// Thin POSIX file-descriptor helpers for the trace writer and reader. Internal to src/trace. Every
// failure throws IoError naming the path and the errno text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace retrace::trace {

// Owns a file descriptor; closes it on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd();
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Reads up to n bytes at offset; returns fewer only at end of file.
size_t pread_full(int fd, void* buf, size_t n, uint64_t offset, const std::string& path);
// Writes all n bytes at the current position (one write(2) call unless the kernel takes less).
void write_full(int fd, const void* buf, size_t n, const std::string& path);
uint64_t file_size(int fd, const std::string& path);
void fsync_fd(int fd, const std::string& path);

}  // namespace retrace::trace
