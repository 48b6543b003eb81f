#include "ckpt/checkpoint_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "ckpt/schema.h"
#include "core/error.h"
#include "core/parse_number.h"
#include "core/file_util.h"

namespace retrace::ckpt {
namespace {

namespace stdfs = std::filesystem;

std::string join(const std::string& dir, const std::string& file) { return (stdfs::path(dir) / file).string(); }

// What rotation may do with one entry of the checkpoint root.
enum class Kind {
  kComplete,     // a real directory whose manifest checks out, every shard present with its size
  kInterrupted,  // a real directory without a manifest holding only files a save writes
  kUnknown,      // anything else: never removed, reported
};

struct Classified {
  Kind kind = Kind::kUnknown;
  std::string why;  // for kUnknown
};

bool is_regular_no_follow(const stdfs::path& p) {
  std::error_code ec;
  return stdfs::symlink_status(p, ec).type() == stdfs::file_type::regular;
}

// Only what retrace's own save writes into a step directory: shard files, their .tmp, and the
// manifest's .tmp.
bool is_save_file_name(const std::string& name) {
  return (name.rfind("shard-rank", 0) == 0 &&
          (name.size() > 12 && (name.compare(name.size() - 12, 12, ".safetensors") == 0 ||
                                (name.size() > 16 && name.compare(name.size() - 16, 16, ".safetensors.tmp") == 0)))) ||
         name == std::string(kManifestFile) + ".tmp";
}

Classified classify(const std::string& dir) {
  std::error_code ec;
  if (stdfs::symlink_status(dir, ec).type() != stdfs::file_type::directory)
    return {Kind::kUnknown, "not a directory that retrace made (a link or another kind of file)"};
  const stdfs::path manifest = stdfs::path(dir) / kManifestFile;
  if (stdfs::symlink_status(manifest, ec).type() == stdfs::file_type::not_found) {
    for (const auto& entry : stdfs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (!is_regular_no_follow(entry.path()) || !is_save_file_name(name))
        return {Kind::kUnknown, "no manifest, and it holds " + name + ", which no save of retrace writes"};
    }
    if (ec) return {Kind::kUnknown, "cannot list it: " + ec.message()};
    return {Kind::kInterrupted, {}};
  }
  try {
    Manifest m = read_checked_manifest(dir, std::nullopt);
    for (const ShardEntry& sh : m.shards) {
      struct stat st {};
      const std::string path = join(dir, sh.file);
      if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || uint64_t(st.st_size) != sh.size)
        return {Kind::kUnknown, "its manifest lists " + sh.file + ", which is missing or of another size"};
    }
    return {Kind::kComplete, {}};
  } catch (const Error& e) {
    return {Kind::kUnknown, e.what()};
  }
}

void remove_tmp_files(const std::string& dir, std::vector<std::string>* removed, std::vector<std::string>* failed) {
  std::error_code ec;
  for (const auto& entry : stdfs::directory_iterator(dir, ec)) {
    if (entry.path().extension() != ".tmp" || !is_regular_no_follow(entry.path())) continue;
    std::error_code rm;
    stdfs::remove(entry.path(), rm);
    (rm ? failed : removed)->push_back(entry.path().string() + (rm ? " (" + rm.message() + ")" : ""));
  }
}

}  // namespace

std::optional<uint64_t> parse_step_dir_name(const std::string& name) {
  const std::string prefix = "step-";
  if (name.size() <= prefix.size() || name.size() > prefix.size() + 19 || name.compare(0, prefix.size(), prefix) != 0)
    return std::nullopt;
  if (name.find_first_not_of("0123456789", prefix.size()) != std::string::npos) return std::nullopt;
  return parse_decimal_u64(std::string_view(name).substr(prefix.size()));  // 19 digits at most: fits
}

std::vector<std::pair<uint64_t, std::string>> list_step_dirs(const std::string& root) {
  std::vector<std::pair<uint64_t, std::string>> out;
  std::error_code ec;
  for (const auto& entry : stdfs::directory_iterator(root, ec)) {
    std::error_code e2;
    if (!entry.is_symlink(e2) && entry.is_directory(e2))  // a link is never a checkpoint of this run
      if (auto step = parse_step_dir_name(entry.path().filename().string()))
        out.emplace_back(*step, entry.path().string());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

std::optional<std::string> first_shard_to_resume(const std::string& root) {
  std::error_code ec;
  for (const auto& [step, dir] : list_step_dirs(root))
    if (stdfs::is_regular_file(join(dir, kManifestFile), ec)) return join(dir, shard_file_name(0));
  return std::nullopt;
}

std::string prepare_checkpoint_dir(const std::string& root, uint64_t step) {
  std::error_code ec;
  const bool new_root = !stdfs::exists(root, ec);
  fs::make_writable_dir(root);
  if (new_root) fs::fsync_dir(stdfs::absolute(root).parent_path().string());  // the run directory knows it
  const std::string dir = join(root, step_dir_name(step));
  const std::string manifest = join(dir, kManifestFile);
  if (stdfs::exists(manifest, ec)) {
    RETRACE_CHECK(::unlink(manifest.c_str()) == 0, IoError, "cannot remove ", manifest, " before saving step ", step,
                  " again: ", fs::errno_text(errno));
    fs::fsync_dir(dir);
  }
  fs::make_writable_dir(dir);
  fs::fsync_dir(root);
  return dir;
}

std::string commit_checkpoint(const std::string& root, Manifest m, uint32_t keep_last, RotationReport* rotation,
                              bool shards_read_back) {
  RETRACE_CHECK(keep_last >= 1, ConfigError,
                "keep_last is 0; it must be at least 1 so that the checkpoint just "
                "saved is kept");
  const std::string dir = join(root, step_dir_name(m.step));
  m.schema = kSchemaCurrent;
  std::sort(m.shards.begin(), m.shards.end(), [](const ShardEntry& a, const ShardEntry& b) { return a.rank < b.rank; });
  for (const ShardEntry& s : m.shards) {
    struct stat st {};
    const std::string path = join(dir, s.file);
    RETRACE_CHECK(::stat(path.c_str(), &st) == 0, IntegrityError, "shard file missing: ", s.file, " for rank ", s.rank,
                  " in ", dir, ": cannot commit step ", m.step, " before every rank has written its shard");
    RETRACE_CHECK(uint64_t(st.st_size) == s.size, IntegrityError, "sha256 mismatch on rank ", s.rank, ": ", path,
                  " is ", uint64_t(st.st_size), " bytes, the manifest to commit records ", s.size,
                  "; not committing step ", m.step);
  }
  const std::string text = serialize_manifest(m);
  fs::write_file_atomic(join(dir, kManifestFile), text);  // the commit point; fsyncs dir
  fs::fsync_dir(root);
  // Nothing older goes before the new checkpoint has been read back from the disk and verified
  // (manifest, sizes, and the shards' bytes: here their sha256, or by their writers before the
  // rename when shards_read_back): a save that the disk did not keep must not cost the checkpoints
  // before it.
  try {
    if (shards_read_back) verify_checkpoint(dir, m.world_size, kEveryShard);
    else verify_checkpoint(dir, m.world_size);
  } catch (const Error& e) {
    RETRACE_FAIL(IntegrityError, "checkpoint ", dir, " was written but does not verify when read back: ", e.what(),
                 "; no older checkpoint was removed");
  }
  fs::write_file_atomic(join(root, kLatestFile), step_dir_name(m.step) + "\n");
  RotationReport r = rotate_checkpoints(root, keep_last);
  if (rotation) *rotation = std::move(r);
  return dir;
}

RotationReport rotate_checkpoints(const std::string& root, uint32_t keep_last) {
  RETRACE_CHECK(keep_last >= 1, ConfigError, "keep_last is 0; it must be at least 1");
  RotationReport report;
  std::vector<std::string> failed, kept;
  std::optional<uint64_t> newest_complete;
  uint32_t complete_kept = 0;
  auto remove = [&](const std::string& path) {
    // The manifest goes first, so that a crash in the middle of the removal leaves an incomplete
    // directory, never a manifest whose shards are gone. Only the files a save writes are removed,
    // one by one, then the directory itself: nothing else can be in it (classify checked).
    std::error_code ec;
    const std::string manifest = join(path, kManifestFile);
    if (stdfs::remove(manifest, ec) && !ec) {
      try {
        fs::fsync_dir(path);
      } catch (const Error&) {
        // Best effort: the removal below reports what really fails.
      }
    }
    for (const auto& entry : stdfs::directory_iterator(path, ec)) {
      std::error_code rm;
      if (is_regular_no_follow(entry.path()) && is_save_file_name(entry.path().filename().string()))
        stdfs::remove(entry.path(), rm);
      if (rm) failed.push_back(entry.path().string() + " (" + rm.message() + ")");
    }
    ec.clear();
    stdfs::remove(path, ec);  // fails, and says so, if anything is left in it
    if (ec) failed.push_back(path + " (" + ec.message() + ")");
    else report.removed.push_back(path);
  };
  std::error_code ec;
  for (const auto& entry : stdfs::directory_iterator(root, ec)) {  // what list_step_dirs leaves out
    const std::string name = entry.path().filename().string();
    std::error_code e2;
    if (parse_step_dir_name(name) && (entry.is_symlink(e2) || !entry.is_directory(e2)))
      report.left.emplace_back(entry.path().string(), "a link or another kind of file named like a checkpoint");
  }
  for (const auto& [step, dir] : list_step_dirs(root)) {  // newest first
    const Classified c = classify(dir);
    switch (c.kind) {
      case Kind::kComplete:
        if (!newest_complete) newest_complete = step;
        if (complete_kept < keep_last) {
          ++complete_kept;
          kept.push_back(dir);
        } else {
          remove(dir);
        }
        break;
      case Kind::kInterrupted:
        // Older than the newest complete checkpoint: a save that died. Newer: maybe one in progress.
        if (newest_complete && step < *newest_complete) remove(dir);
        else kept.push_back(dir);
        break;
      case Kind::kUnknown: report.left.emplace_back(dir, c.why); break;
    }
  }
  remove_tmp_files(root, &report.removed, &failed);
  for (const std::string& dir : kept) remove_tmp_files(dir, &report.removed, &failed);
  if (!report.removed.empty()) {
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
  return report;
}

std::optional<std::string> read_latest(const std::string& root) {
  try {
    std::string s = fs::read_file(join(root, kLatestFile), 4096, fs::Links::kRefuse);
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
  } catch (const Error&) {
    return std::nullopt;
  }
}

std::optional<ResumePick> find_newest_valid(const std::string& root, std::optional<uint32_t> expected_world_size,
                                            std::vector<std::pair<std::string, std::string>>* skipped_out) {
  std::vector<std::pair<std::string, std::string>> skipped;
  auto found = newest_step_dir_that(
      root, [&](const std::string& dir) { return verify_checkpoint(dir, expected_world_size); }, skipped);
  if (skipped_out) *skipped_out = skipped;
  if (!found) return std::nullopt;
  return ResumePick{found->first, std::move(found->second), std::move(skipped)};
}

}  // namespace retrace::ckpt
