// Helpers shared by the checkpoint-format tests and properties: temporary directories, a small
// deterministic checkpoint writer, and byte-level damage.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/manifest.h"
#include "ckpt/shard.h"
#include "testing/temp_dir.h"

namespace retrace::ckpt::testing {

using TempDir = ::retrace::testing::TempDir;  // the one test library's (tests/testing/temp_dir.h)

// Deterministic content for (step, rank, tensor index): a counter-based pattern, so a reader can
// check every byte without keeping the original.
std::vector<uint8_t> pattern_bytes(uint64_t step, uint32_t rank, uint32_t index, uint64_t nbytes);

// Writes a complete checkpoint of `step` under root: world_size shards, each with two F32 tensors
// and one I64 tensor holding about bytes_per_shard bytes in total, then commits it. Returns the dir.
std::string save_checkpoint(const std::string& root, uint64_t step, uint32_t world_size, uint64_t bytes_per_shard,
                            uint32_t keep_last = kDefaultKeepLast, const WriteFaults& faults = {});

// Checks that every tensor of every shard of a verified checkpoint holds pattern_bytes; returns
// an empty string or the first difference.
std::string check_checkpoint_content(const std::string& dir, const Manifest& m);

// Writes and commits a ckpt.v3 checkpoint of `step` under root the way save_snapshot lays one
// out: `tensors` (name, dtype, shape) with the bytes `values` split among `world` ranks
// (split_among_ranks), each rank's shard with its pieces and a "rng/state" of "rng of rank R".
// Returns the step directory.
std::string write_sharded(const std::string& root, uint64_t step, uint32_t world,
                          const std::vector<TensorLayout>& tensors, const std::vector<std::vector<char>>& values);

// Every tensor of a ckpt.v3 checkpoint gathered from its pieces (read_pieces), in table order;
// `rng` (if given) receives rank `own`'s rng/state.
std::vector<std::vector<char>> read_sharded(const std::string& dir, uint32_t own = 0, std::string* rng = nullptr);

std::string read_all(const std::string& path);
void write_all(const std::string& path, const std::string& bytes);

}  // namespace retrace::ckpt::testing
