// The cores this process may use: its CPU affinity, capped by the CPU quota of its cgroup and of
// every cgroup above it (v2's cpu.max, v1's cpu.cfs_quota_us / cpu.cfs_period_us), shared by the
// ranks on this host. std::thread::hardware_concurrency counts the machine's CPUs, not these: in a
// container limited to 4 of 64 cores it says 64. Torch-free.
//
// Issue 51 (docs/plans/owned-numerics.md, 4.2): runtime.threads = 0 will mean this budget; today it
// is information in the fingerprint (info.cpu_budget) only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace retrace {

struct CpuBudget {
  int64_t affinity = 1;         // CPUs in this process's affinity mask
  std::optional<double> quota;  // the smallest cgroup CPU quota on the way to the root, in cores
  std::string quota_from;       // the cgroup file it came from ("" without a quota)
  int64_t local_ranks = 1;      // the ranks of this job on this host
  int64_t cores = 1;            // floor(min(affinity, quota)) / local_ranks, at least 1
  // How `cores` came about, e.g. "affinity 16, quota 4 (cpu.max of /sys/fs/cgroup/job), 2 local
  // ranks: 2"; a quota below one core is named there ("quota 0.5: below one core, 1").
  std::string why;
};

// The budget of this process: sched_getaffinity, /proc/self/cgroup and the cgroup file system
// under /sys/fs/cgroup, or under $RETRACE_CGROUP_ROOT when set (a testing aid: a fake tree).
CpuBudget cpu_budget(int64_t local_ranks);

// The same from given inputs: the text of /proc/self/cgroup, the root the cgroup hierarchies are
// mounted under (v2 at the root itself or at "unified", v1's cpu controller at "cpu",
// "cpu,cpuacct" or "cpuacct,cpu"), the affinity count and the local ranks. Unreadable or absent
// files mean no quota; a malformed one is ignored the same way (the budget is information, and an
// odd kernel must not stop a run).
CpuBudget cpu_budget_from(const std::string& proc_self_cgroup, const std::string& cgroup_root, int64_t affinity,
                          int64_t local_ranks);

// One cgroup's quota in cores from its files' text: v2 "max 100000" (none) or "50000 100000"
// (0.5); v1 quota "-1" (none) or "150000" with period "100000" (1.5). nullopt for none or text that
// does not parse.
std::optional<double> cgroup_v2_quota(const std::string& cpu_max);
std::optional<double> cgroup_v1_quota(const std::string& cfs_quota_us, const std::string& cfs_period_us);

}  // namespace retrace
