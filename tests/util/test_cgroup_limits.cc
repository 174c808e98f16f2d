// The memory a control group leaves and its CPU quota, read from fake cgroupfs trees: v2 and v1,
// limits on the process's own cgroup or an ancestor, reclaimable page cache, no limit at all.
#include <doctest/doctest.h>

#include <sched.h>

#include <filesystem>
#include <string>

#include "test_util.h"
#include "util/cgroup_limits.h"

using dtrain::cgroup_memory_left;
using dtrain::testing::TempDir;

namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

void put(const TempDir& t, const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(t / path).parent_path());
  t.write(path, text);
}

}  // namespace

TEST_CASE("cgroup memory: v2 limit less the working set, the tightest level wins") {
  TempDir t;
  put(t, "proc", "0::/kubepods/pod1/ctr\n");
  put(t, "sys/cgroup.controllers", "cpu memory\n");
  // The container: 1000 MiB, 600 MiB used of which 100 MiB page cache (120 MiB of file pages, 20
  // MiB of them shared memory, which cannot be dropped): 500 MiB left.
  put(t, "sys/kubepods/pod1/ctr/memory.max", std::to_string(1000 * kMiB) + "\n");
  put(t, "sys/kubepods/pod1/ctr/memory.current", std::to_string(600 * kMiB) + "\n");
  put(t, "sys/kubepods/pod1/ctr/memory.stat",
      "anon 1\nfile " + std::to_string(120 * kMiB) + "\nshmem " + std::to_string(20 * kMiB) +
          "\ninactive_file 3\n");
  put(t, "sys/kubepods/memory.max", "max\n");
  CHECK(cgroup_memory_left(t / "proc", t / "sys") == 500 * kMiB);
  // The pod's limit is tighter: 700 MiB with 400 MiB in use (no stat: nothing reclaimable).
  put(t, "sys/kubepods/pod1/memory.max", std::to_string(700 * kMiB) + "\n");
  put(t, "sys/kubepods/pod1/memory.current", std::to_string(400 * kMiB) + "\n");
  CHECK(cgroup_memory_left(t / "proc", t / "sys") == 300 * kMiB);
  // Over its limit (reclaim pending): nothing left, not a negative figure.
  put(t, "sys/kubepods/pod1/memory.current", std::to_string(900 * kMiB) + "\n");
  CHECK(cgroup_memory_left(t / "proc", t / "sys") == 0);
}

TEST_CASE("cgroup memory: a cgroup namespace's view, v1, and no limit") {
  TempDir t;
  // A container whose cgroup is the mount's root (the path in /proc/self/cgroup is not there).
  put(t, "ns/proc", "0::/docker/abc\n");
  put(t, "ns/sys/cgroup.controllers", "memory\n");
  put(t, "ns/sys/memory.max", std::to_string(256 * kMiB) + "\n");
  put(t, "ns/sys/memory.current", std::to_string(56 * kMiB) + "\n");
  CHECK(cgroup_memory_left(t / "ns/proc", t / "ns/sys") == 200 * kMiB);
  // v1 (hybrid host): the memory controller's hierarchy, total_cache reclaimable; its
  // "no limit" is a page-rounded INT64_MAX at the levels above.
  put(t, "v1/proc", "4:memory:/slurm/job7\n3:cpu,cpuacct:/slurm/job7\n0::/\n");
  put(t, "v1/sys/memory/slurm/job7/memory.limit_in_bytes", std::to_string(2048 * kMiB) + "\n");
  put(t, "v1/sys/memory/slurm/job7/memory.usage_in_bytes", std::to_string(1048 * kMiB) + "\n");
  put(t, "v1/sys/memory/slurm/job7/memory.stat",
      "cache 1\ntotal_cache " + std::to_string(24 * kMiB) + "\ntotal_shmem 0\n");
  put(t, "v1/sys/memory/slurm/memory.limit_in_bytes", "9223372036854771712\n");
  put(t, "v1/sys/memory/memory.limit_in_bytes", "9223372036854771712\n");
  CHECK(cgroup_memory_left(t / "v1/proc", t / "v1/sys") == 1024 * kMiB);
  // No limit anywhere, or nothing to read: -1 (the host's MemAvailable decides).
  put(t, "v1/sys/memory/slurm/job7/memory.limit_in_bytes", "9223372036854771712\n");
  CHECK(cgroup_memory_left(t / "v1/proc", t / "v1/sys") == -1);
  CHECK(cgroup_memory_left(t / "missing", t / "missing") == -1);
  // This machine's own cgroup reads without error, whatever it says.
  CHECK(cgroup_memory_left() >= -1);
}

TEST_CASE("cgroup CPU quota: v2's cpu.max and v1's cfs files, the tightest level wins") {
  TempDir t;
  put(t, "proc", "0::/kubepods/pod1/ctr\n");
  put(t, "sys/cgroup.controllers", "cpu memory\n");
  CHECK(dtrain::cgroup_cpu_quota(t / "proc", t / "sys") == -1);  // no file: no quota
  put(t, "sys/kubepods/pod1/ctr/cpu.max", "max 100000\n");
  CHECK(dtrain::cgroup_cpu_quota(t / "proc", t / "sys") == -1);
  put(t, "sys/kubepods/pod1/cpu.max", "150000 100000\n");  // the pod: 1.5 CPUs
  CHECK(dtrain::cgroup_cpu_quota(t / "proc", t / "sys") == doctest::Approx(1.5));
  put(t, "sys/kubepods/pod1/ctr/cpu.max", "50000 100000\n");  // the container: 0.5
  CHECK(dtrain::cgroup_cpu_quota(t / "proc", t / "sys") == doctest::Approx(0.5));
  put(t, "sys/kubepods/pod1/ctr/cpu.max", "garbage\n");
  CHECK(dtrain::cgroup_cpu_quota(t / "proc", t / "sys") == doctest::Approx(1.5));

  // v1 (docker --cpus on a v1 host): quota -1 is none.
  TempDir v1;
  put(v1, "proc", "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n");
  put(v1, "sys/cpu/docker/abc/cpu.cfs_quota_us", "-1\n");
  put(v1, "sys/cpu/docker/abc/cpu.cfs_period_us", "100000\n");
  CHECK(dtrain::cgroup_cpu_quota(v1 / "proc", v1 / "sys") == -1);
  put(v1, "sys/cpu/docker/abc/cpu.cfs_quota_us", "250000\n");
  CHECK(dtrain::cgroup_cpu_quota(v1 / "proc", v1 / "sys") == doctest::Approx(2.5));
}

TEST_CASE("usable cores: at most this process's affinity mask") {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
  const int n = dtrain::usable_cores();
  CHECK(n >= 1);
  CHECK(n <= CPU_COUNT(&set));
}
