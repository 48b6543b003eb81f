#include "ckpt/verify.h"

#include <string_view>
#include <unordered_map>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <atomic>
#include <exception>
#include <filesystem>
#include <list>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/schema.h"
#include "core/digest.h"
#include "core/file_util.h"

namespace retrace::ckpt {
namespace {

namespace stdfs = std::filesystem;

std::string join(const std::string& dir, const std::string& file) { return (stdfs::path(dir) / file).string(); }

const char* kResumeHint =
    "resume from an older checkpoint (retrace picks the newest one that verifies) or "
    "restore the file";

// Phase 4 for one shard: empty when present with the recorded size.
std::string presence_problem(const std::string& dir, const ShardEntry& s) {
  const std::string path = join(dir, s.file);
  struct stat st {};
  const bool present = ::lstat(path.c_str(), &st) == 0;
  if (present && !S_ISREG(st.st_mode)) {
    return detail::concat("shard file ", s.file, " for rank ", s.rank, " in ", dir, " is ",
                          S_ISLNK(st.st_mode) ? "a symbolic link" : "not a regular file",
                          "; a checkpoint's files are plain files in its directory and retrace neither follows "
                          "links there nor reads anything else; ",
                          kResumeHint);
  }
  if (!present) {
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

// sha256 of each listed shard, several at a time (up to one per core): sha256[i] is the digest of
// shards[i], or error[i] holds what reading its file threw.
struct ShardDigests {
  std::vector<std::string> sha256;
  std::vector<std::exception_ptr> error;
};
ShardDigests hash_shards(const std::string& dir, const std::vector<const ShardEntry*>& shards) {
  ShardDigests out;
  out.sha256.resize(shards.size());
  out.error.resize(shards.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < shards.size(); i = next++) {
      try {
        out.sha256[i] = sha256_file_hex(join(dir, shards[i]->file), fs::Links::kRefuse);
      } catch (...) {
        out.error[i] = std::current_exception();
      }
    }
  };
  const size_t workers = std::min<size_t>(shards.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  return out;
}

uint64_t data_start_offset(const ShardData& shard, const TensorEntry& e) { return shard.data_start + e.offset; }

// What a load requires of the shard entry `e` (nullptr when absent) that holds piece `p` of `t`:
// present, of the table's dtype and the piece's bytes, and (ckpt.v3) at the recorded offset.
// IntegrityError naming the shard, the tensor and the elements. read_pieces (every load of pieces)
// and check_table (`retrace verify`) share it, so that VERIFIED means what a load checks.
void check_piece_entry(const ShardData& shard, const TensorEntry* e, const TensorLayout& t, const TensorPiece& p) {
  const uint64_t count = p.end - p.begin, size = *dtype_size(t.dtype);  // known: checked as the manifest was parsed
  RETRACE_CHECK(e != nullptr, IntegrityError, "shard ", shard.source, " lacks elements [", p.begin, ", ", p.end,
                ") of ", t.name,
                ", which the manifest puts there; the shard belongs to another checkpoint or was "
                "rewritten; ",
                kResumeHint);
  RETRACE_CHECK(e->dtype == t.dtype && e->nbytes == count * size, IntegrityError, "shard ", shard.source, ": ", t.name,
                " elements [", p.begin, ", ", p.end, ") should be ", count, " ", t.dtype, " (", count * size,
                " bytes), the shard holds ", e->dtype, " of ", e->nbytes,
                " bytes; the shard belongs to another checkpoint or was rewritten; ", kResumeHint);
  RETRACE_CHECK(!p.hashed() || data_start_offset(shard, *e) == p.offset, IntegrityError, "shard ", shard.source, ": ",
                t.name, " elements [", p.begin, ", ", p.end, ") are at byte ", data_start_offset(shard, *e),
                ", the manifest records ", p.offset, "; the shard belongs to another checkpoint or was rewritten; ",
                kResumeHint);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
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
  Manifest m = parse_manifest(fs::read_file(path, kMaxManifestBytes, fs::Links::kRefuse), path);
  stdfs::path normal = stdfs::path(dir).lexically_normal();
  if (normal.filename().empty()) normal = normal.parent_path();  // "dir/" names the same directory
  if (auto step = parse_step_dir_name(normal.filename().string())) {
    RETRACE_CHECK(*step == m.step, IntegrityError, "manifest ", path, " says step ", m.step,
                  " but its directory is for step ", *step, "; the manifest was moved or edited; ", kResumeHint);
  }
  if (expected_world_size && *expected_world_size != m.world_size) {
    throw WorldSizeMismatch(detail::concat("world_size mismatch: expected ", *expected_world_size, ", found ",
                                           m.world_size, " in ", path, "; the checkpoint was saved by ", m.world_size,
                                           " ranks and this run has ", *expected_world_size,
                                           "; resume with --world-size ", m.world_size, ", or continue on ",
                                           *expected_world_size, " ranks with --world-size ", *expected_world_size,
                                           " --reshard (bitwise when the run has runtime.invariance = "
                                           "\"batch\")"));
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
  std::vector<const ShardEntry*> to_hash;
  for (const ShardEntry& s : m.shards)
    if (!hashed_by_caller || (*hashed_by_caller != kEveryShard && s.rank != *hashed_by_caller)) to_hash.push_back(&s);
  const ShardDigests found = hash_shards(dir, to_hash);
  for (size_t i = 0; i < to_hash.size(); ++i) {  // the first problem in rank order, as a serial check would find
    if (found.error[i]) std::rethrow_exception(found.error[i]);
    std::string problem = digest_problem(dir, *to_hash[i], found.sha256[i]);
    if (!problem.empty()) throw IntegrityError(problem);
  }
  return m;
}

void check_table(const std::string& dir, const Manifest& manifest) {
  if (manifest.tensors.empty()) return;
  std::vector<ShardData> headers;
  // Each shard's tensors by name: one lookup per piece, not a scan (a model of many tensors on
  // many ranks has as many pieces as tensors and ranks together).
  std::vector<std::unordered_map<std::string_view, const TensorEntry*>> by_name;
  for (const ShardEntry& s : manifest.shards)
    headers.push_back(read_shard_header(join(dir, s.file), fs::Links::kRefuse));
  for (const ShardData& h : headers) {
    by_name.emplace_back();
    for (const TensorEntry& e : h.tensors) by_name.back().emplace(e.name, &e);
  }
  for (const TensorLayout& t : manifest.tensors) {
    for (const TensorPiece& p : t.pieces) {
      const ShardData& shard = headers.at(p.rank);
      const auto found = by_name[p.rank].find(t.name);
      const TensorEntry* e = found == by_name[p.rank].end() ? nullptr : found->second;
      check_piece_entry(shard, e, t, p);
      // The shape a save writes: the table's for a whole tensor, a 1-D run for part of one.
      const std::vector<int64_t> shape = p.begin == 0 && p.end == t.numel()
                                             ? t.shape
                                             : std::vector<int64_t>{static_cast<int64_t>(p.end - p.begin)};
      RETRACE_CHECK(e->shape == shape, IntegrityError, "shard ", shard.source, ": ", t.name, " elements [", p.begin,
                    ", ", p.end, ") should have shape ", shape_text(shape),
                    " by the manifest's table, the shard's "
                    "is ",
                    shape_text(e->shape), "; the shard belongs to another checkpoint or was rewritten; ", kResumeHint);
    }
  }
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
  std::vector<ShardCheck> checks;
  std::vector<const ShardEntry*> present;
  std::vector<size_t> present_at;
  for (const ShardEntry& s : r.manifest.shards) {
    ShardCheck c{s.rank, s.file, s.size, s.sha256, "", false, ""};
    c.problem = presence_problem(dir, s);
    if (c.problem.empty()) {
      present.push_back(&s);
      present_at.push_back(checks.size());
    }
    checks.push_back(std::move(c));
  }
  const ShardDigests found = hash_shards(dir, present);
  for (size_t i = 0; i < present.size(); ++i) {
    ShardCheck& c = checks[present_at[i]];
    try {
      if (found.error[i]) std::rethrow_exception(found.error[i]);
      c.found_sha256 = found.sha256[i];
      c.problem = digest_problem(dir, *present[i], c.found_sha256);
    } catch (const Error& e) {
      c.problem = e.what();
    }
  }
  for (ShardCheck& c : checks) {
    c.ok = c.problem.empty();
    if (!c.ok) {
      r.problems.push_back(c.problem);
      if (r.error_kind.empty()) r.error_kind = "integrity error";
    }
    r.shards.push_back(std::move(c));
  }
  if (r.problems.empty()) {  // the table against shards whose bytes are the manifest's
    try {
      check_table(dir, r.manifest);
    } catch (const Error& e) {
      r.problems.push_back(e.what());
      r.error_kind = e.kind();
    }
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

namespace {

// The manifest's entry for `rank`'s shard, present with its recorded size (IntegrityError otherwise).
const ShardEntry& present_shard(const std::string& dir, const Manifest& manifest, uint32_t rank) {
  const ShardEntry* entry = nullptr;
  for (const ShardEntry& s : manifest.shards)
    if (s.rank == rank) entry = &s;
  RETRACE_CHECK(entry != nullptr, IntegrityError, "shard file missing: the manifest of ", dir,
                " lists no shard for rank ", rank, " (world_size ", manifest.world_size, ")");
  const std::string problem = presence_problem(dir, *entry);
  if (!problem.empty()) throw IntegrityError(problem);
  return *entry;
}

// A parsed shard's metadata in the current schema, checked to be of this checkpoint and rank.
void migrate_and_check_metadata(ShardData& shard, const Manifest& manifest, uint32_t rank, const std::string& path) {
  shard.metadata = migrate_shard_metadata(std::move(shard.metadata), "shard " + path);
  auto check_meta = [&](const char* key, const std::string& expected) {
    auto it = shard.metadata.find(key);
    RETRACE_CHECK(it != shard.metadata.end() && it->second == expected, IntegrityError, "shard ", path, ": metadata \"",
                  key, "\" is \"", (it == shard.metadata.end() ? "(missing)" : it->second),
                  "\", the manifest expects \"", expected, "\"; the shard belongs to another checkpoint; ",
                  kResumeHint);
  };
  check_meta("step", std::to_string(manifest.step));
  check_meta("rank", std::to_string(rank));
  if (shard.metadata.count("world_size")) check_meta("world_size", std::to_string(manifest.world_size));
}

}  // namespace

ShardData load_shard(const std::string& dir, const Manifest& manifest, uint32_t rank, bool check_digest) {
  const ShardEntry* entry = &present_shard(dir, manifest, rank);
  const std::string path = join(dir, entry->file);
  std::string problem;
  // With check_digest the bytes are hashed as they are read, in the same pass (read_file_sha256).
  fs::FileBytes bytes;
  if (check_digest) {
    HashedFile f = read_file_sha256(path, entry->size, fs::Links::kRefuse);
    bytes = std::move(f.bytes);
    if (bytes.size() == entry->size) {
      problem = digest_problem(dir, *entry, f.sha256);
      if (!problem.empty()) throw IntegrityError(problem);
    }
  } else {
    bytes = fs::read_file_bytes(path, entry->size, fs::Links::kRefuse);
  }
  RETRACE_CHECK(bytes.size() == entry->size, IntegrityError, "sha256 mismatch on rank ", rank, ": read ", bytes.size(),
                " bytes of ", path, ", the manifest records ", entry->size, "; ", kResumeHint);
  ShardData shard = parse_shard(std::move(bytes), path);
  migrate_and_check_metadata(shard, manifest, rank, path);
  return shard;
}

namespace {
bool same_table(const std::vector<TensorEntry>& a, const std::vector<TensorEntry>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].name != b[i].name || a[i].dtype != b[i].dtype || a[i].shape != b[i].shape || a[i].offset != b[i].offset ||
        a[i].nbytes != b[i].nbytes)
      return false;
  return true;
}
}  // namespace

ShardData load_shard_into(const std::string& dir, const Manifest& manifest, uint32_t rank,
                          const std::function<char*(const ShardData&, const TensorEntry&)>& place,
                          uint64_t& bytes_read) {
  const ShardEntry& entry = present_shard(dir, manifest, rank);
  const std::string path = join(dir, entry.file);
  ShardData shard;
  try {
    shard = read_shard_header(path, fs::Links::kRefuse);
  } catch (const FormatError&) {
    // A damaged header is reported as load_shard reports it, by the sha256 of the whole file; a
    // file that hashes as recorded yet does not parse keeps the parser's message.
    const std::string problem = digest_problem(dir, entry, sha256_file_hex(path, fs::Links::kRefuse));
    if (!problem.empty()) throw IntegrityError(problem);
    throw;
  }
  // The header is read again in the pass (hashed with the rest) and must be the one the places
  // were chosen by: a file replaced between the two reads is caught here or by its sha256.
  std::string head(size_t(shard.data_start), '\0');
  std::vector<FileSegment> segments{{0, shard.data_start, head.data()}};
  for (const TensorEntry& e : shard.tensors) {
    char* const dest = place(shard, e);
    if (e.nbytes > 0 && dest) segments.push_back({shard.data_start + e.offset, e.nbytes, dest});
  }
  const std::string sha = read_file_sha256_into(path, entry.size, segments, bytes_read, fs::Links::kRefuse);
  RETRACE_CHECK(bytes_read == entry.size, IntegrityError, "sha256 mismatch on rank ", rank, ": read ", bytes_read,
                " bytes of ", path, ", the manifest records ", entry.size, "; ", kResumeHint);
  const std::string problem = digest_problem(dir, entry, sha);
  if (!problem.empty()) throw IntegrityError(problem);
  const ShardData again = parse_shard_header(head, entry.size, path);
  RETRACE_CHECK(same_table(again.tensors, shard.tensors) && again.metadata == shard.metadata, IntegrityError, "shard ",
                path, " changed while it was read (its header differs from the first read); ", kResumeHint);
  migrate_and_check_metadata(shard, manifest, rank, path);
  return shard;
}

namespace {

// The wanted pieces of one rank's shard: the index of each piece's tensor in the table.
using RankPieces = std::vector<std::pair<size_t, const TensorPiece*>>;

// Of piece `p` of tensor `index`, the elements [lo, hi) this process keeps (none when lo >= hi), and
// `first`, the element its window starts at (element 0 without a window).
struct KeptPart {
  uint64_t first, lo, hi;
};
KeptPart kept_part(const Manifest& manifest, const ElementWindow& window, size_t index, const TensorPiece& p) {
  const auto [first, last] = window ? window(index) : std::pair<uint64_t, uint64_t>{0, manifest.tensors[index].numel()};
  return {first, std::max(first, p.begin), std::min(last, p.end)};
}

// Reads the pieces of `entry`'s shard that overlap their windows, each from its recorded offset,
// and checks each against its recorded xxh3 before it is used (ckpt.v3): the process reads what it
// needs of another rank's shard and nothing else.
uint64_t read_hashed_pieces(const std::string& dir, const Manifest& manifest, const ShardEntry& entry,
                            const RankPieces& pieces, const std::function<void*(size_t)>& destination,
                            const ElementWindow& window) {
  const std::string path = join(dir, entry.file);
  uint64_t size = 0;
  const int fd = fs::open_regular_file_within(path, entry.size, size, fs::Links::kRefuse);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  RETRACE_CHECK(size == entry.size, IntegrityError, "sha256 mismatch on rank ", entry.rank, ": ", path, " has ", size,
                " bytes, the manifest records ", entry.size, "; ", kResumeHint);
  std::vector<char> staging;
  uint64_t read = 0;
  for (const auto& [index, piece] : pieces) {
    const TensorLayout& t = manifest.tensors[index];
    const uint64_t elem = *dtype_size(t.dtype), bytes = (piece->end - piece->begin) * elem;
    const auto [first, lo, hi] = kept_part(manifest, window, index, *piece);
    if (lo >= hi) continue;  // none of it is wanted here
    // A piece wanted whole goes straight to its place; a part of one is read whole (its hash is
    // of the whole piece) and the wanted part copied.
    const bool whole = lo == piece->begin && hi == piece->end;
    char* out = static_cast<char*>(destination(index)) + (lo - first) * elem;
    if (!whole) {
      staging.resize(bytes);
      out = staging.data();
    }
    const uint64_t got = fs::read_at(fd, piece->offset, out, bytes, path);
    read += got;
    const std::string found = got == bytes ? xxh3_128(out, bytes).hex() : std::string("(a short read)");
    RETRACE_CHECK(found == piece->xxh3, IntegrityError, "shard ", path, ": ", t.name, " elements [", piece->begin, ", ",
                  piece->end, ") (bytes [", piece->offset, ", ", piece->offset + bytes, ")) have xxh3 ", found,
                  ", the manifest records ", piece->xxh3, "; the shard was damaged after the save; ", kResumeHint);
    if (!whole)
      std::memcpy(static_cast<char*>(destination(index)) + (lo - first) * elem,
                  staging.data() + (lo - piece->begin) * elem, (hi - lo) * elem);
  }
  return read;
}

}  // namespace

namespace {

// A shard read whole (the own rank's; every shard of a ckpt.v2 checkpoint) in one pass, hashed
// (sha256) where its bytes land (load_shard_into): a piece wanted whole straight into its place, a
// piece the window wants a part of into a buffer of its own (the part copied after the hash is
// checked), the pieces not wanted and the bytes between only hashed. Each wanted piece's entry is
// checked against the table before a byte of it is read. The tensors the table does not list (the
// rank's RNG states) land in `own`, by name; `header` gets the shard's header. Returns the bytes read.
uint64_t stream_shard(const std::string& dir, const Manifest& manifest, uint32_t r, const RankPieces& pieces,
                      const std::function<void*(size_t)>& destination, const ElementWindow& window, ShardData& header,
                      std::map<std::string, std::string>& own) {
  std::map<std::string, std::pair<size_t, const TensorPiece*>> by_name;
  for (const auto& [index, piece] : pieces)
    RETRACE_CHECK(by_name.emplace(manifest.tensors[index].name, std::make_pair(index, piece)).second, IntegrityError,
                  dir, "/", kManifestFile, " puts two pieces of ", manifest.tensors[index].name,
                  " in the shard of rank ", r, "; a rank holds one range of a tensor; ", kResumeHint);
  std::set<std::string> in_table;
  for (const TensorLayout& t : manifest.tensors) in_table.insert(t.name);
  struct Partial {
    size_t index;
    const TensorPiece* piece;
    std::vector<char> bytes;
  };
  std::list<Partial> partial;  // stable addresses while the pass writes into them
  uint64_t read = 0;
  header = load_shard_into(
      dir, manifest, r,
      [&](const ShardData& head, const TensorEntry& e) -> char* {
        const auto it = by_name.find(e.name);
        if (it == by_name.end()) {
          if (in_table.count(e.name)) return nullptr;  // a tensor (or range) this process does not keep
          std::string& bytes = own[e.name];
          bytes.assign(size_t(e.nbytes), '\0');
          return bytes.data();
        }
        const auto [index, piece] = it->second;
        const TensorLayout& t = manifest.tensors[index];
        check_piece_entry(head, &e, t, *piece);
        const auto [first, lo, hi] = kept_part(manifest, window, index, *piece);
        if (lo >= hi) return nullptr;
        if (lo == piece->begin && hi == piece->end)
          return static_cast<char*>(destination(index)) + (lo - first) * *dtype_size(t.dtype);
        partial.push_back({index, piece, std::vector<char>(size_t(e.nbytes))});
        return partial.back().bytes.data();
      },
      read);
  for (const auto& [index, piece] : pieces)  // a wanted piece the header does not list
    check_piece_entry(header, header.find(manifest.tensors[index].name), manifest.tensors[index], *piece);
  for (const Partial& p : partial) {
    const uint64_t size = *dtype_size(manifest.tensors[p.index].dtype);
    const auto [first, lo, hi] = kept_part(manifest, window, p.index, *p.piece);
    std::memcpy(static_cast<char*>(destination(p.index)) + (lo - first) * size,
                p.bytes.data() + (lo - p.piece->begin) * size, (hi - lo) * size);
  }
  return read;
}

}  // namespace

uint64_t read_pieces(const std::string& dir, const Manifest& manifest,
                     const std::function<bool(const TensorLayout&)>& wanted,
                     const std::function<void*(size_t)>& destination, uint32_t own_rank,
                     const std::function<void(const ShardData&, const std::map<std::string, std::string>&)>& own_shard,
                     const ElementWindow& window) {
  // The wanted pieces by the rank that holds them. The own rank's shard is read whole and hashed
  // (sha256) in the pass that parses it. Another rank's is read piece by piece when the manifest
  // records the pieces' offsets and hashes (ckpt.v3), only the pieces this process needs; without
  // them (ckpt.v2) it is read whole and hashed like the own one.
  std::vector<RankPieces> by_rank(manifest.world_size);
  std::vector<bool> whole_file(manifest.world_size, false);
  for (size_t i = 0; i < manifest.tensors.size(); ++i) {
    if (!wanted(manifest.tensors[i])) continue;
    for (const TensorPiece& p : manifest.tensors[i].pieces) {
      by_rank[p.rank].emplace_back(i, &p);
      if (!p.hashed()) whole_file[p.rank] = true;
    }
  }
  if (own_rank < manifest.world_size) whole_file[own_rank] = true;
  std::atomic<uint32_t> next{0};
  std::atomic<uint64_t> read{0};
  std::vector<std::exception_ptr> errors(manifest.world_size);
  auto work = [&] {
    for (uint32_t r = next++; r < manifest.world_size; r = next++) {
      try {
        if (!whole_file[r]) {
          read += read_hashed_pieces(dir, manifest, manifest.shards[r], by_rank[r], destination, window);
          continue;
        }
        std::map<std::string, std::string> own;
        ShardData header;
        read += stream_shard(dir, manifest, r, by_rank[r], destination, window, header, own);
        if (r == own_rank) own_shard(header, own);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  if (manifest.world_size > 1) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  return read;
}

std::vector<std::vector<char>> gather_pieces(const std::string& dir, const Manifest& manifest,
                                             const std::function<bool(const TensorLayout&)>& wanted, uint32_t rank,
                                             std::string* rng) {
  std::vector<std::vector<char>> out(manifest.tensors.size());
  for (size_t i = 0; i < manifest.tensors.size(); ++i)
    if (wanted(manifest.tensors[i]))
      out[i].resize(manifest.tensors[i].numel() * *dtype_size(manifest.tensors[i].dtype));
  read_pieces(
      dir, manifest, wanted, [&](size_t i) { return static_cast<void*>(out[i].data()); }, rank,
      [&](const ShardData&, const std::map<std::string, std::string>& own) {
        const auto it = own.find("rng/state");
        if (rng && it != own.end()) *rng = it->second;
      });
  return out;
}

}  // namespace retrace::ckpt
