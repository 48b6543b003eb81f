#include "ckpt/train_state.h"

#include <torch/torch.h>

#include <exception>
#include <memory>
#include <set>
#include <sstream>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/shard.h"
#include "ckpt/verify.h"
#include "core/error.h"
#include "core/parse_number.h"
#include "core/safetensors_torch.h"
#include "core/torch_compat.h"
#include "rng/philox.h"
#include "rng/rng_state.h"
#include "train/config.h"
#include "train/environment.h"
#include "train/optimizer.h"
#include "train/state.h"
#include "train/state_context.h"
#include "train/zero.h"

namespace retrace::ckpt {
namespace {

std::string dtype_name(torch::ScalarType t) {
  auto d = safetensors::dtype_of(t);
  // A user's model (a TorchScript file, a module of the library's user) may hold any dtype.
  RETRACE_CHECK(d.has_value(), ConfigError, "a tensor of the state is ", c10::toString(t),
                ", a dtype a checkpoint "
                "cannot store (F64, F32, F16, BF16, I64, I32, I16, I8, U8 and BOOL); convert the model's tensors");
  return *d;
}

torch::ScalarType scalar_type(const std::string& d, const std::string& where) {
  auto t = safetensors::torch_type(d);
  RETRACE_CHECK(t.has_value(), FormatError, where, ": unknown dtype ", d);
  return *t;
}

uint64_t parse_u64(const std::map<std::string, std::string>& m, const std::string& key, const std::string& where) {
  auto it = m.find(key);
  RETRACE_CHECK(it != m.end(), FormatError, where, ": shard metadata lacks \"", key, "\"");
  return parse_u64_field(it->second, where + ": metadata \"" + key + "\"");
}

std::map<std::string, std::string> versions() {
  return {{"libtorch", compat::libtorch_version()},
          {"retrace", train::retrace_version()},
          {"cuda_devices", std::to_string(torch::cuda::device_count())}};
}
// A slice of a tensor this rank holds alone (ZeRO's optimizer state) and writes.
struct SlicePart {
  std::string name;
  torch::Tensor tensor;  // contiguous, on the CPU
  SliceOf slice;
};

// The table of the ranks' slices: every rank says which it holds (name, dtype, whole shape, first
// and last element), one all-gather, and every rank builds the same layouts from the answers,
// pieces in rank order. A tensor whose slices do not cover it exactly is an InvariantError (the
// ranks disagree about the split), caught here before anything is committed.
std::vector<TensorLayout> sliced_layouts(const std::vector<SlicePart>& mine, uint32_t rank, uint32_t world,
                                         train::Collective* sync, const std::string& dir) {
  std::ostringstream said;
  for (const SlicePart& s : mine) {
    said << s.name << '\t' << dtype_name(s.tensor.scalar_type()) << '\t' << s.slice.begin << '\t'
         << s.slice.begin + s.tensor.numel() << '\t' << s.slice.whole.size();
    for (int64_t d : s.slice.whole) said << '\t' << d;
    said << '\n';
  }
  const std::vector<std::string> all = sync ? sync->allgather(said.str()) : std::vector<std::string>{said.str()};
  RETRACE_CHECK(all.size() == world, InvariantError, "sliced save: ", all.size(), " answers from ", world, " ranks");
  std::map<std::string, TensorLayout> by_name;
  for (uint32_t r = 0; r < all.size(); ++r) {
    std::istringstream in(all[r]);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string name, dtype;
      uint64_t begin = 0, end = 0;
      size_t dims = 0;
      std::getline(fields, name, '\t');
      std::getline(fields, dtype, '\t');
      fields >> begin >> end >> dims;
      std::vector<int64_t> shape(dims);
      for (auto& d : shape) fields >> d;
      TensorLayout& t = by_name[name];
      if (t.name.empty()) t = {name, dtype, shape, {}};
      RETRACE_CHECK(t.dtype == dtype && t.shape == shape, InvariantError, dir, ": ranks disagree about ", name);
      t.pieces.push_back({sync ? r : rank, begin, end});
    }
  }
  std::vector<TensorLayout> out;
  for (auto& [name, t] : by_name) {
    uint64_t at = 0;
    for (const TensorPiece& p : t.pieces) {
      RETRACE_CHECK(p.begin == at && p.end > p.begin, InvariantError, dir, ": the ranks' slices of ", name,
                    " do not cover it in order (a piece at ", p.begin, " after ", at, ")");
      at = p.end;
    }
    RETRACE_CHECK(at == t.numel(), InvariantError, dir, ": the ranks' slices of ", name, " cover ", at, " of its ",
                  t.numel(), " elements");
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

namespace {

// What one rank writes of a snapshot: every tensor's layout (split among the ranks), the CPU
// copies its pieces are read from, and this rank's pieces as views, each with its (tensor name,
// first element) for the manifest's offsets and hashes once the shard is written.
struct ShardPlan {
  std::vector<TensorLayout> layouts;
  std::vector<torch::Tensor> replicated;  // whole tensors on the CPU, the views' bytes
  std::vector<SlicePart> sliced;          // this rank's slices (ZeRO), the views' bytes
  std::vector<TensorView> views;
  std::vector<std::pair<std::string, uint64_t>> own_pieces;
  bool anchor_apart = false;  // an anchor at an earlier step, stored beside the state
};

// The replicated state (data parallelism keeps parameters, optimizer state and the rollback
// anchor equal on every rank) is written once among the ranks: every rank computes the same split
// (split_among_ranks) and writes its pieces; the RNG state is each rank's own. Under ZeRO the
// optimizer state is each rank's own slices of it, which are its pieces (sliced_layouts).
ShardPlan plan_shard(const StateSnapshot& snap, const StateSnapshot* anchor, train::Collective* sync,
                     const std::string& dir) {
  const uint32_t rank = snap.rank, world = snap.world_size;
  ShardPlan plan;
  auto add = [&](const std::string& name, const torch::Tensor& t) {
    torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
    plan.replicated.push_back(c);
    plan.layouts.push_back(
        {name, dtype_name(c.scalar_type()), std::vector<int64_t>(c.sizes().begin(), c.sizes().end()), {}});
  };
  auto add_optim = [&](const std::string& prefix, const StateSnapshot& s) {
    if (!s.optim_sliced) {
      for (const auto& [name, t] : s.optim) add(prefix + name, t);
      return;
    }
    RETRACE_CHECK(s.optim_slices.size() == s.optim.size(), InvariantError, "a snapshot with ", s.optim.size(),
                  " optimizer tensors and ", s.optim_slices.size(), " slices");
    for (size_t i = 0; i < s.optim.size(); ++i)
      if (s.optim_slices[i].write)
        plan.sliced.push_back(
            {prefix + s.optim[i].first, s.optim[i].second.detach().to(torch::kCPU).contiguous(), s.optim_slices[i]});
  };
  for (const auto& [name, t] : snap.model) add("model/" + name, t);
  add_optim("optim/", snap);
  plan.anchor_apart = anchor && anchor->step != snap.step;
  if (plan.anchor_apart) {
    RETRACE_CHECK(anchor->step < snap.step, InvariantError, "rollback anchor at step ", anchor->step,
                  " is after the checkpoint's step ", snap.step);
    for (const auto& [name, t] : anchor->model) add("anchor/model/" + name, t);
    add_optim("anchor/optim/", *anchor);
  }
  plan.layouts = split_among_ranks(std::move(plan.layouts), world);
  for (size_t i = 0; i < plan.layouts.size(); ++i)
    for (const TensorPiece& p : plan.layouts[i].pieces)
      if (p.rank == rank) {
        plan.views.push_back(piece_view(plan.layouts[i], p, plan.replicated[i].data_ptr()));
        plan.own_pieces.emplace_back(plan.layouts[i].name, p.begin);
      }
  // Every rank takes this branch or none (a rank may hold no slice at all).
  if (snap.optim_sliced || (plan.anchor_apart && anchor->optim_sliced)) {
    std::vector<TensorLayout> own = sliced_layouts(plan.sliced, rank, world, sync, dir);
    for (const SlicePart& part : plan.sliced) {
      const TensorLayout& t = *std::find_if(own.begin(), own.end(),
                                            [&](const TensorLayout& l) { return l.name == part.name; });
      const TensorPiece piece{rank, static_cast<uint64_t>(part.slice.begin),
                              static_cast<uint64_t>(part.slice.begin + part.tensor.numel())};
      // piece_view reads the piece at its offset from the whole tensor's first byte.
      const auto* first = static_cast<const char*>(part.tensor.data_ptr()) -
                          part.slice.begin * part.tensor.element_size();
      plan.views.push_back(piece_view(t, piece, first));
      plan.own_pieces.emplace_back(t.name, piece.begin);
    }
    for (TensorLayout& t : own) plan.layouts.push_back(std::move(t));
  }
  return plan;
}

// The manifest must fit parse_manifest's limits (size, tensors, pieces): tried before any shard is
// written, with the longest values its fields can take, so that a model with too many tensors is a
// ConfigError here rather than a manifest refused after the shards.
void check_manifest_fits(const StateSnapshot& snap, const TracePosition& pos, const std::vector<TensorLayout>& layouts,
                         const std::string& dir) {
  Manifest trial;
  trial.step = snap.step;
  trial.world_size = snap.world_size;
  trial.config_hash = snap.config_hash;
  trial.versions = versions();
  trial.trace_chain_hex = pos.chain.hex();
  for (uint32_t r = 0; r < snap.world_size; ++r)
    trial.shards.push_back({r, shard_file_name(r), uint64_t{1} << 62, std::string(64, '0')});
  trial.tensors = layouts;
  size_t pieces = 0;
  for (TensorLayout& t : trial.tensors)
    for (TensorPiece& p : t.pieces) {
      p.offset = uint64_t{1} << 61;
      p.xxh3.assign(32, '0');
      ++pieces;
    }
  try {
    (void)serialize_manifest(trial);
  } catch (const InvariantError& e) {
    RETRACE_FAIL(ConfigError, "cannot checkpoint step ", snap.step, " in ", dir, ": its manifest would list ",
                 trial.tensors.size(), " tensors in ", pieces, " pieces, over what a manifest may hold (",
                 kMaxManifestBytes, " bytes, ", kMaxManifestTensors, " tensors, ", kMaxManifestPieces,
                 " pieces): ", e.what(),
                 "; a model with fewer tensors checkpoints (or set checkpoint.every_steps = 0)");
  }
}

// The shard's metadata: the counters, the snapshot's own entries, the anchor's, the config hash and
// the trace position.
std::map<std::string, std::string> shard_meta(const StateSnapshot& snap, const StateSnapshot* anchor, bool anchor_apart,
                                              const TracePosition& pos) {
  auto meta = shard_metadata(snap.step, snap.rank, snap.world_size);
  for (const auto& [k, v] : snap.metadata) meta[k] = v;
  if (anchor) meta["anchor.step"] = std::to_string(anchor->step);
  if (anchor_apart)
    for (const auto& [k, v] : anchor->metadata) meta["anchor.m." + k] = v;
  meta["config_hash"] = snap.config_hash;
  meta["trace_position"] = std::to_string(pos.bytes);
  meta["trace_chain"] = pos.chain.hex();
  return meta;
}

// A sharded save stops together: each rank's status ("ok", or "failed", the error's kind and its
// message on one line) goes into every exchange of the save, so that a rank whose part failed (a
// full disk, a refused staging copy) still answers, and every rank fails with it instead of
// waiting for a vote that never comes.
std::string status_of(const std::exception_ptr& failed) {
  if (!failed) return "ok";
  std::string kind = "internal error", text;
  try {
    std::rethrow_exception(failed);
  } catch (const Error& e) {
    kind = e.kind();
    text = e.what();
  } catch (const std::exception& e) {
    text = e.what();
  } catch (...) {
    text = "an exception of unknown type";
  }
  for (char& c : text)
    if (c == '\n' || c == '\t') c = ' ';
  return "failed\t" + kind + "\t" + text;
}

// Throws when a rank's status is a failure: this rank's own error as it was thrown, else the first
// failing rank's as an error of the same kind that names the rank. `statuses` is indexed by rank.
void throw_if_failed(const std::vector<std::string>& statuses, const std::exception_ptr& mine,
                     const std::string& what) {
  if (mine) std::rethrow_exception(mine);
  for (size_t r = 0; r < statuses.size(); ++r) {
    if (statuses[r] == "ok") continue;
    const size_t a = statuses[r].find('\t'), b = statuses[r].find('\t', a + 1);
    const std::string kind = b == std::string::npos ? "" : statuses[r].substr(a + 1, b - a - 1);
    const std::string text = what + " failed on rank " + std::to_string(r) + ": " +
                             (b == std::string::npos ? statuses[r] : statuses[r].substr(b + 1)) +
                             "; nothing was committed";
    if (kind == IoError("").kind()) throw IoError(text);
    if (kind == IntegrityError("").kind()) throw IntegrityError(text);
    if (kind == ConfigError("").kind()) throw ConfigError(text);
    if (kind == FormatError("").kind()) throw FormatError(text);
    throw InvariantError(text);
  }
}

// Every rank's status at one point of a sharded save (one all-gather); throws as throw_if_failed.
void agree(train::Collective& sync, const std::exception_ptr& mine, const std::string& what) {
  throw_if_failed(sync.allgather(status_of(mine)), mine, what);
}

// Phase one of a sharded save: every shard is durable (write_shard fsyncs), or a rank says why
// its is not (`failed`); the ranks gather each one's status and what it wrote (its file, size and
// sha256, and each piece's place and xxh3) into `shards` and `records`, which hold this rank's on
// entry. Throws (throw_if_failed) when any rank failed.
void gather_shards(train::Collective& sync, const std::exception_ptr& failed, const ShardFileInfo& info,
                   std::vector<ShardEntry>& shards, std::vector<PieceRecord>& records, const std::string& what) {
  std::string said = status_of(failed) + "\n";
  if (!failed) {
    said += info.file + "\n" + std::to_string(info.size) + "\n" + info.sha256 + "\n";
    for (const PieceRecord& p : records)
      said += std::to_string(p.begin) + '\t' + std::to_string(p.offset) + '\t' + p.xxh3 + '\t' + p.name + '\n';
  }
  const auto all = sync.allgather(said);
  std::vector<std::string> statuses;
  for (const std::string& one : all) statuses.push_back(one.substr(0, one.find('\n')));
  throw_if_failed(statuses, failed, what);
  shards.clear();
  records.clear();
  for (uint32_t r = 0; r < all.size(); ++r) {
    std::istringstream in(all[r]);
    ShardEntry e;
    e.rank = r;
    std::string status, size, line;
    std::getline(in, status);
    std::getline(in, e.file);
    std::getline(in, size);
    std::getline(in, e.sha256);
    const std::string what_rank = "rank " + std::to_string(r) + "'s report of its shard";
    e.size = parse_u64_field(size, "the size in " + what_rank);
    shards.push_back(e);
    while (std::getline(in, line)) {
      const size_t a = line.find('\t'), b = line.find('\t', a + 1), c = line.find('\t', b + 1);
      RETRACE_CHECK(c != std::string::npos, InvariantError, what_rank, ": a piece line without four fields");
      records.push_back({line.substr(c + 1), r, parse_u64_field(line.substr(0, a), what_rank),
                         parse_u64_field(line.substr(a + 1, b - a - 1), what_rank), line.substr(b + 1, c - b - 1)});
    }
  }
}

}  // namespace

std::string save_snapshot(const StateSnapshot& snap, const std::string& root, const TracePosition& pos,
                          uint32_t keep_last, train::Collective* sync, RotationReport* rotation,
                          const StateSnapshot* anchor, const std::function<void()>& before_commit) {
  const uint64_t step = snap.step;
  const uint32_t rank = snap.rank, world = snap.world_size;
  RETRACE_CHECK(world == 1 || sync, InvariantError, "a sharded save of ", world,
                " ranks needs the ranks (a train::Collective)");
  std::string dir = root + "/" + step_dir_name(step);
  const std::string what = "the save of step " + std::to_string(step) + " in " + dir;
  std::exception_ptr failed;
  if (rank == 0) {
    try {
      dir = prepare_checkpoint_dir(root, step);
    } catch (...) {
      failed = std::current_exception();
    }
  }
  if (sync) agree(*sync, failed, what);
  else if (failed) std::rethrow_exception(failed);

  ShardPlan plan = plan_shard(snap, anchor, sync, dir);
  ShardFileInfo info;
  try {
    check_manifest_fits(snap, pos, plan.layouts, dir);
    plan.views.push_back(
        {"rng/state", "U8", {static_cast<int64_t>(snap.rng.size())}, snap.rng.data(), snap.rng.size()});
    if (plan.anchor_apart)
      plan.views.push_back({"anchor/rng/state",
                            "U8",
                            {static_cast<int64_t>(anchor->rng.size())},
                            anchor->rng.data(),
                            anchor->rng.size()});
    info = write_shard(dir + "/" + shard_file_name(rank), shard_meta(snap, anchor, plan.anchor_apart, pos), plan.views);
    if (before_commit) before_commit();
  } catch (...) {
    if (!sync) throw;
    failed = std::current_exception();  // said in the vote, so that no rank waits for this one's
  }

  // What this rank wrote: its file, and where each of its pieces is in it and its xxh3.
  std::vector<PieceRecord> records;
  if (!failed)
    for (size_t v = 0; v < plan.own_pieces.size(); ++v)
      records.push_back({plan.own_pieces[v].first, rank, plan.own_pieces[v].second, info.offsets[v], info.xxh3[v]});
  std::vector<ShardEntry> shards = {{rank, info.file, info.size, info.sha256}};
  if (sync) gather_shards(*sync, failed, info, shards, records, what);
  if (rank != 0) {
    if (sync) agree(*sync, nullptr, what);  // rank 0's commit, or why it failed
    return dir;
  }
  Manifest m;
  m.step = step;
  m.world_size = world;
  m.config_hash = snap.config_hash;
  m.versions = versions();
  m.rng_format_version = rng::kRngFormatVersion;
  m.trace_position = pos.bytes;
  m.trace_chain_hex = pos.chain.hex();
  m.shards = shards;
  set_piece_records(plan.layouts, records, dir);
  m.tensors = std::move(plan.layouts);
  // Phase two: the manifest is the commit point.
  std::string committed;
  try {
    committed = commit_checkpoint(root, m, keep_last, rotation, /*shards_read_back=*/true);
  } catch (...) {
    if (!sync) throw;
    failed = std::current_exception();
  }
  if (sync) agree(*sync, failed, what);
  return committed;
}

StateSnapshot snapshot_of(train::TrainState& state, const train::StateContext& context, bool copy) {
  StateSnapshot snap;
  snap.step = state.step;
  snap.rank = context.rank;
  snap.world_size = context.world_size;
  snap.model = train::model_state(state);
  snap.optim = train::optimizer_state_of(state, context, &snap.optim_slices);
  snap.optim_sliced = state.zero != nullptr;
  if (copy) {
    for (auto& [name, t] : snap.model) t = t.detach().clone();
    for (auto& [name, t] : snap.optim) t = t.detach().clone();
  }
  snap.rng = train::rng_state(state, context.seed).serialize();
  snap.config_hash = context.config_hash;
  snap.metadata["epoch"] = std::to_string(state.cursor.epoch);
  snap.metadata["batch_in_epoch"] = std::to_string(state.cursor.batch_in_epoch);
  snap.metadata["samples_seen"] = std::to_string(state.samples_seen);
  snap.metadata["optim"] = train::optimizer_name(context.optimizer);
  for (const auto& [k, v] : train::policy_state(state)) snap.metadata["x." + k] = v;
  return snap;
}

void apply_snapshot(train::TrainState& state, const train::StateContext& context, const StateSnapshot& snap,
                    const std::string& where, bool adopt_optim) {
  train::load_model_state(state, snap.model);
  train::load_optimizer_state_of(state, context, snap.optim, adopt_optim);
  rng::RngState rng = rng::RngState::deserialize(snap.rng);
  train::restore_position(state, context, snap.step, rng, parse_u64(snap.metadata, "samples_seen", where));
  std::map<std::string, std::string> extra;
  for (const auto& [k, v] : snap.metadata)
    if (k.rfind("x.", 0) == 0) extra[k.substr(2)] = v;
  train::load_policy_state(state, extra);
}

std::string save_checkpoint(train::TrainState& state, const train::StateContext& context, const std::string& root,
                            const TracePosition& pos, uint32_t keep_last,
                            const std::map<std::string, std::string>& extra, train::Collective* sync,
                            RotationReport* rotation, const StateSnapshot* anchor) {
  StateSnapshot snap = snapshot_of(state, context, /*copy=*/false);
  for (const auto& [k, v] : extra) snap.metadata["x." + k] = v;
  return save_snapshot(snap, root, pos, keep_last, sync, rotation, anchor);
}

namespace {

// The replicated tensors of a ckpt.v2 checkpoint gathered from every shard (read_pieces), and the
// rest of `rank`'s shard (its RNG states and metadata), into `out`. `in_place` (load_snapshot's):
// a model tensor this rank keeps whole is read straight into the live tensor of its name, dtype and
// shape, and the optimizer tensors, fresh, are the snapshot's own (adopted, not copied).
void load_pieces(const std::string& dir, uint32_t rank, LoadedSnapshot& out, StateSnapshot& anchor,
                 const KeepRange& keep, const NamedTensors* in_place) {
  std::map<std::string, torch::Tensor> live;
  if (in_place) live.insert(in_place->begin(), in_place->end());
  const Manifest& m = out.manifest;
  std::vector<torch::Tensor> tensors;
  std::vector<std::pair<uint64_t, uint64_t>> windows;
  std::vector<bool> kept;
  for (const TensorLayout& t : m.tensors) {
    const auto options = torch::TensorOptions().dtype(scalar_type(t.dtype, dir));
    const std::optional<std::pair<uint64_t, uint64_t>> range = keep ? keep(t) : std::nullopt;
    if (range) {
      RETRACE_CHECK(range->first <= range->second && range->second <= t.numel(), FormatError, dir, "/", kManifestFile,
                    ": ", t.name, " has ", t.numel(), " elements, fewer than this rank's range [", range->first, ", ",
                    range->second, ") of it; the checkpoint belongs to another model");
      tensors.push_back(torch::empty({static_cast<int64_t>(range->second - range->first)}, options));
      windows.push_back(*range);
      kept.push_back(range->second > range->first);
    } else {
      torch::Tensor into;
      if (t.name.rfind("model/", 0) == 0) {
        const auto it = live.find(t.name.substr(6));
        if (it != live.end() && it->second.device().is_cpu() && it->second.is_contiguous() &&
            it->second.scalar_type() == options.dtype().toScalarType() &&
            it->second.sizes() == c10::IntArrayRef(t.shape))
          into = it->second.detach();
      }
      tensors.push_back(into.defined() ? into : torch::empty(t.shape, options));
      windows.emplace_back(0, t.numel());
      kept.push_back(true);
    }
  }
  out.bytes_read = read_pieces(
      dir, m, [&](const TensorLayout& t) { return kept[static_cast<size_t>(&t - m.tensors.data())]; },
      [&](size_t i) { return tensors[i].data_ptr(); }, rank,
      [&](const ShardData& shard, const std::map<std::string, std::string>& own) {
        out.where = shard.source;
        out.metadata = shard.metadata;
        for (const auto& [name, bytes] : own) {
          if (name == "rng/state") out.rng = bytes;
          else if (name == "anchor/rng/state") anchor.rng = bytes;
        }
      },
      [&](size_t i) { return windows[i]; });
  out.optim_owned = in_place != nullptr;
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    if (!kept[i]) continue;  // none of it is this rank's
    const std::string& name = m.tensors[i].name;
    if (name.rfind("model/", 0) == 0) out.model.emplace_back(name.substr(6), tensors[i]);
    else if (name.rfind("optim/", 0) == 0) out.optim.emplace_back(name.substr(6), tensors[i]);
    else if (name.rfind("anchor/model/", 0) == 0) anchor.model.emplace_back(name.substr(13), tensors[i]);
    else if (name.rfind("anchor/optim/", 0) == 0) anchor.optim.emplace_back(name.substr(13), tensors[i]);
    else RETRACE_FAIL(FormatError, dir, "/", kManifestFile, ": unexpected tensor ", name, " in \"tensors\"");
  }
}

}  // namespace

namespace {

// An entry's bytes are its tensor's (FormatError naming the shard otherwise).
void check_entry_bytes(const TensorEntry& e, const torch::Tensor& t, const std::string& where) {
  RETRACE_CHECK(static_cast<uint64_t>(t.nbytes()) == e.nbytes, FormatError, where, ": tensor ", e.name, " has ",
                e.nbytes, " bytes for shape ", t.sizes());
}

// A whole shard's tensor into the snapshot or its anchor, by its name's prefix.
void file_entry(const TensorEntry& e, const torch::Tensor& t, LoadedSnapshot& out, StateSnapshot& anchor) {
  if (e.name.rfind("model/", 0) == 0) out.model.emplace_back(e.name.substr(6), t);
  else if (e.name.rfind("optim/", 0) == 0) out.optim.emplace_back(e.name.substr(6), t);
  else if (e.name.rfind("anchor/model/", 0) == 0) anchor.model.emplace_back(e.name.substr(13), t);
  else if (e.name.rfind("anchor/optim/", 0) == 0) anchor.optim.emplace_back(e.name.substr(13), t);
  else RETRACE_FAIL(FormatError, out.where, ": unexpected tensor ", e.name);
}

void check_shard_table(const Manifest& m, const ShardData& shard, const std::string& where);

// A one-rank shard: every tensor whole, left as views of the shard's bytes where their alignment
// allows (every tensor of a shard retrace wrote): the state is read once, into memory it keeps, not
// copied a second time.
void load_whole_shard(const std::string& dir, const Manifest& m, uint32_t rank, LoadedSnapshot& out,
                      StateSnapshot& anchor) {
  auto owner = std::make_shared<ShardData>(load_shard(dir, m, rank, /*check_digest=*/true));
  const ShardData& shard = *owner;
  out.bytes_read = shard.bytes.size();
  out.where = shard.source;
  out.metadata = shard.metadata;
  for (const auto& e : shard.tensors) {
    if (e.name == "rng/state") {
      out.rng.assign(static_cast<const char*>(shard.data(e)), e.nbytes);
      continue;
    }
    if (e.name == "anchor/rng/state") {
      anchor.rng.assign(static_cast<const char*>(shard.data(e)), e.nbytes);
      continue;
    }
    const torch::ScalarType type = scalar_type(e.dtype, out.where);
    void* bytes = const_cast<void*>(shard.data(e));
    torch::Tensor t = torch::from_blob(
        bytes, e.shape, [owner](void*) {}, torch::TensorOptions().dtype(type));
    check_entry_bytes(e, t, out.where);
    if (reinterpret_cast<uintptr_t>(bytes) % c10::elementSize(type) != 0) t = t.clone();  // an aligned copy
    file_entry(e, t, out, anchor);
  }
  check_shard_table(m, shard, out.where);
}

// load_whole_shard with no buffer of the shard's bytes: each tensor read where it will live
// (load_snapshot's `in_place`).
void load_whole_shard_in_place(const std::string& dir, const Manifest& m, uint32_t rank, LoadedSnapshot& out,
                               StateSnapshot& anchor, const NamedTensors& targets) {
  std::map<std::string, torch::Tensor> target(targets.begin(), targets.end());
  std::map<std::string, torch::Tensor> placed;
  const std::string where = "checkpoint " + dir;
  auto place = [&](const ShardData&, const TensorEntry& e) -> char* {
    if (e.name == "rng/state" || e.name == "anchor/rng/state") {
      std::string& rng = e.name == "rng/state" ? out.rng : anchor.rng;
      rng.assign(size_t(e.nbytes), '\0');
      return rng.data();
    }
    const torch::ScalarType type = scalar_type(e.dtype, where);
    torch::Tensor t;
    if (e.name.rfind("model/", 0) == 0) {
      auto it = target.find(e.name.substr(6));
      if (it != target.end() && it->second.device().is_cpu() && it->second.is_contiguous() &&
          it->second.scalar_type() == type && it->second.sizes() == c10::IntArrayRef(e.shape))
        t = it->second.detach();
    }
    if (!t.defined()) t = torch::empty(e.shape, torch::TensorOptions().dtype(type));
    check_entry_bytes(e, t, where);
    placed[e.name] = t;
    return static_cast<char*>(t.data_ptr());
  };
  const ShardData shard = load_shard_into(dir, m, rank, place, out.bytes_read);
  out.where = shard.source;
  out.metadata = shard.metadata;
  for (const auto& e : shard.tensors)
    if (e.name != "rng/state" && e.name != "anchor/rng/state") file_entry(e, placed.at(e.name), out, anchor);
  out.optim_owned = true;
  check_shard_table(m, shard, out.where);
}

// A one-rank ckpt.v2 checkpoint's table lists what its shard must hold.
void check_shard_table(const Manifest& m, const ShardData& shard, const std::string& where) {
  for (const TensorLayout& t : m.tensors) {
    const TensorEntry* e = shard.find(t.name);
    RETRACE_CHECK(e != nullptr && e->dtype == t.dtype && e->shape == t.shape, IntegrityError, "shard ", where,
                  " holds ", e ? e->dtype + " " + c10::str(c10::IntArrayRef(e->shape)) : std::string("no tensor"),
                  " for ", t.name, ", the manifest ", t.dtype, " ", c10::str(c10::IntArrayRef(t.shape)),
                  "; the shard belongs to another checkpoint or was rewritten; resume from an older checkpoint");
  }
}

// The rollback anchor the shard stores (none, the checkpoint's own step, or an earlier state whose
// tensors `anchor` holds), checked against the metadata, into out.anchor.
void read_anchor(const Manifest& m, uint32_t rank, uint32_t world_size, StateSnapshot& anchor, LoadedSnapshot& out) {
  const std::string& where = out.where;
  const std::map<std::string, std::string>& metadata = out.metadata;
  if (metadata.count("anchor.step")) {
    anchor.step = parse_u64(metadata, "anchor.step", where);
    RETRACE_CHECK(anchor.step <= m.step, FormatError, where, ": rollback anchor at step ", anchor.step,
                  " is after the checkpoint's step ", m.step);
    out.anchor_is_self = anchor.step == m.step;
    if (!out.anchor_is_self) {
      RETRACE_CHECK(!anchor.rng.empty(), FormatError, where, ": rollback anchor of step ", anchor.step,
                    " has no anchor/rng/state tensor");
      anchor.rank = rank;
      anchor.world_size = world_size;
      anchor.config_hash = m.config_hash;
      for (const auto& [k, v] : metadata)
        if (k.rfind("anchor.m.", 0) == 0) anchor.metadata[k.substr(9)] = v;
      out.anchor = std::move(anchor);
    }
  } else {
    RETRACE_CHECK(anchor.rng.empty() && anchor.model.empty() && anchor.optim.empty(), FormatError, where,
                  ": anchor tensors without anchor.step");
  }
}

}  // namespace

LoadedSnapshot load_snapshot(const std::string& dir, uint32_t world_size, uint32_t rank, const KeepRange& keep,
                             const NamedTensors* in_place) {
  LoadedSnapshot out;
  // The shards this process parses are hashed from the bytes that are parsed (load_shard, or every
  // shard in read_pieces), the others here.
  // One rank's shard holds every tensor whole: it is read as before, the tensors left as views of
  // its bytes (no second copy of the state in memory); with several ranks the pieces are gathered.
  const Manifest peek = read_checked_manifest(dir, world_size);
  const bool pieces = !peek.tensors.empty() && peek.world_size > 1;
  out.manifest = verify_checkpoint(dir, world_size, pieces ? kEveryShard : rank);
  const Manifest& m = out.manifest;
  RETRACE_CHECK(m.rng_format_version == rng::kRngFormatVersion, FormatError, "checkpoint ", dir,
                " stores RNG state format ", m.rng_format_version, ", this binary reads ", rng::kRngFormatVersion);
  StateSnapshot anchor;
  if (pieces) load_pieces(dir, rank, out, anchor, keep, in_place);
  else if (in_place) load_whole_shard_in_place(dir, m, rank, out, anchor, *in_place);
  else load_whole_shard(dir, m, rank, out, anchor);
  RETRACE_CHECK(!out.rng.empty(), FormatError, out.where, ": no rng/state tensor");
  read_anchor(m, rank, world_size, anchor, out);
  const std::string& where = out.where;
  const std::map<std::string, std::string>& metadata = out.metadata;
  out.position.bytes = parse_u64(metadata, "trace_position", where);
  auto chain_it = metadata.find("trace_chain");
  RETRACE_CHECK(chain_it != metadata.end(), FormatError, where, ": no trace_chain");
  out.position.chain = parse_digest_hex(chain_it->second, where, "chain digest");
  // The manifest says the same, or one of the two was edited: trust neither. (Rank 0 writes the
  // trace; the other ranks' shards carry no position.)
  RETRACE_CHECK(rank != 0 || (m.trace_position == out.position.bytes && m.trace_chain_hex == out.position.chain.hex()),
                IntegrityError, where, ": the shard records trace position ", out.position.bytes, " and chain ",
                out.position.chain.hex(), ", the manifest ", m.trace_position, " and ", m.trace_chain_hex,
                "; one of them was edited after the save; resume from an older checkpoint or restore the files");
  return out;
}

uint64_t metadata_u64(const LoadedSnapshot& s, const std::string& key) { return parse_u64(s.metadata, key, s.where); }

std::optional<NewestSnapshot> load_newest_snapshot(const std::string& root, uint32_t world_size, uint32_t rank,
                                                   std::vector<std::pair<std::string, std::string>>* skipped,
                                                   const KeepRange& keep,
                                                   const std::function<void(const LoadedSnapshot&)>& check,
                                                   train::Collective* ranks, const ManifestCheck& before_read,
                                                   const NamedTensors* in_place) {
  // Each rank reads only what it needs of the other ranks' shards, so each may find damage the
  // others do not see: every candidate is taken by all ranks or skipped by all, with the first
  // complaining rank's reason.
  std::function<std::string(const std::string&)> agree;
  if (ranks)
    agree = [ranks](const std::string& why) {
      const std::vector<std::string> all = ranks->allgather(why);
      if (!why.empty()) return why;
      for (size_t r = 0; r < all.size(); ++r)
        if (!all[r].empty()) return "rank " + std::to_string(r) + " cannot load it: " + all[r];
      return std::string();
    };
  auto attempt = [&](const std::string& dir) {
    if (before_read) {
      // The manifest's verdict first, agreed by the ranks, so that no rank reads the shards of a
      // checkpoint that one of them refuses on its manifest alone.
      std::string why;
      try {
        before_read(read_checked_manifest(dir, world_size));
      } catch (const WorldSizeMismatch&) {
        throw;  // the same on every rank: reported, not skipped (newest_step_dir_that)
      } catch (const Error& e) {
        why = e.what();
      }
      if (agree) why = agree(why);
      RETRACE_CHECK(why.empty(), IntegrityError, why);
    }
    LoadedSnapshot s = load_snapshot(dir, world_size, rank, keep, in_place);
    if (check) check(s);
    return s;
  };
  std::vector<std::pair<std::string, std::string>> skips;
  std::optional<NewestSnapshot> out;
  auto found = newest_step_dir_that(root, attempt, skips, agree);
  if (found) out = NewestSnapshot{found->first, std::move(found->second), {}};
  if (skipped) *skipped = skips;
  if (out) out->skipped = std::move(skips);
  return out;
}

namespace {

// The validation layer: every value of one state a checkpoint holds (its own, or its rollback
// anchor's) against what this rank's state expects, before any of it is applied. Model tensors by
// name, dtype and shape; the optimizer's (check_optimizer_state); the RNG state's format and the
// exact sizes of torch's generator states; the counters; the policies' state (scaler, guards,
// fired faults, batches set aside). FormatError naming the shard and the value.
void check_state_values(const train::TrainState& state, const train::StateContext& context, const NamedTensors& model,
                        const NamedTensors& optim, const std::string& rng,
                        const std::map<std::string, std::string>& metadata, const std::string& where) {
  const NamedTensors expected = train::module_tensors(*state.model.module);
  train::check_model_state(expected, model, where);
  std::set<std::string> known;
  for (const auto& [name, t] : expected) known.insert(name);
  for (const auto& [name, t] : model)
    RETRACE_CHECK(known.count(name), FormatError, where, ": model tensor ", name,
                  " is not a parameter or buffer of this model; the checkpoint belongs to another model");
  const train::ZeroShard* zero = state.zero.get();
  const std::function<int64_t(size_t)> part_length = zero ? train::zero_part_lengths(*zero) : nullptr;
  train::check_optimizer_state(optim, *state.model.module, context.optimizer, where, zero ? &part_length : nullptr);
  rng::RngState r;
  try {
    r = rng::RngState::deserialize(rng);
  } catch (const FormatError& e) {
    RETRACE_FAIL(FormatError, where, ": ", e.what());
  }
  rng::check_restorable(r, context.cuda_device, where);
  parse_u64(metadata, "samples_seen", where);
  std::map<std::string, std::string> policy;
  for (const auto& [k, v] : metadata)
    if (k.rfind("x.", 0) == 0) policy[k.substr(2)] = v;
  try {
    train::check_policy_state(state, policy);
  } catch (const FormatError& e) {
    RETRACE_FAIL(FormatError, where, ": ", e.what());
  }
}

void check_snapshot_values(const train::TrainState& state, const train::StateContext& context,
                           const LoadedSnapshot& snap) {
  check_state_values(state, context, snap.model, snap.optim, snap.rng, snap.metadata, snap.where);
  if (snap.anchor && !snap.anchor_is_self) {
    const StateSnapshot& a = *snap.anchor;
    check_state_values(state, context, a.model, a.optim, a.rng, a.metadata, snap.where + " (its rollback anchor)");
  }
}

// values_checked: load_newest_snapshot's predicate already ran check_snapshot_values on it.
RestoredState restore(train::TrainState& state_to, const train::StateContext& context, const std::string& dir,
                      LoadedSnapshot snap, bool values_checked, const Reshard* reshard = nullptr) {
  // The config is checked before any tensor is applied: the manifest holds its hash.
  const std::string cfg_hash = reshard ? reshard->config_hash : context.config_hash;
  const Manifest& m = snap.manifest;
  RETRACE_CHECK(m.config_hash == cfg_hash, ConfigError, "checkpoint ", dir,
                " was made with another config (config hash ", m.config_hash.substr(0, 12), ", this run's is ",
                cfg_hash.substr(0, 12), "); resume with the run directory's own config.toml");
  auto meta_it = snap.metadata.find("optim");
  RETRACE_CHECK(meta_it != snap.metadata.end() && meta_it->second == train::optimizer_name(context.optimizer),
                FormatError, snap.where, ": optimizer in checkpoint does not match optim.name");
  if (!values_checked) check_snapshot_values(state_to, context, snap);

  StateSnapshot state;
  state.step = m.step;
  state.model = std::move(snap.model);
  state.optim = std::move(snap.optim);
  state.rng = snap.rng;
  state.metadata = snap.metadata;
  apply_snapshot(state_to, context, state, snap.where, snap.optim_owned);
  if (reshard && reshard->from_world != context.world_size && !context.invariant) {
    // Per-rank counts and streams: scaled, and re-keyed on the ranks the checkpoint did not have.
    const uint64_t seen = metadata_u64(snap, "samples_seen") * reshard->from_world / context.world_size;
    rng::RngState rng = rng::RngState::deserialize(state.rng);
    train::restore_position(state_to, context, m.step, rng, seen);
    if (context.rank >= reshard->from_world)
      rng::seed_cpu_and_device(train::rank_seed(rng::mix_key(context.seed, m.step), context.rank), context.cuda_device);
  }

  RestoredState out;
  out.dir = dir;
  out.bytes_read = snap.bytes_read;
  out.manifest = m;
  out.position = snap.position;
  for (const auto& [k, v] : snap.metadata)
    if (k.rfind("x.", 0) == 0) out.extra[k.substr(2)] = v;
  if (snap.anchor_is_self) out.anchor = snapshot_of(state_to, context, /*copy=*/true);
  else out.anchor = std::move(snap.anchor);
  return out;
}

}  // namespace

// A ZeRO rank keeps its range of each optimizer tensor (the owned part of its parameter), the step
// count of a parameter it owns part of, and nothing of the others; every other tensor whole (the
// parameters, and a rollback anchor's state).
KeepRange keep_of(const train::TrainState& state) {
  const train::ZeroShard* zero = state.zero.get();
  if (!zero) return {};
  std::map<std::string, std::pair<uint64_t, uint64_t>> part_of;
  std::map<std::string, std::vector<int64_t>> shape_of;
  std::vector<std::string> names;
  for (const auto& item : state.model.module->named_parameters()) {
    shape_of[item.key()] = item.value().sizes().vec();
    names.push_back(item.key());
  }
  for (const auto& part : zero->mine())
    part_of[names[part.param]] = {static_cast<uint64_t>(part.begin), static_cast<uint64_t>(part.end)};
  return [part_of = std::move(part_of),
          shape_of = std::move(shape_of)](const TensorLayout& t) -> std::optional<std::pair<uint64_t, uint64_t>> {
    // A rollback anchor stored with the checkpoint is kept whole: it is saved again as it was.
    if (t.name.rfind("optim/", 0) != 0) return std::nullopt;
    const std::string rest = t.name.substr(6);
    const size_t slash = rest.rfind('/');
    if (slash == std::string::npos) return std::nullopt;
    const std::string param = rest.substr(0, slash);
    auto it = part_of.find(param);
    if (rest.substr(slash + 1) == "step")
      return it == part_of.end() ? std::optional<std::pair<uint64_t, uint64_t>>({0, 0}) : std::nullopt;
    // Only part of it is read: its shape is checked here, as loading a whole one checks it.
    auto shape = shape_of.find(param);
    RETRACE_CHECK(shape != shape_of.end() && shape->second == t.shape, FormatError, "optimizer state entry ", rest,
                  " has shape ", c10::IntArrayRef(t.shape), " in the checkpoint's manifest, the model's parameter ",
                  shape == shape_of.end() ? std::string("does not exist") : c10::str(c10::IntArrayRef(shape->second)),
                  "; the checkpoint belongs to another model");
    if (it == part_of.end()) return std::pair<uint64_t, uint64_t>{0, 0};
    return it->second;
  };
}

RestoredState load_checkpoint(train::TrainState& state, const train::StateContext& context, const std::string& dir) {
  return restore(state, context, dir, load_snapshot(dir, context.world_size, context.rank, keep_of(state)),
                 /*values_checked=*/false);
}

std::optional<RestoredState> load_newest_checkpoint(train::TrainState& state, const train::StateContext& context,
                                                    const std::string& root,
                                                    std::vector<std::pair<std::string, std::string>>* skipped,
                                                    const Reshard* reshard, train::Collective* ranks,
                                                    const ManifestCheck& before_read, bool in_place) {
  const uint32_t world = reshard ? reshard->from_world : context.world_size;
  const uint32_t rank = reshard && context.rank >= reshard->from_world ? 0 : context.rank;
  const NamedTensors targets = in_place ? train::model_state(state) : NamedTensors{};
  auto newest = load_newest_snapshot(
      root, world, rank, skipped, keep_of(state),
      [&state, &context](const LoadedSnapshot& s) { check_snapshot_values(state, context, s); }, ranks, before_read,
      in_place ? &targets : nullptr);
  if (!newest) return std::nullopt;
  return restore(state, context, newest->dir, std::move(newest->snapshot), /*values_checked=*/true, reshard);
}

std::optional<Manifest> newest_checkpoint_manifest(const std::string& root) {
  std::vector<std::pair<std::string, std::string>> skips;
  auto found = newest_step_dir_that(
      root, [](const std::string& dir) { return read_checked_manifest(dir, std::nullopt); }, skips);
  if (!found) return std::nullopt;
  return found->second;
}

}  // namespace retrace::ckpt
