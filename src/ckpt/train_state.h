// The whole training state of one rank as a checkpoint shard (torch side of src/ckpt): model
// parameters and buffers ("model/<name>"), optimizer state ("optim/<param>/<field>"), the
// serialized RngState ("rng/state", U8), and in the shard metadata the counters (step, epoch,
// batch_in_epoch, samples_seen), the config hash, the optimizer name, the trace position and
// chain, and any extra state of the step's policies (loss scaler, guards) as strings.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/manifest.h"
#include "core/digest.h"
#include "train/collective.h"
#include "core/tensor_digest.h"

namespace retrace::train {
struct TrainState;
struct StateContext;
}  // namespace retrace::train

namespace retrace::ckpt {

struct StateSnapshot;

struct TracePosition {
  uint64_t bytes = 0;  // the trace file's size when the checkpoint was taken
  Digest128 chain;     // chain digest of the last step frame before it
};

// Writes this rank's shard and, for world size 1, commits the checkpoint (manifest last, LATEST,
// rotation). Returns the step directory. The state's policy state (scaler, guards, fired faults,
// batches set aside) and `extra` are stored in the shard metadata with an "x." prefix.
// With the ranks (a train::Collective; nullptr: one process): rank 0 creates the step directory,
// every rank writes its shard in parallel, the ranks exchange (file, size, sha256) once every shard
// is durable, and rank 0 writes the manifest (the commit point) before a last barrier. Rank 0's
// rotation report goes to `rotation`.
std::string save_checkpoint(train::TrainState& state, const train::StateContext& context, const std::string& root,
                            const TracePosition& pos, uint32_t keep_last,
                            const std::map<std::string, std::string>& extra, train::Collective* sync = nullptr,
                            RotationReport* rotation = nullptr, const StateSnapshot* anchor = nullptr);

// A rank's state as plain data, what its shard holds: a TrainState's (save_checkpoint) or a user's
// own loop's (the recorder of include/retrace/retrace.h).
struct StateSnapshot {
  uint64_t step = 0;
  uint32_t rank = 0, world_size = 1;
  NamedTensors model;  // stored as "model/<name>"
  NamedTensors optim;  // stored as "optim/<name>"
  // ZeRO: `optim` is this rank's slices of the state, optim_slices says where each lies in its
  // whole tensor (one per entry). Otherwise every entry is whole and replicated among the ranks.
  bool optim_sliced = false;
  std::vector<SliceOf> optim_slices;
  std::string rng;  // rng::RngState::serialize()
  std::string config_hash;
  std::map<std::string, std::string> metadata;  // counters, optimizer name, "x." policy state
};

// Writes the snapshot's shard and commits the checkpoint (see save_checkpoint). Returns the step
// directory. An `anchor` (the rollback anchor, an earlier state of the same rank) goes into the
// same shard as "anchor/model/...", "anchor/optim/...", "anchor/rng/state" and metadata
// "anchor.step" and "anchor.m.<key>"; an anchor at the snapshot's own step is stored as
// "anchor.step" alone.
// `before_commit`, when given, runs once this rank's shard is durable and before the ranks vote: an
// Error it throws leaves the step directory without a manifest (an interrupted save, which
// rotation removes) and propagates (a background save's check of its staged copy).
std::string save_snapshot(const StateSnapshot& snapshot, const std::string& root, const TracePosition& pos,
                          uint32_t keep_last, train::Collective* sync = nullptr, RotationReport* rotation = nullptr,
                          const StateSnapshot* anchor = nullptr, const std::function<void()>& before_commit = {});

// A rank's state as a snapshot; `copy`: tensors are copies (an anchor kept in memory while
// training goes on), else views of the live state (a save).
StateSnapshot snapshot_of(train::TrainState& state, const train::StateContext& context, bool copy);
// Puts a snapshot's state into a rank's state: model, optimizer, counters, cursor, RNG, and policy
// state (the fired faults and batches set aside are added to the state's own, never removed).
// `adopt_optim`: the snapshot's optimizer tensors are given away to the optimizer, not copied (a
// snapshot read in place, held by nobody else); never for an anchor kept in memory.
void apply_snapshot(train::TrainState& state, const train::StateContext& context, const StateSnapshot& snapshot,
                    const std::string& where, bool adopt_optim = false);

struct LoadedSnapshot {
  Manifest manifest;
  NamedTensors model, optim;
  std::string rng;
  std::map<std::string, std::string> metadata;
  TracePosition position;
  std::string where;        // the shard, for messages
  uint64_t bytes_read = 0;  // of the checkpoint's shards, by this process
  // The rollback anchor stored with the state: none (a run without one, or an older checkpoint),
  // at the checkpoint's own step (anchor_is_self), or an earlier state.
  std::optional<StateSnapshot> anchor;
  bool anchor_is_self = false;
  // The optimizer's tensors are this snapshot's alone (read in place): restore adopts them.
  bool optim_owned = false;
};

// Verifies `dir` for `world_size` (verify.h) and reads rank `rank`'s shard, hashed from the very
// bytes it parses; checks the RNG format and that shard and manifest agree on the trace position.
// `keep`, when given, says which elements of a table tensor (its entry in the table, named e.g.
// "optim/fc1.weight/exp_avg") this process keeps, [first, last) as a 1-D tensor, or nullopt for all
// of it whole (it may throw FormatError for an entry that does not fit the model): a ZeRO rank
// keeps its range of the optimizer state (keep_of), so loading never holds the whole of it. Only
// checkpoints whose state is split in pieces (ckpt.v2, several ranks) are read so; a one-rank
// shard is whole anyway.
// `in_place`, when given (a resume's, of the live model's parameters and buffers): a whole shard
// (one rank, or ckpt.v1) is read in one pass straight where its tensors will live, hashed as it
// lands: each model tensor into the tensor of `in_place` of its name where that is on the CPU,
// contiguous, of its dtype and shape (the snapshot's model tensor is then that tensor itself), the
// rest into tensors of their own (optim_owned). No buffer of the shard's bytes, no copy. Pieces
// (several ranks) likewise: the own shard streamed into the pieces' places (read_pieces), a model
// tensor this rank keeps whole gathered straight into its live tensor, the optimizer's tensors its
// own. The
// tensors of `in_place` then hold the candidate's bytes before any verdict on it: only for a caller
// that has nothing to keep in them (every checkpoint that loads overwrites all of them, and a resume
// that finds none fails).
using KeepRange = std::function<std::optional<std::pair<uint64_t, uint64_t>>(const TensorLayout&)>;
LoadedSnapshot load_snapshot(const std::string& dir, uint32_t world_size, uint32_t rank, const KeepRange& keep = {},
                             const NamedTensors* in_place = nullptr);
// The newest checkpoint under `root` that loads: each step directory, newest first, goes through
// load_snapshot, and one that fails to verify or parse is skipped (in `skipped`, with why). So a
// resume reads and hashes its own shard once, in the pass that parses it, where picking the
// checkpoint with find_newest_valid first and loading it then hashed it twice. WorldSizeMismatch
// propagates.
struct NewestSnapshot {
  std::string dir;
  LoadedSnapshot snapshot;
  std::vector<std::pair<std::string, std::string>> skipped;  // (dir, why), newest first
};
// `check`, when given, runs on each snapshot loaded: one it throws an Error for is skipped too
// (a resume's validation layer, so a checkpoint holding a wrong value gives way to an older one).
// `ranks`, when given (the ranks of a data-parallel resume, each calling this): a rank reads only
// the pieces of other ranks' shards it needs (read_pieces), so it may see damage the others do not;
// after each candidate the ranks exchange their verdicts (one all-gather of the reasons) and all
// take it or all skip it, with the first complaining rank's reason.
// `before_read`, when given, judges each candidate's manifest before any shard is read (e.g. that
// its trace position continues the run's trace): one that throws an Error is skipped without
// reading its shards. With ranks, every rank passes one (a no-op where it has nothing to judge),
// since the verdicts are exchanged in one more all-gather per candidate.
using ManifestCheck = std::function<void(const Manifest&)>;
std::optional<NewestSnapshot> load_newest_snapshot(const std::string& root, uint32_t world_size, uint32_t rank,
                                                   std::vector<std::pair<std::string, std::string>>* skipped = nullptr,
                                                   const KeepRange& keep = {},
                                                   const std::function<void(const LoadedSnapshot&)>& check = {},
                                                   train::Collective* ranks = nullptr,
                                                   const ManifestCheck& before_read = {},
                                                   const NamedTensors* in_place = nullptr);
// A counter of the snapshot's metadata (FormatError naming the shard when absent or not a number).
uint64_t metadata_u64(const LoadedSnapshot& snapshot, const std::string& key);

struct RestoredState {
  std::string dir;
  uint64_t bytes_read = 0;  // of the checkpoint's shards, by this process
  Manifest manifest;
  TracePosition position;
  std::map<std::string, std::string> extra;  // without the "x." prefix
  std::optional<StateSnapshot> anchor;       // the rollback anchor it stores (a copy)
};

// Verifies `dir` (verify.h) for the rank's world size (`world_size mismatch` otherwise), loads
// the rank's own shard, checks the config hash against context.config_hash, and loads model,
// optimizer, counters, RNG and policy state into `state`. ConfigError when the checkpoint belongs
// to another config.
RestoredState load_checkpoint(train::TrainState& state, const train::StateContext& context, const std::string& dir);
// Elastic resume (`resume --world-size M --reshard`): the checkpoints were written by `from_world`
// ranks under the config whose hash is `config_hash` (the same run at its own layout); the
// state is restored on M ranks. Rank r loads shard r, or shard 0 when r >= from_world (data
// parallelism keeps parameters, optimizer and policy state equal on every rank; under
// runtime.invariance = "batch" the RNG state and the samples seen too). Otherwise ranks >= from_world re-key their
// generators with rank_seed, and the samples seen per rank are scaled by from_world / M.
struct Reshard {
  uint32_t from_world = 1;
  std::string config_hash;
};
// load_checkpoint of the newest checkpoint under `root` that loads (load_newest_snapshot); nullopt
// when none does (`skipped` then says why each was skipped). `before_read` as in
// load_newest_snapshot. `in_place`: each candidate is read straight into the model's tensors and
// optimizer tensors of its own (load_snapshot), for a resume, whose model holds nothing to keep.
std::optional<RestoredState> load_newest_checkpoint(train::TrainState& state, const train::StateContext& context,
                                                    const std::string& root,
                                                    std::vector<std::pair<std::string, std::string>>* skipped,
                                                    const Reshard* reshard = nullptr,
                                                    train::Collective* ranks = nullptr,
                                                    const ManifestCheck& before_read = {}, bool in_place = false);
// The manifest of the newest checkpoint under `root` whose manifest reads, or nullopt.
std::optional<Manifest> newest_checkpoint_manifest(const std::string& root);

}  // namespace retrace::ckpt
