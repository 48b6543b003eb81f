#include "ckpt/ckpt_test_util.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "ckpt/verify.h"
#include "core/file_util.h"

namespace retrace::ckpt::testing {

std::vector<uint8_t> pattern_bytes(uint64_t step, uint32_t rank, uint32_t index, uint64_t nbytes) {
  std::vector<uint8_t> out(nbytes);
  uint64_t x = (step * 0x9E3779B97F4A7C15ull) ^ (uint64_t(rank) << 32) ^ (uint64_t(index) << 48) ^ 0x5bd1e995u;
  size_t i = 0;
  while (i < nbytes) {
    // splitmix64
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    size_t n = std::min<size_t>(8, nbytes - i);
    std::memcpy(out.data() + i, &z, n);
    i += n;
  }
  return out;
}

std::string save_checkpoint(const std::string& root, uint64_t step, uint32_t world_size, uint64_t bytes_per_shard,
                            uint32_t keep_last, const WriteFaults& faults) {
  const std::string dir = prepare_checkpoint_dir(root, step);
  Manifest m;
  m.step = step;
  m.world_size = world_size;
  m.config_hash = "cfg-test";
  m.versions = {{"retrace", "0.1.0"}, {"libtorch", "none"}};
  m.rng_format_version = 1;
  m.trace_position = step * 10;
  m.trace_chain_hex = "00ff";
  // Three tensors: a big F32 matrix, a small F32 vector, an I64 counter block.
  const uint64_t small = 64, counters = 8 * 4;
  const uint64_t big = bytes_per_shard > small + counters ? ((bytes_per_shard - small - counters) / 4) * 4 : 4;
  for (uint32_t r = 0; r < world_size; ++r) {
    std::vector<std::vector<uint8_t>> data = {pattern_bytes(step, r, 0, big), pattern_bytes(step, r, 1, small),
                                              pattern_bytes(step, r, 2, counters)};
    std::vector<TensorView> views = {
        {"model.weight", "F32", {int64_t(big / 4)}, data[0].data(), big},
        {"model.bias", "F32", {4, 4}, data[1].data(), small},
        {"counters", "I64", {4}, data[2].data(), counters},
    };
    ShardFileInfo info = write_shard(dir + "/" + shard_file_name(r), shard_metadata(step, r, world_size), views,
                                     faults);
    m.shards.push_back({r, info.file, info.size, info.sha256});
  }
  return commit_checkpoint(root, m, keep_last);
}

std::string check_checkpoint_content(const std::string& dir, const Manifest& m) {
  for (const ShardEntry& s : m.shards) {
    ShardData shard = load_shard(dir, m, s.rank, /*check_digest=*/false);
    const char* names[] = {"model.weight", "model.bias", "counters"};
    for (uint32_t i = 0; i < 3; ++i) {
      const TensorEntry* e = shard.find(names[i]);
      if (!e) return "rank " + std::to_string(s.rank) + " has no " + names[i];
      auto want = pattern_bytes(m.step, s.rank, i, e->nbytes);
      if (std::memcmp(shard.data(*e), want.data(), want.size()) != 0)
        return "rank " + std::to_string(s.rank) + " tensor " + names[i] + " differs from step " +
               std::to_string(m.step);
    }
  }
  return {};
}

std::string read_all(const std::string& path) { return fs::read_file(path); }

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

std::string write_sharded(const std::string& root, uint64_t step, uint32_t world,
                          const std::vector<TensorLayout>& tensors, const std::vector<std::vector<char>>& values) {
  const auto split = split_among_ranks(tensors, world);
  const std::string dir = prepare_checkpoint_dir(root, step);
  Manifest m;
  m.step = step;
  m.world_size = world;
  m.config_hash = "c";
  m.tensors = split;
  std::vector<PieceRecord> records;
  for (uint32_t r = 0; r < world; ++r) {
    std::vector<TensorView> views;
    std::vector<std::pair<std::string, uint64_t>> pieces;
    for (size_t i = 0; i < split.size(); ++i)
      for (const TensorPiece& p : split[i].pieces)
        if (p.rank == r) {
          views.push_back(piece_view(split[i], p, values[i].data()));
          pieces.emplace_back(split[i].name, p.begin);
        }
    const std::string rng = "rng of rank " + std::to_string(r);
    views.push_back({"rng/state", "U8", {static_cast<int64_t>(rng.size())}, rng.data(), rng.size()});
    const ShardFileInfo info = write_shard(dir + "/" + shard_file_name(r), shard_metadata(step, r, world), views);
    m.shards.push_back({r, info.file, info.size, info.sha256});
    for (size_t v = 0; v < pieces.size(); ++v)
      records.push_back({pieces[v].first, r, pieces[v].second, info.offsets[v], info.xxh3[v]});
  }
  set_piece_records(m.tensors, records, dir);
  commit_checkpoint(root, m);
  return dir;
}

std::vector<std::vector<char>> read_sharded(const std::string& dir, uint32_t own, std::string* rng) {
  const Manifest m = verify_checkpoint(dir, std::nullopt, kEveryShard);
  return gather_pieces(
      dir, m, [](const TensorLayout&) { return true; }, own, rng);
}

}  // namespace retrace::ckpt::testing
