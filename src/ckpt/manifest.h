// The checkpoint manifest: manifest.json in a step directory, written last (it is the commit point
// of a save, see checkpoint_dir.h). It lists every rank's shard with its size and sha256, and what
// a resume must match (world size, config hash, versions, RNG format, trace position).
//
// On disk: one JSON object (pretty-printed, keys sorted) with the fields of Manifest plus
// "manifest_sha256": the sha256 hex of the canonical serialization of all other fields, i.e.
// nlohmann::json::dump() (compact, keys sorted) of the object without "manifest_sha256". The digest
// covers the content, not the whitespace.
//
//   {"schema": "ckpt.v3", "step": 10, "world_size": 4, "config_hash": "...",
//    "versions": {"libtorch": "1.13.1", ...}, "rng_format_version": 1, "trace_position": 123,
//    "trace_chain_hex": "...", "shards": [{"rank": 0, "file": "shard-rank00000.safetensors",
//    "size": 1234, "sha256": "..."}, ...], "extra": {...},
//    "tensors": [{"name": "model/w", "dtype": "F32", "shape": [4, 8],
//                 "pieces": [{"rank": 0, "begin": 0, "end": 20, "offset": 512, "xxh3": "..."},
//                            {"rank": 1, "begin": 20, "end": 32, "offset": 256, "xxh3": "..."}]}],
//    "manifest_sha256": "..."}
//
// Older schemas are migrated on parse (schema.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ckpt/shard.h"

namespace retrace::ckpt {

constexpr const char* kManifestFile = "manifest.json";
// Hostile-input limits of parse_manifest.
constexpr uint64_t kMaxManifestBytes = 16ull << 20;
constexpr size_t kMaxManifestString = 4096;
constexpr size_t kMaxManifestMapEntries = 4096;
constexpr uint32_t kMaxWorldSize = 1u << 16;

struct ShardEntry {
  uint32_t rank = 0;
  std::string file;    // base name inside the step directory, e.g. shard-rank00000.safetensors
  uint64_t size = 0;   // bytes
  std::string sha256;  // 64 lowercase hex digits
};

// One copy of the replicated state on disk (schema ckpt.v2): the tensors every rank holds alike
// (under data parallelism the parameters and optimizer state, and a rollback anchor's) are viewed
// as one flat byte space in a fixed order and split into world_size contiguous ranges, cut at
// element boundaries; rank r's shard holds the pieces of range r, each under the tensor's own
// name, with the tensor's shape when the piece is the whole tensor and as a 1-D run of elements
// otherwise. A TensorLayout says where the elements of one tensor are: its pieces, in order of
// `begin`, partition [0, numel) (elements of the row-major flattened tensor).
// Since ckpt.v3 each piece also says where its bytes are in its rank's file (`offset`, from the
// file's first byte) and their xxh3-128 (`xxh3`, 32 lowercase hex digits), so that a process reads
// and checks exactly the pieces it needs from another rank's shard (read_pieces) instead of the
// whole file; pieces of a migrated ckpt.v2 manifest have neither (`xxh3` empty) and their shards
// are read whole. xxh3 guards against damage (a bad disk, a bad copy), as sha256 of the whole file
// does; neither is a signature: whoever can edit the files can reseal the manifest.
struct TensorPiece {
  uint32_t rank = 0;
  uint64_t begin = 0, end = 0;  // elements [begin, end), begin < end
  uint64_t offset = 0;          // the piece's first byte in the file of `rank` (ckpt.v3)
  std::string xxh3;             // xxh3-128 hex of the piece's bytes; empty: not recorded (ckpt.v2)
  bool hashed() const { return !xxh3.empty(); }
};
struct TensorLayout {
  std::string name;   // as in the shards: "model/<name>", "optim/<name>", "anchor/model/<name>", ...
  std::string dtype;  // a safetensors dtype (shard.h)
  std::vector<int64_t> shape;
  std::vector<TensorPiece> pieces;
  uint64_t numel() const;
};
// Hostile-input limits of the table.
constexpr size_t kMaxManifestTensors = 1u << 20;
constexpr size_t kMaxManifestPieces = 1u << 22;

// The pieces of `tensors` (name, dtype and shape set, pieces ignored) for `world` ranks: the flat
// byte space of all of them in the given order cut into `world` ranges of total / world bytes, each
// cut moved down to an element boundary of the tensor it falls in. Deterministic: every rank
// computes the same table. InvariantError for an unknown dtype or world 0.
std::vector<TensorLayout> split_among_ranks(std::vector<TensorLayout> tensors, uint32_t world);

// The shard entry of `piece` of tensor `t`, whose bytes (contiguous, all of the tensor) are at
// `data`: under the tensor's name, with its shape when the piece is the whole tensor and as a 1-D
// run of elements otherwise.
TensorView piece_view(const TensorLayout& t, const TensorPiece& piece, const void* data);

// Where a rank wrote one piece (write_shard's offsets and xxh3), for the manifest.
struct PieceRecord {
  std::string name;
  uint32_t rank = 0;
  uint64_t begin = 0;
  uint64_t offset = 0;
  std::string xxh3;
};
// Sets each piece's offset and xxh3 from `records`. InvariantError naming `dir` when a piece has no
// record or a record no piece (the ranks disagree about the table).
void set_piece_records(std::vector<TensorLayout>& tensors, const std::vector<PieceRecord>& records,
                       const std::string& dir);

struct Manifest {
  std::string schema = "ckpt.v3";  // as found on disk (content is migrated); written as current
  uint64_t step = 0;
  uint32_t world_size = 0;
  std::string config_hash;
  std::map<std::string, std::string> versions;  // libtorch, cuda, cudnn, nccl, retrace
  uint32_t rng_format_version = 1;
  uint64_t trace_position = 0;
  std::string trace_chain_hex;
  std::vector<ShardEntry> shards;  // exactly one per rank, sorted by rank
  std::map<std::string, std::string> extra;
  // ckpt.v2 and later: where each replicated tensor's elements are. Empty: every shard holds its rank's whole
  // state (checkpoints of ckpt.v1 and older, migrated).
  std::vector<TensorLayout> tensors;
};

// Serializes (schema is always written as the current one). Throws InvariantError if `m` would not
// parse back: shards not exactly one per rank 0..world_size-1, a file name with a path in it, a
// sha256 that is not 64 lowercase hex digits, or a limit exceeded. Deterministic.
std::string serialize_manifest(const Manifest& m);

// Parses strictly: size and count limits, strict JSON, the checksum (IntegrityError starting
// `manifest checksum mismatch`), the schema (FormatError, see schema.h; older ones are migrated),
// required keys, no unknown keys, exact types (integers must be non-negative JSON integers), shard
// list as for serialize_manifest. Every problem names `path_for_errors`. Shards come back sorted by
// rank. Thread-safe.
Manifest parse_manifest(const std::string& bytes, const std::string& path_for_errors);

// The canonical file names of the layout.
std::string shard_file_name(uint32_t rank);  // shard-rank00000.safetensors
std::string step_dir_name(uint64_t step);    // step-00000010

// Shard metadata that a writer puts into every shard (schema, step, rank, world_size).
std::map<std::string, std::string> shard_metadata(uint64_t step, uint32_t rank, uint32_t world_size);

}  // namespace retrace::ckpt
