#include "ckpt/schema.h"

#include <functional>
#include <vector>

#include "core/error.h"
#include "core/parse_number.h"

namespace retrace::ckpt {
namespace {

using nlohmann::json;

const char* kReadable = "ckpt.v0, ckpt.v1 and ckpt.v2 (migrated on load) and ckpt.v3";

void rename_key(json& j, const char* from, const char* to, const std::string& where) {
  RETRACE_CHECK(j.contains(from), FormatError, where, ": schema ckpt.v0 requires key \"", from, "\", it is missing");
  RETRACE_CHECK(!j.contains(to), FormatError, where, ": schema ckpt.v0 must not have key \"", to, "\"");
  j[to] = j[from];
  j.erase(from);
}

// Index i migrates version i to version i + 1.
const std::vector<std::function<void(json&, const std::string&)>>& manifest_migrations() {
  static const std::vector<std::function<void(json&, const std::string&)>> kChain = {
      [](json& j, const std::string& where) {
        rename_key(j, "global_step", "step", where);
        if (!j.contains("rng_format_version")) j["rng_format_version"] = uint64_t{1};
        if (!j.contains("trace_chain_hex")) j["trace_chain_hex"] = "";
        j["schema"] = "ckpt.v1";
      },
      // v1 -> v2: every shard held its rank's whole state; an empty "tensors" table says so.
      [](json& j, const std::string& where) {
        RETRACE_CHECK(!j.contains("tensors"), FormatError, where, ": schema ckpt.v1 must not have key \"tensors\"");
        j["tensors"] = json::array();
        j["schema"] = "ckpt.v2";
      },
      // v2 -> v3: the pieces gain "offset" and "xxh3"; a v2 table has neither, and its shards are
      // read whole (TensorPiece::hashed).
      [](json& j, const std::string&) { j["schema"] = "ckpt.v3"; },
  };
  return kChain;
}

const std::vector<std::function<void(std::map<std::string, std::string>&, const std::string&)>>& shard_migrations() {
  static const std::vector<std::function<void(std::map<std::string, std::string>&, const std::string&)>> kChain = {
      [](std::map<std::string, std::string>& m, const std::string& where) {
        auto it = m.find("global_step");
        RETRACE_CHECK(it != m.end(), FormatError, where,
                      ": schema ckpt.v0 requires metadata \"global_step\", it is missing");
        RETRACE_CHECK(m.count("step") == 0, FormatError, where, ": schema ckpt.v0 must not have metadata \"step\"");
        m["step"] = it->second;
        m.erase(it);
        m["schema"] = "ckpt.v1";
      },
      [](std::map<std::string, std::string>& m, const std::string&) { m["schema"] = "ckpt.v2"; },
      [](std::map<std::string, std::string>& m, const std::string&) { m["schema"] = "ckpt.v3"; },
  };
  return kChain;
}

}  // namespace

int schema_version(const std::string& schema, const std::string& where) {
  const std::string prefix = "ckpt.v";
  bool well_formed = schema.size() > prefix.size() && schema.size() <= prefix.size() + 6 &&
                     schema.compare(0, prefix.size(), prefix) == 0 &&
                     schema.find_first_not_of("0123456789", prefix.size()) == std::string::npos &&
                     !(schema.size() > prefix.size() + 1 && schema[prefix.size()] == '0');
  if (!well_formed) {
    RETRACE_FAIL(FormatError, "unknown schema \"", schema, "\" in ", where, ": this binary reads ", kReadable,
                 (schema.rfind("ckpt", 0) == 0 ? "; the schema string is malformed"
                                               : "; this is not a retrace checkpoint"),
                 ". Point retrace at a checkpoint directory written by retrace, or convert the file");
  }
  // Well formed: digits only; a number too large for any type is newer than this binary too.
  const std::optional<uint64_t> digits = parse_decimal_u64(std::string_view(schema).substr(prefix.size()));
  const int version = digits && *digits <= uint64_t(kSchemaVersionCurrent) ? static_cast<int>(*digits)
                                                                           : kSchemaVersionCurrent + 1;
  RETRACE_CHECK(version <= kSchemaVersionCurrent, FormatError, "unknown schema \"", schema, "\" in ", where,
                ": newer than this binary, which reads ", kReadable, "; load it with the newer retrace that wrote it");
  return version;
}

void migrate_manifest_json(json& manifest, int from_version, const std::string& where) {
  for (int v = from_version; v < kSchemaVersionCurrent; ++v) manifest_migrations().at(size_t(v))(manifest, where);
}

std::map<std::string, std::string> migrate_shard_metadata(std::map<std::string, std::string> metadata,
                                                          const std::string& where) {
  auto it = metadata.find("schema");
  RETRACE_CHECK(it != metadata.end(), FormatError, "unknown schema \"\" in ", where,
                ": the shard metadata has no \"schema\"; this binary reads ", kReadable,
                ". Point retrace at a shard written by retrace");
  int version = schema_version(it->second, where);
  for (int v = version; v < kSchemaVersionCurrent; ++v) shard_migrations().at(size_t(v))(metadata, where);
  return metadata;
}

}  // namespace retrace::ckpt
