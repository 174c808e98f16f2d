// Helpers for the tests that drive real engines (Slurm, Open MPI): skipping with the reason, a
// private one-node Slurm cluster per test (scripts/engines/slurm.sh), jobs submitted with sbatch
// and polled until they end.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "cli/cli_util.h"
#include "test_util.h"

namespace dtrain::testing {

inline const std::string kSource = DTRAIN_SOURCE_DIR;
inline const std::string kSlurmSh = kSource + "/scripts/engines/slurm.sh";
// Before a command: no torchrun or master variables of the test's own environment leak into the
// ranks (torchrun's would take precedence over Slurm's and Open MPI's).
inline const std::string kCleanEnv =
    "env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT "
    "-u DTRAIN_FAULT ";

// The engine is missing or cannot start: exit 77 (CTest: skipped) with the reason. Where the
// engines must be there (DTRAIN_ENGINES_REQUIRED=1: scripts/ci_engines.sh, which has just
// installed them) the test fails instead, so CI cannot pass by skipping.
[[noreturn]] inline void skip_test(const std::string& why) {
  const char* req = std::getenv("DTRAIN_ENGINES_REQUIRED");
  if (req != nullptr && std::string(req) == "1") {
    FAIL("the engine is required here (DTRAIN_ENGINES_REQUIRED=1) but: " << why);
  }
  std::printf("SKIP: %s\n", why.c_str());
  std::fflush(stdout);
  std::exit(77);
}

// Whether `program` is on PATH.
inline bool have_program(const std::string& program) {
  return run_cmd("command -v " + program + " >/dev/null").exit_code == 0;
}

// A job's end as scontrol reports it: JobState (COMPLETED, FAILED, CANCELLED, ...) and the
// batch script's exit status (ExitCode=status:signal). state "" when it did not end in time.
struct JobEnd {
  std::string state;
  int exit_code = -1;
  int signal = 0;
};

// A private one-node Slurm cluster whose files live in a fresh folder (slurm.sh start
// --no-install: the test never installs packages). Skips the test when Slurm is not installed,
// not startable, or not root. stop() (or the destructor) ends every daemon it started.
class SlurmCluster {
 public:
  SlurmCluster() {
    if (geteuid() != 0) skip_test("a private Slurm cluster needs root (SlurmdUser=root)");
    // Under DTRAIN_ENGINES_TMP when set: scripts/ci_engines.sh stops whatever cluster is left
    // there (a test killed by its timeout never runs its destructor).
    const char* base = std::getenv("DTRAIN_ENGINES_TMP");
    std::string tmpl = std::string(base != nullptr && *base != 0 ? base : "/tmp") +
                       "/dtrain_slurm_XXXXXX";
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    dir_ = tmpl;
    const CmdResult r = run_cmd(kSlurmSh + " start --no-install " + dir_);
    if (r.exit_code != 0) {
      stop_quietly();
      skip_test("scripts/engines/slurm.sh start failed (exit " + std::to_string(r.exit_code) +
                "): " + r.output);
    }
    env_ = "SLURM_CONF=" + dir_ + "/slurm.conf ";
  }
  ~SlurmCluster() { stop_quietly(); }
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  // "SLURM_CONF=... " to put before a Slurm client command.
  const std::string& env() const { return env_; }

  // `sbatch --parsable ARGS` run in folder `cwd` (the job's submit folder) with `env_prefix`
  // (VAR=value ...) in its environment, which sbatch passes to the job; returns the job id.
  long submit(const std::string& args, const std::string& cwd, const std::string& env_prefix = "") {
    const CmdResult r = run_cmd("cd " + cwd + " && " + env_ + kCleanEnv + env_prefix +
                                " sbatch --parsable " + args);
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    return std::stol(r.output);
  }

  // The job's JobState= and ExitCode= fields (state "" when scontrol does not know it).
  JobEnd query(long job) const {
    const CmdResult r = run_cmd(env_ + "scontrol show job -o " + std::to_string(job));
    JobEnd e;
    e.state = field(r.output, "JobState=");
    const std::string code = field(r.output, "ExitCode=");
    const size_t colon = code.find(':');
    if (colon != std::string::npos) {
      e.exit_code = std::atoi(code.substr(0, colon).c_str());
      e.signal = std::atoi(code.substr(colon + 1).c_str());
    }
    return e;
  }

  // Polls the job every 100 ms (sbatch --wait polls every few seconds) until it has ended, at
  // most timeout_s; state "" on timeout.
  JobEnd wait(long job, double timeout_s) const {
    JobEnd e;
    const bool ended = wait_until(
        [&] {
          e = query(job);
          for (const char* s : {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                                "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"})
            if (e.state == s) return true;
          std::this_thread::sleep_for(std::chrono::milliseconds(80));
          return false;
        },
        timeout_s);
    if (!ended) e.state = "";
    return e;
  }

  // Stops the cluster and checks that none of its daemons still runs.
  void stop() {
    const std::vector<int> pids = daemon_pids();
    CHECK(pids.size() == 3);  // munged, slurmctld, slurmd
    stop_quietly();
    for (int pid : pids)
      CHECK_MESSAGE(!running(pid), "daemon pid ", pid, " still runs after slurm.sh stop");
  }

 private:
  static std::string field(const std::string& text, const std::string& key) {
    const size_t at = text.find(key);
    if (at == std::string::npos) return "";
    const size_t b = at + key.size();
    return text.substr(b, text.find_first_of(" \n", b) - b);
  }

  // Alive and not a zombie (the stopped daemons were reparented; their reaper may be slow).
  static bool running(int pid) {
    const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
    const size_t paren = stat.rfind(')');
    return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
  }

  std::vector<int> daemon_pids() const {
    std::vector<int> pids;
    for (const char* d : {"munged", "slurmctld", "slurmd"}) {
      std::ifstream in(dir_ + "/" + d + ".ours");
      int pid = 0;
      if (in >> pid) pids.push_back(pid);
    }
    return pids;
  }

  void stop_quietly() {
    if (dir_.empty()) return;
    const CmdResult r = run_cmd(kSlurmSh + " stop " + dir_);
    if (r.exit_code != 0 || !r.output.empty()) MESSAGE("slurm.sh stop: " << r.output);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    dir_.clear();
  }

  std::string dir_, env_;
};

}  // namespace dtrain::testing
