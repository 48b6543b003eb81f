#include "ckpt/manifest.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "ckpt/schema.h"
#include "ckpt/strict_json.h"
#include "core/digest.h"
#include "core/error.h"

namespace retrace::ckpt {
namespace {

using nlohmann::json;

constexpr const char* kChecksumKey = "manifest_sha256";

bool is_hex(const std::string& s) {
  return s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

bool is_plain_file_name(const std::string& f) {
  return !f.empty() && f.size() <= 255 && f != "." && f != ".." &&
         f.find_first_of(std::string("/\\\0", 3)) == std::string::npos;
}

class Reader {
 public:
  Reader(const json& j, const std::string& path) : j_(j), path_(path) {}

  const json& field(const char* key) const {
    RETRACE_CHECK(j_.contains(key), FormatError, "manifest ", path_, ": required key \"", key,
                  "\" is missing; the manifest is damaged or not from retrace");
    return j_.at(key);
  }
  uint64_t u64(const json& v, const std::string& what, uint64_t max = std::numeric_limits<uint64_t>::max()) const {
    RETRACE_CHECK(v.is_number_unsigned(), FormatError, "manifest ", path_, ": \"", what,
                  "\" must be a non-negative integer, found ", json_type_text(v), " ", json_text(v));
    uint64_t x = v.get<uint64_t>();
    RETRACE_CHECK(x <= max, FormatError, "manifest ", path_, ": \"", what, "\" is ", x, ", the limit is ", max);
    return x;
  }
  std::string str(const json& v, const std::string& what) const {
    RETRACE_CHECK(v.is_string(), FormatError, "manifest ", path_, ": \"", what, "\" must be a string, found ",
                  json_type_text(v));
    const auto& s = v.get_ref<const std::string&>();
    RETRACE_CHECK(s.size() <= kMaxManifestString, FormatError, "manifest ", path_, ": \"", what, "\" is ",
                  s.size(), " characters, the limit is ", kMaxManifestString);
    return s;
  }
  std::map<std::string, std::string> string_map(const json& v, const std::string& what) const {
    RETRACE_CHECK(v.is_object(), FormatError, "manifest ", path_, ": \"", what,
                  "\" must be an object of strings, found ", json_type_text(v));
    RETRACE_CHECK(v.size() <= kMaxManifestMapEntries, FormatError, "manifest ", path_, ": \"", what, "\" has ",
                  v.size(), " entries, the limit is ", kMaxManifestMapEntries);
    std::map<std::string, std::string> out;
    for (const auto& [k, x] : v.items()) {
      RETRACE_CHECK(k.size() <= kMaxManifestString, FormatError, "manifest ", path_, ": a key of \"", what,
                    "\" is too long");
      out[k] = str(x, what + "." + k);
    }
    return out;
  }

 private:
  const json& j_;
  const std::string& path_;
};

json to_json(const Manifest& m) {
  std::vector<ShardEntry> sorted = m.shards;
  std::sort(sorted.begin(), sorted.end(), [](const ShardEntry& a, const ShardEntry& b) { return a.rank < b.rank; });
  json shards = json::array();
  for (const ShardEntry& s : sorted)
    shards.push_back({{"rank", s.rank}, {"file", s.file}, {"size", s.size}, {"sha256", s.sha256}});
  return json{{"schema", kSchemaCurrent},
              {"step", m.step},
              {"world_size", m.world_size},
              {"config_hash", m.config_hash},
              {"versions", m.versions},
              {"rng_format_version", m.rng_format_version},
              {"trace_position", m.trace_position},
              {"trace_chain_hex", m.trace_chain_hex},
              {"shards", shards},
              {"extra", m.extra}};
}

std::string canonical_sha256(const json& j) {
  std::string text = json_text(j);
  return sha256_hex(text.data(), text.size());
}

Manifest from_json(const json& j, const std::string& path) {
  static const std::set<std::string> kKeys = {"schema", "step", "world_size", "config_hash", "versions",
                                              "rng_format_version", "trace_position", "trace_chain_hex",
                                              "shards", "extra"};
  for (const auto& [k, unused] : j.items()) {
    (void)unused;
    RETRACE_CHECK(kKeys.count(k) == 1, FormatError, "manifest ", path, ": unexpected key \"", k,
                  "\"; schema ", kSchemaCurrent, " has no such key");
  }
  Reader r(j, path);
  Manifest m;
  m.schema = r.str(r.field("schema"), "schema");
  m.step = r.u64(r.field("step"), "step");
  m.world_size = uint32_t(r.u64(r.field("world_size"), "world_size", kMaxWorldSize));
  RETRACE_CHECK(m.world_size >= 1, FormatError, "manifest ", path, ": \"world_size\" is 0, expected at least 1");
  m.config_hash = r.str(r.field("config_hash"), "config_hash");
  m.versions = r.string_map(r.field("versions"), "versions");
  m.rng_format_version = uint32_t(r.u64(r.field("rng_format_version"), "rng_format_version",
                                        std::numeric_limits<uint32_t>::max()));
  m.trace_position = r.u64(r.field("trace_position"), "trace_position");
  m.trace_chain_hex = r.str(r.field("trace_chain_hex"), "trace_chain_hex");
  RETRACE_CHECK(is_hex(m.trace_chain_hex), FormatError, "manifest ", path,
                ": \"trace_chain_hex\" must be lowercase hex digits, found \"", m.trace_chain_hex, "\"");
  m.extra = r.string_map(r.field("extra"), "extra");

  const json& shards = r.field("shards");
  RETRACE_CHECK(shards.is_array(), FormatError, "manifest ", path, ": \"shards\" must be an array, found ",
                json_type_text(shards));
  RETRACE_CHECK(shards.size() == m.world_size, FormatError, "manifest ", path, ": \"shards\" lists ",
                shards.size(), " shards, world_size is ", m.world_size, "; expected one shard per rank");
  std::vector<bool> seen(m.world_size, false);
  for (const json& s : shards) {
    RETRACE_CHECK(s.is_object(), FormatError, "manifest ", path, ": a shard entry must be an object, found ",
                  json_type_text(s));
    Reader sr(s, path);
    for (const auto& [k, unused] : s.items()) {
      (void)unused;
      RETRACE_CHECK(k == "rank" || k == "file" || k == "size" || k == "sha256", FormatError, "manifest ", path,
                    ": unexpected key \"", k, "\" in a shard entry; expected rank, file, size, sha256");
    }
    ShardEntry e;
    e.rank = uint32_t(sr.u64(sr.field("rank"), "shards[].rank", m.world_size - 1));
    RETRACE_CHECK(!seen[e.rank], FormatError, "manifest ", path, ": rank ", e.rank, " is listed twice in \"shards\"");
    seen[e.rank] = true;
    e.file = sr.str(sr.field("file"), "shards[].file");
    RETRACE_CHECK(is_plain_file_name(e.file), FormatError, "manifest ", path, ": shard file of rank ", e.rank,
                  " is \"", e.file, "\"; expected a plain file name inside the checkpoint directory");
    for (const ShardEntry& other : m.shards)
      RETRACE_CHECK(other.file != e.file, FormatError, "manifest ", path, ": ranks ", other.rank, " and ", e.rank,
                    " list the same shard file \"", e.file, "\"; every rank has a shard of its own");
    e.size = sr.u64(sr.field("size"), "shards[].size");
    e.sha256 = sr.str(sr.field("sha256"), "shards[].sha256");
    RETRACE_CHECK(e.sha256.size() == 64 && is_hex(e.sha256), FormatError, "manifest ", path,
                  ": sha256 of rank ", e.rank, " is \"", e.sha256, "\"; expected 64 lowercase hex digits");
    m.shards.push_back(std::move(e));
  }
  std::sort(m.shards.begin(), m.shards.end(),
            [](const ShardEntry& a, const ShardEntry& b) { return a.rank < b.rank; });
  return m;
}

}  // namespace

std::string serialize_manifest(const Manifest& m) {
  json j = to_json(m);
  std::string text;
  try {
    std::string sum = canonical_sha256(j);
    j[kChecksumKey] = sum;
    text = json_text(j, 2) + "\n";
  } catch (const json::exception& e) {
    RETRACE_FAIL(InvariantError, "serialize_manifest: a string of the manifest is not valid UTF-8 (", e.what(), ")");
  }
  try {
    (void)parse_manifest(text, "(manifest being written)");
  } catch (const Error& e) {
    RETRACE_FAIL(InvariantError, "serialize_manifest: refusing to write a manifest that would not load: ", e.what());
  }
  return text;
}

Manifest parse_manifest(const std::string& bytes, const std::string& path) {
  RETRACE_CHECK(bytes.size() <= kMaxManifestBytes, FormatError, "manifest ", path, " is ", bytes.size(),
                " bytes, the limit is ", kMaxManifestBytes, "; this is not a retrace manifest");
  json j = parse_strict_json(bytes, "manifest " + path + " (unparsable manifest)", 6);
  RETRACE_CHECK(j.is_object(), FormatError, "manifest ", path, " (unparsable manifest): expected a JSON object, found ",
                json_type_text(j));
  // A foreign file has no checksum: report its schema first, that is the more useful message.
  if (!j.contains(kChecksumKey) || !j[kChecksumKey].is_string()) {
    RETRACE_CHECK(j.contains("schema") && j["schema"].is_string(), FormatError, "unknown schema \"\" in ", path,
                  ": the manifest has no \"schema\" string; this binary reads ckpt.v0 and ckpt.v1. Point "
                  "retrace at a checkpoint directory written by retrace");
    (void)schema_version(j["schema"].get<std::string>(), path);
    RETRACE_FAIL(IntegrityError, "manifest checksum mismatch in ", path, ": \"", kChecksumKey,
                 "\" is missing or not a string; the manifest was damaged or edited, so this checkpoint "
                 "cannot be trusted; resume from an older checkpoint");
  }
  const std::string stored = j[kChecksumKey].get<std::string>();
  j.erase(kChecksumKey);
  const std::string computed = canonical_sha256(j);
  RETRACE_CHECK(stored == computed, IntegrityError, "manifest checksum mismatch in ", path, ": expected ",
                stored, " (", kChecksumKey, "), computed ", computed,
                "; the manifest was damaged or edited, so this checkpoint cannot be trusted; resume "
                "from an older checkpoint");
  RETRACE_CHECK(j.contains("schema") && j["schema"].is_string(), FormatError, "unknown schema \"\" in ", path,
                ": the manifest has no \"schema\" string; this binary reads ckpt.v0 and ckpt.v1");
  const std::string schema_on_disk = j["schema"].get<std::string>();
  int version = schema_version(schema_on_disk, path);
  migrate_manifest_json(j, version, "manifest " + path);
  Manifest m = from_json(j, path);
  m.schema = schema_on_disk;
  return m;
}

std::string shard_file_name(uint32_t rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard-rank%05u.safetensors", rank);
  return buf;
}

std::string step_dir_name(uint64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "step-%08llu", static_cast<unsigned long long>(step));
  return buf;
}

std::map<std::string, std::string> shard_metadata(uint64_t step, uint32_t rank, uint32_t world_size) {
  return {{"schema", kSchemaCurrent},
          {"step", std::to_string(step)},
          {"rank", std::to_string(rank)},
          {"world_size", std::to_string(world_size)}};
}

}  // namespace retrace::ckpt
