// A shard hashed ahead. `retrace resume` spends its first half second loading LibTorch before the
// trainer can read a byte, and reading a checkpoint costs its sha256 (one core, about 1.7 GB/s
// here). So the launcher (tools/retrace/launcher.cpp), which starts in milliseconds and has no
// LibTorch, forks a child that computes the sha256 of the shard the resume will read first, while
// the trainer starts. The trainer reads that shard into its tensors computing only an xxh3-128 per
// 4 MiB block of the file (about a tenth of sha256's cost), and takes the child's sha256 for those
// bytes when the file is the one the child hashed (device, inode, size, times) and every block's
// xxh3 equals the child's: the bytes it read are the bytes the child hashed. The sha256 is then
// checked against the manifest as ever. In every other case (another file, a file changed or
// replaced, a child that failed or was killed, no launcher) the trainer hashes the file itself, as
// it does without this. A hint that saves time, never a verdict on its own.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/digest.h"

namespace retrace::hash_ahead {

constexpr const char* kEnv = "RETRACE_HASH_AHEAD";  // "<pipe fd>:<child pid>", set by the launcher
constexpr uint64_t kBlock = uint64_t(4) << 20;      // the block of the per-block xxh3-128

// What identifies a file's content between two looks at it without reading it: a file written in
// place or replaced changes one of these.
struct Identity {
  uint64_t dev = 0, ino = 0, size = 0;
  int64_t mtime_s = 0, mtime_ns = 0, ctime_s = 0, ctime_ns = 0;
  bool operator==(const Identity& o) const;
};
std::optional<Identity> identity_of(int fd);

// The digests of one pass over a file's bytes: the sha256 of all, the xxh3-128 of each kBlock.
struct BlockedHash {
  std::string sha256;  // lowercase hex
  std::vector<Digest128> blocks;
};
BlockedHash hash_blocks(const char* data, uint64_t size);

// The child's records on its pipe, little-endian: first (when it starts) a magic and the file's
// Identity, 64 bytes; then (when it is done) the sha256 in hex, the number of blocks, and each
// block's xxh3-128 (hi, lo). A child that fails writes nothing more and exits non-zero.
std::string identity_record(const Identity& id);
std::string digests_record(const BlockedHash& h);

// The launcher, before it executes the trainer: forks the child that hashes `path` (a regular file,
// read without following a link) and puts its pipe and pid in the environment of the program this
// process executes next. Returns false, having started nothing, when it cannot.
bool start(const std::string& path);

// The trainer, first thing: takes the pipe and the child that the environment names, and removes
// the variable so that no process it starts inherits it. A variable that does not name a pipe and
// a child of this process is ignored.
void adopt();

// Whether the adopted hint is for the file open as `fd` (waits for the child's first record, written
// when it starts).
bool is_for(int fd);

// Waits for the child's digests and ends the hint (it is used once): the child's sha256 of the file
// when its size is `size` and its blocks' xxh3-128 are `blocks`, else nullopt.
std::optional<std::string> confirm(const std::vector<Digest128>& blocks, uint64_t size);

// How the hints of this process went: taken (the sha256 came from the child), refused (a hint for
// the file that did not confirm, so the trainer hashed it itself).
struct Stats {
  uint32_t taken = 0, refused = 0;
};
Stats stats();

// Tests: a hint from `fd` and `pid` as adopt() takes it (the environment untouched); the same checks.
void adopt_for_test(int fd, pid_t pid);

}  // namespace retrace::hash_ahead
