// Crash consistency: a child process saves checkpoints in a loop and is SIGKILLed at random
// moments. After every kill, find_newest_valid must return a checkpoint that verifies fully and
// holds exactly the bytes of its step, and every directory that has a manifest must verify
// (a kill cannot lose data the kernel already has, so a manifest is never ahead of its shards).
// 30 kills by default; RETRACE_LONG=1 for 300. RETRACE_SEED picks the kill times.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/ckpt_test_util.h"

namespace retrace::ckpt {
namespace {

using testing::TempDir;

constexpr uint32_t kWorldSize = 4;
constexpr uint64_t kBytesPerShard = 16ull << 20;  // 64 MB per checkpoint

[[noreturn]] void child_save_loop(const std::string& root, uint64_t first_step) {
  try {
    for (uint64_t step = first_step; step < first_step + 10000; ++step)
      testing::save_checkpoint(root, step, kWorldSize, kBytesPerShard);
  } catch (...) {
    _exit(2);
  }
  _exit(0);
}

TEST(CrashConsistency, SigkillDuringSavesNeverYieldsATornCheckpoint) {
  const bool long_run = std::getenv("RETRACE_LONG") != nullptr;
  const int trials = long_run ? 300 : 30;
  const uint64_t seed = std::getenv("RETRACE_SEED") ? std::strtoull(std::getenv("RETRACE_SEED"), nullptr, 10)
                                                    : uint64_t(std::random_device{}());
  std::mt19937_64 rng(seed);
  RecordProperty("seed", std::to_string(seed));
  std::cout << "crash test: " << trials << " kills, RETRACE_SEED=" << seed << "\n";

  TempDir tmp("crash");
  const std::string root = tmp.file("checkpoints");

  // Time one save to spread the kills over every phase of several saves.
  auto t0 = std::chrono::steady_clock::now();
  {
    TempDir probe("crash-probe");
    testing::save_checkpoint(probe.path(), 1, kWorldSize, kBytesPerShard);
  }
  const double save_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::uniform_real_distribution<double> kill_after(0.0, 2.5 * save_ms);

  int picked = 0, none_yet = 0, total_skipped = 0;
  for (int trial = 0; trial < trials; ++trial) {
    auto before = find_newest_valid(root, kWorldSize);
    const uint64_t first_step = before ? before->manifest.step + 1 : 1;
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0) << "fork failed";
    if (pid == 0) child_save_loop(root, first_step);
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(kill_after(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the saving child ended by itself with status " << status;

    // Every directory with a manifest verifies fully.
    uint64_t newest_committed = 0;
    for (const auto& [step, dir] : list_step_dirs(root)) {
      if (!std::filesystem::exists(dir + "/manifest.json")) continue;
      newest_committed = std::max(newest_committed, step);
      EXPECT_NO_THROW(verify_checkpoint(dir, kWorldSize)) << "trial " << trial << ", " << dir << ", seed " << seed;
    }
    auto pick = find_newest_valid(root, kWorldSize);
    if (!pick) {
      EXPECT_EQ(newest_committed, 0u) << "a committed checkpoint was skipped, seed " << seed;
      ++none_yet;
      continue;
    }
    ++picked;
    total_skipped += int(pick->skipped.size());
    EXPECT_EQ(pick->manifest.step, newest_committed) << "seed " << seed;
    EXPECT_EQ(testing::check_checkpoint_content(pick->dir, pick->manifest), "")
        << "trial " << trial << ", seed " << seed;
    for (const auto& [dir, why] : pick->skipped)
      EXPECT_EQ(why.rfind("no manifest: ", 0), 0u) << dir << ": " << why << " (seed " << seed << ")";
  }
  std::cout << "crash test: one save took " << save_ms << " ms; " << picked << " kills left a checkpoint to resume, "
            << none_yet << " none yet; " << total_skipped << " interrupted saves skipped\n";
  EXPECT_GT(picked, 0);
}

}  // namespace
}  // namespace retrace::ckpt
