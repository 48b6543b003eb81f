// The whole training state of one rank as a checkpoint shard (torch side of src/ckpt): model
// parameters and buffers ("model/<name>"), optimizer state ("optim/<param>/<field>"), the
// serialized RngState ("rng/state", U8), and in the shard metadata the counters (step, epoch,
// batch_in_epoch, samples_seen), the config hash, the optimizer name, the trace position and
// chain, and any extra state of the step's policies (loss scaler, guards) as strings.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/manifest.h"
#include "core/digest.h"

namespace retrace::train {
class Trainer;
}

namespace retrace::ckpt {

struct TracePosition {
  uint64_t bytes = 0;  // the trace file's size when the checkpoint was taken
  Digest128 chain;     // chain digest of the last step frame before it
};

// How the ranks of a data-parallel run agree during a sharded save (two-phase commit). Default:
// one process.
struct ShardSync {
  std::function<std::vector<std::string>(const std::string&)> allgather;  // every rank's bytes
  std::function<void()> barrier;
};

// Writes this rank's shard and, for world size 1, commits the checkpoint (manifest last, LATEST,
// rotation). Returns the step directory. The trainer's policy state (scaler, guards, fired faults,
// batches set aside) and `extra` are stored in the shard metadata with an "x." prefix.
// With a ShardSync: rank 0 creates the step directory, every rank writes its shard in parallel,
// the ranks exchange (file, size, sha256) once every shard is durable, and rank 0 writes the
// manifest (the commit point) before a last barrier. Rank 0's rotation report goes to `rotation`.
std::string save_checkpoint(train::Trainer& trainer, const std::string& root, const TracePosition& pos,
                            uint32_t keep_last, const std::map<std::string, std::string>& extra,
                            const ShardSync* sync = nullptr, RotationReport* rotation = nullptr);

struct RestoredState {
  std::string dir;
  Manifest manifest;
  TracePosition position;
  std::map<std::string, std::string> extra;  // without the "x." prefix
};

// Verifies `dir` (verify.h) for the trainer's world size (`world_size mismatch` otherwise), loads
// the trainer's own rank's shard, checks the config hash against the trainer's config,
// and loads model, optimizer, counters, RNG and policy state into the trainer. ConfigError when the checkpoint
// belongs to another config.
RestoredState load_checkpoint(train::Trainer& trainer, const std::string& dir);

std::string config_hash(const std::string& config_toml);

}  // namespace retrace::ckpt
