#include "core/cpu_budget.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace retrace {
namespace {

// A small file's first line, or nullopt when it cannot be read.
std::optional<std::string> first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

std::optional<double> positive_number(const std::string& text) {
  if (text.empty() || text.size() > 20) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !std::isfinite(v) || v <= 0) return std::nullopt;
  return v;
}

// The cgroup paths of /proc/self/cgroup: v2's ("0::/path") and v1's cpu controller's.
struct CgroupPaths {
  std::optional<std::string> v2, v1_cpu;
};

CgroupPaths paths_of(const std::string& proc_self_cgroup) {
  CgroupPaths p;
  std::istringstream in(proc_self_cgroup);
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (id == "0" && controllers.empty()) p.v2 = path;
    std::istringstream list(controllers);
    for (std::string c; std::getline(list, c, ',');)
      if (c == "cpu") p.v1_cpu = path;
  }
  return p;
}

// The directories from the cgroup's own up to its hierarchy's root.
std::vector<std::string> up_to_root(const std::string& mount, const std::string& path) {
  std::vector<std::string> dirs;
  std::string p = path;
  while (!p.empty() && p.back() == '/') p.pop_back();
  for (;;) {
    dirs.push_back(mount + p);
    if (p.empty()) break;
    p.erase(p.rfind('/'));
  }
  return dirs;
}

void take_smaller(CpuBudget& b, std::optional<double> q, const std::string& from) {
  if (q && (!b.quota || *q < *b.quota)) {
    b.quota = q;
    b.quota_from = from;
  }
}

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

std::optional<double> cgroup_v2_quota(const std::string& cpu_max) {
  std::istringstream in(cpu_max);
  std::string quota, period, rest;
  if (!(in >> quota) || quota == "max") return std::nullopt;
  if (!(in >> period) || (in >> rest)) return std::nullopt;
  const auto q = positive_number(quota), p = positive_number(period);
  if (!q || !p) return std::nullopt;
  return *q / *p;
}

std::optional<double> cgroup_v1_quota(const std::string& cfs_quota_us, const std::string& cfs_period_us) {
  const auto q = positive_number(cfs_quota_us), p = positive_number(cfs_period_us);  // -1: no quota
  if (!q || !p) return std::nullopt;
  return *q / *p;
}

CpuBudget cpu_budget_from(const std::string& proc_self_cgroup, const std::string& cgroup_root, int64_t affinity,
                          int64_t local_ranks) {
  CpuBudget b;
  b.affinity = std::max<int64_t>(1, affinity);
  b.local_ranks = std::max<int64_t>(1, local_ranks);
  const CgroupPaths paths = paths_of(proc_self_cgroup);
  if (paths.v2)
    for (const std::string& mount : {cgroup_root, cgroup_root + "/unified"})
      for (const std::string& dir : up_to_root(mount, *paths.v2))
        if (auto text = first_line(dir + "/cpu.max")) take_smaller(b, cgroup_v2_quota(*text), dir + "/cpu.max");
  if (paths.v1_cpu)
    for (const std::string& mount : {cgroup_root + "/cpu", cgroup_root + "/cpu,cpuacct", cgroup_root + "/cpuacct,cpu"})
      for (const std::string& dir : up_to_root(mount, *paths.v1_cpu)) {
        const auto quota = first_line(dir + "/cpu.cfs_quota_us"), period = first_line(dir + "/cpu.cfs_period_us");
        if (quota && period) take_smaller(b, cgroup_v1_quota(*quota, *period), dir + "/cpu.cfs_quota_us");
      }
  double usable = static_cast<double>(b.affinity);
  b.why = "affinity " + std::to_string(b.affinity);
  if (b.quota) {
    usable = std::min(usable, *b.quota);
    b.why += ", quota " + number_text(*b.quota) + " (" + b.quota_from + ")";
    if (*b.quota < 1) b.why += ": below one core";
  }
  const int64_t whole = std::max<int64_t>(1, static_cast<int64_t>(std::floor(usable)));
  b.cores = std::max<int64_t>(1, whole / b.local_ranks);
  if (b.local_ranks > 1) b.why += ", " + std::to_string(b.local_ranks) + " local ranks";
  b.why += ": " + std::to_string(b.cores);
  return b;
}

CpuBudget cpu_budget(int64_t local_ranks) {
  int64_t affinity = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) affinity = CPU_COUNT(&set);
  if (affinity <= 0) affinity = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
  std::ifstream in("/proc/self/cgroup");
  std::stringstream text;
  text << in.rdbuf();
  const char* root = std::getenv("RETRACE_CGROUP_ROOT");
  return cpu_budget_from(text.str(), root && *root ? root : "/sys/fs/cgroup", affinity, local_ranks);
}

}  // namespace retrace
