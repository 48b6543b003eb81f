// Verification of a checkpoint directory, done before any shard is parsed.
//
// verify_checkpoint runs these phases in order and throws at the first problem:
//   1. manifest.json present. Without it the directory is an interrupted save and is never used:
//      IntegrityError starting `no manifest:`.
//   2. manifest parsed, its self checksum checked (IntegrityError starting `manifest checksum
//      mismatch`, FormatError for an unparsable manifest), schema dispatched (FormatError, see
//      schema.h), step equal to the directory name's step (IntegrityError).
//   3. world size, if the caller expects one: WorldSizeMismatch (an IntegrityError) starting
//      `world_size mismatch`.
//   4. every shard present (`shard file missing: <file> for rank N`) with the size the manifest
//      records (`sha256 mismatch on rank N`: a short file cannot have the right digest).
//   5. the sha256 of every shard: `sha256 mismatch on rank N`.
// check_table (phase 6, run by `retrace verify` and verify_report) then checks what a load checks of
// the `tensors` table against the shards' headers, without reading tensor data: every piece is a
// tensor of its rank's shard under the table's name, with its dtype, its shape (the table's when the
// piece is the whole tensor, a 1-D run otherwise), its bytes, and (ckpt.v3) at its recorded offset;
// the pieces of each tensor cover it exactly (checked when the manifest is parsed). IntegrityError
// naming the tensor otherwise, so VERIFIED means every rank's load will find what it looks for.
// Messages name the file, the expected and the found value, and what to do.
// All functions are thread-safe (they only read files).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/manifest.h"
#include "ckpt/shard.h"
#include "core/error.h"

namespace retrace::ckpt {

// Raised for a resume on another world size: the files are fine, the request does not fit them.
class WorldSizeMismatch : public IntegrityError {
 public:
  using IntegrityError::IntegrityError;
};

// Full verification (phases 1-5); returns the manifest (schema as found on disk, content migrated).
// `hashed_by_caller`: the rank whose shard the caller is about to read and hash itself
// (load_shard with check_digest), so that the bytes hashed are the very bytes parsed; its digest
// is not read here (its presence and size are).
// kEveryShard as `hashed_by_caller`: the caller reads and hashes every shard itself (read_pieces),
// so only their presence and sizes are checked here.
constexpr uint32_t kEveryShard = 0xffffffffu;
Manifest verify_checkpoint(const std::string& dir, std::optional<uint32_t> expected_world_size,
                           std::optional<uint32_t> hashed_by_caller = std::nullopt);

// Phase 6: the manifest's `tensors` table against the shards' headers (see above). Reads only the
// headers (a few KiB a shard). IntegrityError for the first piece a load would refuse.
void check_table(const std::string& dir, const Manifest& manifest);

// Phases 1-3 only: the manifest of `dir`, read and checked, without touching the shards.
Manifest read_checked_manifest(const std::string& dir, std::optional<uint32_t> expected_world_size);

struct ShardCheck {
  uint32_t rank = 0;
  std::string file;
  uint64_t size = 0;         // as recorded in the manifest
  std::string sha256;        // as recorded in the manifest
  std::string found_sha256;  // empty when the file was missing or had the wrong size
  bool ok = false;
  std::string problem;  // empty when ok
};

// The same checks as a value: never throws for integrity or format problems (only for bugs).
// Unlike verify_checkpoint it checks every shard and lists every problem.
struct VerifyReport {
  bool ok = false;
  std::string dir;
  uint64_t step = 0;
  std::vector<std::string> problems;
  Manifest manifest;  // valid when the manifest phases passed
  bool manifest_ok = false;
  std::vector<ShardCheck> shards;
  std::string error_kind;  // retrace::Error::kind() of the first problem, empty when ok
};
VerifyReport verify_report(const std::string& dir, std::optional<uint32_t> expected_world_size = std::nullopt);

// For `retrace verify CKPT_DIR --json`:
//   {"ok": bool, "dir": str, "step": int, "world_size": int, "schema": str,
//    "shards": [{"rank", "file", "size", "sha256", "ok", ("found_sha256"), ("problem")}],
//    ("error": first problem), ("error_kind": str), ("problems": [str])}
nlohmann::json verify_report_json(const std::string& dir, std::optional<uint32_t> expected_world_size = std::nullopt);

// Reads the shard of `rank` listed in a verified manifest, checks its size and (if check_digest)
// its sha256 again on the bytes read, parses it (parse_shard), migrates its metadata (schema.h) and
// checks that its metadata "step" and "rank" match the manifest. The returned metadata is in the
// current schema. Throws IntegrityError / FormatError naming the file.
ShardData load_shard(const std::string& dir, const Manifest& manifest, uint32_t rank, bool check_digest = true);
// The same checks with each tensor's bytes read straight into memory the caller chose: the shard's
// header is read first, `place(header, entry)` gives the destination of each tensor, in file order
// (entry.nbytes bytes, not overlapping another's; called for empty tensors too; nullptr: the bytes
// are hashed, not kept; it may throw, before a byte of data is read), and one pass reads the file
// into them while hashing it. The
// destinations hold unchecked bytes until it returns; when it throws (sha256, size, a header that
// changed between the two reads, metadata), they hold some or all of a damaged shard's bytes. Returns
// the parsed header (`bytes` empty) with its metadata migrated; `bytes_read`: the bytes read.
ShardData load_shard_into(const std::string& dir, const Manifest& manifest, uint32_t rank,
                          const std::function<char*(const ShardData&, const TensorEntry&)>& place,
                          uint64_t& bytes_read);

// The replicated tensors of a ckpt.v2/v3 checkpoint (manifest.tensors), gathered from the shards
// that hold their pieces, up to two shards at a time. `own_rank`'s shard is read whole in one pass,
// hashed (sha256) where its bytes land (load_shard_into): each wanted piece straight into its
// destination (a piece the window wants a part of into a buffer of its own, then that part), the
// rest only hashed; no buffer of the shard. Another rank's shard, when the manifest records
// its pieces' offsets and xxh3 (ckpt.v3), is read piece by piece: only the pieces whose elements
// this process keeps, each checked against its xxh3 before use (IntegrityError naming the file, the
// tensor, the elements and the bytes otherwise), so a shard with nothing wanted is not read at all;
// the other ranks' damage is theirs to find (the ranks of a resume agree on what they skip, see
// load_newest_snapshot). Without them (ckpt.v2) every shard is read whole and hashed. Each piece
// read from a parsed shard is checked against the table (its entry present, of the tensor's dtype,
// with the piece's length and, in v3, at the recorded offset; IntegrityError naming the file and
// range otherwise). A piece lands at destination(index into manifest.tensors) + begin *
// element size. Only tensors whose name `wanted` accepts are read. `own_shard` is called, on one
// of the reading threads, with the own rank's shard header (its metadata) and its rank-own tensors
// (those the table does not list: its RNG states) by name. The destination buffers are the
// caller's, each large enough for its tensor; distinct tensors' buffers must not overlap. They hold
// unchecked bytes when it throws.
// `window`, when given: the elements [first, last) of tensor i the caller keeps (a ZeRO rank's
// range of the optimizer state); destination(i) then holds those only, element `first` at its
// start, and the pieces are copied where they overlap it.
using ElementWindow = std::function<std::pair<uint64_t, uint64_t>(size_t)>;
// Returns the bytes it read of the shards.
uint64_t read_pieces(const std::string& dir, const Manifest& manifest,
                     const std::function<bool(const TensorLayout&)>& wanted,
                     const std::function<void*(size_t)>& destination, uint32_t own_rank,
                     const std::function<void(const ShardData&, const std::map<std::string, std::string>&)>& own_shard,
                     const ElementWindow& window = {});
// read_pieces into byte buffers of their own: the bytes of each wanted tensor, in table order
// (empty for the others); `rank`'s rng/state into `rng` when given.
std::vector<std::vector<char>> gather_pieces(const std::string& dir, const Manifest& manifest,
                                             const std::function<bool(const TensorLayout&)>& wanted, uint32_t rank = 0,
                                             std::string* rng = nullptr);

}  // namespace retrace::ckpt
