#include "core/cpu_budget.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "testing/temp_dir.h"

namespace retrace {
namespace {

using testing::TempDir;

// Writes `text` to root/path, making the directories.
void put(const TempDir& root, const std::string& path, const std::string& text) {
  const std::filesystem::path p = std::filesystem::path(root.path()) / path;
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p) << text << "\n";
}

TEST(CpuBudget, QuotaFilesReadAsCores) {
  EXPECT_FALSE(cgroup_v2_quota("max 100000"));
  EXPECT_EQ(cgroup_v2_quota("50000 100000"), 0.5);
  EXPECT_EQ(cgroup_v2_quota("400000 100000"), 4.0);
  for (const char* bad : {"", "x 100000", "50000", "50000 0", "0 100000", "-5 100000", "50000 100000 7"})
    EXPECT_FALSE(cgroup_v2_quota(bad)) << bad;
  EXPECT_FALSE(cgroup_v1_quota("-1", "100000"));
  EXPECT_EQ(cgroup_v1_quota("150000", "100000"), 1.5);
  EXPECT_FALSE(cgroup_v1_quota("150000", ""));
  EXPECT_FALSE(cgroup_v1_quota("nan", "100000"));
}

TEST(CpuBudget, TheSmallestQuotaOnTheWayToTheRootSharedByTheLocalRanks) {
  TempDir root("cgroup");
  put(root, "job/cpu.max", "400000 100000");  // 4 cores for the job
  put(root, "job/step/cpu.max", "max 100000");
  put(root, "cpu.max", "800000 100000");
  const CpuBudget b = cpu_budget_from("0::/job/step\n", root.path(), 16, 2);
  ASSERT_TRUE(b.quota);
  EXPECT_EQ(*b.quota, 4.0);
  EXPECT_EQ(b.quota_from, root.path() + "/job/cpu.max");
  EXPECT_EQ(b.cores, 2);
  EXPECT_EQ(b.why, "affinity 16, quota 4 (" + root.path() + "/job/cpu.max), 2 local ranks: 2");
}

TEST(CpuBudget, CgroupV1CpuControllerAndAFractionalQuota) {
  TempDir root("cgroup");
  put(root, "cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "250000");
  put(root, "cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000");
  put(root, "cpu,cpuacct/cpu.cfs_quota_us", "-1");
  put(root, "cpu,cpuacct/cpu.cfs_period_us", "100000");
  const CpuBudget b = cpu_budget_from("4:memory:/x\n3:cpu,cpuacct:/docker/abc\n0::/\n", root.path(), 8, 1);
  ASSERT_TRUE(b.quota);
  EXPECT_EQ(*b.quota, 2.5);
  EXPECT_EQ(b.cores, 2);  // floor(2.5)
}

TEST(CpuBudget, BelowOneCoreAffinityAndRanksBoundIt) {
  TempDir root("cgroup");
  put(root, "cpu.max", "50000 100000");
  const CpuBudget half = cpu_budget_from("0::/\n", root.path(), 8, 1);
  EXPECT_EQ(half.cores, 1);
  EXPECT_NE(half.why.find("below one core"), std::string::npos) << half.why;
  put(root, "cpu.max", "800000 100000");
  EXPECT_EQ(cpu_budget_from("0::/\n", root.path(), 3, 1).cores, 3);  // the affinity is smaller
  EXPECT_EQ(cpu_budget_from("0::/\n", root.path(), 2, 4).cores, 1);  // more ranks than cores: one each
  // No cgroup information, or files that are missing or malformed: the affinity alone.
  const CpuBudget none = cpu_budget_from("", root.path(), 6, 1);
  EXPECT_FALSE(none.quota);
  EXPECT_EQ(none.cores, 6);
  EXPECT_EQ(none.why, "affinity 6: 6");
  put(root, "odd/cpu.max", "lots");
  EXPECT_EQ(cpu_budget_from("0::/odd\n", root.path(), 6, 1).cores, 6);
}

TEST(CpuBudget, ThisProcessHasAtLeastOneCoreAndNoMoreThanTheMachine) {
  const CpuBudget b = cpu_budget(1);
  EXPECT_GE(b.cores, 1);
  EXPECT_LE(b.cores, std::max<int64_t>(1, std::thread::hardware_concurrency()));
  EXPECT_FALSE(b.why.empty());
}

}  // namespace
}  // namespace retrace
