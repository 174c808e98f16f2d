#include "util/cgroup_limits.h"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <thread>
#include <vector>

namespace dtrain {

namespace {

namespace fs = std::filesystem;

// A file holding one number (or "max": -1), -1 when absent or unreadable.
int64_t number_in(const fs::path& file) {
  std::ifstream in(file);
  std::string text;
  if (!(in >> text) || text == "max") return -1;
  int64_t v = -1;
  const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  return ec == std::errc() && v >= 0 ? v : -1;
}

// A "key N" line of a memory.stat file, 0 when absent.
int64_t stat_field(const fs::path& file, std::string_view key) {
  std::ifstream in(file);
  std::string k;
  int64_t v = 0;
  while (in >> k >> v)
    if (k == key) return std::max<int64_t>(v, 0);
  return 0;
}

// The cgroup's path in the hierarchy whose controllers `want` names ("" for v2's "0::" line),
// from /proc/self/cgroup ("ID:CONTROLLERS:PATH" per line); empty when there is none.
std::string cgroup_path(const std::string& proc_cgroup, std::string_view want) {
  std::ifstream in(proc_cgroup);
  for (std::string line; std::getline(in, line);) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string_view controllers = std::string_view(line).substr(a + 1, b - a - 1);
    bool match = want.empty() ? controllers.empty() : false;
    for (size_t i = 0; !want.empty() && i <= controllers.size();) {
      const size_t j = std::min(controllers.find(',', i), controllers.size());
      match = match || controllers.substr(i, j - i) == want;
      i = j + 1;
    }
    if (match) return line.substr(b + 1);
  }
  return "";
}

// The folders from the cgroup's own up to the mount's root: the cgroup's path joined to the
// mount when that folder exists (the host's view), else the mount alone (a cgroup namespace:
// the container's cgroup is the mount's root).
std::vector<fs::path> levels(const fs::path& mount, const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(mount, ec)) return {};
  fs::path leaf = (mount / fs::path(path).relative_path()).lexically_normal();
  if (!fs::is_directory(leaf, ec)) leaf = mount;
  std::vector<fs::path> out;
  const fs::path root = mount.lexically_normal();
  for (fs::path p = leaf;; p = p.parent_path()) {
    out.push_back(p);
    if (p == root || p == p.parent_path() || p.string().size() <= root.string().size()) break;
  }
  return out;
}

// The least left at any level of one hierarchy; -1 when no level has a limit.
// `cache_key` and `shmem_key`: memory.stat's page cache and its shared-memory part; the cache
// less shmem (tmpfs, /dev/shm: not reclaimable without swap) is what the kernel reclaims before
// it kills at the limit.
int64_t least_left(const std::vector<fs::path>& dirs, const char* limit_file,
                   const char* usage_file, const char* cache_key, const char* shmem_key) {
  // (v1 reports "no limit" as a page-rounded INT64_MAX; above 2^62 is no machine's memory)
  constexpr int64_t kNoLimit = int64_t{1} << 62;
  int64_t best = -1;
  for (const fs::path& d : dirs) {
    const int64_t limit = number_in(d / limit_file);
    if (limit < 0 || limit >= kNoLimit) continue;
    const int64_t usage = std::max<int64_t>(number_in(d / usage_file), 0);
    const fs::path stat = d / "memory.stat";
    const int64_t reclaimable =
        std::max<int64_t>(stat_field(stat, cache_key) - stat_field(stat, shmem_key), 0);
    const int64_t working = std::max<int64_t>(usage - reclaimable, 0);
    const int64_t left = std::max<int64_t>(limit - working, 0);
    if (best < 0 || left < best) best = left;
  }
  return best;
}

// The tightest quota of one hierarchy's levels, in CPUs; -1 when none. v2: `cpu_max` holds
// "QUOTA PERIOD"; v1: `quota_file` and `period_file` hold one number each (quota -1: none).
double least_quota(const std::vector<fs::path>& dirs, bool v2) {
  double best = -1;
  for (const fs::path& d : dirs) {
    double quota = -1, period = -1;
    if (v2) {
      std::ifstream in(d / "cpu.max");
      std::string q;
      int64_t p = 0;
      if (!(in >> q >> p) || q == "max" || p <= 0) continue;
      int64_t qv = -1;
      const auto [e, ec] = std::from_chars(q.data(), q.data() + q.size(), qv);
      if (ec != std::errc() || qv <= 0) continue;
      quota = static_cast<double>(qv);
      period = static_cast<double>(p);
    } else {
      quota = static_cast<double>(number_in(d / "cpu.cfs_quota_us"));
      period = static_cast<double>(number_in(d / "cpu.cfs_period_us"));
    }
    if (quota <= 0 || period <= 0) continue;
    const double cpus = quota / period;
    if (best < 0 || cpus < best) best = cpus;
  }
  return best;
}

}  // namespace

double cgroup_cpu_quota(const std::string& proc_cgroup, const std::string& sys_cgroup) {
  double best = -1;
  const auto take = [&](double v) {
    if (v > 0 && (best < 0 || v < best)) best = v;
  };
  const fs::path sys(sys_cgroup);
  // (v1 mounts the controller as cpu/, often linked to cpu,cpuacct/)
  if (const std::string v1 = cgroup_path(proc_cgroup, "cpu"); !v1.empty())
    take(least_quota(levels(sys / "cpu", v1), false));
  if (const std::string v2 = cgroup_path(proc_cgroup, ""); !v2.empty()) {
    std::error_code ec;
    const fs::path mount = fs::exists(sys / "cgroup.controllers", ec) ? sys : sys / "unified";
    take(least_quota(levels(mount, v2), true));
  }
  return best;
}

int usable_cores() {
  int n = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  if (const double q = cgroup_cpu_quota(); q > 0)
    n = std::min(n, static_cast<int>(std::ceil(q - 1e-9)));
  return std::max(1, n);
}

int64_t cgroup_memory_left(const std::string& proc_cgroup, const std::string& sys_cgroup) {
  int64_t best = -1;
  const auto take = [&](int64_t v) {
    if (v >= 0 && (best < 0 || v < best)) best = v;
  };
  const fs::path sys(sys_cgroup);
  const std::string v1 = cgroup_path(proc_cgroup, "memory");
  if (!v1.empty())
    take(least_left(levels(sys / "memory", v1), "memory.limit_in_bytes", "memory.usage_in_bytes",
                    "total_cache", "total_shmem"));
  const std::string v2 = cgroup_path(proc_cgroup, "");
  if (!v2.empty()) {
    std::error_code ec;
    // (hybrid hosts mount v2 at unified/; a v2-only host at the root, with cgroup.controllers)
    const fs::path mount = fs::exists(sys / "cgroup.controllers", ec) ? sys : sys / "unified";
    take(least_left(levels(mount, v2), "memory.max", "memory.current", "file", "shmem"));
  }
  return best;
}

}  // namespace dtrain
