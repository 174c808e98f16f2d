// What a control group lets this process use. Memory: a container's limit (Kubernetes' resources
// limits, Docker's --memory, Slurm's cgroup plugin) is not in /proc/meminfo, whose MemAvailable
// is the host's. A run that passes a memory check against the host's figure is killed by the
// kernel's OOM killer at the container's limit instead of refused with a clear message. CPUs: a
// container's CPU quota (--cpus, a Kubernetes CPU limit) and cpuset (--cpuset-cpus, the static
// CPU manager, taskset) are not the host's core count, which std::thread::hardware_concurrency
// gives: more BLAS threads than the CPUs a process may use only contend for them.
#pragma once

#include <cstdint>
#include <string>

namespace dtrain {

// Bytes left under the tightest memory limit of this process's cgroup and its ancestors: the
// limit less the usage that cannot be reclaimed (usage less the page cache, shared memory
// excepted: the kernel drops cache before it kills at the limit), at each level with a limit.
// cgroup v2 (memory.max, memory.current, memory.stat's file and shmem) and v1
// (memory.limit_in_bytes, memory.usage_in_bytes, memory.stat's total_cache and total_shmem); -1
// when no limit applies or none can be read. `proc_cgroup`: /proc/self/cgroup; `sys_cgroup`: where
// cgroupfs is mounted (/sys/fs/cgroup; v1's memory controller in its memory/ folder, v2 also as
// unified/ on hybrid hosts). Parameters for tests; thread-safe (reads files only).
int64_t cgroup_memory_left(const std::string& proc_cgroup = "/proc/self/cgroup",
                           const std::string& sys_cgroup = "/sys/fs/cgroup");

// The CPUs' worth of time the tightest CPU quota of this process's cgroup and its ancestors
// allows (quota / period: 0.5 for `docker run --cpus 0.5`), from cgroup v2's cpu.max ("QUOTA
// PERIOD" or "max PERIOD") or v1's cpu.cfs_quota_us and cpu.cfs_period_us (-1: none); -1 when no
// quota applies or none can be read. Parameters as for cgroup_memory_left.
double cgroup_cpu_quota(const std::string& proc_cgroup = "/proc/self/cgroup",
                        const std::string& sys_cgroup = "/sys/fs/cgroup");

// The cores this process may use, >= 1: the CPUs of its affinity mask (taskset, a cpuset), at
// most the CPU quota rounded up (1.5 CPUs: 2 threads can use them), else the host's count.
int usable_cores();

}  // namespace dtrain
