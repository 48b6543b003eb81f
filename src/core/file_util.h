// Small POSIX file helpers with the durability protocol of checkpoints and run files: write to a
// `.tmp` name, fsync, rename over the final name, fsync the directory. All failures throw IoError
// naming the path and the errno text; a failed atomic write leaves the old file untouched and
// removes its `.tmp`.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace retrace::fs {

// Replaces `path` atomically with `data` (tmp, fsync, rename, fsync dir).
void write_file_atomic(const std::string& path, std::string_view data);
// fsyncs a directory so that renames inside it are durable.
void fsync_dir(const std::string& dir);
// Reads a whole file; throws IoError if missing, FormatError if larger than max_bytes.
std::string read_file(const std::string& path, uint64_t max_bytes = uint64_t(1) << 32);
// Opens a regular file for reading (never blocking on a FIFO); FormatError (exit 3) when what is
// at `path` is not a regular file, IoError when it cannot be opened. The caller owns the fd.
int open_regular_file(const std::string& path);
// Creates a directory and its parents; throws IoError naming the path if that fails or if the
// directory cannot be written to.
void make_writable_dir(const std::string& dir);
std::string errno_text(int err);

}  // namespace retrace::fs
