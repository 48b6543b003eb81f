// Small POSIX file helpers with the durability protocol of checkpoints and run files: write to a
// `.tmp` name, fsync, rename over the final name, fsync the directory. All failures throw IoError
// naming the path and the errno text; a failed atomic write leaves the old file untouched and
// removes its `.tmp`.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

namespace retrace::fs {

// The bytes of a file read whole. Unlike std::string, its memory is not zeroed when it is made:
// the read itself is the first write, so the page faults of fresh memory happen in the reading
// loop (overlapping the hashing, see read_file_sha256) instead of in a zero-fill before it, which
// took 0.17 s for 256 MB on a 2-core VM, longer than sha256 of the same bytes.
class FileBytes {
 public:
  FileBytes() = default;
  explicit FileBytes(size_t n) : p_(n ? new char[n] : nullptr), n_(n) {}  // not initialized
  explicit FileBytes(std::string_view s) : FileBytes(s.size()) {
    if (n_) std::memcpy(p_.get(), s.data(), n_);
  }
  char* data() { return p_.get(); }
  const char* data() const { return p_.get(); }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  char operator[](size_t i) const { return p_[i]; }
  std::string_view view() const { return {p_.get(), n_}; }
  void shrink_to(size_t n) { n_ = n < n_ ? n : n_; }  // after a short read; keeps the memory

 private:
  std::unique_ptr<char[]> p_;
  size_t n_ = 0;
};

// Replaces `path` atomically with `data` (tmp, fsync, rename, fsync dir).
void write_file_atomic(const std::string& path, std::string_view data);
// fsyncs a directory so that renames inside it are durable.
void fsync_dir(const std::string& dir);
// Whether a read follows a symbolic link at the path's last component. A checkpoint's files are
// read with kRefuse: they are plain files in their directory, and a link there could point at
// anything (FormatError naming it).
enum class Links : bool { kFollow, kRefuse };
// Reads a whole file; throws IoError if missing, FormatError if larger than max_bytes.
std::string read_file(const std::string& path, uint64_t max_bytes = uint64_t(1) << 32, Links links = Links::kFollow);
// The same into FileBytes, for large files (shards): no zero-fill before the read.
FileBytes read_file_bytes(const std::string& path, uint64_t max_bytes, Links links = Links::kFollow);
// open_regular_file, then its size, checked against max_bytes (FormatError when larger, IoError
// when it cannot be stat'ed; the fd is closed then). The caller owns the fd.
int open_regular_file_within(const std::string& path, uint64_t max_bytes, uint64_t& size, Links links = Links::kFollow);
// Opens a regular file for reading (never blocking on a FIFO); FormatError (exit 3) when what is
// at `path` is not a regular file (or, with kRefuse, is a symbolic link), IoError when it cannot
// be opened. The caller owns the fd.
int open_regular_file(const std::string& path, Links links = Links::kFollow);
// Reads bytes [offset, offset + size) of the open file `fd` into `out` (pread, so several threads
// may read one fd). Returns how many came: fewer only at the end of the file. IoError naming
// `path` for a read error.
uint64_t read_at(int fd, uint64_t offset, void* out, uint64_t size, const std::string& path);
// Reads from `fd` until `size` bytes came, the file or pipe ended, or a read failed (EINTR is
// retried); returns how many came. The caller tells an end from an error by errno when it cares.
size_t read_fully(int fd, char* out, size_t size);
// Writes all `size` bytes to `fd` (EINTR retried); returns how many were written, fewer only when a
// write failed (errno says why).
size_t write_fully(int fd, const char* data, size_t size);
// Creates a directory and its parents; throws IoError naming the path if that fails or if the
// directory cannot be written to.
void make_writable_dir(const std::string& dir);
std::string errno_text(int err);

}  // namespace retrace::fs
