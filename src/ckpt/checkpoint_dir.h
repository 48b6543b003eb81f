// The checkpoint directory protocol (DESIGN.md invariant 3: a checkpoint exists only when its
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

// The step directories of root (full paths), newest (highest step) first. Empty if root is absent.
std::vector<std::pair<uint64_t, std::string>> list_step_dirs(const std::string& root);

// Creates <root>/step-XXXXXXXX and makes it durable in root; returns its path. If it already holds
// a manifest (the step is saved again), the manifest is removed first, so the directory counts as
// incomplete until the new commit. IoError if that fails.
std::string prepare_checkpoint_dir(const std::string& root, uint64_t step);

// Commits the checkpoint of m.step whose shards are already in <root>/step-XXXXXXXX: checks that
// every listed shard is there with its size (IntegrityError `shard file missing` / `sha256 mismatch`
// otherwise, nothing is written), writes manifest.json atomically (the commit point), fsyncs the
// directory and root, replaces LATEST atomically, then rotates (rotate_checkpoints). Returns the
// step directory. keep_last must be >= 1 (ConfigError).
std::string commit_checkpoint(const std::string& root, Manifest m, uint32_t keep_last = kDefaultKeepLast);

// Keeps the newest keep_last complete checkpoints (manifest parses, every shard present with its
// size; digests are not re-read here), removes older complete ones, removes incomplete directories
// older than the newest complete one (interrupted saves), and removes *.tmp files in root and in the
// kept directories. Incomplete directories newer than the newest complete one are left alone.
// Returns the removed paths. IoError if something cannot be removed (the rest is still done).
std::vector<std::string> rotate_checkpoints(const std::string& root, uint32_t keep_last = kDefaultKeepLast);

// The content of LATEST (without the newline), or nullopt.
std::optional<std::string> read_latest(const std::string& root);

struct ResumePick {
  std::string dir;
  Manifest manifest;
  std::vector<std::pair<std::string, std::string>> skipped;  // newer dirs passed over: dir, reason
};

// Scans the step directories newest first and returns the first that verify_checkpoint accepts,
// with the reasons for every newer one it skipped (torn, corrupt, no manifest). A world size
// mismatch is not skipped but thrown (WorldSizeMismatch): resuming on another world size is a
// request to fix, not damage to step over. nullopt if none verifies; `skipped_out`, if given,
// receives the reasons in both cases.
std::optional<ResumePick> find_newest_valid(
    const std::string& root, std::optional<uint32_t> expected_world_size,
    std::vector<std::pair<std::string, std::string>>* skipped_out = nullptr);

}  // namespace retrace::ckpt
