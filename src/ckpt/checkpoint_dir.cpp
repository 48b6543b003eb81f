#include "ckpt/checkpoint_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "ckpt/schema.h"
#include "core/error.h"
#include "core/file_util.h"

namespace retrace::ckpt {
namespace {

namespace stdfs = std::filesystem;

std::string join(const std::string& dir, const std::string& file) { return (stdfs::path(dir) / file).string(); }

// Cheap completeness for rotation: no digests, only what a crash can leave behind.
bool looks_complete(const std::string& dir) {
  try {
    Manifest m = read_checked_manifest(dir, std::nullopt);
    for (const ShardEntry& s : m.shards) {
      struct stat st {};
      if (::stat(join(dir, s.file).c_str(), &st) != 0 || uint64_t(st.st_size) != s.size) return false;
    }
    return true;
  } catch (const Error&) {
    return false;
  }
}

void remove_tmp_files(const std::string& dir, std::vector<std::string>* removed, std::vector<std::string>* failed) {
  std::error_code ec;
  for (const auto& entry : stdfs::directory_iterator(dir, ec)) {
    if (entry.path().extension() != ".tmp") continue;
    std::error_code rm;
    stdfs::remove_all(entry.path(), rm);
    (rm ? failed : removed)->push_back(entry.path().string() + (rm ? " (" + rm.message() + ")" : ""));
  }
}

}  // namespace

std::optional<uint64_t> parse_step_dir_name(const std::string& name) {
  const std::string prefix = "step-";
  if (name.size() <= prefix.size() || name.size() > prefix.size() + 19 || name.compare(0, prefix.size(), prefix) != 0)
    return std::nullopt;
  if (name.find_first_not_of("0123456789", prefix.size()) != std::string::npos) return std::nullopt;
  return std::stoull(name.substr(prefix.size()));
}

std::vector<std::pair<uint64_t, std::string>> list_step_dirs(const std::string& root) {
  std::vector<std::pair<uint64_t, std::string>> out;
  std::error_code ec;
  for (const auto& entry : stdfs::directory_iterator(root, ec)) {
    std::error_code e2;
    if (!entry.is_directory(e2)) continue;
    if (auto step = parse_step_dir_name(entry.path().filename().string())) out.emplace_back(*step, entry.path().string());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

std::string prepare_checkpoint_dir(const std::string& root, uint64_t step) {
  fs::make_writable_dir(root);
  const std::string dir = join(root, step_dir_name(step));
  const std::string manifest = join(dir, kManifestFile);
  std::error_code ec;
  if (stdfs::exists(manifest, ec)) {
    RETRACE_CHECK(::unlink(manifest.c_str()) == 0, IoError, "cannot remove ", manifest,
                  " before saving step ", step, " again: ", fs::errno_text(errno));
    fs::fsync_dir(dir);
  }
  fs::make_writable_dir(dir);
  fs::fsync_dir(root);
  return dir;
}

std::string commit_checkpoint(const std::string& root, Manifest m, uint32_t keep_last) {
  RETRACE_CHECK(keep_last >= 1, ConfigError, "keep_last is 0; it must be at least 1 so that the checkpoint just "
                "saved is kept");
  const std::string dir = join(root, step_dir_name(m.step));
  m.schema = kSchemaCurrent;
  std::sort(m.shards.begin(), m.shards.end(), [](const ShardEntry& a, const ShardEntry& b) { return a.rank < b.rank; });
  for (const ShardEntry& s : m.shards) {
    struct stat st {};
    const std::string path = join(dir, s.file);
    RETRACE_CHECK(::stat(path.c_str(), &st) == 0, IntegrityError, "shard file missing: ", s.file, " for rank ",
                  s.rank, " in ", dir, ": cannot commit step ", m.step, " before every rank has written its shard");
    RETRACE_CHECK(uint64_t(st.st_size) == s.size, IntegrityError, "sha256 mismatch on rank ", s.rank, ": ", path,
                  " is ", uint64_t(st.st_size), " bytes, the manifest to commit records ", s.size,
                  "; not committing step ", m.step);
  }
  const std::string text = serialize_manifest(m);
  fs::write_file_atomic(join(dir, kManifestFile), text);  // the commit point; fsyncs dir
  fs::fsync_dir(root);
  fs::write_file_atomic(join(root, kLatestFile), step_dir_name(m.step) + "\n");
  rotate_checkpoints(root, keep_last);
  return dir;
}

std::vector<std::string> rotate_checkpoints(const std::string& root, uint32_t keep_last) {
  RETRACE_CHECK(keep_last >= 1, ConfigError, "keep_last is 0; it must be at least 1");
  std::vector<std::string> removed, failed, kept;
  std::optional<uint64_t> newest_complete;
  uint32_t complete_kept = 0;
  auto remove = [&](const std::string& path) {
    // The manifest goes first, so that a crash in the middle of the removal leaves an incomplete
    // directory, never a manifest whose shards are gone.
    std::error_code ec;
    const std::string manifest = join(path, kManifestFile);
    if (stdfs::remove(manifest, ec) && !ec) {
      try {
        fs::fsync_dir(path);
      } catch (const Error&) {
        // Best effort: remove_all below reports what really fails.
      }
    }
    ec.clear();
    stdfs::remove_all(path, ec);
    if (ec) failed.push_back(path + " (" + ec.message() + ")");
    else removed.push_back(path);
  };
  for (const auto& [step, dir] : list_step_dirs(root)) {  // newest first
    if (looks_complete(dir)) {
      if (!newest_complete) newest_complete = step;
      if (complete_kept < keep_last) {
        ++complete_kept;
        kept.push_back(dir);
      } else {
        remove(dir);
      }
    } else if (newest_complete && step < *newest_complete) {
      remove(dir);
    } else {
      kept.push_back(dir);
    }
  }
  remove_tmp_files(root, &removed, &failed);
  for (const std::string& dir : kept) remove_tmp_files(dir, &removed, &failed);
  if (!removed.empty()) {
    try {
      fs::fsync_dir(root);
    } catch (const Error&) {
      // Removal is best effort; a rotation that is not durable is redone at the next commit.
    }
  }
  if (!failed.empty()) {
    std::string list;
    for (const auto& f : failed) list += "\n  " + f;
    RETRACE_FAIL(IoError, "checkpoint rotation in ", root, " could not remove:", list,
                 "\nthe newest checkpoint is committed; fix the permissions or remove these by hand");
  }
  return removed;
}

std::optional<std::string> read_latest(const std::string& root) {
  try {
    std::string s = fs::read_file(join(root, kLatestFile), 4096);
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
  } catch (const Error&) {
    return std::nullopt;
  }
}

std::optional<ResumePick> find_newest_valid(const std::string& root, std::optional<uint32_t> expected_world_size,
                                            std::vector<std::pair<std::string, std::string>>* skipped_out) {
  std::vector<std::pair<std::string, std::string>> skipped;
  std::optional<ResumePick> pick;
  for (const auto& [step, dir] : list_step_dirs(root)) {
    (void)step;
    try {
      Manifest m = verify_checkpoint(dir, expected_world_size);
      pick = ResumePick{dir, std::move(m), {}};
      break;
    } catch (const WorldSizeMismatch&) {
      throw;
    } catch (const Error& e) {
      skipped.emplace_back(dir, e.what());
    }
  }
  if (skipped_out) *skipped_out = skipped;
  if (pick) pick->skipped = std::move(skipped);
  return pick;
}

}  // namespace retrace::ckpt
