// Checkpoint schema strings and the migration chain.
//
// Every manifest and every shard's metadata carries "schema": "ckpt.vN". Loading dispatches on it:
//   ckpt.v3  current, read as is: the manifest's "tensors" table maps the replicated state's
//            element ranges to the ranks' shards, each piece with its byte offset and xxh3-128
//            (manifest.h), so a process reads only the pieces it needs
//   ckpt.v2  migrated to v3: the same table without offsets and hashes (such shards are read whole)
//   ckpt.v1  migrated to v2: "tensors" is empty (each shard holds its rank's whole state)
//   ckpt.v0  migrated to v1 (manifest: "global_step" becomes "step", "rng_format_version"
//            defaults to 1, "trace_chain_hex" defaults to ""; shard metadata: "global_step"
//            becomes "step"), then to v2 and v3
//   ckpt.vN, N > 3        FormatError: the file is newer than this binary
//   anything else         FormatError starting with `unknown schema`
// Migrations run one version at a time (v0 -> v1 -> ...), so adding v2 means adding one function.
// All functions are pure and thread-safe.
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

namespace retrace::ckpt {

constexpr const char* kSchemaCurrent = "ckpt.v3";
constexpr int kSchemaVersionCurrent = 3;
constexpr int kSchemaVersionOldest = 0;

// The N of "ckpt.vN" if this binary reads it; throws FormatError otherwise (see above). `where`
// names the file for the message.
int schema_version(const std::string& schema, const std::string& where);

// Brings a manifest JSON object of `from_version` up to the current schema, in place (its
// "schema" becomes kSchemaCurrent). Throws FormatError naming `where` if a key to migrate is absent.
void migrate_manifest_json(nlohmann::json& manifest, int from_version, const std::string& where);

// Checks the "schema" of shard metadata and returns the metadata in the current schema.
std::map<std::string, std::string> migrate_shard_metadata(std::map<std::string, std::string> metadata,
                                                          const std::string& where);

}  // namespace retrace::ckpt
