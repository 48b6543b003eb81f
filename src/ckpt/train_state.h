// The whole training state of one rank as a checkpoint shard (torch side of src/ckpt): model
// parameters and buffers ("model/<name>"), optimizer state ("optim/<param>/<field>"), the
// serialized RngState ("rng/state", U8), and in the shard metadata the counters (step, epoch,
// batch_in_epoch, samples_seen), the config hash, the optimizer name, the trace position and
// chain, and any extra state of the step's policies (loss scaler, guards) as strings.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

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

// Writes this rank's shard and, for world size 1, commits the checkpoint (manifest last, LATEST,
// rotation). Returns the step directory. The trainer's policy state (scaler, guards, fired faults,
// batches set aside) and `extra` are stored in the shard metadata with an "x." prefix.
std::string save_checkpoint(train::Trainer& trainer, const std::string& root, const TracePosition& pos,
                            uint32_t keep_last, const std::map<std::string, std::string>& extra);

struct RestoredState {
  std::string dir;
  Manifest manifest;
  TracePosition position;
  std::map<std::string, std::string> extra;  // without the "x." prefix
};

// Verifies `dir` (verify.h) for world size 1, checks the config hash against the trainer's config,
// and loads model, optimizer, counters, RNG and policy state into the trainer. ConfigError when the checkpoint
// belongs to another config.
RestoredState load_checkpoint(train::Trainer& trainer, const std::string& dir);

std::string config_hash(const std::string& config_toml);

}  // namespace retrace::ckpt
