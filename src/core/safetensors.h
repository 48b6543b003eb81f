// A safetensors file: the layout of checkpoint shards and of users' tensor data sets, so that
// Python's `safetensors` reads and writes them.
//
// Byte layout (all integers little-endian):
//
//   [0, 8)           u64 N: length of the JSON header in bytes
//   [8, 8 + N)       JSON header, UTF-8, padded with trailing spaces so that 8 + N is a multiple
//                    of 8 (the data section starts 8-byte aligned):
//                      {"__metadata__": {"schema": "ckpt.v1", "step": "10", ...},   (strings only)
//                       "<tensor name>": {"dtype": "F32", "shape": [2, 3],
//                                         "data_offsets": [begin, end]}, ...}
//   [8 + N, EOF)     data section: the raw little-endian bytes of every tensor, back to back.
//                    data_offsets are relative to the start of the data section; the ranges are
//                    contiguous, start at 0 and end exactly at EOF (safetensors demands the same).
//
// dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL. The writer orders the data by element size
// (largest first), then by name, so every tensor starts aligned to its element size.
//
// The writer never copies the tensors: it writes straight from the caller's memory while a second
// thread computes the sha256 of the same bytes, so the digest costs no extra pass over the disk
// (and, in the same pass, each tensor's xxh3-128: a checkpoint's manifest records it per piece).
// Durability: final_path + ".tmp" is written, fsynced, renamed to final_path, and the directory is
// fsynced. A failure removes the .tmp and touches no other file.
//
// The reader validates everything before it returns (see parse_shard) and reports each problem as
// a FormatError naming the file, the tensor, what was expected and what was found.
#pragma once

#include <cerrno>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/file_util.h"

namespace retrace::safetensors {

// Hostile-input limits of the reader.
constexpr uint64_t kMaxShardHeaderBytes = 100ull << 20;  // 100 MB, as in safetensors
constexpr size_t kMaxTensorRank = 64;

// Element size in bytes of a safetensors dtype string, or nullopt if we do not know it.
std::optional<uint64_t> dtype_size(const std::string& dtype);

// A tensor to write: a view of memory the caller owns and keeps alive during write_shard.
struct TensorView {
  std::string name;
  std::string dtype;           // one of the dtypes above
  std::vector<int64_t> shape;  // non-negative dims; {} is a scalar
  const void* data = nullptr;  // nbytes little-endian bytes, contiguous
  uint64_t nbytes = 0;         // must equal product(shape) * dtype_size(dtype)
};

// What write_shard produced. `file` is the base name (what a ShardEntry records).
struct ShardFileInfo {
  std::string file;
  uint64_t size = 0;
  std::string sha256;  // 64 lowercase hex digits of the whole file
  // Per tensor, in the order given: where its bytes start in the file, and their xxh3-128 (32 hex
  // digits), computed in the pass that computes the sha256.
  std::vector<uint64_t> offsets;
  std::vector<std::string> xxh3;
  // Every byte was written past the page cache (set_direct_writes) and read back the same way.
  bool direct = false;
};

// Test seam, in the spirit of leveldb's fault-injection env: make the write fail once
// `fail_at_byte` bytes of the file are written, with errno `error` (a short write first, like a
// disk that fills up in the middle of a buffer). `flip_byte_at`: once the file is written and
// fsynced, flip the lowest bit of that byte of it, as a disk that did not keep what it was given
// (the read-back must refuse the shard).
struct WriteFaults {
  uint64_t fail_at_byte = std::numeric_limits<uint64_t>::max();
  int error = ENOSPC;
  uint64_t flip_byte_at = std::numeric_limits<uint64_t>::max();
};

// Writes a shard atomically (see above). metadata values are stored as given; tensor names must be
// unique, non-empty and not "__metadata__". Throws InvariantError for views that contradict
// themselves (bad dtype, nbytes that does not match the shape), IoError naming the file for any
// file system failure (ENOSPC, EIO, permissions); in that case the .tmp is removed and final_path
// and every other file are untouched. Thread-safe for distinct paths.
// Before the rename the .tmp is read back from the file system, once fsynced: its header must be
// the bytes written and each tensor's bytes must have the xxh3-128 the writing pass computed from
// the caller's memory (the pass that computed the sha256), so the file holds the bytes the sha256
// describes. IntegrityError naming the tensor otherwise (the .tmp removed, as above). The read-back
// costs a read of the file and one xxh3 pass (about a sixth of a sha256 pass here), not a second
// sha256: commit_checkpoint need not hash such shards again (see its `shards_read_back`).
ShardFileInfo write_shard(const std::string& final_path, const std::map<std::string, std::string>& metadata,
                          const std::vector<TensorView>& tensors);
// Whether write_shard writes (and reads back) past the page cache (O_DIRECT) from an aligned
// buffer, process-wide; false until set (checkpoint.direct_io sets it for a run). The file's bytes
// are the same either way. Where the file system refuses it (tmpfs: EINVAL), or a direct write
// fails or comes short, the rest of the file is written through the page cache, with the errors
// and messages of that path. A fault seam (WriteFaults::fail_at_byte) writes through the cache.
void set_direct_writes(bool on);
bool direct_writes();
ShardFileInfo write_shard(const std::string& final_path, const std::map<std::string, std::string>& metadata,
                          const std::vector<TensorView>& tensors, const WriteFaults& faults);

// A validated tensor of a parsed shard; offset is relative to the data section.
struct TensorEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t offset = 0;
  uint64_t nbytes = 0;
};

// A parsed shard. Owns the file's bytes; tensors are in data order (ascending offset).
struct ShardData {
  std::string source;  // path or name used in error messages
  std::map<std::string, std::string> metadata;
  std::vector<TensorEntry> tensors;
  fs::FileBytes bytes;      // the whole file
  uint64_t data_start = 0;  // 8 + header length; a multiple of 8 for files we write

  // Pointer to the tensor's bytes inside `bytes` (valid while this ShardData lives unmoved).
  const void* data(const TensorEntry& entry) const { return bytes.data() + data_start + entry.offset; }
  // The entry called `name`, or nullptr.
  const TensorEntry* find(const std::string& name) const;
};

// Parses and validates shard bytes: header length within kMaxShardHeaderBytes and the file,
// strict JSON (no duplicate keys), an object whose "__metadata__" maps strings to strings, known
// dtypes, shapes of at most kMaxTensorRank non-negative dims whose byte count does not overflow,
// data_offsets [begin, end] with end - begin == product(shape) * dtype size, ranges contiguous
// from 0 to the end of the file. Throws FormatError naming `name_for_errors`. Does not look at
// the schema (see schema.h); does not check any digest (the manifest does, see verify.h).
ShardData parse_shard(fs::FileBytes bytes, const std::string& name_for_errors);
// The same on a copy of `bytes`.
ShardData parse_shard(std::string_view bytes, const std::string& name_for_errors);

// Reads the file and parse_shard()s it. IoError if it cannot be read.
ShardData read_shard(const std::string& path);
// The header alone, validated as parse_shard validates it against the file's size, read from the
// file's first bytes (the length and the JSON header): metadata, tensors and data_start, `bytes`
// left empty. For checks of what a shard holds without reading its data (retrace verify).
ShardData read_shard_header(const std::string& path, fs::Links links);
// The header from `head`, a shard's first bytes (the length and the JSON header, or more), validated
// against the shard's `file_size` as read_shard_header validates it; `bytes` left empty.
ShardData parse_shard_header(std::string_view head, uint64_t file_size, const std::string& name_for_errors);

}  // namespace retrace::safetensors
