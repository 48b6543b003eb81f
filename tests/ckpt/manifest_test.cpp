// Manifest serialization, its checksum, strict parsing, schema dispatch and the ckpt.v0 fixture.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "ckpt/ckpt_test_util.h"
#include "ckpt/manifest.h"
#include "ckpt/schema.h"
#include "ckpt/verify.h"
#include "core/digest.h"
#include "core/error.h"

namespace retrace::ckpt {
namespace {

using nlohmann::json;
using testing::TempDir;

Manifest sample_manifest() {
  Manifest m;
  m.step = 10;
  m.world_size = 2;
  m.config_hash = "abc123";
  m.versions = {{"libtorch", "1.13.1"}, {"cuda", "none"}, {"retrace", "0.1.0"}};
  m.rng_format_version = 3;
  m.trace_position = 4096;
  m.trace_chain_hex = "deadbeef";
  m.shards = {{1, "shard-rank00001.safetensors", 200, std::string(64, 'b')},
              {0, "shard-rank00000.safetensors", 100, std::string(64, 'a')}};
  m.extra = {{"note", "x"}};
  return m;
}

// Re-signs a manifest JSON after a deliberate edit, so that the check under test is reached.
std::string signed_text(json j) {
  j.erase("manifest_sha256");
  std::string canon = j.dump();
  j["manifest_sha256"] = sha256_hex(canon.data(), canon.size());
  return j.dump(2);
}

template <typename Kind>
std::string expect_error(const std::string& text, const std::string& phrase) {
  try {
    parse_manifest(text, "/ck/manifest.json");
    ADD_FAILURE() << "accepted, expected: " << phrase;
  } catch (const Kind& e) {
    std::string what = e.what();
    EXPECT_NE(what.find(phrase), std::string::npos) << what;
    EXPECT_NE(what.find("/ck/manifest.json"), std::string::npos) << what;
    return what;
  } catch (const Error& e) {
    ADD_FAILURE() << "wrong kind " << e.kind() << ": " << e.what();
  }
  return {};
}

TEST(Manifest, RoundTrip) {
  Manifest m = sample_manifest();
  std::string text = serialize_manifest(m);
  Manifest p = parse_manifest(text, "m.json");
  EXPECT_EQ(p.schema, "ckpt.v3");
  EXPECT_EQ(p.step, m.step);
  EXPECT_EQ(p.world_size, m.world_size);
  EXPECT_EQ(p.config_hash, m.config_hash);
  EXPECT_EQ(p.versions, m.versions);
  EXPECT_EQ(p.rng_format_version, m.rng_format_version);
  EXPECT_EQ(p.trace_position, m.trace_position);
  EXPECT_EQ(p.trace_chain_hex, m.trace_chain_hex);
  EXPECT_EQ(p.extra, m.extra);
  ASSERT_EQ(p.shards.size(), 2u);
  EXPECT_EQ(p.shards[0].rank, 0u);
  EXPECT_EQ(p.shards[0].sha256, std::string(64, 'a'));
  EXPECT_EQ(p.shards[1].size, 200u);
  EXPECT_EQ(serialize_manifest(p), text) << "serialization is deterministic";
  // Whitespace is not content: a reformatted manifest still checks.
  EXPECT_NO_THROW(parse_manifest(json::parse(text).dump(), "m.json"));
}

TEST(Manifest, ChecksumMismatch) {
  json j = json::parse(serialize_manifest(sample_manifest()));
  j["step"] = 11;
  std::string what = expect_error<IntegrityError>(j.dump(2), "manifest checksum mismatch");
  EXPECT_NE(what.find("expected"), std::string::npos);
  j.erase("manifest_sha256");
  expect_error<IntegrityError>(j.dump(2), "manifest checksum mismatch");
}

TEST(Manifest, EverySingleBitFlipIsRejected) {
  const std::string text = serialize_manifest(sample_manifest());
  size_t integrity = 0, format = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = text;
      bad[i] = char(bad[i] ^ (1 << bit));
      try {
        parse_manifest(bad, "m.json");
        ADD_FAILURE() << "flip of bit " << bit << " at byte " << i << " accepted";
      } catch (const IntegrityError& e) {
        ++integrity;
        EXPECT_NE(std::string(e.what()).find("manifest checksum mismatch"), std::string::npos) << e.what();
      } catch (const FormatError&) {
        ++format;
      }
    }
  }
  EXPECT_GT(integrity, 0u);
  EXPECT_GT(format, 0u);
}

TEST(Manifest, EveryTruncationIsRejected) {
  const std::string text = serialize_manifest(sample_manifest());
  // The trailing newline is whitespace; cutting it off changes nothing.
  for (size_t n = 0; n + 1 < text.size(); ++n) EXPECT_THROW(parse_manifest(text.substr(0, n), "m.json"), Error) << n;
}

TEST(Manifest, StrictFieldsAndLimits) {
  const json good = json::parse(serialize_manifest(sample_manifest()));
  auto edited = [&](auto edit) {
    json j = good;
    edit(j);
    return signed_text(j);
  };
  expect_error<FormatError>(edited([](json& j) { j["surprise"] = 1; }), "unexpected key \"surprise\"");
  expect_error<FormatError>(edited([](json& j) { j.erase("world_size"); }), "required key \"world_size\"");
  expect_error<FormatError>(edited([](json& j) { j["step"] = -1; }), "non-negative integer");
  expect_error<FormatError>(edited([](json& j) { j["step"] = 1.0; }), "non-negative integer");
  expect_error<FormatError>(edited([](json& j) { j["step"] = "10"; }), "non-negative integer");
  expect_error<FormatError>(edited([](json& j) { j["world_size"] = 0; }), "world_size");
  expect_error<FormatError>(edited([](json& j) { j["world_size"] = 3; }), "one shard per rank");
  expect_error<FormatError>(edited([](json& j) { j["shards"][1]["rank"] = 0; }), "listed twice");
  expect_error<FormatError>(edited([](json& j) { j["shards"][0]["file"] = "../../etc/passwd"; }), "plain file name");
  expect_error<FormatError>(edited([](json& j) { j["shards"][0]["sha256"] = "ABC"; }), "64 lowercase hex");
  expect_error<FormatError>(edited([](json& j) { j["versions"]["cuda"] = 12; }), "must be a string");
  expect_error<FormatError>(edited([](json& j) { j["config_hash"] = std::string(5000, 'x'); }), "the limit is");
  expect_error<FormatError>(edited([](json& j) { j["trace_chain_hex"] = "xyz"; }), "hex digits");
  expect_error<FormatError>("{\"a\":1,\"a\":2}", "duplicate key");
  expect_error<FormatError>("not json", "unparsable manifest");
  expect_error<FormatError>(std::string(kMaxManifestBytes + 1, ' '), "the limit is");
}

TEST(Manifest, SerializeRefusesWhatWouldNotLoad) {
  Manifest m = sample_manifest();
  m.shards.pop_back();
  EXPECT_THROW(serialize_manifest(m), InvariantError);
  m = sample_manifest();
  m.shards[0].file = "a/b";
  EXPECT_THROW(serialize_manifest(m), InvariantError);
  m = sample_manifest();
  m.shards[0].sha256 = "zz";
  EXPECT_THROW(serialize_manifest(m), InvariantError);
}

TEST(Schema, UnknownSchema) {
  json j = json::parse(serialize_manifest(sample_manifest()));
  j["schema"] = "torch.save";
  std::string what = expect_error<FormatError>(signed_text(j), "unknown schema");
  EXPECT_EQ(what.rfind("unknown schema", 0), 0u) << what;
  EXPECT_NE(what.find("torch.save"), std::string::npos) << what;
  EXPECT_NE(what.find("ckpt.v1"), std::string::npos) << "says which schemas it reads: " << what;
  // A foreign JSON file without a checksum gets the schema message, not a checksum one.
  what = expect_error<FormatError>(R"({"schema": "pytorch-lightning"})", "unknown schema");
  EXPECT_EQ(what.rfind("unknown schema", 0), 0u) << what;
  for (const char* s : {"ckpt", "ckpt.v", "ckpt.v01", "ckpt.vx", "ckpt.v1.1", "", "CKPT.v1"})
    EXPECT_THROW(schema_version(s, "f"), FormatError) << s;
  EXPECT_EQ(schema_version("ckpt.v0", "f"), 0);
  EXPECT_EQ(schema_version("ckpt.v1", "f"), 1);
}

TEST(Schema, NewerThanBinary) {
  json j = json::parse(serialize_manifest(sample_manifest()));
  j["schema"] = "ckpt.v7";
  std::string what = expect_error<FormatError>(signed_text(j), "newer than this binary");
  EXPECT_NE(what.find("ckpt.v7"), std::string::npos);
}

TEST(Schema, ShardMetadataDispatch) {
  auto md = migrate_shard_metadata({{"schema", "ckpt.v0"}, {"global_step", "5"}, {"rank", "0"}}, "s");
  EXPECT_EQ(md, (std::map<std::string, std::string>{{"schema", "ckpt.v3"}, {"step", "5"}, {"rank", "0"}}));
  EXPECT_EQ(migrate_shard_metadata({{"schema", "ckpt.v1"}, {"step", "5"}}, "s").at("schema"), "ckpt.v3");
  EXPECT_EQ(migrate_shard_metadata({{"schema", "ckpt.v2"}, {"step", "5"}}, "s").at("schema"), "ckpt.v3");
  EXPECT_THROW(migrate_shard_metadata({{"schema", "ckpt.v0"}, {"step", "5"}}, "s"), FormatError);
  EXPECT_THROW(migrate_shard_metadata({{"schema", "gguf"}}, "s"), FormatError);
  EXPECT_THROW(migrate_shard_metadata({{"step", "5"}}, "s"), FormatError);
  EXPECT_THROW(migrate_shard_metadata({{"schema", "ckpt.v4"}}, "s"), FormatError);
}

// ---- the ckpt.v0 fixture ------------------------------------------------------------------------

const std::string kFixture = std::string(RETRACE_CKPT_FIXTURES) + "/ckpt_v0";

// Writes the ckpt.v0 fixture the way the old format did. Run with RETRACE_REGEN_FIXTURES=1 to
// rewrite the committed files (only needed if the fixture itself must change).
void write_v0_fixture(const std::string& root) {
  const std::string dir = root + "/step-00000003";
  std::filesystem::create_directories(dir);
  json shards = json::array();
  for (uint32_t r = 0; r < 2; ++r) {
    float w[4] = {0.5f + r, -1.0f, 2.0f, 3.0f * r};
    int64_t count = 3;
    std::map<std::string, std::string> md = {{"schema", "ckpt.v0"}, {"global_step", "3"}, {"rank", std::to_string(r)}};
    ShardFileInfo info = write_shard(dir + "/" + shard_file_name(r), md,
                                     {{"w", "F32", {2, 2}, w, 16}, {"count", "I64", {}, &count, 8}});
    shards.push_back({{"rank", r}, {"file", info.file}, {"size", info.size}, {"sha256", info.sha256}});
  }
  json j = {{"schema", "ckpt.v0"},
            {"global_step", 3},
            {"world_size", 2},
            {"config_hash", "v0-fixture"},
            {"versions", {{"retrace", "0.0.1"}}},
            {"trace_position", 30},
            {"shards", shards},
            {"extra", json::object()}};
  testing::write_all(dir + "/manifest.json", signed_text(j) + "\n");
  testing::write_all(root + "/LATEST", "step-00000003\n");
}

TEST(Schema, V0FixtureMigrates) {
  if (std::getenv("RETRACE_REGEN_FIXTURES")) write_v0_fixture(kFixture);
  ASSERT_TRUE(std::filesystem::exists(kFixture + "/step-00000003/manifest.json")) << kFixture;
  // Work on a copy: loading must not need write access, but rotation tests elsewhere must not touch it.
  TempDir tmp;
  std::filesystem::copy(kFixture, tmp.path(), std::filesystem::copy_options::recursive);
  const std::string dir = tmp.file("step-00000003");
  Manifest m = verify_checkpoint(dir, 2);
  EXPECT_EQ(m.schema, "ckpt.v0");
  EXPECT_EQ(m.step, 3u);
  EXPECT_EQ(m.world_size, 2u);
  EXPECT_EQ(m.rng_format_version, 1u);
  EXPECT_EQ(m.trace_chain_hex, "");
  EXPECT_EQ(m.trace_position, 30u);
  for (uint32_t r = 0; r < 2; ++r) {
    ShardData s = load_shard(dir, m, r);
    EXPECT_EQ(s.metadata.at("schema"), "ckpt.v3");
    EXPECT_EQ(s.metadata.at("step"), "3");
    EXPECT_EQ(s.metadata.count("global_step"), 0u);
    const float* w = static_cast<const float*>(s.data(*s.find("w")));
    EXPECT_EQ(w[0], 0.5f + r);
  }
  // Re-serializing migrates it to the current schema.
  Manifest again = parse_manifest(serialize_manifest(m), "x");
  EXPECT_EQ(again.schema, "ckpt.v3");
  EXPECT_TRUE(again.tensors.empty()) << "a migrated checkpoint keeps each rank's whole state in its shard";
  EXPECT_EQ(again.step, 3u);
  json report = verify_report_json(dir);
  EXPECT_TRUE(report["ok"].get<bool>()) << report.dump(2);
  EXPECT_EQ(report["schema"], "ckpt.v0");
}

}  // namespace
}  // namespace retrace::ckpt

namespace retrace::ckpt {
namespace {

// Regression: two ranks listing the same shard file verified as VERIFIED.
TEST(Manifest, TwoRanksCannotShareAShardFile) {
  json j = json::parse(serialize_manifest(sample_manifest()));
  ASSERT_GE(j["shards"].size(), 2u);
  j["shards"][1]["file"] = j["shards"][0]["file"];
  std::string what = expect_error<FormatError>(signed_text(j), "list the same shard file");
  EXPECT_NE(what.find("every rank has a shard of its own"), std::string::npos) << what;
}

// Regression: the newer-schema error lacked the `unknown schema` wording users search for.
TEST(Schema, NewerSchemaSaysUnknownSchema) {
  json j = json::parse(serialize_manifest(sample_manifest()));
  j["schema"] = "ckpt.v4";
  std::string what = expect_error<FormatError>(signed_text(j), "unknown schema \"ckpt.v4\"");
  EXPECT_EQ(what.rfind("unknown schema", 0), 0u) << what;
}

}  // namespace
}  // namespace retrace::ckpt
