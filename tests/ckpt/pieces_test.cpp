// One copy of the replicated state on disk (schema ckpt.v2): the split among ranks, the manifest's
// table of element ranges, reading the pieces back from every shard, and each kind of bad input
// (a range missing from every file, overlapping ranges, a range beyond its tensor, a file holding
// a range of the wrong dtype or length, a file from another step), each a clear error naming the
// file and the range.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>
#include <numeric>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/ckpt_test_util.h"
#include "ckpt/manifest.h"
#include "ckpt/verify.h"
#include "core/digest.h"
#include "core/error.h"

namespace retrace::ckpt {
namespace {

using testing::read_all;
using testing::TempDir;
using testing::write_all;

std::vector<TensorLayout> sample_tensors() {
  return {{"model/w", "F32", {4, 8}, {}},
          {"model/b", "F16", {5}, {}},
          {"optim/w/exp_avg", "F64", {3, 3}, {}},
          {"model/scalar", "F32", {}, {}},
          {"model/empty", "F32", {0, 4}, {}}};
}

uint64_t bytes_of(const TensorLayout& t) { return t.numel() * *dtype_size(t.dtype); }

TEST(Pieces, SplitPartitionsEveryTensorAndBalancesTheBytes) {
  for (uint32_t world : {1u, 2u, 3u, 4u, 7u, 8u, 64u}) {
    const auto split = split_among_ranks(sample_tensors(), world);
    std::vector<uint64_t> per_rank(world, 0);
    uint64_t total = 0;
    for (const TensorLayout& t : split) {
      uint64_t next = 0;
      for (const TensorPiece& p : t.pieces) {
        EXPECT_EQ(p.begin, next) << t.name << " at world " << world;
        EXPECT_LT(p.begin, p.end);
        EXPECT_LT(p.rank, world);
        per_rank[p.rank] += (p.end - p.begin) * *dtype_size(t.dtype);
        next = p.end;
      }
      EXPECT_EQ(next, t.numel()) << t.name << " at world " << world;
      total += bytes_of(t);
    }
    // No rank holds more than its share plus one element of the tensor its cut falls in.
    for (uint32_t r = 0; r < world; ++r) EXPECT_LE(per_rank[r], total / world + 8) << "rank " << r << " of " << world;
    // A manifest with the table parses back equal.
    Manifest m;
    m.step = 1;
    m.world_size = world;
    m.config_hash = "c";
    for (uint32_t r = 0; r < world; ++r) m.shards.push_back({r, shard_file_name(r), 1ull << 40, std::string(64, 'a')});
    m.tensors = split;
    uint64_t at = 8;
    for (TensorLayout& t : m.tensors)
      for (TensorPiece& p : t.pieces) {
        p.offset = at++;
        p.xxh3 = Digest128{at, ~at}.hex();
      }
    const Manifest back = parse_manifest(serialize_manifest(m), "m.json");
    ASSERT_EQ(back.tensors.size(), split.size());
    for (size_t i = 0; i < split.size(); ++i) {
      EXPECT_EQ(back.tensors[i].name, split[i].name);
      EXPECT_EQ(back.tensors[i].shape, split[i].shape);
      ASSERT_EQ(back.tensors[i].pieces.size(), split[i].pieces.size());
      for (size_t k = 0; k < split[i].pieces.size(); ++k) {
        EXPECT_EQ(back.tensors[i].pieces[k].offset, m.tensors[i].pieces[k].offset);
        EXPECT_EQ(back.tensors[i].pieces[k].xxh3, m.tensors[i].pieces[k].xxh3);
      }
    }
    // Without the pieces' offsets and hashes the current schema refuses to write the table.
    m.tensors = split;
    EXPECT_THROW(serialize_manifest(m), InvariantError);
  }
}

// A ckpt.v2 checkpoint of sample_tensors() with a pattern of bytes for `step`.
struct Written {
  std::string dir;
  std::vector<std::vector<char>> values;  // each tensor's bytes
};

Written write_sharded(const std::string& root, uint64_t step, uint32_t world) {
  Written w;
  const auto tensors = sample_tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    w.values.emplace_back(bytes_of(tensors[i]));
    for (size_t k = 0; k < w.values[i].size(); ++k) w.values[i][k] = static_cast<char>(i * 31 + k * 7 + step);
  }
  w.dir = testing::write_sharded(root, step, world, tensors, w.values);
  return w;
}

// Reads every tensor back; returns the own rank's rng/state.
std::string read_back(const std::string& dir, std::vector<std::vector<char>>& out, uint32_t own = 0) {
  std::string rng;
  out = testing::read_sharded(dir, own, &rng);
  return rng;
}

TEST(Pieces, EveryRankWritesItsRangeAndTheTensorsComeBackWhole) {
  for (uint32_t world : {1u, 2u, 3u, 4u}) {
    TempDir tmp;
    const Written w = write_sharded(tmp.path(), 5, world);
    std::vector<std::vector<char>> back;
    EXPECT_EQ(read_back(w.dir, back, world - 1), "rng of rank " + std::to_string(world - 1));
    EXPECT_EQ(back, w.values) << "world " << world;
    // Only what a tensor needs is read into it: a filter leaves the others untouched.
    const Manifest m = verify_checkpoint(w.dir, std::nullopt);
    std::vector<std::vector<char>> model(m.tensors.size());
    for (size_t i = 0; i < m.tensors.size(); ++i) model[i].assign(bytes_of(m.tensors[i]), 0);
    read_pieces(
        w.dir, m, [](const TensorLayout& t) { return t.name.rfind("model/", 0) == 0; },
        [&](size_t i) { return static_cast<void*>(model[i].data()); }, 0,
        [](const ShardData&, const std::map<std::string, std::string>&) {});
    for (size_t i = 0; i < m.tensors.size(); ++i)
      if (m.tensors[i].name.rfind("model/", 0) == 0) EXPECT_EQ(model[i], w.values[i]) << m.tensors[i].name;
      else EXPECT_EQ(model[i], std::vector<char>(model[i].size(), 0)) << m.tensors[i].name;
    // A window (a ZeRO rank's range): only elements [first, last) of each tensor, into a buffer of
    // that many, from whichever pieces overlap it; every element position tried at the edges.
    for (size_t i = 0; i < m.tensors.size(); ++i) {
      const uint64_t n = m.tensors[i].numel(), size = bytes_of(m.tensors[i]) / std::max<uint64_t>(n, 1);
      for (const auto& [first, last] : std::vector<std::pair<uint64_t, uint64_t>>{{0, n},
                                                                                  {n / 3, n / 3 + (n + 1) / 2},
                                                                                  {n > 0 ? n - 1 : 0, n},
                                                                                  {0, 1 % (n + 1)}}) {
        std::vector<char> part((last - first) * size, 0);
        read_pieces(
            w.dir, m, [&](const TensorLayout& t) { return &t == &m.tensors[i]; },
            [&](size_t) { return static_cast<void*>(part.data()); }, 0,
            [](const ShardData&, const std::map<std::string, std::string>&) {},
            [&](size_t) {
              return std::pair<uint64_t, uint64_t>{first, last};
            });
        EXPECT_EQ(part, std::vector<char>(w.values[i].begin() + static_cast<int64_t>(first * size),
                                          w.values[i].begin() + static_cast<int64_t>(last * size)))
            << m.tensors[i].name << " [" << first << ", " << last << ") at world " << world;
      }
    }
  }
}

// The bytes this process has read so far (/proc/self/io rchar: every read and pread).
uint64_t bytes_read_so_far() {
  std::ifstream io("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (io >> key >> value)
    if (key == "rchar:") return value;
  return 0;
}

uint64_t piece_bytes(const TensorLayout& t, const TensorPiece& p) { return (p.end - p.begin) * *dtype_size(t.dtype); }

// Another rank's shard is read piece by piece: exactly the pieces wanted, each checked against its
// hash; damage elsewhere in that file is not this process's to find (nor to pay for).
TEST(Pieces, AnotherRanksShardIsReadByRangeOnlyWhereWanted) {
  TempDir tmp;
  const Written w = write_sharded(tmp.path(), 5, 4);
  const Manifest m = verify_checkpoint(w.dir, std::nullopt);
  ASSERT_EQ(m.schema, "ckpt.v3");
  auto is_model = [](const TensorLayout& t) { return t.name.rfind("model/", 0) == 0; };
  uint64_t own = 0, wanted = 0, pieces_elsewhere = 0;
  for (const ShardEntry& s : m.shards)
    if (s.rank == 0) own = s.size;
  for (const TensorLayout& t : m.tensors)
    for (const TensorPiece& p : t.pieces)
      if (p.rank != 0) {
        pieces_elsewhere += piece_bytes(t, p);
        if (is_model(t)) wanted += piece_bytes(t, p);
      }
  ASSERT_GT(pieces_elsewhere, wanted);
  ASSERT_GT(wanted, 0u);
  std::vector<std::vector<char>> out(m.tensors.size());
  for (size_t i = 0; i < m.tensors.size(); ++i) out[i].resize(bytes_of(m.tensors[i]));
  // The own shard's header is read first (its length, then the header with it), to choose where
  // each piece lands, and again in the hashed pass.
  const uint64_t header_look = 8 + read_shard_header(w.dir + "/" + shard_file_name(0), fs::Links::kFollow).data_start;
  // Reading /proc/self/io counts too: what one look costs is taken off.
  const uint64_t look = bytes_read_so_far(), before = bytes_read_so_far(), one_look = before - look;
  const uint64_t reported = read_pieces(
      w.dir, m, is_model, [&](size_t i) { return static_cast<void*>(out[i].data()); }, 0,
      [](const ShardData&, const std::map<std::string, std::string>&) {});
  const uint64_t read = bytes_read_so_far() - before - one_look;
  EXPECT_EQ(reported, own + wanted);
  // Rank 0's shard whole (and its header once more), and of the others exactly the model's pieces.
  EXPECT_EQ(read, own + wanted + header_look) << "pieces elsewhere " << pieces_elsewhere;
  for (size_t i = 0; i < m.tensors.size(); ++i)
    if (is_model(m.tensors[i])) {
      EXPECT_EQ(out[i], w.values[i]) << m.tensors[i].name;
    }

  // Damage in rank 2's shard outside what is wanted: not read, so not seen; inside: an
  // IntegrityError naming the file, the tensor, its elements and bytes.
  const std::string path = w.dir + "/" + shard_file_name(2);
  const std::string original = read_all(path);
  const TensorLayout* optim = nullptr;
  const TensorPiece* optim_piece = nullptr;
  const TensorLayout* model = nullptr;
  const TensorPiece* model_piece = nullptr;
  for (const TensorLayout& t : m.tensors)
    for (const TensorPiece& p : t.pieces)
      if (p.rank == 2 && !is_model(t)) optim = &t, optim_piece = &p;
      else if (p.rank == 2) model = &t, model_piece = &p;
  ASSERT_TRUE(optim && model);
  std::string damaged = original;
  damaged[optim_piece->offset] ^= 1;
  write_all(path, damaged);
  EXPECT_NO_THROW(read_pieces(
      w.dir, m, is_model, [&](size_t i) { return static_cast<void*>(out[i].data()); }, 0,
      [](const ShardData&, const std::map<std::string, std::string>&) {}));
  damaged = original;
  damaged[model_piece->offset + piece_bytes(*model, *model_piece) - 1] ^= 1;
  write_all(path, damaged);
  try {
    read_pieces(
        w.dir, m, is_model, [&](size_t i) { return static_cast<void*>(out[i].data()); }, 0,
        [](const ShardData&, const std::map<std::string, std::string>&) {});
    ADD_FAILURE() << "a damaged piece was accepted";
  } catch (const IntegrityError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find(path), std::string::npos) << text;
    EXPECT_NE(text.find(model->name + " elements [" + std::to_string(model_piece->begin)), std::string::npos) << text;
    EXPECT_NE(text.find("(bytes [" + std::to_string(model_piece->offset)), std::string::npos) << text;
  }
  write_all(path, original);
}

// A checkpoint written before ckpt.v3 (pieces without offsets and hashes) still reads: its shards
// are read whole and hashed, as they were.
TEST(Pieces, AVersionTwoManifestIsReadWhole) {
  TempDir tmp;
  const Written w = write_sharded(tmp.path(), 5, 3);
  auto j = nlohmann::json::parse(read_all(w.dir + "/manifest.json"));
  j["schema"] = "ckpt.v2";
  for (auto& t : j["tensors"])
    for (auto& p : t["pieces"]) {
      p.erase("offset");
      p.erase("xxh3");
    }
  j.erase("manifest_sha256");
  const std::string canon = j.dump();
  j["manifest_sha256"] = sha256_hex(canon.data(), canon.size());
  write_all(w.dir + "/manifest.json", j.dump(2));
  const Manifest m = verify_checkpoint(w.dir, std::nullopt);
  EXPECT_EQ(m.schema, "ckpt.v2");
  for (const TensorLayout& t : m.tensors)
    for (const TensorPiece& p : t.pieces) EXPECT_FALSE(p.hashed()) << t.name;
  std::vector<std::vector<char>> back;
  EXPECT_EQ(read_back(w.dir, back, 1), "rng of rank 1");
  EXPECT_EQ(back, w.values);
  // Read whole: damage anywhere in another rank's shard is found by its sha256.
  const std::string path = w.dir + "/" + shard_file_name(2);
  std::string damaged = read_all(path);
  damaged[damaged.size() - 1] ^= 1;
  write_all(path, damaged);
  EXPECT_THROW(read_back(w.dir, back, 1), IntegrityError);
}

// Rewrites a checkpoint's manifest with `edit` applied and a valid checksum.
void reseal(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  auto j = nlohmann::json::parse(read_all(dir + "/manifest.json"));
  edit(j);
  j.erase("manifest_sha256");
  const std::string canon = j.dump();
  j["manifest_sha256"] = sha256_hex(canon.data(), canon.size());
  write_all(dir + "/manifest.json", j.dump(2));
}

std::string error_of(const std::string& dir) {
  try {
    std::vector<std::vector<char>> back;
    read_back(dir, back);
  } catch (const Error& e) {
    return std::string(e.kind()) + ": " + e.what();
  }
  return "no error";
}

nlohmann::json& pieces_of(nlohmann::json& j, const std::string& name) {
  for (auto& t : j["tensors"])
    if (t["name"] == name) return t["pieces"];
  throw std::runtime_error("no tensor " + name);
}

TEST(Pieces, BadTablesAndFilesAreClearErrorsNamingFileAndRange) {
  TempDir tmp;
  const Written w = write_sharded(tmp.path(), 5, 2);
  const std::string good = read_all(w.dir + "/manifest.json");
  auto expect = [&](const char* what, const std::function<void(nlohmann::json&)>& edit, const std::string& kind,
                    const std::string& words) {
    write_all(w.dir + "/manifest.json", good);
    reseal(w.dir, edit);
    const std::string e = error_of(w.dir);
    EXPECT_EQ(e.rfind(kind, 0), 0u) << what << ": " << e;
    EXPECT_NE(e.find(words), std::string::npos) << what << ": " << e;
  };
  // model/w has 32 elements, split between the two ranks.
  expect(
      "a range missing from every file", [](nlohmann::json& j) { pieces_of(j, "model/w").erase(1); }, "format error",
      "are in no shard (a range missing from every file)");
  expect(
      "overlapping ranges", [](nlohmann::json& j) { pieces_of(j, "model/w")[1]["begin"] = 1; }, "format error",
      "overlaps the one before it");
  expect(
      "a range beyond its tensor", [](nlohmann::json& j) { pieces_of(j, "model/w").back()["end"] = 33; },
      "format error", "beyond the tensor's 32 elements");
  expect(
      "a range on a rank the world does not have", [](nlohmann::json& j) { pieces_of(j, "model/w")[0]["rank"] = 2; },
      "format error", "the limit is 1");
  // The table agrees with itself but not with the files: the other rank's range, a wrong dtype.
  expect(
      "a piece the file does not hold at that length",
      [](nlohmann::json& j) {
        auto& p = pieces_of(j, "model/w");
        p[0]["end"] = p[0]["end"].get<uint64_t>() - 1;
        p[1]["begin"] = p[1]["begin"].get<uint64_t>() - 1;
      },
      "integrity error", "model/w elements [");
  expect(
      "a file holding the range in another dtype",
      [](nlohmann::json& j) {
        for (auto& t : j["tensors"])
          if (t["name"] == "model/w") t["dtype"] = "I32";
      },
      "integrity error", "should be");
  const std::string any_xxh3(32, '0');
  expect(
      "a tensor no file holds",
      [&](nlohmann::json& j) {
        j["tensors"].push_back(
            {{"name", "model/ghost"},
             {"dtype", "F32"},
             {"shape", {2}},
             {"pieces", {{{"rank", 0}, {"begin", 0}, {"end", 2}, {"offset", 8}, {"xxh3", any_xxh3}}}}});
      },
      "integrity error", "lacks elements [0, 2) of model/ghost");
  // In another rank's shard, read by range: the bytes at the offset are not the piece's.
  expect(
      "a tensor no file holds, in a shard read by range",
      [&](nlohmann::json& j) {
        j["tensors"].push_back(
            {{"name", "model/ghost"},
             {"dtype", "F32"},
             {"shape", {2}},
             {"pieces", {{{"rank", 1}, {"begin", 0}, {"end", 2}, {"offset", 8}, {"xxh3", any_xxh3}}}}});
      },
      "integrity error", "shard-rank00001.safetensors: model/ghost elements [0, 2) (bytes [8, 16)) have xxh3");
  expect(
      "a piece whose offset moved",
      [](nlohmann::json& j) {
        auto& p = pieces_of(j, "model/w")[1];
        p["offset"] = p["offset"].get<uint64_t>() + 4;
      },
      "integrity error", "have xxh3");
  expect(
      "a piece whose offset moved, in the shard parsed whole",
      [](nlohmann::json& j) {
        auto& p = pieces_of(j, "model/w")[0];
        p["offset"] = p["offset"].get<uint64_t>() + 4;
      },
      "integrity error", "the manifest records");
  expect(
      "a piece past the end of its file",
      [](nlohmann::json& j) { pieces_of(j, "model/w")[1]["offset"] = uint64_t{1} << 40; }, "format error",
      "bytes at offset 1099511627776 of shard-rank00001.safetensors");
  expect(
      "a piece without its hash", [](nlohmann::json& j) { pieces_of(j, "model/w")[1].erase("xxh3"); }, "format error",
      "a piece must be an object of rank, begin, end, offset, xxh3");
  expect(
      "a hash that is not hex", [](nlohmann::json& j) { pieces_of(j, "model/w")[1]["xxh3"] = "xyz"; }, "format error",
      "expected 32 lowercase hex digits");
  // A file from another step: its metadata says so (and its sha256 is not the manifest's).
  write_all(w.dir + "/manifest.json", good);
  TempDir other;
  const Written w2 = write_sharded(other.path(), 6, 2);
  write_all(w.dir + "/" + shard_file_name(1), read_all(w2.dir + "/" + shard_file_name(1)));
  const std::string e = error_of(w.dir);
  EXPECT_NE(e.find("shard-rank00001.safetensors"), std::string::npos) << e;
  EXPECT_EQ(e.rfind("integrity error", 0), 0u) << e;
}

}  // namespace
}  // namespace retrace::ckpt
