#include <doctest/doctest.h>

#include <stdlib.h>
#include <sys/stat.h>

#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>

#include "launch/dist_env.h"
#include "test_util.h"
#include "util/check.h"

using namespace dtrain;
using dtrain::testing::contains;
using dtrain::testing::TempDir;
using Env = std::map<std::string, std::string>;

namespace {

// The UserError message `f` throws; "<no error>" when it returns.
std::string user_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "<no error>";
}

std::string env_error(const Env& env, int config_world = 1, const DistOverrides& flags = {}) {
  return user_error([&] { resolve_dist_env(env, config_world, flags); });
}

}  // namespace

TEST_CASE("resolve_dist_env: config only") {
  DistEnv d = resolve_dist_env({}, 1, {});
  CHECK(d.rank == 0);
  CHECK(d.world_size == 1);
  CHECK(d.local_rank == 0);
  CHECK(d.local_world_size == 1);
  CHECK(d.master_addr == "127.0.0.1");
  CHECK(d.master_port == 0);
  CHECK(d.source == "config");

  // In-process ranks all live on this machine, and need no port.
  d = resolve_dist_env({{"PATH", "/bin"}, {"LOCAL_RANK", "zz"}}, 4, {});
  CHECK(d.world_size == 4);
  CHECK(d.local_world_size == 4);
  CHECK(d.rank == 0);
  CHECK(d.source == "config");
  // MASTER_* are honoured whatever decided the ranks.
  d = resolve_dist_env({{"MASTER_ADDR", "h1"}, {"MASTER_PORT", "1234"}}, 1, {});
  CHECK(d.master_addr == "h1");
  CHECK(d.master_port == 1234);
  CHECK(contains(env_error({}, 0), "distributed.world_size"));
}

TEST_CASE("resolve_dist_env: torchrun environment") {
  const Env env = {{"RANK", "5"},
                   {"WORLD_SIZE", "8"},
                   {"LOCAL_RANK", "1"},
                   {"LOCAL_WORLD_SIZE", "4"},
                   {"MASTER_ADDR", "10.0.0.7"},
                   {"MASTER_PORT", "29500"}};
  const DistEnv d = resolve_dist_env(env, 1, {});
  CHECK(d.rank == 5);
  CHECK(d.world_size == 8);
  CHECK(d.local_rank == 1);
  CHECK(d.local_world_size == 4);
  CHECK(d.master_addr == "10.0.0.7");
  CHECK(d.master_port == 29500);
  CHECK(d.source == "torchrun");

  // Without the LOCAL_* pair every rank is taken to be on this machine.
  const DistEnv s = resolve_dist_env({{"RANK", "2"}, {"WORLD_SIZE", "3"}, {"MASTER_PORT", "9"}}, 1);
  CHECK(s.local_rank == 2);
  CHECK(s.local_world_size == 3);
  CHECK(s.master_addr == "127.0.0.1");
  // A one-process job needs no port.
  CHECK(resolve_dist_env({{"RANK", "0"}, {"WORLD_SIZE", "1"}}, 4).world_size == 1);

  // torchrun's agent serving its own store on MASTER_PORT: dtrain's rendezvous takes the next
  // port (rank 0 found MASTER_PORT taken); --master-port is the user's and stays as given.
  Env agent = env;
  agent["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  CHECK(resolve_dist_env(agent, 1, {}).master_port == 29501);
  DistOverrides flag;
  flag.master_port = 4000;
  CHECK(resolve_dist_env(agent, 1, flag).master_port == 4000);
  agent["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  CHECK(resolve_dist_env(agent, 1, {}).master_port == 29500);
  agent["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  agent["MASTER_PORT"] = "65535";
  CHECK_THROWS_WITH_AS(resolve_dist_env(agent, 1, {}),
                       doctest::Contains("MASTER_PORT + 1 (torchrun's agent serves its store on "
                                         "MASTER_PORT: TORCHELASTIC_USE_AGENT_STORE=True)=65536 "
                                         "is not a TCP port"),
                       UserError);
}

TEST_CASE("resolve_dist_env: bad torchrun values are UserErrors naming the variable") {
  const Env ok = {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}};
  auto with = [&](const std::string& k, const std::string& v) {
    Env e = ok;
    e[k] = v;
    return e;
  };
  auto without = [&](const std::string& k) {
    Env e = ok;
    e.erase(k);
    return e;
  };
  CHECK(contains(env_error(without("WORLD_SIZE")), "RANK is set but WORLD_SIZE is not"));
  CHECK(contains(env_error(without("RANK")), "WORLD_SIZE is set but RANK is not"));
  CHECK(contains(env_error(with("RANK", "abc")), "RANK='abc' is not an integer"));
  // A number too large for its variable says so, rather than "not an integer".
  CHECK(contains(env_error(with("RANK", "99999999999")),
                 "RANK='99999999999' is out of range (-2147483648 to 2147483647)"));
  CHECK(contains(env_error(with("RANK", "1 ")), "RANK='1 '"));
  CHECK(contains(env_error(with("RANK", "")), "RANK=''"));
  CHECK(contains(env_error(with("RANK", "99999999999")), "RANK="));
  CHECK(contains(env_error(with("RANK", "2")), "RANK=2 is out of range for WORLD_SIZE=2"));
  CHECK(contains(env_error(with("RANK", "-1")), "RANK=-1"));
  CHECK(contains(env_error(with("WORLD_SIZE", "0")), "WORLD_SIZE=0"));
  CHECK(contains(env_error(with("WORLD_SIZE", "2000000")),
                 "WORLD_SIZE=2000000 is above 1024, the most ranks a dtrain job runs"));
  CHECK(contains(env_error(with("LOCAL_WORLD_SIZE", "3")), "LOCAL_WORLD_SIZE=3"));
  CHECK(contains(env_error(with("LOCAL_WORLD_SIZE", "0")), "LOCAL_WORLD_SIZE=0"));
  CHECK(contains(env_error(with("LOCAL_RANK", "2")), "LOCAL_RANK=2"));
  Env lr = with("LOCAL_RANK", "1");
  lr["LOCAL_WORLD_SIZE"] = std::string("1");
  CHECK(contains(env_error(lr), "LOCAL_RANK=1 is out of range for LOCAL_WORLD_SIZE=1"));
  CHECK(contains(env_error(with("MASTER_PORT", "70000")), "MASTER_PORT=70000"));
  CHECK(contains(env_error(with("MASTER_PORT", "0")), "MASTER_PORT=0"));
  CHECK(contains(env_error(with("MASTER_PORT", "http")), "MASTER_PORT='http'"));
  CHECK(contains(env_error(without("MASTER_PORT")), "MASTER_PORT is not set"));
  CHECK(contains(env_error(with("MASTER_ADDR", "")), "MASTER_ADDR is empty"));
  // A port or scheme in the address: rank 0 listened on neither, the others waited out the
  // rendezvous timeout. IPv6 literals are addresses.
  CHECK(contains(env_error(with("MASTER_ADDR", "10.0.0.1:29500")),
                 "MASTER_ADDR '10.0.0.1:29500' holds a port (host:port)"));
  CHECK(contains(env_error(with("MASTER_ADDR", "[fd00::1]:29500")), "holds a port"));
  CHECK(contains(env_error(with("MASTER_ADDR", "tcp://node0")), "is a URL"));
  CHECK(contains(env_error(with("MASTER_ADDR", "node0 ")), "holds whitespace"));
  CHECK(dtrain::master_addr_problem("fd00::1").empty());
  // One rank meets nobody: the address is never used, and a run that ran before still runs.
  Env one = with("MASTER_ADDR", "myhost:29500");
  one["WORLD_SIZE"] = std::string("1");
  one["RANK"] = std::string("0");
  CHECK(resolve_dist_env(one, 1, {}).world_size == 1);
  CHECK(dtrain::master_addr_problem("node0.cluster").empty());
}

TEST_CASE("resolve_dist_env: Slurm environment") {
  Env env = {{"SLURM_STEP_ID", "0"},
             {"SLURM_PROCID", "5"},
             {"SLURM_NTASKS", "8"},
             {"SLURM_LOCALID", "1"},
             {"SLURM_NODEID", "1"},
             {"SLURM_TASKS_PER_NODE", "4(x2)"},
             {"SLURM_JOB_NODELIST", "node[03-04]"},
             {"SLURM_JOB_ID", "12345"}};
  DistEnv d = resolve_dist_env(env, 1, {});
  CHECK(d.source == "slurm");
  CHECK(d.rank == 5);
  CHECK(d.world_size == 8);
  CHECK(d.local_rank == 1);
  CHECK(d.local_world_size == 4);
  CHECK(d.master_addr == "node03");  // first host of the allocation
  CHECK(d.master_port == 27520);     // 10000 + (16 * 12345 + 0) % 20000, as scripts/slurm.sbatch

  // MASTER_ADDR / MASTER_PORT from the environment win over the derived ones.
  env["MASTER_ADDR"] = "login1";
  env["MASTER_PORT"] = "4242";
  d = resolve_dist_env(env, 1, {});
  CHECK(d.master_addr == "login1");
  CHECK(d.master_port == 4242);

  // Uneven nodes: "2(x3),1" is 2, 2, 2, 1 tasks; this node's entry by SLURM_NODEID.
  env = {{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "7"},
         {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "3"}, {"SLURM_TASKS_PER_NODE", "2(x3),1"},
         {"MASTER_PORT", "5000"}};
  d = resolve_dist_env(env, 1, {});
  CHECK(d.local_world_size == 1);
  CHECK(d.local_rank == 0);
  env["SLURM_NODEID"] = std::string("0");
  env["SLURM_PROCID"] = std::string("1");
  env["SLURM_LOCALID"] = std::string("1");
  CHECK(resolve_dist_env(env, 1, {}).local_world_size == 2);
  env.erase("SLURM_NODEID");  // unknown node: the largest count
  CHECK(resolve_dist_env(env, 1, {}).local_world_size == 2);
  // The step's layout beats the job's request, which beats the job's layout.
  env["SLURM_NTASKS_PER_NODE"] = std::string("3");
  CHECK(resolve_dist_env(env, 1, {}).local_world_size == 3);
  env["SLURM_STEP_TASKS_PER_NODE"] = "4,3";
  CHECK(resolve_dist_env(env, 1, {}).local_world_size == 4);

  CHECK(contains(env_error({{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "0"}}), "SLURM_NTASKS"));
  CHECK(contains(env_error({{"SLURM_STEP_ID", "0"},
                            {"SLURM_PROCID", "x"},
                            {"SLURM_NTASKS", "2"},
                            {"MASTER_PORT", "9"}}),
                 "SLURM_PROCID='x'"));
  CHECK(contains(env_error({{"SLURM_STEP_ID", "0"},
                            {"SLURM_PROCID", "2"},
                            {"SLURM_NTASKS", "2"},
                            {"MASTER_PORT", "9"}}),
                 "SLURM_PROCID=2 is out of range for SLURM_NTASKS=2"));
  CHECK(contains(env_error({{"SLURM_STEP_ID", "0"},
                            {"SLURM_PROCID", "0"},
                            {"SLURM_NTASKS", "2"},
                            {"SLURM_TASKS_PER_NODE", "2(x"},
                            {"MASTER_PORT", "9"}}),
                 "SLURM_TASKS_PER_NODE='2(x'"));
  CHECK(contains(env_error({{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}),
                 "MASTER_PORT is not set"));
  CHECK(contains(env_error({{"SLURM_STEP_ID", "0"},
                            {"SLURM_PROCID", "0"},
                            {"SLURM_NTASKS", "2"},
                            {"SLURM_JOB_ID", "7"},
                            {"SLURM_JOB_NODELIST", "n[1-2"}}),
                 "SLURM_JOB_NODELIST"));
}

TEST_CASE("Slurm task counts and host lists") {
  using V = std::vector<int>;
  CHECK(parse_slurm_tasks_per_node("4", "V") == V{4});
  CHECK(parse_slurm_tasks_per_node("4(x2)", "V") == V{4, 4});
  CHECK(parse_slurm_tasks_per_node("2(x3),1", "V") == V{2, 2, 2, 1});
  CHECK(parse_slurm_tasks_per_node("1,3(x2),2", "V") == V{1, 3, 3, 2});
  for (const char* bad : {"", ",", "4,", "x", "4(2)", "4(x0)", "0", "4(x2", "-1", "4 "})
    CHECK(contains(user_error([&] { parse_slurm_tasks_per_node(bad, "VAR"); }), "VAR='"));

  CHECK(slurm_first_host("node07", "V") == "node07");
  CHECK(slurm_first_host("node[001-004]", "V") == "node001");
  CHECK(slurm_first_host("gpu-[7,9-10],cpu1", "V") == "gpu-7");
  CHECK(slurm_first_host("rack[1-2]-n[3,5]", "V") == "rack1-n3");
  CHECK(slurm_first_host("a,b[1-3]", "V") == "a");
  for (const char* bad : {"", "n[1-2", "n]1", "[]", ",a"})
    CHECK(contains(user_error([&] { slurm_first_host(bad, "NL"); }), "NL='"));
}

TEST_CASE("resolve_dist_env: Open MPI environment") {
  const Env env = {{"OMPI_COMM_WORLD_RANK", "3"},
                   {"OMPI_COMM_WORLD_SIZE", "4"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                   {"MASTER_ADDR", "head"},
                   {"MASTER_PORT", "6000"}};
  const DistEnv d = resolve_dist_env(env, 1, {});
  CHECK(d.source == "openmpi");
  CHECK(d.rank == 3);
  CHECK(d.world_size == 4);
  CHECK(d.local_rank == 1);
  CHECK(d.local_world_size == 2);
  CHECK(d.master_addr == "head");
  CHECK(d.master_port == 6000);
  CHECK(contains(env_error({{"OMPI_COMM_WORLD_RANK", "0"}}),
                 "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not"));
  CHECK(contains(env_error({{"OMPI_COMM_WORLD_RANK", "0"},
                            {"OMPI_COMM_WORLD_SIZE", "2"},
                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "two"},
                            {"MASTER_PORT", "1"}}),
                 "OMPI_COMM_WORLD_LOCAL_SIZE='two'"));
}

TEST_CASE("resolve_dist_env: torchrun beats Open MPI beats Slurm") {
  Env env = {{"RANK", "1"},
             {"WORLD_SIZE", "2"},
             {"SLURM_STEP_ID", "0"},
             {"SLURM_PROCID", "3"},
             {"SLURM_NTASKS", "4"},
             {"OMPI_COMM_WORLD_RANK", "5"},
             {"OMPI_COMM_WORLD_SIZE", "6"},
             {"MASTER_PORT", "7000"}};
  env["MASTER_ADDR"] = "head";  // an Open MPI job has no default master
  DistEnv d = resolve_dist_env(env, 1, {});
  CHECK(d.source == "torchrun");
  CHECK(d.rank == 1);
  env.erase("RANK");
  env.erase("WORLD_SIZE");
  // mpirun inside an sbatch job: every process inherits the batch shell's SLURM_PROCID (0);
  // Open MPI's own variables are per process.
  d = resolve_dist_env(env, 1, {});
  CHECK(d.source == "openmpi");
  CHECK(d.rank == 5);
  env.erase("OMPI_COMM_WORLD_RANK");
  env.erase("OMPI_COMM_WORLD_SIZE");
  d = resolve_dist_env(env, 1, {});
  CHECK(d.source == "slurm");
  CHECK(d.rank == 3);
}

TEST_CASE("resolve_dist_env: a Slurm step's first node is rank 0's host") {
  // srun -w node[04-05] inside an allocation of node[03-05]: task 0 runs on node04.
  const Env env = {{"SLURM_STEP_ID", "0"},
                   {"SLURM_PROCID", "1"},
                   {"SLURM_NTASKS", "2"},
                   {"SLURM_JOB_NODELIST", "node[03-05]"},
                   {"SLURM_STEP_NODELIST", "node[04-05]"},
                   {"SLURM_JOB_ID", "7"}};
  CHECK(resolve_dist_env(env, 1, {}).master_addr == "node04");
}

TEST_CASE("resolve_dist_env: an sbatch batch shell is no Slurm step") {
  // As Slurm 22.05 sets them in the batch shell of `sbatch --ntasks=2`: no step number.
  Env env = {{"SLURM_PROCID", "0"},
             {"SLURM_NTASKS", "2"},
             {"SLURM_LOCALID", "0"},
             {"SLURM_TASKS_PER_NODE", "2"},
             {"SLURM_JOB_NODELIST", "node[03-04]"},
             {"SLURM_JOB_ID", "128401"}};
  DistEnv d = resolve_dist_env(env, 3, {});
  CHECK(d.source == "config");
  CHECK(d.rank == 0);
  CHECK(d.world_size == 3);
  CHECK_FALSE(in_slurm_step(env));
  const std::string note = slurm_batch_shell_note(env);
  CHECK(contains(note, "SLURM_PROCID=0 and SLURM_NTASKS=2 are the batch shell's"));
  CHECK(contains(note, "srun dtrain run"));
  // One task: nothing to warn about; mpirun's ranks in a batch shell: Open MPI decides.
  env["SLURM_NTASKS"] = "1";
  CHECK(slurm_batch_shell_note(env).empty());
  env["SLURM_NTASKS"] = "2";
  env["OMPI_COMM_WORLD_RANK"] = "1";
  CHECK(slurm_batch_shell_note(env).empty());
  env.erase("OMPI_COMM_WORLD_RANK");
  // An srun task (either spelling of the step number): Slurm's place and no note.
  for (const char* step : {"SLURM_STEP_ID", "SLURM_STEPID"}) {
    Env task = env;
    task[step] = "3";
    CHECK(in_slurm_step(task));
    CHECK(slurm_batch_shell_note(task).empty());
    d = resolve_dist_env(task, 3, {});
    CHECK(d.source == "slurm");
    CHECK(d.world_size == 2);
    CHECK(d.master_port == slurm_default_port(128401, 3));
  }
}

TEST_CASE("slurm_default_port: below the ephemeral range, one per concurrent step") {
  std::set<int> ports;
  for (int step = 0; step < 16; ++step) ports.insert(slurm_default_port(128401, step));
  CHECK(ports.size() == 16);  // 16 steps of one job at once
  // Neighbouring jobs' steps never meet theirs.
  size_t met = 0;
  for (int job = 128402; job < 128401 + 1250; ++job)
    for (int step = 0; step < 16; ++step) met += ports.count(slurm_default_port(job, step));
  CHECK(met == 0);
  for (int job : {0, 1, 1249, 1250, 2047, 999999, 2147483647})
    for (int step : {0, 1, 15, 16, 4000000}) {
      const int p = slurm_default_port(job, step);
      CHECK(p >= 10000);
      CHECK(p < 30000);  // Linux's ephemeral ports start at 32768
    }
  CHECK(slurm_default_port(12345, 0) == 27520);
  // Federated clusters' job ids pass 2^31 (3000000000 was refused as "not an integer"): the
  // same formula, without overflow.
  CHECK(slurm_default_port(3000000000, 3) == 10000 + (16 * int64_t{3000000000} + 3) % 20000);
  CHECK(slurm_default_port(INT64_MAX, 15) >= 10000);
  Env env = {{"SLURM_PROCID", "1"},
             {"SLURM_NTASKS", "2"},
             {"SLURM_STEP_ID", "3"},
             {"SLURM_LOCALID", "0"},
             {"SLURM_TASKS_PER_NODE", "1(x2)"},
             {"SLURM_JOB_ID", "3000000000"},
             {"SLURM_JOB_NODELIST", "node[1-2]"}};
  const DistEnv d = resolve_dist_env(env, 2, {});
  CHECK(d.source == "slurm");
  CHECK(d.master_port == slurm_default_port(3000000000, 3));
}

TEST_CASE("resolve_dist_env: flags override the environment and the config") {
  const Env env = {{"RANK", "1"},        {"WORLD_SIZE", "4"},
                   {"LOCAL_RANK", "1"},  {"LOCAL_WORLD_SIZE", "4"},
                   {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1000"}};
  DistOverrides f;
  f.rank = 3;
  f.master_addr = "b";
  f.master_port = 2000;
  f.local_rank = 3;
  DistEnv d = resolve_dist_env(env, 1, f);
  CHECK(d.source == "flags");
  CHECK(d.rank == 3);
  CHECK(d.world_size == 4);  // from the environment still
  CHECK(d.local_rank == 3);
  CHECK(d.master_addr == "b");
  CHECK(d.master_port == 2000);

  // Flags with the config's world size and no environment.
  DistOverrides g;
  g.rank = 1;
  g.master_port = 5000;
  d = resolve_dist_env({}, 2, g);
  CHECK(d.source == "flags");
  CHECK(d.rank == 1);
  CHECK(d.world_size == 2);
  CHECK(d.local_rank == 1);
  CHECK(d.local_world_size == 2);
  g.world_size = 8;
  g.rank = 7;
  CHECK(resolve_dist_env({}, 2, g).world_size == 8);

  // Errors name the flag.
  DistOverrides bad;
  bad.rank = 9;
  CHECK(contains(env_error(env, 1, bad), "--rank=9 is out of range for WORLD_SIZE=4"));
  bad = {};
  bad.world_size = 2;
  CHECK(contains(env_error(env, 1, bad), "LOCAL_WORLD_SIZE=4 is out of range for --world-size=2"));
  bad = {};
  bad.master_port = 0;
  CHECK(contains(env_error(env, 1, bad), "--master-port=0"));
  bad = {};
  bad.local_rank = -1;
  CHECK(contains(env_error(env, 1, bad), "--local-rank=-1"));
  bad = {};
  bad.rank = 1;
  CHECK(contains(env_error({}, 2, bad), "MASTER_PORT is not set"));
}

TEST_CASE("default_blas_threads and the environment") {
  CHECK(default_blas_threads(8, 4) == 2);
  CHECK(default_blas_threads(7, 2) == 3);
  CHECK(default_blas_threads(2, 4) == 1);
  CHECK(default_blas_threads(4, 1) == 4);
  CHECK(default_blas_threads(4, 0) == 4);
  CHECK(default_blas_threads(0, 1) == 1);
  CHECK(available_cores() >= 1);

  ::setenv("DTRAIN_TEST_DIST_ENV", "a=b c", 1);
  const auto env = current_environment();
  REQUIRE(env.count("DTRAIN_TEST_DIST_ENV") == 1);
  CHECK(env.at("DTRAIN_TEST_DIST_ENV") == "a=b c");
  ::unsetenv("DTRAIN_TEST_DIST_ENV");
}

TEST_CASE("job token from the environment, a file, or none") {
  TempDir dir;
  const std::string file = dir.write("token", "  s3cret-token\n");
  ::chmod(file.c_str(), 0600);
  bool too_open = true;

  CHECK(resolve_job_token({}, "", &too_open) == "");
  CHECK_FALSE(too_open);
  CHECK(resolve_job_token({{"DTRAIN_JOB_TOKEN", "from-env"}}, "") == "from-env");
  CHECK(resolve_job_token({{"DTRAIN_JOB_TOKEN", "from-env"}}, file) == "from-env");
  CHECK(resolve_job_token({{"DTRAIN_JOB_TOKEN", ""}}, file, &too_open) == "s3cret-token");
  CHECK_FALSE(too_open);
  ::chmod(file.c_str(), 0644);
  CHECK(resolve_job_token({}, file, &too_open) == "s3cret-token");
  CHECK(too_open);

  const std::string missing = dir / "nope";
  CHECK(contains(user_error([&] { resolve_job_token({}, missing); }), missing));
  const std::string empty = dir.write("empty", " \n\n");
  CHECK(contains(user_error([&] { resolve_job_token({}, empty); }), "is empty"));
  CHECK(contains(user_error([&] { resolve_job_token({}, dir.path()); }),
                 "is a directory, not a file"));
  // A device or a huge file is refused after a bounded read, before a token no RPC can carry
  // (/dev/zero filled memory until the allocation failed); a pipe holding a token is read
  // (`--token-file <(pass show job)` keeps it off disk).
  CHECK(contains(user_error([&] { resolve_job_token({}, "/dev/zero"); }),
                 "'/dev/zero' holds more than 65536 bytes"));
  const std::string fifo = dir / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::thread writer([&] { std::ofstream(fifo) << "piped-token\n"; });
  CHECK(resolve_job_token({}, fifo) == "piped-token");
  writer.join();
  const std::string long_token = dir.write("long", std::string(5000, 'k') + "\n");
  CHECK(contains(user_error([&] { resolve_job_token({}, long_token); }),
                 "is 5000 bytes long: at most 4096"));
  CHECK(contains(user_error([&] {
                   resolve_job_token({{"DTRAIN_JOB_TOKEN", std::string(5000, 'k')}}, "");
                 }),
                 "DTRAIN_JOB_TOKEN is 5000 bytes long"));
  const std::string huge = dir / "huge";
  std::filesystem::resize_file(dir.write("huge", ""), uint64_t{20} << 30);  // sparse
  CHECK(contains(user_error([&] { resolve_job_token({}, huge); }),
                 "is 21474836480 bytes: a token file holds one token"));
  const std::string spaced = dir.write("spaced", "two words\n");
  CHECK(contains(user_error([&] { resolve_job_token({}, spaced); }), spaced));
  CHECK(contains(user_error([&] {
                   resolve_job_token({{"DTRAIN_JOB_TOKEN", "a\tb"}}, "");
                 }),
                 "DTRAIN_JOB_TOKEN"));
}

TEST_CASE("random_token is 32 fresh hex digits") {
  const std::string a = random_token(), b = random_token();
  CHECK(a.size() == 32);
  CHECK(a.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(a != b);
}
