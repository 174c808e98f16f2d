// Where this process sits in a multi-process job, and the job's shared secret.
//
// A rank learns its place from (highest precedence first): command-line flags, the environment a
// launcher set (torchrun's contract, else Open MPI's, else Slurm's), the config. `dtrain launch`
// and scripts/launch_local.sh set torchrun's variables; `srun` sets Slurm's; `mpirun` Open MPI's.
// Nothing here talks to the network; the gRPC transport consumes the result.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dtrain {

// The most ranks a job has (distributed.world_size, --nproc and a launcher's WORLD_SIZE).
inline constexpr int kMaxWorldSize = 1024;

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // index of this process among the job's processes on this machine
  int local_world_size = 1;  // the job's processes on this machine (divides the cores)
  std::string master_addr = "127.0.0.1";         // where rank 0's rendezvous service listens
  std::string master_addr_from = "MASTER_ADDR";  // what gave it: MASTER_ADDR, --master-addr, ...
  int master_port = 0;                           // 0: not set (fine for a single process)
  // Which source decided rank/world: "config" | "torchrun" | "slurm" | "openmpi" | "kubeflow" |
  // "k8s-indexed" | "flags"
  // ("flags" as soon as any flag was given, whatever filled the other fields).
  std::string source = "config";
};

// Command-line overrides (dtrain run --rank/--world-size/--local-rank/--master-addr/
// --master-port). Error messages name them by those flag spellings.
struct DistOverrides {
  std::optional<int> rank;
  std::optional<int> world_size;
  std::optional<int> local_rank;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
  bool any() const { return rank || world_size || local_rank || master_addr || master_port; }
};

// Resolves the process's place in the job; per field, flags > environment > config.
//
// Environment sources, the first present wins:
//  - torchrun, when RANK or WORLD_SIZE is set: RANK, WORLD_SIZE (both required), LOCAL_RANK,
//    LOCAL_WORLD_SIZE.
//  - Open MPI, when OMPI_COMM_WORLD_RANK or OMPI_COMM_WORLD_SIZE is set: OMPI_COMM_WORLD_RANK,
//    OMPI_COMM_WORLD_SIZE (both required), OMPI_COMM_WORLD_LOCAL_RANK,
//    OMPI_COMM_WORLD_LOCAL_SIZE. Open MPI names no master, so a job of more than one process
//    needs MASTER_ADDR (or --master-addr): no 127.0.0.1 default, which is wrong on other hosts.
//    (Before Slurm: mpirun inside an sbatch job leaves every process the batch shell's
//    SLURM_PROCID, while these are per process.)
//  - Slurm, inside an srun step (in_slurm_step): SLURM_PROCID, SLURM_NTASKS (required),
//    SLURM_LOCALID; the
//    local world from SLURM_STEP_TASKS_PER_NODE, else SLURM_NTASKS_PER_NODE, else
//    SLURM_TASKS_PER_NODE ("4(x2)" / "2(x3),1" forms; the entry for SLURM_NODEID, or the largest
//    when SLURM_NODEID is unknown). Without MASTER_ADDR / MASTER_PORT, the master is the first
//    host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST) and slurm_default_port (as
//    scripts/slurm.sbatch sets them), so every rank of the step agrees without coordination.
//    A batch shell's SLURM_PROCID (sbatch sets SLURM_PROCID=0 and the job's SLURM_NTASKS there,
//    for a shell that is no rank) is not a source: see slurm_batch_shell_note.
//  - Kubeflow Trainer, when PET_NODE_RANK or PET_NNODES is set (one rank per pod):
//    PET_NODE_RANK, PET_NNODES (both required), PET_NPROC_PER_NODE (must be 1: a pod of several
//    ranks runs `dtrain launch`), PET_MASTER_ADDR, PET_MASTER_PORT; local world 1.
//  - a Kubernetes Indexed Job, when JOB_COMPLETION_INDEX is set: the index is the rank, the
//    world the config's (or --world-size); local world 1. (It alone does not make `dtrain run`
//    a multi-process job -- an Indexed Job may be a sweep -- the config's backend: grpc does;
//    with more than one rank it needs MASTER_ADDR: each pod is a host of its own.)
// MASTER_ADDR and MASTER_PORT are read from the environment whatever the source (over the PET_
// ones).
// Config only: rank 0 of `config_world_size`, all ranks in this process (local world = world).
// A missing local world is taken as "every rank on this machine" (local world = world), a missing
// local rank as rank % local world: dividing the cores too finely is cheaper than
// oversubscribing them.
//
// Throws UserError naming the variable or flag for: a value that is not a whole integer, a
// partial set (RANK without WORLD_SIZE, ...), world < 1, rank outside [0, world), local rank
// outside [0, local world), local world > world, a port outside 1..65535, an empty address, and
// a job of more than one process (source other than "config") with no master port, an Open MPI
// job of more than one process with no master address.
DistEnv resolve_dist_env(const std::map<std::string, std::string>& env, int config_world_size,
                         const DistOverrides& flags = {});

// Whether this process is a task of an srun step: SLURM_PROCID and the step's number
// (SLURM_STEP_ID, or SLURM_STEPID of older releases) are set. Checked on Slurm 22.05: an sbatch
// batch shell has SLURM_PROCID=0 and SLURM_NTASKS of the job but no step number; an srun task
// has all three (SLURM_NTASKS then counts the step's tasks).
bool in_slurm_step(const std::map<std::string, std::string>& env);

// Slurm's master port when MASTER_PORT is unset: 10000 + (16 * job + step % 16) % 20000, in
// 10000..29999, below Linux's ephemeral range (32768..60999) where outgoing connections take
// their ports; up to 16 steps of one job running at once get distinct ports, and jobs whose ids
// differ by less than 1250 never share one. scripts/slurm.sbatch uses step 0's (its srun is the
// job's first step). job_id, step_id >= 0 (job ids pass 2^31 on federated clusters).
int slurm_default_port(int64_t job_id, int64_t step_id);

// For `dtrain run` started in an sbatch batch shell of more than one task (SLURM_PROCID and
// SLURM_NTASKS > 1 but no srun step) with no other launcher's variables: a warning that they are
// ignored and how to start the ranks; "" otherwise. (Rank flags decide too: the caller checks.)
std::string slurm_batch_shell_note(const std::map<std::string, std::string>& env);

// This process's environment (environ) as a map; for a name given twice the first wins, as
// getenv does.
std::map<std::string, std::string> current_environment();

// The variable through which `dtrain launch` tells its ranks its process id.
inline constexpr char kLauncherPidEnv[] = "DTRAIN_LAUNCHER_PID";
// The descriptor through which `dtrain launch` gives its ranks its output folder's lock
// (LaunchOptions::inherit_fd).
inline constexpr int kInheritedFd = 3;

// A rank that `dtrain launch` started (kLauncherPidEnv names its parent) ends with it: the kernel
// sends it launcher_gone_signal() (util/interrupt.h) if the launcher dies (SIGKILL, the OOM
// killer), which InterruptGuard takes as the preemption signal (a checkpoint if configured, exit
// 75), instead of training on, orphaned, into the launcher's output folder; SIGPIPE is ignored
// (its console pipes may lead to the dead launcher). A launcher already gone before this call:
// the same stop at once. Under a wrapper between launcher and rank (another parent, still
// alive): nothing. Call while an InterruptGuard is alive (its destructor cancels the request).
// Linux only; never throws.
void end_with_launcher(const std::map<std::string, std::string>& env);

// OpenBLAS threads for one rank when runtime.threads is 0: the cores shared by the ranks on this
// machine, at least 1.
int default_blas_threads(int cores, int local_world_size);

// CPUs this process may run on (its affinity mask, so taskset/cgroup cpusets count, at most its
// cgroup's CPU quota rounded up: util/cgroup_limits.h usable_cores), >= 1.
int available_cores();

// The job token every rank presents to the rendezvous: DTRAIN_JOB_TOKEN when set and non-empty,
// else the trimmed contents of `token_file_path` when that is non-empty, else "" (no token).
// Throws UserError when the file is missing, unreadable or empty, or a token holds characters
// other than printable non-space ASCII (it travels as gRPC metadata). A file readable by group
// or others is accepted with a spdlog warning, and *file_too_open (if given) set to true.
std::string resolve_job_token(const std::map<std::string, std::string>& env,
                              const std::string& token_file_path, bool* file_too_open = nullptr);

// 32 lowercase hex digits from /dev/urandom. Throws std::runtime_error if it cannot be read.
std::string random_token();

// Why `addr` cannot be rank 0's host as MASTER_ADDR / --master-addr give it ("" when it can): a
// "host:port" (the port is MASTER_PORT's: rank 0 would listen on neither, the others wait out the
// rendezvous), a URL, or whitespace. IPv6 literals (two or more ':') pass.
std::string master_addr_problem(const std::string& addr);

// An environment variable's (or flag's) value as an int: the whole text must be base-10 digits
// with an optional '-' ("4 ", "+4", "4x" and "" are refused), so a typo in a launcher's variable
// fails loudly instead of silently becoming rank 0. UserError naming `name` otherwise.
int parse_env_int(const std::string& text, const std::string& name);
// The same for a 64-bit value (SLURM_JOB_ID: federated clusters' ids are above 2^31).
int64_t parse_env_int64(const std::string& text, const std::string& name);

// Slurm's compressed per-node task counts, "2(x3),1" -> {2, 2, 2, 1}. `var` names the variable
// in the UserError thrown for malformed text.
std::vector<int> parse_slurm_tasks_per_node(const std::string& text, const std::string& var);

// The first host of a Slurm hostlist: "node[03-05,9],gpu1" -> "node03". Throws UserError naming
// `var` for unbalanced brackets or an empty list.
std::string slurm_first_host(const std::string& nodelist, const std::string& var);

}  // namespace dtrain
