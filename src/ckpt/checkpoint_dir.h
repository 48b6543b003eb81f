// The checkpoint directory protocol (a checkpoint exists only when its
// manifest exists).
//
//   <root>/step-00000010/shard-rank00000.safetensors ...   written by write_shard (tmp, fsync, rename)
//   <root>/step-00000010/manifest.json                     written last: the commit point
//   <root>/LATEST                                          "step-00000010\n", replaced atomically;
//                                                          a hint for people, never trusted on load
//
// A save: prepare_checkpoint_dir, every rank write_shard()s its shard into it, then (after the
// ranks agree that all shards are written) one process calls commit_checkpoint.
// A resume: find_newest_valid, which verifies (verify.h) instead of trusting LATEST.
// Not safe against two processes committing into the same root at the same time.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/manifest.h"
#include "ckpt/verify.h"

namespace retrace::ckpt {

constexpr uint32_t kDefaultKeepLast = 5;
constexpr const char* kLatestFile = "LATEST";

// The step of a directory name "step-<digits>", or nullopt for any other name.
std::optional<uint64_t> parse_step_dir_name(const std::string& name);

// The step directories of root (full paths), newest (highest step) first; links are left out (a
// checkpoint is never read or removed through one). Empty if root is absent.
std::vector<std::pair<uint64_t, std::string>> list_step_dirs(const std::string& root);

// Creates <root>/step-XXXXXXXX and makes it durable in root; returns its path. If it already holds
// a manifest (the step is saved again), the manifest is removed first, so the directory counts as
// incomplete until the new commit. IoError if that fails.
std::string prepare_checkpoint_dir(const std::string& root, uint64_t step);

// What a rotation removed, and what it left in place because it could not prove it its own.
struct RotationReport {
  std::vector<std::string> removed;
  std::vector<std::pair<std::string, std::string>> left;  // path, why it was not touched
};

// Commits the checkpoint of m.step whose shards are already in <root>/step-XXXXXXXX: checks that
// every listed shard is there with its size (IntegrityError `shard file missing` / `sha256 mismatch`
// otherwise, nothing is written), writes manifest.json atomically (the commit point), fsyncs the
// directory and root, reads the checkpoint back and verifies it (IntegrityError, and nothing older
// is touched, when the disk did not keep it), replaces LATEST atomically, then rotates
// (rotate_checkpoints; its report goes to `rotation` when given). Returns the step directory.
// keep_last must be >= 1 (ConfigError).
// `shards_read_back`: every shard was written by write_shard, which read it back before renaming it
// (each rank its own, in parallel); the verification after the commit then reads the manifest back
// and checks each shard's presence and size, without a second sha256 of every shard on this process.
std::string commit_checkpoint(const std::string& root, Manifest m, uint32_t keep_last = kDefaultKeepLast,
                              RotationReport* rotation = nullptr, bool shards_read_back = false);

// Never deletes what it cannot prove is its own. Each step-* entry of root is one of:
//   complete     a real directory (not a link) whose manifest checks out (checksum, a schema this
//                binary reads, its step) with every listed shard present at its size;
//   interrupted  a real directory without a manifest holding only files a save writes;
//   anything else: a link, a manifest that does not check out (damaged, a newer schema), a shard
//                missing from a valid manifest, a file no save writes. Left in place and reported.
// Keeps the newest keep_last complete checkpoints and removes older complete ones; removes
// interrupted ones older than the newest complete one (saves that died; newer ones may be in
// progress); removes regular *.tmp files in root and in the kept directories. A removal takes the
// manifest first, then only the save's own files, then the empty directory. IoError if something
// cannot be removed (the rest is still done).
RotationReport rotate_checkpoints(const std::string& root, uint32_t keep_last = kDefaultKeepLast);

// The shard a resume on one rank reads first: rank 0's file of the newest step directory that holds
// a manifest (what find_newest_valid tries first), or nullopt. Unverified: for hashing ahead only
// (core/hash_ahead.h), whose hint the load checks against the file it opens.
std::optional<std::string> first_shard_to_resume(const std::string& root);

// The content of LATEST (without the newline), or nullopt.
std::optional<std::string> read_latest(const std::string& root);

// The step directories newest first, each passed to `attempt(dir)` until one returns; one that
// throws an Error is skipped with its message in `skipped` (dir, reason), except a world size
// mismatch (WorldSizeMismatch), which is thrown: resuming on another world size is a request to
// fix, not damage to step over. Returns (dir, what attempt returned), or nullopt when none did.
// With `agree` (ranks that each read part of a checkpoint): every candidate's verdict, this
// process's reason or "" when it loaded, goes through agree(reason), which returns the reason to
// skip it on every rank ("" to take it), so that all ranks take the same directory.
template <class Attempt>
auto newest_step_dir_that(const std::string& root, Attempt attempt,
                          std::vector<std::pair<std::string, std::string>>& skipped,
                          const std::function<std::string(const std::string&)>& agree = {})
    -> std::optional<std::pair<std::string, decltype(attempt(std::string()))>> {
  for (const auto& entry : list_step_dirs(root)) {
    const std::string& dir = entry.second;
    std::optional<decltype(attempt(std::string()))> value;
    std::string why;
    try {
      value.emplace(attempt(dir));
    } catch (const WorldSizeMismatch&) {
      throw;  // the manifest's, the same on every rank
    } catch (const Error& e) {
      why = e.what();
      if (why.empty()) why = "failed to load";
    }
    if (agree) why = agree(why);
    if (why.empty() && value) return std::make_pair(dir, std::move(*value));
    skipped.emplace_back(dir, why);
  }
  return std::nullopt;
}

struct ResumePick {
  std::string dir;
  Manifest manifest;
  std::vector<std::pair<std::string, std::string>> skipped;  // newer dirs passed over: dir, reason
};

// newest_step_dir_that with verify_checkpoint: the newest checkpoint that verifies, with the
// reasons for every newer one it skipped (torn, corrupt, no manifest). nullopt if none verifies;
// `skipped_out`, if given, receives the reasons in both cases.
std::optional<ResumePick> find_newest_valid(const std::string& root, std::optional<uint32_t> expected_world_size,
                                            std::vector<std::pair<std::string, std::string>>* skipped_out = nullptr);

}  // namespace retrace::ckpt
