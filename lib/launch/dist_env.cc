#include "launch/dist_env.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <thread>

#include <spdlog/spdlog.h>

#include "util/cgroup_limits.h"
#include "util/check.h"
#include "util/fs.h"
#include "util/interrupt.h"
#include "util/strings.h"

extern char** environ;

namespace dtrain {

namespace {

using Env = std::map<std::string, std::string>;

const std::string* find(const Env& env, const std::string& key) {
  const auto it = env.find(key);
  return it == env.end() ? nullptr : &it->second;
}

// A resolved value and the variable, flag or config key it came from (for messages).
struct Field {
  int value = 0;
  std::string name;
  bool set = false;
};

Field from_env(const Env& env, const std::string& key) {
  const std::string* v = find(env, key);
  if (v == nullptr) return {};
  return {parse_env_int(*v, key), key, true};
}

std::string show(const Field& f) {
  return f.name + "=" + std::to_string(f.value);
}

// Both halves of a pair a launcher always sets together, or neither.
// The launchers that set a rank's place as four variables (rank and world both required), in
// precedence order: torchrun's contract, then Open MPI's -- before Slurm's, since mpirun inside
// an sbatch job or salloc shell sets these per process while the SLURM_PROCID it inherits from
// the batch shell is 0 in every process.
struct RankVars {
  const char *source, *launcher, *rank, *world, *local_rank, *local_world;
};
constexpr RankVars kRankVars[] = {
    {"torchrun", "torchrun-style", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"openmpi", "mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
};

void require_pair(const Env& env, const std::string& a, const std::string& b,
                  const std::string& launcher) {
  const bool has_a = env.count(a) > 0, has_b = env.count(b) > 0;
  if (has_a != has_b)
    throw UserError((has_a ? a : b) + " is set but " + (has_a ? b : a) + " is not: a " + launcher +
                    " launch sets both");
}

bool valid_token(const std::string& t) {
  return std::all_of(t.begin(), t.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// The step's number (SLURM_STEP_ID, or SLURM_STEPID of older releases) when it is a
// non-negative integer, else 0.
int64_t slurm_step_id(const Env& env) {
  for (const char* var : {"SLURM_STEP_ID", "SLURM_STEPID"}) {
    const std::string* v = find(env, var);
    if (v == nullptr) continue;
    int64_t id = 0;
    const auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), id);
    return ec == std::errc() && p == v->data() + v->size() && id >= 0 ? id : 0;
  }
  return 0;
}

}  // namespace

bool in_slurm_step(const std::map<std::string, std::string>& env) {
  return env.count("SLURM_PROCID") > 0 &&
         (env.count("SLURM_STEP_ID") > 0 || env.count("SLURM_STEPID") > 0);
}

int slurm_default_port(int64_t job_id, int64_t step_id) {
  DT_CHECK_GE(job_id, 0);
  DT_CHECK_GE(step_id, 0);
  // (16 * job mod 20000 first: no overflow for any int64 id)
  return 10000 + static_cast<int>(((16 * (job_id % 20000)) % 20000 + step_id % 16) % 20000);
}

std::string slurm_batch_shell_note(const std::map<std::string, std::string>& env) {
  const std::string* procid = find(env, "SLURM_PROCID");
  const std::string* ntasks = find(env, "SLURM_NTASKS");
  if (procid == nullptr || ntasks == nullptr || in_slurm_step(env) || *ntasks == "1") return "";
  for (const RankVars& v : kRankVars)  // (mpirun's ranks in a batch shell: those decide)
    if (env.count(v.rank) || env.count(v.world)) return "";
  for (const char* var : {"PET_NODE_RANK", "PET_NNODES", "JOB_COMPLETION_INDEX"})
    if (env.count(var)) return "";  // another source decides
  return "SLURM_PROCID=" + shown_text(*procid) + " and SLURM_NTASKS=" + shown_text(*ntasks) +
         " are the batch shell's, not an srun step's (no SLURM_STEP_ID): ignored, the run "
         "follows the config; start the ranks with `srun dtrain run ...`";
}

namespace {
template <class T>
T parse_env_integer(const std::string& text, const std::string& name) {
  T v = 0;
  const char* b = text.data();
  const char* e = b + text.size();
  const auto [p, ec] = std::from_chars(b, e, v);
  if (!text.empty() && ec == std::errc::result_out_of_range && p == e)
    throw UserError(name + "='" + shown_text(text) + "' is out of range (" +
                    std::to_string(std::numeric_limits<T>::min()) + " to " +
                    std::to_string(std::numeric_limits<T>::max()) + ")");
  if (text.empty() || ec != std::errc() || p != e)
    throw UserError(name + "='" + shown_text(text) + "' is not an integer");
  return v;
}
}  // namespace

int parse_env_int(const std::string& text, const std::string& name) {
  return parse_env_integer<int>(text, name);
}

int64_t parse_env_int64(const std::string& text, const std::string& name) {
  return parse_env_integer<int64_t>(text, name);
}

std::vector<int> parse_slurm_tasks_per_node(const std::string& text, const std::string& var) {
  // Grammar: item ("," item)*, item = count ["(x" repeat ")"].
  auto bad = [&]() -> UserError {
    return UserError(var + "='" + text + "' is not a Slurm task count list like 4(x2),1");
  };
  std::vector<int> out;
  size_t i = 0;
  auto number = [&]() {
    const size_t start = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    if (i == start || i - start > 6) throw bad();
    return std::stoi(text.substr(start, i - start));
  };
  while (true) {
    const int count = number();
    int repeat = 1;
    if (text.compare(i, 2, "(x") == 0) {
      i += 2;
      repeat = number();
      if (i >= text.size() || text[i] != ')') throw bad();
      ++i;
    }
    if (count < 1 || repeat < 1 || out.size() + static_cast<size_t>(repeat) > 100000) throw bad();
    out.insert(out.end(), static_cast<size_t>(repeat), count);
    if (i == text.size()) break;
    if (text[i] != ',') throw bad();
    ++i;
  }
  return out;
}

std::string slurm_first_host(const std::string& nodelist, const std::string& var) {
  // The first top-level item, each bracket group replaced by the start of its first range:
  // "rack[1-2]-n[07,9],x" -> "rack1-n07".
  auto bad = [&]() -> UserError {
    return UserError(var + "='" + nodelist + "' is not a Slurm host list");
  };
  std::string host;
  size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    if (nodelist[i] == ']') throw bad();
    if (nodelist[i] != '[') {
      host += nodelist[i++];
      continue;
    }
    const size_t close = nodelist.find(']', i);
    if (close == std::string::npos) throw bad();
    const std::string group = nodelist.substr(i + 1, close - i - 1);
    const std::string first = group.substr(0, group.find_first_of(",-"));
    if (first.empty()) throw bad();
    host += first;
    i = close + 1;
  }
  if (host.empty()) throw bad();
  return host;
}

std::string master_addr_problem(const std::string& addr) {
  return host_text_problem(addr, "the port as MASTER_PORT or --master-port");
}

namespace {

// An srun step's ranks (in_slurm_step): rank, world, this node's tasks, and the defaults every
// rank of the step derives identically for rank 0's address and port.
void read_slurm_step(const Env& env, Field& rank, Field& world, Field& local_rank,
                     Field& local_world, Field& port, std::string& addr, std::string& addr_name) {
  if (!env.count("SLURM_NTASKS"))
    throw UserError("SLURM_PROCID is set but SLURM_NTASKS is not: run the ranks with srun");
  rank = from_env(env, "SLURM_PROCID");
  world = from_env(env, "SLURM_NTASKS");
  local_rank = from_env(env, "SLURM_LOCALID");
  for (const char* var :
       {"SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    const std::string* v = find(env, var);
    if (v == nullptr) continue;
    const std::vector<int> counts = parse_slurm_tasks_per_node(*v, var);
    int n = *std::max_element(counts.begin(), counts.end());
    if (counts.size() > 1) {
      // Nodes may run different numbers of tasks; pick this node's entry when it is known.
      const Field node = from_env(env, "SLURM_NODEID");
      if (node.set && node.value >= 0 && static_cast<size_t>(node.value) < counts.size())
        n = counts[static_cast<size_t>(node.value)];
    }
    local_world = {n, var, true};
    break;
  }
  // Defaults every rank of the step derives identically (scripts/slurm.sbatch exports its own
  // MASTER_ADDR and MASTER_PORT, which win: the allocation's first host, where its srun puts task
  // 0). The step's nodes first: `srun -w` / `--relative` / `-x` put task 0 on another node than
  // the allocation's first.
  for (const char* var : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (const std::string* v = find(env, var)) {
      addr = slurm_first_host(*v, var);
      addr_name = var;
      break;
    }
  }
  if (const std::string* job = find(env, "SLURM_JOB_ID")) {
    const int64_t id = parse_env_int64(*job, "SLURM_JOB_ID");
    if (id >= 0) port = {slurm_default_port(id, slurm_step_id(env)), "SLURM_JOB_ID", true};
  }
}

}  // namespace

DistEnv resolve_dist_env(const std::map<std::string, std::string>& env, int config_world_size,
                         const DistOverrides& flags) {
  Field rank{0, "rank", true};
  Field world{config_world_size, "distributed.world_size", true};
  Field local_rank, local_world, port;
  std::string addr = "127.0.0.1", addr_name = "MASTER_ADDR";
  std::string source = "config";

  const RankVars* four = nullptr;
  for (const RankVars& v : kRankVars)
    if (!four && (env.count(v.rank) || env.count(v.world))) four = &v;
  if (four != nullptr) {
    source = four->source;
    require_pair(env, four->rank, four->world, four->launcher);
    rank = from_env(env, four->rank);
    world = from_env(env, four->world);
    local_rank = from_env(env, four->local_rank);
    local_world = from_env(env, four->local_world);
  } else if (in_slurm_step(env)) {
    source = "slurm";
    read_slurm_step(env, rank, world, local_rank, local_world, port, addr, addr_name);
  } else if (env.count("PET_NODE_RANK") || env.count("PET_NNODES")) {
    // Kubeflow Trainer describes nodes (pods) for torchrun: one rank per pod here.
    source = "kubeflow";
    require_pair(env, "PET_NODE_RANK", "PET_NNODES", "Kubeflow Trainer");
    // "auto" and "cpu" (PyTorchJob's default) name no count: `dtrain launch` takes its --nproc
    // for them, `dtrain run` is one rank per pod; "gpu" is refused as launch refuses it.
    const std::string* per_text = find(env, "PET_NPROC_PER_NODE");
    if (per_text != nullptr && *per_text == "gpu")
      throw UserError("PET_NPROC_PER_NODE=gpu: dtrain trains on CPUs; give a number, auto or cpu");
    if (per_text == nullptr || (*per_text != "auto" && *per_text != "cpu"))
      if (const Field per = from_env(env, "PET_NPROC_PER_NODE"); per.set && per.value != 1)
        throw UserError(show(per) +
                        ": each pod runs several ranks, which `dtrain run` cannot start; "
                        "make `dtrain launch` the pod's command (it reads the PET_ variables)");
    rank = from_env(env, "PET_NODE_RANK");
    world = from_env(env, "PET_NNODES");
    local_rank = {0, "local rank", true};
    local_world = {1, "local world size (one rank per pod)", true};
  } else if (env.count("JOB_COMPLETION_INDEX")) {
    // A Kubernetes Indexed Job: the pod's index is the rank; the world is the config's
    // distributed.world_size (or --world-size), which the manifest keeps equal to completions.
    source = "k8s-indexed";
    rank = from_env(env, "JOB_COMPLETION_INDEX");
    local_rank = {0, "local rank", true};
    local_world = {1, "local world size (one rank per pod)", true};
  }
  if (source == "kubeflow") {
    if (const std::string* v = find(env, "PET_MASTER_ADDR")) {
      addr = *v;
      addr_name = "PET_MASTER_ADDR";
    }
    if (env.count("PET_MASTER_PORT")) port = from_env(env, "PET_MASTER_PORT");
  }

  const bool from_openmpi = source == "openmpi";
  const bool from_indexed = source == "k8s-indexed";  // (flags below rename the source)
  bool addr_given = false;                            // by MASTER_ADDR or --master-addr
  if (const std::string* v = find(env, "MASTER_ADDR")) {
    addr = *v;
    addr_name = "MASTER_ADDR";
    addr_given = true;
  }
  if (env.count("MASTER_PORT")) port = from_env(env, "MASTER_PORT");
  // torchrun's static rendezvous (and from PyTorch 2.4 its c10d one, sharing its store) keeps
  // MASTER_PORT for the agent's own TCPStore, which workers are to use as clients: it says so
  // with TORCHELASTIC_USE_AGENT_STORE=True. dtrain's rank 0 serves a rendezvous of its own, so it
  // takes the next port, the same on every rank (rank 0 runs on MASTER_ADDR, the store's host);
  // else rank 0 found MASTER_PORT taken and exited 1.
  if (const std::string* agent = find(env, "TORCHELASTIC_USE_AGENT_STORE");
      agent != nullptr && *agent == "True" && port.set && port.name == "MASTER_PORT")
    port = {port.value + 1,
            "MASTER_PORT + 1 (torchrun's agent serves its store on MASTER_PORT: "
            "TORCHELASTIC_USE_AGENT_STORE=True)",
            true};

  if (flags.any()) source = "flags";
  if (flags.rank) rank = {*flags.rank, "--rank", true};
  if (flags.world_size) world = {*flags.world_size, "--world-size", true};
  if (flags.local_rank) local_rank = {*flags.local_rank, "--local-rank", true};
  if (flags.master_addr) {
    addr = *flags.master_addr;
    addr_name = "--master-addr";
    addr_given = true;
  }
  if (flags.master_port) port = {*flags.master_port, "--master-port", true};

  if (world.value < 1) throw UserError(show(world) + ": the world size must be at least 1");
  // The transports stop at 1024 ranks (distributed.world_size and --nproc are capped there too):
  // a WORLD_SIZE of 2000000 waited for two million ranks and listed them in one 17 MB line.
  if (world.value > kMaxWorldSize)
    throw UserError(show(world) + " is above " + std::to_string(kMaxWorldSize) +
                    ", the most ranks a dtrain job runs");
  if (rank.value < 0 || rank.value >= world.value)
    throw UserError(show(rank) + " is out of range for " + show(world) +
                    " (0 <= rank < world size)");
  if (!local_world.set) local_world = {world.value, "local world size (= world size)", true};
  if (local_world.value < 1 || local_world.value > world.value)
    throw UserError(show(local_world) + " is out of range for " + show(world) +
                    " (1 <= local world size <= world size)");
  if (!local_rank.set) local_rank = {rank.value % local_world.value, "local rank", true};
  if (local_rank.value < 0 || local_rank.value >= local_world.value)
    throw UserError(show(local_rank) + " is out of range for " + show(local_world) +
                    " (0 <= local rank < local world size)");
  if (port.set && (port.value < 1 || port.value > 65535))
    throw UserError(show(port) + " is not a TCP port (1..65535)");
  if (addr.empty()) throw UserError(addr_name + " is empty");
  // (one rank meets nobody but itself, over gRPC only: refused there, train/distributed.cc)
  if (const std::string why = master_addr_problem(addr); !why.empty() && world.value > 1)
    throw UserError(addr_name + " '" + addr + "' " + why);
  // Open MPI says nothing about rank 0's host; 127.0.0.1 would be wrong on every other host
  // (their ranks would wait on their own loopback until the rendezvous timeout).
  if (from_indexed && world.value > 1 && !addr_given)
    throw UserError(
        "MASTER_ADDR is not set: each pod of an Indexed Job is a host of its own, so "
        "127.0.0.1 is never rank 0's; set MASTER_ADDR to pod 0's DNS name (as "
        "deploy/ does) or pass --master-addr");
  if (from_openmpi && world.value > 1 && !addr_given)
    throw UserError("MASTER_ADDR is not set: Open MPI does not tell the " +
                    std::to_string(world.value) +
                    " processes where rank 0 runs; pass -x MASTER_ADDR=<rank 0's host> -x "
                    "MASTER_PORT=<port> to mpirun (127.0.0.1 when all run on this machine)");
  if (source != "config" && world.value > 1 && !port.set)
    throw UserError("MASTER_PORT is not set: the " + std::to_string(world.value) +
                    " processes of this job need rank 0's rendezvous port (MASTER_PORT or "
                    "--master-port)");

  DistEnv d;
  d.rank = rank.value;
  d.world_size = world.value;
  d.local_rank = local_rank.value;
  d.local_world_size = local_world.value;
  d.master_addr = addr;
  d.master_addr_from = addr_name;
  d.master_port = port.set ? port.value : 0;
  d.source = source;
  return d;
}

void end_with_launcher(const std::map<std::string, std::string>& env) {
  const auto it = env.find(kLauncherPidEnv);
  if (it == env.end()) return;
  pid_t launcher = 0;
  const char* end = it->second.data() + it->second.size();
  // (pid 1 only as this rank's parent: a launcher that is a container's entry point)
  if (std::from_chars(it->second.data(), end, launcher).ptr != end || launcher < 1 ||
      (launcher == 1 && ::getppid() != 1)) {
    spdlog::warn("{}='{}' is not a process id: this rank does not follow its launcher",
                 kLauncherPidEnv, it->second);
    return;
  }
  set_signal_forwarder(launcher);  // (its forwarded copies never escalate a stop)
  // Our stdout and stderr may be pipes the launcher reads: once it is gone, a write must fail
  // (EPIPE) rather than kill this rank (SIGPIPE) before it stops cleanly.
  std::signal(SIGPIPE, SIG_IGN);
  if (::prctl(PR_SET_PDEATHSIG, launcher_gone_signal()) != 0) return;
  if (::getppid() == launcher) return;  // from now on the kernel tells us
  ::prctl(PR_SET_PDEATHSIG, 0);         // our parent is a wrapper, not the launcher
  if (::kill(launcher, 0) != 0 && errno == ESRCH) {
    spdlog::warn("the launcher (pid {}) is gone: stopping", launcher);
    ::raise(launcher_gone_signal());
  }
}

std::map<std::string, std::string> current_environment() {
  std::map<std::string, std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq == nullptr) continue;
    out.emplace(std::string(*e, static_cast<size_t>(eq - *e)),
                std::string(eq + 1));  // keeps the first
  }
  return out;
}

int default_blas_threads(int cores, int local_world_size) {
  return std::max(1, cores / std::max(1, local_world_size));
}

int available_cores() {
  return usable_cores();
}

// The longest token (random_token() gives 32 hex digits): every RPC carries it as metadata, and
// gRPC refuses more than 8 KiB of it ("received initial metadata size exceeds limit", exit 1 at
// the rendezvous). And the most a token file is read for (a token and its line end).
constexpr size_t kMaxTokenBytes = 4096;
constexpr uint64_t kMaxTokenFileBytes = 64 << 10;

namespace {

// A token file's text: a regular file of at most kMaxTokenFileBytes, or a pipe -- `--token-file
// <(pass show job)` keeps the secret off disk -- or device, read for at most that many bytes
// (/dev/zero would read without end). UserError naming the file otherwise.
std::string read_token_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode))) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw UserError("token file '" + path + "' cannot be opened: " + strerror(errno));
    std::string text(kMaxTokenFileBytes + 1, '\0');
    size_t got = 0;
    while (got < text.size()) {
      const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    ::close(fd);
    if (got > kMaxTokenFileBytes)
      throw UserError("token file '" + path + "' holds more than " +
                      std::to_string(kMaxTokenFileBytes) + " bytes: not one token");
    text.resize(got);
    return text;
  }
  if (const std::string why = input_file_problem(path); !why.empty())  // (a directory too)
    throw UserError("token file '" + path + "' " + why);
  if (std::error_code ec; std::filesystem::file_size(path, ec) > kMaxTokenFileBytes)
    throw UserError(
        "token file '" + path + "' is " + std::to_string(std::filesystem::file_size(path, ec)) +
        " bytes: a token file holds one token (at most " + std::to_string(kMaxTokenBytes) + ")");
  return read_regular_file(path, kMaxTokenFileBytes);
}

}  // namespace

std::string resolve_job_token(const std::map<std::string, std::string>& env,
                              const std::string& token_file_path, bool* file_too_open) {
  if (file_too_open != nullptr) *file_too_open = false;
  const auto too_long = [](const std::string& what, size_t n) {
    return UserError(what + " is " + std::to_string(n) + " bytes long: at most " +
                     std::to_string(kMaxTokenBytes) +
                     " (every request carries it, and gRPC takes no more)");
  };
  if (const std::string* v = find(env, "DTRAIN_JOB_TOKEN"); v != nullptr && !v->empty()) {
    if (!valid_token(*v))
      throw UserError("DTRAIN_JOB_TOKEN holds spaces or non-printable characters");
    if (v->size() > kMaxTokenBytes) throw too_long("DTRAIN_JOB_TOKEN", v->size());
    return *v;
  }
  if (token_file_path.empty()) return "";
  const std::string token = trim(read_token_file(token_file_path));
  if (token.size() > kMaxTokenBytes)
    throw too_long("the token in '" + token_file_path + "'", token.size());
  if (token.empty()) throw UserError("token file '" + token_file_path + "' is empty");
  if (!valid_token(token))
    throw UserError("token file '" + token_file_path +
                    "' holds spaces or non-printable characters inside the token");
  struct stat st {};
  if (::stat(token_file_path.c_str(), &st) == 0 && (st.st_mode & (S_IRGRP | S_IROTH)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    spdlog::warn("token file '{}' is readable by other users (mode {}): chmod 600 it",
                 token_file_path, mode);
    if (file_too_open != nullptr) *file_too_open = true;
  }
  return token;
}

std::string random_token() {
  unsigned char bytes[16];
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(std::string("cannot open /dev/urandom: ") + strerror(errno));
  size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = ::read(fd, bytes + got, sizeof bytes - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      throw std::runtime_error("cannot read /dev/urandom");
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

}  // namespace dtrain
