// The directory protocol and verification: every damage is found, with the right words.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/ckpt_test_util.h"
#include "ckpt/shard.h"
#include "core/digest.h"
#include "core/error.h"

namespace retrace::ckpt {
namespace {

namespace stdfs = std::filesystem;
using testing::read_all;
using testing::save_checkpoint;
using testing::TempDir;
using testing::write_all;

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

// The error verify_checkpoint throws, as (kind, message); ("", "") if it passes.
std::pair<std::string, std::string> verify_error(const std::string& dir, std::optional<uint32_t> ws = std::nullopt) {
  try {
    verify_checkpoint(dir, ws);
    return {"", ""};
  } catch (const Error& e) {
    return {e.kind(), e.what()};
  }
}

TEST(CheckpointDir, SaveVerifyLoad) {
  TempDir tmp;
  const std::string dir = save_checkpoint(tmp.path(), 10, 2, 4096);
  EXPECT_EQ(dir, tmp.file("step-00000010"));
  Manifest m = verify_checkpoint(dir, 2);
  EXPECT_EQ(m.step, 10u);
  EXPECT_EQ(testing::check_checkpoint_content(dir, m), "");
  EXPECT_EQ(read_latest(tmp.path()).value_or(""), "step-00000010");
  auto j = verify_report_json(dir, 2);
  EXPECT_TRUE(j["ok"].get<bool>()) << j.dump(2);
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_EQ(j["shards"].size(), 2u);
  EXPECT_EQ(j["shards"][1]["sha256"], j["shards"][1]["found_sha256"]);
  EXPECT_FALSE(j.contains("error"));
}

TEST(CheckpointDir, EveryByteFlipAndTruncationOfAShardIsDetected) {
  TempDir tmp;
  const std::string dir = save_checkpoint(tmp.path(), 10, 2, 160);
  const std::string path = dir + "/" + shard_file_name(1);
  const std::string good = read_all(path);
  ASSERT_LT(good.size(), 2000u);
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = char(bad[i] ^ 0xff);
    write_all(path, bad);
    auto [kind, what] = verify_error(dir);
    EXPECT_EQ(kind, "integrity error") << "byte " << i;
    EXPECT_TRUE(starts_with(what, "sha256 mismatch on rank 1")) << "byte " << i << ": " << what;
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_FALSE(verify_report_json(dir)["ok"].get<bool>());
  }
  for (size_t n = 0; n < good.size(); ++n) {
    write_all(path, good.substr(0, n));
    auto [kind, what] = verify_error(dir);
    EXPECT_EQ(kind, "integrity error") << "length " << n;
    EXPECT_TRUE(starts_with(what, "sha256 mismatch on rank 1")) << "length " << n << ": " << what;
  }
  write_all(path, good + "x");
  EXPECT_TRUE(starts_with(verify_error(dir).second, "sha256 mismatch on rank 1"));
  write_all(path, good);
  EXPECT_EQ(verify_error(dir).first, "");
}

TEST(CheckpointDir, EveryBitFlipAndTruncationOfAManifestIsDetected) {
  TempDir tmp;
  const std::string dir = save_checkpoint(tmp.path(), 10, 2, 160);
  const std::string path = dir + "/manifest.json";
  const std::string good = read_all(path);
  size_t checksum = 0, format = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = good;
      bad[i] = char(bad[i] ^ (1 << bit));
      write_all(path, bad);
      auto [kind, what] = verify_error(dir);
      ASSERT_NE(kind, "") << "flip of bit " << bit << " at byte " << i << " passed verification";
      if (kind == "integrity error") {
        EXPECT_TRUE(starts_with(what, "manifest checksum mismatch")) << what;
        ++checksum;
      } else {
        EXPECT_EQ(kind, "format error") << what;
        EXPECT_NE(what.find(path), std::string::npos) << what;
        ++format;
      }
    }
  }
  EXPECT_GT(checksum, 0u);
  EXPECT_GT(format, 0u);
  for (size_t n = 0; n + 1 < good.size(); ++n) {  // the last byte is the trailing newline
    write_all(path, good.substr(0, n));
    auto [kind, what] = verify_error(dir);
    EXPECT_TRUE(kind == "format error" || kind == "integrity error") << "length " << n << ": " << kind;
  }
  write_all(path, good);
  EXPECT_EQ(verify_error(dir).first, "");
}

TEST(CheckpointDir, MissingShard) {
  TempDir tmp;
  const std::string dir = save_checkpoint(tmp.path(), 10, 3, 256);
  stdfs::remove(dir + "/" + shard_file_name(2));
  auto [kind, what] = verify_error(dir);
  EXPECT_EQ(kind, "integrity error");
  EXPECT_TRUE(starts_with(what, "shard file missing: shard-rank00002.safetensors for rank 2")) << what;
  auto j = verify_report_json(dir);
  EXPECT_FALSE(j["ok"].get<bool>());
  EXPECT_TRUE(j["shards"][0]["ok"].get<bool>());
  EXPECT_FALSE(j["shards"][2]["ok"].get<bool>());
}

TEST(CheckpointDir, WorldSizeMismatch) {
  TempDir tmp;
  const std::string dir = save_checkpoint(tmp.path(), 10, 2, 256);
  try {
    verify_checkpoint(dir, 4);
    FAIL() << "accepted world size 4";
  } catch (const WorldSizeMismatch& e) {
    std::string what = e.what();
    EXPECT_TRUE(starts_with(what, "world_size mismatch")) << what;
    EXPECT_NE(what.find("expected 4, found 2"), std::string::npos) << what;
    EXPECT_NE(what.find("resume with --world-size 2"), std::string::npos) << what;
  }
  EXPECT_THROW(find_newest_valid(tmp.path(), 4), WorldSizeMismatch);
  EXPECT_NO_THROW(verify_checkpoint(dir, 2));
}

TEST(CheckpointDir, NoManifestIsNeverUsed) {
  TempDir tmp;
  const std::string dir = save_checkpoint(tmp.path(), 10, 2, 256);
  stdfs::remove(dir + "/manifest.json");
  auto [kind, what] = verify_error(dir);
  EXPECT_TRUE(starts_with(what, "no manifest: ")) << what;
  EXPECT_NE(what.find("incomplete checkpoint"), std::string::npos) << what;
  EXPECT_NE(what.find("2 shard file(s)"), std::string::npos) << what;
}

TEST(CheckpointDir, UnknownSchemaInManifest) {
  TempDir tmp;
  const std::string dir = save_checkpoint(tmp.path(), 10, 1, 256);
  auto j = nlohmann::json::parse(read_all(dir + "/manifest.json"));
  j["schema"] = "megatron.v3";
  j.erase("manifest_sha256");
  std::string canon = j.dump();
  j["manifest_sha256"] = sha256_hex(canon.data(), canon.size());
  write_all(dir + "/manifest.json", j.dump(2));
  auto [kind, what] = verify_error(dir);
  EXPECT_EQ(kind, "format error");
  EXPECT_TRUE(starts_with(what, "unknown schema \"megatron.v3\"")) << what;
}

TEST(CheckpointDir, ManifestForAnotherStep) {
  TempDir tmp;
  const std::string dir = save_checkpoint(tmp.path(), 10, 1, 256);
  stdfs::create_directory(tmp.file("step-00000011"));
  stdfs::copy(dir, tmp.file("step-00000011"), stdfs::copy_options::recursive | stdfs::copy_options::overwrite_existing);
  auto [kind, what] = verify_error(tmp.file("step-00000011"));
  EXPECT_EQ(kind, "integrity error");
  EXPECT_NE(what.find("says step 10"), std::string::npos) << what;
}

TEST(CheckpointDir, RotationKeepsFiveAndRemovesLeftovers) {
  TempDir tmp;
  const std::string root = tmp.path();
  for (uint64_t s = 1; s <= 7; ++s) save_checkpoint(root, s, 2, 256);
  // Leftovers of interrupted saves: an older dir without manifest, .tmp files, and a newer
  // manifest-less dir that rotation must leave alone (it may be a save in progress).
  stdfs::create_directories(tmp.file("step-00000005x"));     // not a step dir: ignored
  const std::string torn = prepare_checkpoint_dir(root, 6);  // re-save of 6 that never commits
  write_all(torn + "/shard-rank00000.safetensors.tmp", "partial");
  write_all(tmp.file("LATEST.tmp"), "x");
  const std::string future = prepare_checkpoint_dir(root, 99);
  write_all(future + "/shard-rank00000.safetensors", "partial");
  save_checkpoint(root, 8, 2, 256);
  std::vector<uint64_t> steps;
  for (auto& [step, dir] : list_step_dirs(root)) steps.push_back(step);
  EXPECT_EQ(steps, (std::vector<uint64_t>{99, 8, 7, 5, 4, 3})) << "keeps 3,4,5,7,8; 6 lost its manifest";
  EXPECT_FALSE(stdfs::exists(tmp.file("LATEST.tmp")));
  EXPECT_TRUE(stdfs::exists(tmp.file("step-00000005x")));
  EXPECT_EQ(read_latest(root).value_or(""), "step-00000008");
  for (uint64_t s : {3, 4, 5, 7, 8}) EXPECT_NO_THROW(verify_checkpoint(root + "/" + step_dir_name(s), 2)) << s;
  save_checkpoint(root, 9, 2, 256, /*keep_last=*/2);
  steps.clear();
  for (auto& [step, dir] : list_step_dirs(root)) steps.push_back(step);
  EXPECT_EQ(steps, (std::vector<uint64_t>{99, 9, 8}));
  Manifest m;
  EXPECT_THROW(commit_checkpoint(root, m, 0), ConfigError);
}

TEST(CheckpointDir, FindNewestValidFallsBack) {
  TempDir tmp;
  const std::string root = tmp.path();
  EXPECT_FALSE(find_newest_valid(root, 2).has_value());
  EXPECT_FALSE(find_newest_valid(tmp.file("absent"), 2).has_value());
  for (uint64_t s : {10, 20, 30}) save_checkpoint(root, s, 2, 4096);
  // Newest complete one is torn (a shard cut short behind a valid manifest) ...
  const std::string shard30 = root + "/step-00000030/" + shard_file_name(0);
  std::string bytes = read_all(shard30);
  write_all(shard30, bytes.substr(0, bytes.size() / 2));
  // ... and an even newer save was interrupted before its manifest.
  const std::string d40 = prepare_checkpoint_dir(root, 40);
  write_all(d40 + "/" + shard_file_name(0), "half a shard");
  EXPECT_EQ(read_latest(root).value_or(""), "step-00000030");  // LATEST points at a torn one

  auto pick = find_newest_valid(root, 2);
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->dir, root + "/step-00000020");
  EXPECT_EQ(pick->manifest.step, 20u);
  ASSERT_EQ(pick->skipped.size(), 2u);
  EXPECT_EQ(pick->skipped[0].first, d40);
  EXPECT_TRUE(starts_with(pick->skipped[0].second, "no manifest: ")) << pick->skipped[0].second;
  EXPECT_EQ(pick->skipped[1].first, root + "/step-00000030");
  EXPECT_TRUE(starts_with(pick->skipped[1].second, "sha256 mismatch on rank 0")) << pick->skipped[1].second;
  EXPECT_EQ(testing::check_checkpoint_content(pick->dir, pick->manifest), "");

  // Nothing valid at all: nullopt, with every reason.
  for (uint64_t s : {10, 20}) stdfs::remove(root + "/" + step_dir_name(s) + "/manifest.json");
  std::vector<std::pair<std::string, std::string>> skipped;
  EXPECT_FALSE(find_newest_valid(root, 2, &skipped).has_value());
  EXPECT_EQ(skipped.size(), 4u);
}

TEST(CheckpointDir, DiskFullDuringSaveKeepsPreviousCheckpoints) {
  TempDir tmp;
  const std::string root = tmp.path();
  save_checkpoint(root, 10, 2, 1 << 20);
  save_checkpoint(root, 20, 2, 1 << 20);
  for (uint64_t at : {uint64_t(0), uint64_t(100), uint64_t(700000)}) {
    try {
      save_checkpoint(root, 30, 2, 1 << 20, kDefaultKeepLast, WriteFaults{at, ENOSPC});
      FAIL() << "save with a full disk succeeded";
    } catch (const IoError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("No space left on device"), std::string::npos) << what;
      EXPECT_NE(what.find("step-00000030/shard-rank00000.safetensors"), std::string::npos) << what;
      EXPECT_NE(what.find("existing checkpoints are untouched"), std::string::npos) << what;
    }
    for (const auto& entry : stdfs::directory_iterator(root + "/step-00000030"))
      EXPECT_NE(entry.path().extension(), ".tmp") << entry.path();
    EXPECT_NO_THROW(verify_checkpoint(root + "/step-00000010", 2));
    EXPECT_NO_THROW(verify_checkpoint(root + "/step-00000020", 2));
    EXPECT_EQ(read_latest(root).value_or(""), "step-00000020");
    auto pick = find_newest_valid(root, 2);
    ASSERT_TRUE(pick.has_value());
    EXPECT_EQ(pick->manifest.step, 20u);
    ASSERT_EQ(pick->skipped.size(), 1u);
    EXPECT_TRUE(starts_with(pick->skipped[0].second, "no manifest: ")) << pick->skipped[0].second;
  }
  // The disk has room again: the next save commits and rotation clears the torn step 30.
  save_checkpoint(root, 40, 2, 1 << 20);
  EXPECT_FALSE(stdfs::exists(root + "/step-00000030"));
  EXPECT_EQ(find_newest_valid(root, 2)->manifest.step, 40u);
}

TEST(CheckpointDir, CommitRefusesMissingShards) {
  TempDir tmp;
  const std::string dir = prepare_checkpoint_dir(tmp.path(), 5);
  Manifest m;
  m.step = 5;
  m.world_size = 1;
  m.shards = {{0, shard_file_name(0), 10, std::string(64, '0')}};
  try {
    commit_checkpoint(tmp.path(), m);
    FAIL();
  } catch (const IntegrityError& e) {
    EXPECT_TRUE(starts_with(e.what(), "shard file missing: shard-rank00000.safetensors for rank 0")) << e.what();
  }
  EXPECT_FALSE(stdfs::exists(dir + "/manifest.json"));
}

TEST(CheckpointDir, ReportListsEveryProblem) {
  TempDir tmp;
  const std::string dir = save_checkpoint(tmp.path(), 10, 3, 256);
  std::string b0 = read_all(dir + "/" + shard_file_name(0));
  b0[b0.size() - 1] ^= 1;
  write_all(dir + "/" + shard_file_name(0), b0);
  stdfs::remove(dir + "/" + shard_file_name(2));
  VerifyReport r = verify_report(dir);
  EXPECT_FALSE(r.ok);
  ASSERT_EQ(r.problems.size(), 2u);
  EXPECT_TRUE(starts_with(r.problems[0], "sha256 mismatch on rank 0"));
  EXPECT_TRUE(starts_with(r.problems[1], "shard file missing: "));
  auto j = verify_report_json(tmp.file("nowhere"));
  EXPECT_FALSE(j["ok"].get<bool>());
  EXPECT_TRUE(j.contains("error"));
}

}  // namespace
}  // namespace retrace::ckpt

namespace retrace::ckpt {
namespace {

// Rewrites a checkpoint's manifest with `edit` applied and a valid checksum ("resealed").
void reseal_manifest(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  auto j = nlohmann::json::parse(read_all(dir + "/manifest.json"));
  edit(j);
  j.erase("manifest_sha256");
  std::string canon = j.dump();
  j["manifest_sha256"] = sha256_hex(canon.data(), canon.size());
  write_all(dir + "/manifest.json", j.dump(2));
}

std::vector<uint64_t> steps_in(const std::string& root) {
  std::vector<uint64_t> steps;
  for (auto& [step, dir] : list_step_dirs(root)) steps.push_back(step);
  return steps;
}

// Regression (data loss): rotation took whatever it could not read for an interrupted save and
// removed it: a newer schema, a damaged manifest, a directory with files no save writes.
TEST(Rotation, NeverRemovesWhatItCannotProveItsOwn) {
  TempDir tmp;
  const std::string root = tmp.path();
  for (uint64_t s = 1; s <= 4; ++s) save_checkpoint(root, s, 1, 256);
  reseal_manifest(root + "/step-00000001", [](nlohmann::json& j) { j["schema"] = "ckpt.v4"; });  // a newer retrace's
  write_all(root + "/step-00000002/manifest.json", "{\"damaged\": true}");                       // checksum fails
  stdfs::remove(root + "/step-00000003/manifest.json");                                          // no manifest ...
  write_all(root + "/step-00000003/notes.txt", "my notes");  // ... and a user's file
  RotationReport r;
  Manifest m;
  save_checkpoint(root, 5, 1, 256, /*keep_last=*/1);
  r = rotate_checkpoints(root, 1);
  EXPECT_EQ(steps_in(root), (std::vector<uint64_t>{5, 3, 2, 1})) << "only the complete step 4 may go";
  EXPECT_EQ(read_all(root + "/step-00000003/notes.txt"), "my notes");
  ASSERT_EQ(r.left.size(), 3u);
  std::map<std::string, std::string> why(r.left.begin(), r.left.end());
  EXPECT_NE(why[root + "/step-00000001"].find("unknown schema \"ckpt.v4\""), std::string::npos)
      << why[root + "/step-00000001"];
  EXPECT_NE(why[root + "/step-00000003"].find("notes.txt"), std::string::npos);
}

// Regression (data loss): a step-* link was followed and the target's manifest unlinked.
TEST(Rotation, NeverFollowsLinks) {
  TempDir tmp, outside;
  const std::string root = tmp.path();
  const std::string target = save_checkpoint(outside.path(), 1, 1, 256);
  stdfs::create_directory_symlink(target, root + "/step-00000001");
  for (uint64_t s = 2; s <= 4; ++s) save_checkpoint(root, s, 1, 256, /*keep_last=*/1);
  EXPECT_TRUE(stdfs::exists(target + "/manifest.json")) << "the link's target lost its manifest";
  EXPECT_NO_THROW(verify_checkpoint(target, 1));
  EXPECT_TRUE(stdfs::is_symlink(root + "/step-00000001"));
  RotationReport r = rotate_checkpoints(root, 1);
  ASSERT_EQ(r.left.size(), 1u);
  EXPECT_EQ(r.left[0].first, root + "/step-00000001");
  // Nor is a checkpoint read through a link.
  auto pick = find_newest_valid(root, 1);
  ASSERT_TRUE(pick);
  EXPECT_EQ(pick->dir, root + "/step-00000004");
}

// Regression (data loss): rotation ran before the new checkpoint was read back, so a save the
// disk did not keep cost the older checkpoints.
TEST(Rotation, WaitsForTheNewCheckpointToVerifyFromDisk) {
  TempDir tmp;
  const std::string root = tmp.path();
  for (uint64_t s = 1; s <= 2; ++s) save_checkpoint(root, s, 1, 256, /*keep_last=*/1);
  EXPECT_EQ(steps_in(root), (std::vector<uint64_t>{2}));
  // Step 3's shard as the disk returns it differs from what was hashed while writing.
  const std::string dir = prepare_checkpoint_dir(root, 3);
  std::vector<uint8_t> data(64, 7);
  std::vector<TensorView> views = {{"w", "F32", {16}, data.data(), data.size()}};
  ShardFileInfo info = write_shard(dir + "/" + shard_file_name(0), shard_metadata(3, 0, 1), views);
  std::string bytes = read_all(dir + "/" + info.file);
  bytes[bytes.size() - 1] ^= 1;
  write_all(dir + "/" + info.file, bytes);
  Manifest m;
  m.step = 3;
  m.world_size = 1;
  m.config_hash = "cfg-test";
  m.rng_format_version = 1;
  m.trace_chain_hex = "00";
  m.shards = {{0, info.file, info.size, info.sha256}};
  try {
    commit_checkpoint(root, m, 1);
    FAIL() << "a checkpoint that does not read back was committed quietly";
  } catch (const IntegrityError& e) {
    EXPECT_NE(std::string(e.what()).find("does not verify when read back"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sha256 mismatch on rank 0"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(verify_checkpoint(root + "/step-00000002", 1)) << "the previous checkpoint must survive";
  EXPECT_EQ(find_newest_valid(root, 1)->dir, root + "/step-00000002");
}

// load_shard_into: one pass from the file straight into the caller's memory gives load_shard's
// bytes and metadata, on one thread (a small shard) and with the hashing thread (blocks of the read
// straddle tensors); every flipped byte and every truncation of the shard is a sha256 mismatch, as
// load_shard reports it, header bytes included.
std::string load_into_error(const std::string& dir, const Manifest& m, std::map<std::string, std::vector<char>>& out) {
  try {
    uint64_t got = 0;
    load_shard_into(
        dir, m, 0,
        [&](const ShardData&, const TensorEntry& e) {
          out[e.name].assign(size_t(e.nbytes), '\0');
          return out[e.name].data();
        },
        got);
    return "";
  } catch (const Error& e) {
    return std::string(e.kind()) + ": " + e.what();
  }
}

TEST(CheckpointDir, AShardReadInPlaceHoldsLoadShardsBytesAndEveryDamageIsASha256Mismatch) {
  TempDir tmp;
  for (uint64_t bytes : {uint64_t(4096), uint64_t(12) << 20}) {
    const std::string dir = save_checkpoint(tmp.file(std::to_string(bytes)), 10, 1, bytes);
    const Manifest m = verify_checkpoint(dir, 1);
    const ShardData whole = load_shard(dir, m, 0);
    std::map<std::string, std::vector<char>> placed;
    uint64_t got = 0;
    const ShardData head = load_shard_into(
        dir, m, 0,
        [&](const ShardData&, const TensorEntry& e) {
          placed[e.name].assign(size_t(e.nbytes), '\0');
          return placed[e.name].data();
        },
        got);
    EXPECT_EQ(got, whole.bytes.size());
    EXPECT_TRUE(head.bytes.empty());
    EXPECT_EQ(head.metadata, whole.metadata);
    ASSERT_EQ(head.tensors.size(), whole.tensors.size());
    for (const TensorEntry& e : whole.tensors) {
      ASSERT_EQ(placed[e.name].size(), e.nbytes) << e.name;
      EXPECT_EQ(std::memcmp(placed[e.name].data(), whole.data(e), size_t(e.nbytes)), 0) << e.name;
    }
  }
  const std::string dir = save_checkpoint(tmp.file("small"), 10, 1, 160);
  const Manifest m = verify_checkpoint(dir, 1);
  const std::string path = dir + "/" + shard_file_name(0);
  const std::string good = read_all(path);
  ASSERT_LT(good.size(), 2000u);
  std::map<std::string, std::vector<char>> out;
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = char(bad[i] ^ 0xff);
    write_all(path, bad);
    const std::string what = load_into_error(dir, m, out);
    EXPECT_TRUE(starts_with(what, "integrity error: sha256 mismatch on rank 0")) << "byte " << i << ": " << what;
  }
  for (size_t n : {size_t(0), size_t(7), good.size() / 2, good.size() - 1}) {
    write_all(path, good.substr(0, n));
    EXPECT_TRUE(starts_with(load_into_error(dir, m, out), "integrity error: sha256 mismatch on rank 0")) << n;
  }
  write_all(path, good);
  EXPECT_EQ(load_into_error(dir, m, out), "");
}

}  // namespace
}  // namespace retrace::ckpt
