#include "ckpt/verify.h"

#include <sys/stat.h>

#include <filesystem>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/schema.h"
#include "core/digest.h"
#include "core/file_util.h"

namespace retrace::ckpt {
namespace {

namespace stdfs = std::filesystem;

std::string join(const std::string& dir, const std::string& file) { return (stdfs::path(dir) / file).string(); }

const char* kResumeHint = "resume from an older checkpoint (retrace picks the newest one that verifies) or "
                          "restore the file";

// Phase 4 for one shard: empty when present with the recorded size.
std::string presence_problem(const std::string& dir, const ShardEntry& s) {
  const std::string path = join(dir, s.file);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return detail::concat("shard file missing: ", s.file, " for rank ", s.rank, " in ", dir,
                          ": the manifest lists it but there is no such file; the checkpoint is incomplete; ",
                          kResumeHint);
  }
  if (uint64_t(st.st_size) != s.size) {
    return detail::concat("sha256 mismatch on rank ", s.rank, ": ", path, " is ", uint64_t(st.st_size),
                          " bytes, the manifest records ", s.size, " bytes and sha256 ", s.sha256,
                          "; the shard was cut short or replaced; ", kResumeHint);
  }
  return {};
}

std::string digest_problem(const std::string& dir, const ShardEntry& s, const std::string& found) {
  if (found == s.sha256) return {};
  return detail::concat("sha256 mismatch on rank ", s.rank, ": ", join(dir, s.file), ": expected ", s.sha256,
                        " (manifest), found ", found, "; the shard is damaged or torn (a save cut short); ",
                        kResumeHint);
}

}  // namespace

Manifest read_checked_manifest(const std::string& dir, std::optional<uint32_t> expected_world_size) {
  std::error_code ec;
  RETRACE_CHECK(stdfs::is_directory(dir, ec), IntegrityError, "checkpoint directory missing: ", dir,
                " does not exist or is not a directory; list the run's checkpoints with: ls RUN/checkpoints");
  const std::string path = join(dir, kManifestFile);
  if (!stdfs::exists(path, ec)) {
    size_t shards = 0;
    for (const auto& entry : stdfs::directory_iterator(dir, ec))
      if (entry.path().extension() == ".safetensors") ++shards;
    RETRACE_FAIL(IntegrityError, "no manifest: ", dir, " has no ", kManifestFile, " (", shards,
                 " shard file(s) present); this is an incomplete checkpoint (an interrupted save) and is "
                 "never used; resume from an older checkpoint");
  }
  Manifest m = parse_manifest(fs::read_file(path, kMaxManifestBytes), path);
  stdfs::path normal = stdfs::path(dir).lexically_normal();
  if (normal.filename().empty()) normal = normal.parent_path();  // "dir/" names the same directory
  if (auto step = parse_step_dir_name(normal.filename().string())) {
    RETRACE_CHECK(*step == m.step, IntegrityError, "manifest ", path, " says step ", m.step,
                  " but its directory is for step ", *step, "; the manifest was moved or edited; ", kResumeHint);
  }
  if (expected_world_size && *expected_world_size != m.world_size) {
    throw WorldSizeMismatch(detail::concat(
        "world_size mismatch: expected ", *expected_world_size, ", found ", m.world_size, " in ", path,
        "; the checkpoint was saved by ", m.world_size, " ranks and this run has ", *expected_world_size,
        "; resume with --world-size ", m.world_size));
  }
  return m;
}

Manifest verify_checkpoint(const std::string& dir, std::optional<uint32_t> expected_world_size,
                           std::optional<uint32_t> hashed_by_caller) {
  Manifest m = read_checked_manifest(dir, expected_world_size);
  for (const ShardEntry& s : m.shards) {
    std::string problem = presence_problem(dir, s);
    if (!problem.empty()) throw IntegrityError(problem);
  }
  for (const ShardEntry& s : m.shards) {
    if (hashed_by_caller && s.rank == *hashed_by_caller) continue;
    std::string problem = digest_problem(dir, s, sha256_file_hex(join(dir, s.file)));
    if (!problem.empty()) throw IntegrityError(problem);
  }
  return m;
}

VerifyReport verify_report(const std::string& dir, std::optional<uint32_t> expected_world_size) {
  VerifyReport r;
  r.dir = dir;
  try {
    r.manifest = read_checked_manifest(dir, expected_world_size);
  } catch (const Error& e) {
    r.problems.push_back(e.what());
    r.error_kind = e.kind();
    return r;
  }
  r.manifest_ok = true;
  r.step = r.manifest.step;
  for (const ShardEntry& s : r.manifest.shards) {
    ShardCheck c{s.rank, s.file, s.size, s.sha256, "", false, ""};
    c.problem = presence_problem(dir, s);
    if (c.problem.empty()) {
      try {
        c.found_sha256 = sha256_file_hex(join(dir, s.file));
        c.problem = digest_problem(dir, s, c.found_sha256);
      } catch (const Error& e) {
        c.problem = e.what();
      }
    }
    c.ok = c.problem.empty();
    if (!c.ok) {
      r.problems.push_back(c.problem);
      if (r.error_kind.empty()) r.error_kind = "integrity error";
    }
    r.shards.push_back(std::move(c));
  }
  r.ok = r.problems.empty();
  return r;
}

nlohmann::json verify_report_json(const std::string& dir, std::optional<uint32_t> expected_world_size) {
  VerifyReport r = verify_report(dir, expected_world_size);
  nlohmann::json j = {{"ok", r.ok}, {"dir", r.dir}};
  if (r.manifest_ok) {
    j["step"] = r.manifest.step;
    j["world_size"] = r.manifest.world_size;
    j["schema"] = r.manifest.schema;
  } else {
    j["step"] = nullptr;
    j["world_size"] = nullptr;
    j["schema"] = nullptr;
  }
  j["shards"] = nlohmann::json::array();
  for (const ShardCheck& c : r.shards) {
    nlohmann::json s = {{"rank", c.rank}, {"file", c.file}, {"size", c.size}, {"sha256", c.sha256}, {"ok", c.ok}};
    if (!c.found_sha256.empty()) s["found_sha256"] = c.found_sha256;
    if (!c.ok) s["problem"] = c.problem;
    j["shards"].push_back(std::move(s));
  }
  if (!r.ok) {
    j["error"] = r.problems.front();
    j["error_kind"] = r.error_kind;
    j["problems"] = r.problems;
  }
  return j;
}

ShardData load_shard(const std::string& dir, const Manifest& manifest, uint32_t rank, bool check_digest) {
  const ShardEntry* entry = nullptr;
  for (const ShardEntry& s : manifest.shards)
    if (s.rank == rank) entry = &s;
  RETRACE_CHECK(entry != nullptr, IntegrityError, "shard file missing: the manifest of ", dir,
                " lists no shard for rank ", rank, " (world_size ", manifest.world_size, ")");
  const std::string path = join(dir, entry->file);
  std::string problem = presence_problem(dir, *entry);
  if (!problem.empty()) throw IntegrityError(problem);
  std::string bytes = fs::read_file(path, entry->size);
  RETRACE_CHECK(bytes.size() == entry->size, IntegrityError, "sha256 mismatch on rank ", rank, ": read ",
                bytes.size(), " bytes of ", path, ", the manifest records ", entry->size, "; ", kResumeHint);
  if (check_digest) {
    problem = digest_problem(dir, *entry, sha256_hex(bytes.data(), bytes.size()));
    if (!problem.empty()) throw IntegrityError(problem);
  }
  ShardData shard = parse_shard(std::move(bytes), path);
  shard.metadata = migrate_shard_metadata(std::move(shard.metadata), "shard " + path);
  auto check_meta = [&](const char* key, const std::string& expected) {
    auto it = shard.metadata.find(key);
    RETRACE_CHECK(it != shard.metadata.end() && it->second == expected, IntegrityError, "shard ", path,
                  ": metadata \"", key, "\" is \"", (it == shard.metadata.end() ? "(missing)" : it->second),
                  "\", the manifest expects \"", expected, "\"; the shard belongs to another checkpoint; ",
                  kResumeHint);
  };
  check_meta("step", std::to_string(manifest.step));
  check_meta("rank", std::to_string(rank));
  if (shard.metadata.count("world_size")) check_meta("world_size", std::to_string(manifest.world_size));
  return shard;
}

}  // namespace retrace::ckpt
