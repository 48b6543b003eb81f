#include "ckpt/manifest.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "ckpt/schema.h"
#include "ckpt/shard.h"
#include "ckpt/strict_json.h"
#include "core/digest.h"
#include "core/error.h"

namespace retrace::ckpt {
namespace {

using nlohmann::json;

constexpr const char* kChecksumKey = "manifest_sha256";

bool is_hex(const std::string& s) { return s.find_first_not_of("0123456789abcdef") == std::string::npos; }

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
    RETRACE_CHECK(s.size() <= kMaxManifestString, FormatError, "manifest ", path_, ": \"", what, "\" is ", s.size(),
                  " characters, the limit is ", kMaxManifestString);
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
  json tensors = json::array();
  for (const TensorLayout& t : m.tensors) {
    json pieces = json::array();
    for (const TensorPiece& p : t.pieces) {
      json piece = {{"rank", p.rank}, {"begin", p.begin}, {"end", p.end}};
      if (p.hashed()) {
        piece["offset"] = p.offset;
        piece["xxh3"] = p.xxh3;
      }
      pieces.push_back(std::move(piece));
    }
    tensors.push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}, {"pieces", pieces}});
  }
  return json{{"schema", kSchemaCurrent},
              {"tensors", tensors},
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

// The "tensors" table, checked: known dtypes, shapes within the limits, names unique, and each
// tensor's pieces (in order) a partition of [0, numel) among ranks < world. `hashed`: every piece
// says where its bytes are in its rank's shard and their xxh3 (ckpt.v3), within that shard's size.
// One piece of a tensor of the table (`where` names the tensor, of `numel` elements), which must
// start at `next`: its rank, its range and, when `hashed`, its place in its shard and its xxh3.
TensorPiece table_piece(const json& p, const std::vector<ShardEntry>& shards, bool hashed, const std::string& path,
                        const std::string& where, const std::string& dtype, uint64_t numel, uint64_t next) {
  const uint32_t world = static_cast<uint32_t>(shards.size());
  RETRACE_CHECK(p.is_object() && p.size() == (hashed ? 5u : 3u), FormatError, "manifest ", path, ": ", where,
                ": a piece must be an object of rank, begin, end", hashed ? ", offset, xxh3" : "");
  Reader pr(p, path);
  TensorPiece piece;
  piece.rank = uint32_t(pr.u64(pr.field("rank"), where + ".pieces[].rank", world - 1));
  piece.begin = pr.u64(pr.field("begin"), where + ".pieces[].begin");
  piece.end = pr.u64(pr.field("end"), where + ".pieces[].end");
  RETRACE_CHECK(piece.begin < piece.end && piece.end <= numel, FormatError, "manifest ", path, ": ", where,
                ": piece of rank ", piece.rank, " holds elements [", piece.begin, ", ", piece.end,
                "), beyond the tensor's ", numel, " elements or empty");
  RETRACE_CHECK(piece.begin == next, FormatError, "manifest ", path, ": ", where, ": ",
                piece.begin > next
                    ? "elements [" + std::to_string(next) + ", " + std::to_string(piece.begin) +
                          ") are in no shard (a range missing from every file)"
                    : "the piece of rank " + std::to_string(piece.rank) + " at [" + std::to_string(piece.begin) + ", " +
                          std::to_string(piece.end) + ") overlaps the one before it",
                "; the manifest is not one retrace wrote");
  if (hashed) {
    const uint64_t bytes = (piece.end - piece.begin) * *dtype_size(dtype), size = shards[piece.rank].size;
    piece.offset = pr.u64(pr.field("offset"), where + ".pieces[].offset");
    RETRACE_CHECK(piece.offset >= 8 && piece.offset <= size && bytes <= size - piece.offset, FormatError, "manifest ",
                  path, ": ", where, ": elements [", piece.begin, ", ", piece.end, ") are ", bytes, " bytes at offset ",
                  piece.offset, " of ", shards[piece.rank].file, ", which has ", size,
                  " bytes; the manifest is not one retrace wrote");
    piece.xxh3 = pr.str(pr.field("xxh3"), where + ".pieces[].xxh3");
    RETRACE_CHECK(piece.xxh3.size() == 32 && is_hex(piece.xxh3), FormatError, "manifest ", path, ": ", where,
                  ": the xxh3 of elements [", piece.begin, ", ", piece.end, ") is \"", piece.xxh3,
                  "\"; expected 32 lowercase hex digits");
  }
  return piece;
}

std::vector<TensorLayout> tensor_table(const json& v, const std::vector<ShardEntry>& shards, bool hashed,
                                       const std::string& path) {
  RETRACE_CHECK(v.is_array(), FormatError, "manifest ", path, ": \"tensors\" must be an array, found ",
                json_type_text(v));
  RETRACE_CHECK(v.size() <= kMaxManifestTensors, FormatError, "manifest ", path, ": \"tensors\" lists ", v.size(),
                " tensors, the limit is ", kMaxManifestTensors);
  std::vector<TensorLayout> out;
  std::set<std::string> names;
  size_t pieces_total = 0;
  for (const json& t : v) {
    RETRACE_CHECK(t.is_object(), FormatError, "manifest ", path, ": a \"tensors\" entry must be an object, found ",
                  json_type_text(t));
    for (const auto& [k, unused] : t.items()) {
      (void)unused;
      RETRACE_CHECK(k == "name" || k == "dtype" || k == "shape" || k == "pieces", FormatError, "manifest ", path,
                    ": unexpected key \"", k, "\" in a \"tensors\" entry; expected name, dtype, shape, pieces");
    }
    Reader tr(t, path);
    TensorLayout L;
    L.name = tr.str(tr.field("name"), "tensors[].name");
    RETRACE_CHECK(!L.name.empty() && names.insert(L.name).second, FormatError, "manifest ", path, ": tensor \"", L.name,
                  "\" is listed twice in \"tensors\" (or has no name)");
    const std::string where = "tensor \"" + L.name + "\"";
    L.dtype = tr.str(tr.field("dtype"), where + ".dtype");
    RETRACE_CHECK(dtype_size(L.dtype).has_value(), FormatError, "manifest ", path, ": ", where, " has dtype \"",
                  L.dtype, "\", which is not a safetensors dtype");
    const json& shape = tr.field("shape");
    RETRACE_CHECK(shape.is_array() && shape.size() <= kMaxTensorRank, FormatError, "manifest ", path, ": ", where,
                  ": \"shape\" must be an array of at most ", kMaxTensorRank, " sizes");
    uint64_t numel = 1;
    for (const json& d : shape) {
      const uint64_t n = tr.u64(d, where + ".shape[]", uint64_t{1} << 48);
      RETRACE_CHECK(n == 0 || numel <= (uint64_t{1} << 56) / n, FormatError, "manifest ", path, ": ", where,
                    ": its shape has more than 2^56 elements");
      numel *= n;
      L.shape.push_back(static_cast<int64_t>(n));
    }
    const json& pieces = tr.field("pieces");
    RETRACE_CHECK(pieces.is_array(), FormatError, "manifest ", path, ": ", where, ": \"pieces\" must be an array");
    pieces_total += pieces.size();
    RETRACE_CHECK(pieces_total <= kMaxManifestPieces, FormatError, "manifest ", path, ": more than ",
                  kMaxManifestPieces, " pieces in \"tensors\"");
    uint64_t next = 0;
    for (const json& p : pieces) {
      const TensorPiece piece = table_piece(p, shards, hashed, path, where, L.dtype, numel, next);
      next = piece.end;
      L.pieces.push_back(piece);
    }
    RETRACE_CHECK(next == numel, FormatError, "manifest ", path, ": ", where, ": elements [", next, ", ", numel,
                  ") are in no shard (a range missing from every file); the manifest is not one retrace wrote");
    out.push_back(std::move(L));
  }
  return out;
}

Manifest from_json(const json& j, const std::string& path, bool hashed_pieces) {
  static const std::set<std::string> kKeys = {"schema",         "step",
                                              "world_size",     "config_hash",
                                              "versions",       "rng_format_version",
                                              "trace_position", "trace_chain_hex",
                                              "shards",         "extra",
                                              "tensors"};
  for (const auto& [k, unused] : j.items()) {
    (void)unused;
    RETRACE_CHECK(kKeys.count(k) == 1, FormatError, "manifest ", path, ": unexpected key \"", k, "\"; schema ",
                  kSchemaCurrent, " has no such key");
  }
  Reader r(j, path);
  Manifest m;
  m.schema = r.str(r.field("schema"), "schema");
  m.step = r.u64(r.field("step"), "step");
  m.world_size = uint32_t(r.u64(r.field("world_size"), "world_size", kMaxWorldSize));
  RETRACE_CHECK(m.world_size >= 1, FormatError, "manifest ", path, ": \"world_size\" is 0, expected at least 1");
  m.config_hash = r.str(r.field("config_hash"), "config_hash");
  m.versions = r.string_map(r.field("versions"), "versions");
  m.rng_format_version = uint32_t(
      r.u64(r.field("rng_format_version"), "rng_format_version", std::numeric_limits<uint32_t>::max()));
  m.trace_position = r.u64(r.field("trace_position"), "trace_position");
  m.trace_chain_hex = r.str(r.field("trace_chain_hex"), "trace_chain_hex");
  RETRACE_CHECK(is_hex(m.trace_chain_hex), FormatError, "manifest ", path,
                ": \"trace_chain_hex\" must be lowercase hex digits, found \"", m.trace_chain_hex, "\"");
  m.extra = r.string_map(r.field("extra"), "extra");

  const json& shards = r.field("shards");
  RETRACE_CHECK(shards.is_array(), FormatError, "manifest ", path, ": \"shards\" must be an array, found ",
                json_type_text(shards));
  RETRACE_CHECK(shards.size() == m.world_size, FormatError, "manifest ", path, ": \"shards\" lists ", shards.size(),
                " shards, world_size is ", m.world_size, "; expected one shard per rank");
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
    RETRACE_CHECK(is_plain_file_name(e.file), FormatError, "manifest ", path, ": shard file of rank ", e.rank, " is \"",
                  e.file, "\"; expected a plain file name inside the checkpoint directory");
    for (const ShardEntry& other : m.shards)
      RETRACE_CHECK(other.file != e.file, FormatError, "manifest ", path, ": ranks ", other.rank, " and ", e.rank,
                    " list the same shard file \"", e.file, "\"; every rank has a shard of its own");
    e.size = sr.u64(sr.field("size"), "shards[].size");
    e.sha256 = sr.str(sr.field("sha256"), "shards[].sha256");
    RETRACE_CHECK(e.sha256.size() == 64 && is_hex(e.sha256), FormatError, "manifest ", path, ": sha256 of rank ",
                  e.rank, " is \"", e.sha256, "\"; expected 64 lowercase hex digits");
    m.shards.push_back(std::move(e));
  }
  std::sort(m.shards.begin(), m.shards.end(), [](const ShardEntry& a, const ShardEntry& b) { return a.rank < b.rank; });
  m.tensors = tensor_table(r.field("tensors"), m.shards, hashed_pieces, path);
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
                  ": the manifest has no \"schema\" string; this binary reads ckpt.v0 to ckpt.v3. Point "
                  "retrace at a checkpoint directory written by retrace");
    (void)schema_version(j["schema"].get<std::string>(), path);
    RETRACE_FAIL(IntegrityError, "manifest checksum mismatch in ", path, ": \"", kChecksumKey,
                 "\" is missing or not a string; the manifest was damaged or edited, so this checkpoint "
                 "cannot be trusted; resume from an older checkpoint");
  }
  const std::string stored = j[kChecksumKey].get<std::string>();
  j.erase(kChecksumKey);
  const std::string computed = canonical_sha256(j);
  RETRACE_CHECK(stored == computed, IntegrityError, "manifest checksum mismatch in ", path, ": expected ", stored, " (",
                kChecksumKey, "), computed ", computed,
                "; the manifest was damaged or edited, so this checkpoint cannot be trusted; resume "
                "from an older checkpoint");
  RETRACE_CHECK(j.contains("schema") && j["schema"].is_string(), FormatError, "unknown schema \"\" in ", path,
                ": the manifest has no \"schema\" string; this binary reads ckpt.v0 to ckpt.v3");
  const std::string schema_on_disk = j["schema"].get<std::string>();
  int version = schema_version(schema_on_disk, path);
  migrate_manifest_json(j, version, "manifest " + path);
  Manifest m = from_json(j, path, /*hashed_pieces=*/version >= 3);
  m.schema = schema_on_disk;
  return m;
}

uint64_t TensorLayout::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

std::vector<TensorLayout> split_among_ranks(std::vector<TensorLayout> tensors, uint32_t world) {
  RETRACE_CHECK(world >= 1, InvariantError, "split_among_ranks: world size 0");
  uint64_t total = 0;
  std::vector<uint64_t> size(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto bytes = dtype_size(tensors[i].dtype);
    RETRACE_CHECK(bytes.has_value(), InvariantError, "split_among_ranks: unknown dtype ", tensors[i].dtype);
    size[i] = *bytes;
    total += tensors[i].numel() * size[i];
  }
  // Rank r's range is bytes [cut(r), cut(r + 1)) of the flat space; each tensor gets, from each
  // rank, the elements whose first byte lies in its range.
  auto cut = [&](uint32_t r) -> uint64_t {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(total) * r) / world);
  };
  uint64_t start = 0;  // the tensor's first byte in the flat space
  uint32_t rank = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorLayout& t = tensors[i];
    t.pieces.clear();
    const uint64_t n = t.numel();
    uint64_t e = 0;
    while (e < n) {
      while (rank + 1 < world && cut(rank + 1) <= start + e * size[i]) ++rank;
      // Elements of this tensor whose first byte is before the next cut.
      uint64_t stop = n;
      if (rank + 1 < world) {
        const uint64_t limit = cut(rank + 1);
        stop = std::min<uint64_t>(n, (limit - start + size[i] - 1) / size[i]);
      }
      t.pieces.push_back({rank, e, stop});
      e = stop;
    }
    start += n * size[i];
  }
  return tensors;
}

void set_piece_records(std::vector<TensorLayout>& tensors, const std::vector<PieceRecord>& records,
                       const std::string& dir) {
  std::map<std::string, TensorLayout*> by_name;
  for (TensorLayout& t : tensors) by_name[t.name] = &t;
  for (const PieceRecord& r : records) {
    auto it = by_name.find(r.name);
    TensorPiece* piece = nullptr;
    if (it != by_name.end())
      for (TensorPiece& p : it->second->pieces)
        if (p.rank == r.rank && p.begin == r.begin) piece = &p;
    RETRACE_CHECK(piece != nullptr, InvariantError, dir, ": rank ", r.rank, " wrote elements from ", r.begin, " of ",
                  r.name, ", which the table does not give it");
    piece->offset = r.offset;
    piece->xxh3 = r.xxh3;
  }
  for (const TensorLayout& t : tensors)
    for (const TensorPiece& p : t.pieces)
      RETRACE_CHECK(p.hashed(), InvariantError, dir, ": no rank reports writing elements [", p.begin, ", ", p.end,
                    ") of ", t.name, " (rank ", p.rank, ")");
}

TensorView piece_view(const TensorLayout& t, const TensorPiece& piece, const void* data) {
  const uint64_t size = *dtype_size(t.dtype), count = piece.end - piece.begin;
  const bool whole = piece.begin == 0 && piece.end == t.numel();
  return {t.name, t.dtype, whole ? t.shape : std::vector<int64_t>{static_cast<int64_t>(count)},
          static_cast<const char*>(data) + piece.begin * size, count * size};
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
