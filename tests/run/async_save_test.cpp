// The background save's parts (src/run/async_save.h): the staging buffer, the check of a staged
// copy against its step's digests, and a save on the writer thread whose shard is byte for byte
// the synchronous save's.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <random>
#include <thread>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/verify.h"
#include "core/disk_wait.h"
#include "core/error.h"
#include "run/async_save.h"
#include "testing/fake_ranks.h"
#include "testing/temp_dir.h"
#include "train/step_digests.h"

namespace retrace::run {
namespace {

namespace fsys = std::filesystem;

using testing::TempDir;

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

ckpt::StateSnapshot a_state(uint64_t step, float shift) {
  ckpt::StateSnapshot s;
  s.step = step;
  s.model = {{"fc.bias", torch::arange(8, torch::kFloat32) + shift},
             {"fc.weight", torch::linspace(-1, 1, 96).reshape({8, 12}) * (1 + shift)}};
  s.optim = {{"fc.bias/exp_avg", torch::full({8}, 0.25f + shift)},
             {"fc.weight/exp_avg", torch::linspace(0, 3, 96).reshape({8, 12})}};
  s.rng = "rng state of step " + std::to_string(step);
  s.config_hash = "cafe";
  s.metadata = {{"epoch", "0"}, {"batch_in_epoch", std::to_string(step)}, {"samples_seen", "64"}, {"optim", "adamw"}};
  return s;
}

// What the trace would hold for the state: its digests and each tensor's share.
StepProof proof_of(const ckpt::StateSnapshot& s, DigestKind kind) {
  StepProof p;
  p.step = s.step;
  p.kind = kind;
  p.param = digest_named(s.model, kind, nullptr, &p.parts.model);
  p.optim = digest_named(s.optim, kind, nullptr, &p.parts.optim);
  p.parts.step = s.step;
  p.parts.with_optimizer = true;
  p.rng = train::rng_digest(s.rng);
  return p;
}

SaveOutcome save_on_writer(const ckpt::StateSnapshot& staged, const StepProof& proof, const std::string& root) {
  BackgroundSave writer;
  BackgroundSave::Job job;
  job.snapshot = staged;
  job.root = root;
  job.keep_last = 3;
  job.proof = proof;
  writer.start(std::move(job));
  EXPECT_TRUE(writer.in_flight());
  return *writer.wait();
}

TEST(AsyncSave, TheShardOfABackgroundSaveIsTheSynchronousSavesByteForByte) {
  TempDir sync_root, async_root;
  const ckpt::StateSnapshot live = a_state(10, 0.5f);
  const std::string sync_dir = ckpt::save_snapshot(live, sync_root.path(), {}, 3);
  StagingBuffer staging;
  const ckpt::StateSnapshot staged = staging.stage(live);
  EXPECT_EQ(staging.bytes(), uint64_t{(8 + 96) * 4 * 2});
  const SaveOutcome out = save_on_writer(staged, proof_of(live, DigestKind::kLanes), async_root.path());
  ASSERT_FALSE(out.error);
  EXPECT_EQ(out.step, 10u);
  EXPECT_EQ(fsys::path(out.dir).filename(), fsys::path(sync_dir).filename());
  const std::string shard = "/" + ckpt::shard_file_name(0);
  const std::string a = file_bytes(sync_dir + shard), b = file_bytes(out.dir + shard);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  EXPECT_TRUE(fsys::exists(out.dir + "/manifest.json"));
}

// A resume's read in place (load_snapshot with `in_place`): the model's bytes land in the live
// tensors themselves, everything else in tensors of the snapshot's own (adopted, not copied), and
// every value is the buffered load's; a live tensor of another shape is left alone.
TEST(AsyncSave, AShardReadInPlaceFillsTheLiveTensorsWithTheBufferedLoadsValues) {
  TempDir root;
  const ckpt::StateSnapshot live = a_state(10, 0.5f);
  ckpt::StateSnapshot anchor = a_state(5, 0.25f);
  const std::string dir = ckpt::save_snapshot(live, root.path(), {}, 3, nullptr, nullptr, &anchor);
  const ckpt::LoadedSnapshot buffered = ckpt::load_snapshot(dir, 1, 0);
  const NamedTensors targets = {{"fc.bias", torch::zeros({8})}, {"fc.weight", torch::zeros({8, 12})}};
  const ckpt::LoadedSnapshot placed = ckpt::load_snapshot(dir, 1, 0, {}, &targets);
  EXPECT_TRUE(placed.optim_owned);
  EXPECT_FALSE(buffered.optim_owned);
  ASSERT_EQ(placed.model.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(placed.model[i].first, buffered.model[i].first);
    EXPECT_TRUE(torch::equal(placed.model[i].second, buffered.model[i].second)) << placed.model[i].first;
  }
  EXPECT_EQ(placed.model[0].second.data_ptr(), targets[0].second.data_ptr());
  EXPECT_EQ(placed.model[1].second.data_ptr(), targets[1].second.data_ptr());
  EXPECT_TRUE(torch::equal(targets[1].second, live.model[1].second));
  ASSERT_EQ(placed.optim.size(), buffered.optim.size());
  for (size_t i = 0; i < placed.optim.size(); ++i)
    EXPECT_TRUE(torch::equal(placed.optim[i].second, buffered.optim[i].second)) << placed.optim[i].first;
  EXPECT_EQ(placed.rng, buffered.rng);
  EXPECT_EQ(placed.metadata, buffered.metadata);
  EXPECT_EQ(placed.bytes_read, buffered.bytes_read);
  ASSERT_TRUE(placed.anchor.has_value() && buffered.anchor.has_value());
  EXPECT_EQ(placed.anchor->rng, buffered.anchor->rng);
  ASSERT_EQ(placed.anchor->model.size(), 2u);
  EXPECT_TRUE(torch::equal(placed.anchor->model[1].second, anchor.model[1].second));
  // A live tensor of another shape is not written: the snapshot's tensor is its own.
  const NamedTensors other = {{"fc.bias", torch::zeros({8})}, {"fc.weight", torch::zeros({12, 8})}};
  const ckpt::LoadedSnapshot apart = ckpt::load_snapshot(dir, 1, 0, {}, &other);
  EXPECT_NE(apart.model[1].second.data_ptr(), other[1].second.data_ptr());
  EXPECT_TRUE(torch::equal(apart.model[1].second, live.model[1].second));
  EXPECT_EQ(other[1].second.abs().sum().item<float>(), 0.0f);
}

TEST(AsyncSave, TheStagingBufferIsReusedAndHoldsTheLatestValues) {
  StagingBuffer staging;
  const ckpt::StateSnapshot first = staging.stage(a_state(10, 0.5f));
  const void* where = first.model[1].second.data_ptr();
  const ckpt::StateSnapshot live = a_state(20, 2.0f);
  const ckpt::StateSnapshot second = staging.stage(live);
  EXPECT_EQ(second.model[1].second.data_ptr(), where);  // no fresh pages per save
  EXPECT_TRUE(torch::equal(second.model[1].second, live.model[1].second));
  EXPECT_NE(second.model[1].second.data_ptr(), live.model[1].second.data_ptr());
  EXPECT_EQ(second.step, 20u);
  EXPECT_EQ(second.rng, live.rng);
  // Another shape: the buffer makes a tensor of the new shape.
  ckpt::StateSnapshot wider = a_state(30, 1.0f);
  wider.model[1].second = torch::ones({8, 13});
  const ckpt::StateSnapshot third = staging.stage(wider);
  EXPECT_EQ(third.model[1].second.sizes(), (std::vector<int64_t>{8, 13}));
}

TEST(AsyncSave, EveryDigestKindChecksAnUntouchedCopy) {
  for (DigestKind kind : {DigestKind::kXxh3, DigestKind::kLanes, DigestKind::kMixed, DigestKind::kMixed4}) {
    StagingBuffer staging;
    const ckpt::StateSnapshot live = a_state(10, 0.5f);
    EXPECT_NO_THROW(check_staged(staging.stage(live), proof_of(live, kind), "here")) << static_cast<int>(kind);
  }
}

TEST(AsyncSave, AFlippedBitInTheStagingCopyNamesTheTensorAndCommitsNothing) {
  TempDir root;
  const ckpt::StateSnapshot older = a_state(10, 0.5f);
  ckpt::save_snapshot(older, root.path(), {}, 3);
  const std::string latest = file_bytes(root.path() + "/LATEST");
  for (const std::string tensor : {"optim/fc.weight/exp_avg", "model/fc.bias"}) {
    StagingBuffer staging;
    const ckpt::StateSnapshot live = a_state(20, 1.0f);
    ckpt::StateSnapshot staged = staging.stage(live);
    corrupt_staged(staged, tensor);
    const SaveOutcome out = save_on_writer(staged, proof_of(live, DigestKind::kLanes), root.path());
    ASSERT_TRUE(out.error);
    EXPECT_FALSE(out.disk_error);
    try {
      std::rethrow_exception(out.error);
    } catch (const IntegrityError& e) {
      EXPECT_NE(std::string(e.what()).find("staged copy of " + tensor + " differs"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(out.dir.empty());
    EXPECT_FALSE(fsys::exists(root.path() + "/" + ckpt::step_dir_name(20) + "/manifest.json"));
    EXPECT_EQ(file_bytes(root.path() + "/LATEST"), latest);
  }
}

TEST(AsyncSave, AnotherRngStateIsCaught) {
  const ckpt::StateSnapshot live = a_state(10, 0.5f);
  StepProof proof = proof_of(live, DigestKind::kLanes);
  ckpt::StateSnapshot staged = StagingBuffer().stage(live);
  staged.rng[0] ^= 1;
  EXPECT_THROW(check_staged(staged, proof, "here"), IntegrityError);
}

TEST(AsyncSave, AnOptimizerTheRecordDidNotDigestIsNotChecked) {
  const ckpt::StateSnapshot live = a_state(10, 0.5f);
  StepProof proof = proof_of(live, DigestKind::kLanes);
  proof.parts.with_optimizer = false;  // trace.optimizer_digest_every > 1 and not this step
  ckpt::StateSnapshot staged = StagingBuffer().stage(live);
  corrupt_staged(staged, "optim/fc.bias/exp_avg");
  EXPECT_NO_THROW(check_staged(staged, proof, "here"));
  corrupt_staged(staged, "model/fc.weight");
  EXPECT_THROW(check_staged(staged, proof, "here"), IntegrityError);
}

TEST(AsyncSave, CorruptStagingOfATensorTheCheckpointLacksIsAConfigError) {
  ckpt::StateSnapshot staged = StagingBuffer().stage(a_state(10, 0.5f));
  try {
    corrupt_staged(staged, "model/fc2.weight");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model/fc.weight"), std::string::npos) << e.what();
  }
}

TEST(AsyncSave, ADigestPartNamesItsTensorAndThePartsDoNotChangeTheDigest) {
  const ckpt::StateSnapshot s = a_state(10, 0.5f);
  DigestParts parts;
  EXPECT_EQ(digest_named(s.model, DigestKind::kLanes, nullptr, &parts), digest_named(s.model, DigestKind::kLanes));
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].first, "fc.bias");
  EXPECT_NE(parts[0].second, parts[1].second);
}

// A rank of a FakeWorld for a writer thread, which takes no turns otherwise: each collective takes
// the world's turn around it. A writer votes with all-gathers and barriers only.
class WriterRank final : public train::Collective {
 public:
  WriterRank(testing::FakeWorld& world, int rank) : world_(world), rank_(world, rank) {}
  uint32_t rank() const override { return rank_.rank(); }
  uint32_t world_size() const override { return rank_.world_size(); }
  void allreduce_grads(const std::vector<torch::Tensor>&, uint64_t, train::CollectiveStats&) override { no(); }
  float allreduce_sum(float, train::CollectiveStats&) override { no(); }
  std::vector<torch::Tensor> alltoall(const std::vector<torch::Tensor>&, const std::vector<int64_t>&,
                                      train::CollectiveStats&) override {
    no();
  }
  torch::Tensor alltoall_rows(const torch::Tensor&, train::CollectiveStats&) override { no(); }
  std::vector<torch::Tensor> allgather_tensor(const torch::Tensor&, train::CollectiveStats&) override { no(); }
  std::vector<std::string> allgather(const std::string& mine) override {
    std::lock_guard<std::mutex> turn(world_.turn);
    return rank_.allgather(mine);
  }
  void barrier() override {
    std::lock_guard<std::mutex> turn(world_.turn);
    rank_.barrier();
  }

 private:
  [[noreturn]] static void no() {
    RETRACE_FAIL(InvariantError, "a writer thread's vote used a collective of the loop's");
  }
  testing::FakeWorld& world_;
  testing::FakeRank rank_;
};

// Step 20's state (a_state) saved by two ranks' writer threads, each with its own RNG state
// ("rng of rank R"), voting on a group of their own; `corrupt_rank1`: rank 1's staged copy of
// model/fc.bias flipped. The two outcomes.
std::pair<SaveOutcome, SaveOutcome> save_on_two_ranks(const std::string& root, bool corrupt_rank1) {
  testing::FakeWorld world(2);
  WriterRank ranks[2] = {{world, 0}, {world, 1}};
  BackgroundSave writers[2];
  for (uint32_t r = 0; r < 2; ++r) {
    ckpt::StateSnapshot live = a_state(20, 1.0f);
    live.rank = r;
    live.world_size = 2;
    live.rng = "rng of rank " + std::to_string(r);
    BackgroundSave::Job job;
    job.snapshot = StagingBuffer().stage(live);
    if (corrupt_rank1 && r == 1) corrupt_staged(job.snapshot, "model/fc.bias");
    job.root = root;
    job.keep_last = 3;
    job.sync = &ranks[r];
    job.proof = proof_of(live, DigestKind::kLanes);
    writers[r].start(std::move(job));
  }
  SaveOutcome out0 = *writers[0].wait(), out1 = *writers[1].wait();
  return {std::move(out0), std::move(out1)};
}

// Two ranks' writer threads vote on a group of their own: a save whose staged copy is refused on
// rank 1 alone fails on both ranks (rank 0 names rank 1 and the tensor) and commits nothing; the
// same save untouched commits once, for both.
// The writer's loan (checkpoint.lend_lane) is a lane lent while the writer works and given back to
// the step while it waits on the disk: lanes_lent() is 1 outside a DiskWait on the writer's thread,
// 0 inside it (nested or not) and after the loan ends; the lent seconds leave the waits out.
TEST(AsyncSave, TheWritersLaneGoesBackToTheStepWhileItWaitsOnTheDisk) {
  const int lanes_before = model::configured_lanes();
  model::set_lanes(3);
  {
    WriterLaneLoan loan;
    EXPECT_EQ(model::lanes_lent(), 1);
    EXPECT_EQ(model::lanes(), 2);
    const auto start = std::chrono::steady_clock::now();
    {
      const fs::DiskWait waiting;
      EXPECT_EQ(model::lanes_lent(), 0);
      EXPECT_EQ(model::lanes(), 3);
      {
        const fs::DiskWait nested;
        EXPECT_EQ(model::lanes_lent(), 0);
      }
      EXPECT_EQ(model::lanes_lent(), 0) << "the outer wait goes on";
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    EXPECT_EQ(model::lanes_lent(), 1) << "taken again after the wait";
    std::thread other([] {
      const fs::DiskWait elsewhere;  // another thread's wait is not the writer's
      EXPECT_EQ(model::lanes_lent(), 1);
    });
    other.join();
    const double all = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(loan.seconds_lent(), all - 0.25) << "the 0.3 s wait is not lent time";
  }
  EXPECT_EQ(model::lanes_lent(), 0);
  {
    const fs::DiskWait after;  // the hooks went with the loan
    EXPECT_EQ(model::lanes_lent(), 0);
  }
  model::set_lanes(lanes_before);
}

TEST(AsyncSave, TwoRanksWriterThreadsCommitTogetherOrNotAtAll) {
  TempDir root;
  for (const bool corrupt : {true, false}) {
    const auto [out0, out1] = save_on_two_ranks(root.path(), corrupt);
    const std::string manifest = root.path() + "/" + ckpt::step_dir_name(20) + "/manifest.json";
    if (corrupt) {
      ASSERT_TRUE(out0.error && out1.error);
      for (const auto& [rank, out] : {std::pair{0, &out0}, std::pair{1, &out1}}) {
        try {
          std::rethrow_exception(out->error);
        } catch (const IntegrityError& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find("staged copy of model/fc.bias differs"), std::string::npos) << what;
          EXPECT_EQ(what.find("failed on rank 1") != std::string::npos, rank == 0) << what;
        }
      }
      EXPECT_FALSE(fsys::exists(manifest));
    } else {
      ASSERT_FALSE(out0.error || out1.error);
      EXPECT_EQ(out0.dir, out1.dir);
      ASSERT_TRUE(fsys::exists(manifest));
      EXPECT_EQ(ckpt::verify_checkpoint(out0.dir, 2).shards.size(), 2u);
    }
  }
}

// A resume's read in place of a checkpoint in pieces (two ranks, ckpt.v3): on each rank, the own
// shard streams into the pieces' places and the other's pieces are read by range; the model's
// tensors are the live ones, filled with the buffered load's values; the optimizer's are the
// snapshot's own, equal to the buffered load's, whole or (a ZeRO rank's window) in part; the RNG
// state is the rank's own.
TEST(AsyncSave, PiecesReadInPlaceFillTheLiveTensorsOnEveryRank) {
  TempDir root;
  const ckpt::StateSnapshot live = a_state(20, 1.0f);
  const auto [out0, out1] = save_on_two_ranks(root.path(), /*corrupt_rank1=*/false);
  ASSERT_FALSE(out0.error || out1.error);
  ASSERT_FALSE(ckpt::verify_checkpoint(out0.dir, 2).tensors.empty()) << "a checkpoint in pieces";
  // A ZeRO rank's window: of each optimizer tensor, elements [3, 7).
  const ckpt::KeepRange window = [](const ckpt::TensorLayout& t) -> std::optional<std::pair<uint64_t, uint64_t>> {
    if (t.name.rfind("optim/", 0) == 0) return std::pair<uint64_t, uint64_t>{3, 7};
    return std::nullopt;
  };
  for (uint32_t r = 0; r < 2; ++r) {
    for (const bool zero : {false, true}) {
      const ckpt::KeepRange keep = zero ? window : ckpt::KeepRange{};
      const ckpt::LoadedSnapshot buffered = ckpt::load_snapshot(out0.dir, 2, r, keep);
      const NamedTensors targets = {{"fc.bias", torch::zeros({8})}, {"fc.weight", torch::zeros({8, 12})}};
      const ckpt::LoadedSnapshot placed = ckpt::load_snapshot(out0.dir, 2, r, keep, &targets);
      EXPECT_TRUE(placed.optim_owned);
      EXPECT_FALSE(buffered.optim_owned);
      EXPECT_EQ(placed.rng, "rng of rank " + std::to_string(r));
      EXPECT_EQ(placed.rng, buffered.rng);
      EXPECT_EQ(placed.metadata, buffered.metadata);
      EXPECT_EQ(placed.bytes_read, buffered.bytes_read);
      ASSERT_EQ(placed.model.size(), 2u);
      for (size_t i = 0; i < 2; ++i) {
        const auto& [name, t] = placed.model[i];
        const auto target = name == "fc.bias" ? targets[0].second : targets[1].second;
        EXPECT_EQ(t.data_ptr(), target.data_ptr()) << name << " rank " << r;
        const auto want = name == "fc.bias" ? live.model[0].second : live.model[1].second;
        EXPECT_TRUE(torch::equal(target, want)) << name << " rank " << r;
      }
      ASSERT_EQ(placed.optim.size(), buffered.optim.size());
      for (size_t i = 0; i < placed.optim.size(); ++i) {
        EXPECT_EQ(placed.optim[i].first, buffered.optim[i].first);
        EXPECT_TRUE(torch::equal(placed.optim[i].second, buffered.optim[i].second)) << placed.optim[i].first;
        if (zero) {
          EXPECT_EQ(placed.optim[i].second.numel(), 4) << placed.optim[i].first;
        }
      }
    }
  }
}

// --- SIGKILL during background saves -------------------------------------------------------
// A child process (this test binary again, told by RETRACE_ASYNC_SAVE_CHILD=ROOT) saves step after
// step in the background, as the loop does: stage the step's state, hand it to the writer, then
// "train" on (the live tensors change while the writer writes the staged copy), and take the
// outcome. The parent SIGKILLs it at random moments: every committed checkpoint verifies, LATEST
// names a committed one, and the newest holds exactly its own step's state (not the state the
// loop went on to), so a resume from it is bitwise.

constexpr int64_t kSigkillElements = 1 << 21;  // 8 MB a tensor, 32 MB a checkpoint

ckpt::StateSnapshot state_of_step(uint64_t step) {
  ckpt::StateSnapshot s;
  s.step = step;
  const float at = static_cast<float>(step);
  s.model = {{"a", torch::arange(kSigkillElements, torch::kFloat32).add_(at)},
             {"b", torch::full({kSigkillElements}, at * 0.5f)}};
  s.optim = {{"a/exp_avg", torch::full({kSigkillElements}, -at)},
             {"b/exp_avg", torch::full({kSigkillElements}, at + 1)}};
  s.rng = "rng of step " + std::to_string(step);
  s.config_hash = "cafe";
  s.metadata = {{"epoch", "0"}, {"batch_in_epoch", std::to_string(step)}, {"samples_seen", "1"}, {"optim", "adamw"}};
  return s;
}

// The file a saving child creates once it has started (beside ROOT, not in it), so that the parent
// times its kill from there and not from a guess at how long LibTorch takes to load.
std::string ready_file(const std::string& root, pid_t pid) { return root + ".ready-" + std::to_string(pid); }

[[noreturn]] void child_background_saves(const std::string& root) {
  try {
    std::ofstream(ready_file(root, ::getpid())) << "started\n";
    const auto newest = ckpt::find_newest_valid(root, 1);
    StagingBuffer staging;
    BackgroundSave writer;
    for (uint64_t step = newest ? newest->manifest.step + 1 : 1;; ++step) {
      ckpt::StateSnapshot live = state_of_step(step);
      BackgroundSave::Job job;
      job.snapshot = staging.stage(live);
      job.proof = proof_of(live, DigestKind::kLanes);
      job.root = root;
      job.keep_last = 3;
      writer.start(std::move(job));
      for (auto& [name, t] : live.model) t.add_(1);  // the next step writes into the live state
      if (writer.wait()->error) _exit(2);
    }
  } catch (...) {
    _exit(3);
  }
}

const bool kIsSaverChild = [] {
  if (const char* root = std::getenv("RETRACE_ASYNC_SAVE_CHILD")) child_background_saves(root);
  return false;
}();

TEST(AsyncSave, SigkillDuringBackgroundSavesLeavesTheNewestCommittedStepsOwnState) {
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  TempDir tmp;
  const std::string root = tmp.path() + "/checkpoints";
  fsys::create_directories(root);
  const auto t0 = std::chrono::steady_clock::now();
  {
    TempDir probe;
    save_on_writer(StagingBuffer().stage(state_of_step(1)), proof_of(state_of_step(1), DigestKind::kLanes),
                   probe.path());
  }
  const double save_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::uniform_real_distribution<double> kill_after(0.0, 3.0 * save_ms);
  const std::string variable = "RETRACE_ASYNC_SAVE_CHILD=" + root;
  std::vector<char*> env;
  for (char** e = environ; *e; ++e) env.push_back(*e);
  env.push_back(const_cast<char*>(variable.c_str()));
  env.push_back(nullptr);
  char self[] = "/proc/self/exe";
  char* argv[] = {self, nullptr};
  int resumable = 0, interrupted = 0;
  for (int trial = 0; trial < 12; ++trial) {
    pid_t pid = 0;
    ASSERT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, env.data()), 0);
    // The child's process start (LibTorch's) first, however long a loaded machine makes it, then a
    // point within its saves.
    const auto spawned = std::chrono::steady_clock::now();
    while (!fsys::exists(ready_file(root, pid)) &&
           std::chrono::steady_clock::now() - spawned < std::chrono::seconds(60))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(kill_after(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the saving child ended by itself with status " << status << ", seed " << seed;
    uint64_t newest = 0;
    for (const auto& [step, dir] : ckpt::list_step_dirs(root)) {
      if (!fsys::exists(dir + "/manifest.json")) {
        interrupted += step > newest;
        continue;
      }
      newest = std::max(newest, step);
      EXPECT_NO_THROW(ckpt::verify_checkpoint(dir, 1)) << dir << ", seed " << seed;
    }
    if (newest == 0) continue;
    ++resumable;
    // LATEST is written after the commit, so a kill between them leaves it naming the one before
    // (or, at the first commit, not there yet: a hint, never trusted on load), but never a step
    // without a manifest.
    if (fsys::exists(root + "/LATEST")) {
      const std::string latest = file_bytes(root + "/LATEST").substr(0, 13);
      EXPECT_TRUE(fsys::exists(root + "/" + latest + "/manifest.json")) << latest << ", seed " << seed;
    }
    const ckpt::LoadedSnapshot back = ckpt::load_snapshot(root + "/" + ckpt::step_dir_name(newest), 1, 0);
    const ckpt::StateSnapshot want = state_of_step(newest);
    ASSERT_EQ(back.model.size(), want.model.size());
    for (size_t i = 0; i < want.model.size(); ++i)
      EXPECT_TRUE(torch::equal(back.model[i].second, want.model[i].second))
          << want.model[i].first << " of step " << newest << ", seed " << seed;
    for (size_t i = 0; i < want.optim.size(); ++i)
      EXPECT_TRUE(torch::equal(back.optim[i].second, want.optim[i].second)) << want.optim[i].first;
    EXPECT_EQ(back.rng, want.rng);
  }
  std::cout << "background-save kills: one save took " << save_ms << " ms; " << resumable
            << " kills left a committed checkpoint, " << interrupted << " an interrupted save beyond it; seed " << seed
            << "\n";
  EXPECT_GT(resumable, 0) << "no kill left a committed checkpoint (one save took " << save_ms << " ms)";
}

}  // namespace
}  // namespace retrace::run
