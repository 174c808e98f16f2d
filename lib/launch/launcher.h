// `dtrain launch`: runs the ranks of a job as child processes on this machine, torchrun-style.
#pragma once

#include <csignal>
#include <functional>
#include <string>
#include <vector>

#include "launch/job_agent.h"
#include "util/check.h"

namespace dtrain {

struct LaunchOptions {
  int nproc = 1;        // ranks to start on this node, >= 1
  int master_port = 0;  // rank 0's rendezvous port; 0: a free one (pick_free_port, one node only)
  // Multi-node: this node's ranks are node_rank * nproc + 0..nproc-1 of nnodes * nproc, rank 0's
  // rendezvous is at master_addr:master_port and the launchers agree through node 0's
  // (job_agent.h) at master_port + 1. nnodes > 1 needs a master port, a non-loopback master
  // address and the token (the same on every node).
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  double join_timeout_s = 300;  // multi-node: how long to wait for every node's launcher
  // Elastic node count (--nnodes MIN:MAX): 0, or MIN with nnodes = MAX. Every attempt then runs on
  // the nodes that checked in at node 0's launcher (at least MIN; once MIN are in, node 0 waits
  // last_call_s for the rest), numbered anew in the order of their node_rank (node 0 first), and
  // a node whose launcher is lost, or whose ranks were killed by a signal not sent by a
  // launcher, is dropped for the restart; the job ends when fewer than MIN are left. node_rank
  // is then the node's id, 0 <= id < MAX. resize_argv gives the command whenever the world is
  // not nnodes * nproc (the first attempt's too), with that as the original world.
  int min_nnodes = 0;
  double last_call_s = 30;
  // The command every rank runs, argv[0] first (looked up in PATH when it has no '/'), e.g.
  // {"/abs/path/dtrain", "run", "cfg.yaml", "--set", "a=b", "--out", "runs/x"}.
  std::vector<std::string> child_argv;
  std::string log_dir;  // created if missing; rank r's output goes to log_dir/rank-<r>.log
  // A descriptor every rank gets as its descriptor 3, or -1. dtrain launch passes its output
  // folder's lock (OutDirLock, a flock), so the folder stays locked while any rank lives: ranks
  // orphaned by a killed launcher still write there, and a second job must not start in it.
  int inherit_fd = -1;
  // DTRAIN_JOB_TOKEN for the ranks; "": a fresh random_token() (one node only: several nodes
  // need the same token on every node, so it must be given)
  std::string token;
  // TORCHELASTIC_RUN_ID for the ranks, fixed across restarts (torchrun's --rdzv-id); "": as
  // torchrun, a fresh random id on one node (its --standalone), "none" with several nodes.
  std::string run_id;
  double grace_s = 10;  // after SIGTERM to stop the rest of a failed job: time before SIGKILL
  // After a SIGINT/SIGTERM received here is forwarded, how long the ranks get to finish their step
  // and write their checkpoint (dtrain run's safe interrupt) before SIGKILL; a second signal
  // kills them at once.
  double interrupt_grace_s = 120;
  // The ranks' preemption signal (train.preempt_signal): a rank that this launcher's forwarded
  // signal kills before it installed its handler (still starting: nothing to save) counts as
  // having exited as the handler would have made it, 75 for this signal (else 128 + the signal).
  int preempt_signal = SIGTERM;
  int max_restarts = 0;  // after a rank failed, start all ranks again at most this many times
  // The command of restart `attempt` (1..max_restarts), asked for just before it starts, so it
  // can depend on what the failed attempts left behind (their checkpoints); unset: child_argv.
  std::function<std::vector<std::string>(int attempt)> restart_argv;
  // Elastic (one node): when > 0 and < nproc, a restart drops the slots of the ranks that failed
  // (as a cluster loses a node) and runs with the ranks left, never fewer than min_nproc; below
  // it the launcher gives up. resize_argv(attempt, world) gives the command at a new world size
  // (it may refuse with UserError, e.g. when the global batch cannot be kept); unset: as above.
  int min_nproc = 0;
  // The ranks left are rounded down to a multiple of this (the rank grid's tensor x pipeline
  // cell: a world it does not divide cannot run) before min_nproc is checked.
  int rank_multiple = 1;
  std::function<std::vector<std::string>(int attempt, int world)> resize_argv;
  // Copy rank 0's output to this process's stdout and stderr too (false: only to its log; for
  // callers that print their own report, such as dtrain verify).
  bool echo_rank0 = true;
};

// UserError for options that cannot run (counts, ports, node ranks, the multi-node musts); what
// launch_local checks first.
void check_launch_options(const LaunchOptions& o);

// The options of a multi-node launcher's JobAgent (job_agent.h) for `o`, under the job token.
AgentOptions launch_agent_options(const LaunchOptions& o, const std::string& token);

// Node 0 of a multi-node launch (o.nnodes > 1, o.node_rank 0) that cannot start
// the job for a reason only it checks (its --out holds a run, say): logs `why` at once, hosts the
// launchers' store and tells every other node's launcher as it checks in (each exits 2 with
// "node 0 refused this job: ..."), for at most o.join_timeout_s, then throws `why`. (They waited
// out their join timeout for a node 0 that had exited, and exited 1.) Without o.token it throws
// `why` at once: no launcher can join without the token, and each refuses that itself.
[[noreturn]] void refuse_launch(const LaunchOptions& o, const UserError& why);

// Starts o.nproc ranks and supervises them until all have exited. Each rank gets this process's
// environment plus RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (= nproc), MASTER_ADDR
// (127.0.0.1, or o.master_addr with several nodes), MASTER_PORT, DTRAIN_JOB_TOKEN and
// DTRAIN_RESTART_COUNT; stdin is /dev/null. (RANK is the global rank; logs are named by it and
// "rank 0" below is this node's first rank.) Each
// rank's stdout and stderr are appended to log_dir/rank-<r>.log (after a "==== ... ====" separator
// line); rank 0's are also copied to this process's stdout and stderr respectively.
//
// Each rank runs in its own process group, and every signal to a rank goes to its whole group,
// so helpers a rank spawned go with it. SIGINT, SIGTERM, SIGHUP and SIGUSR1 received here (unless
// they were ignored on entry) are forwarded to every rank, which get interrupt_grace_s to stop on
// their own (dtrain run checkpoints first); a second one sends SIGKILL at once. When a rank exits
// non-zero or by a signal, "rank R failed: exit status S" (or "killed by signal SIGKILL") is logged
// and the others get SIGTERM. Ranks still alive grace_s after a SIGTERM get SIGKILL; after SIGKILL
// the launcher waits at most 5 more seconds (a process stuck in the kernel cannot be reaped) and
// then returns regardless, so it never hangs. Whatever remains of a rank's group when the rank
// exits is SIGKILLed. Status lines go through spdlog. Several nodes: while this node's launcher
// waits for the others (their check-in, or how an attempt ended on them) no rank of it runs, and
// a stop signal ends it at once (by the signal; the preemption signal with 75).
//
// Restarts: once every rank of a failed attempt has exited, and unless the launcher received a
// signal or a rank exited with status 2 (bad input fails again), all ranks are started again, at
// most max_restarts times, each restart logged with its cause (the rank that failed first, its
// exit status or signal) and its number. Every attempt gets the same token, a fresh free port
// (unless master_port is set), DTRAIN_RESTART_COUNT=<attempt> (0 for the first) in the ranks'
// environment and a separator line in the logs.
//
// Multi-node: a rank failure or a received signal on any node stops every node's ranks (the
// signal is forwarded as the same signal on every node, a failure as SIGTERM), every launcher
// names the cause with its rank and node, and node 0's launcher decides restarts for all
// (attempt numbers and the restart budget are node 0's). Elastic nodes (min_nnodes): every
// attempt first checks in (JobAgent::rendezvous), its ranks are node_rank * nproc + local of
// that attempt's nodes, a node that was lost or dropped is left out of the restart (a dropped
// node's launcher returns 1), and "elastic restart N: ..." logs which nodes left or joined.
//
// Returns, for the last attempt: 0 when every rank exited 0, 2 when a rank failed and some rank
// exited with status 2 (a user error: bad config, data or checkpoint), 1 when a rank failed
// otherwise; when stopped by a signal (received here, by another node's launcher, or by a rank
// itself: it exited 75 or 128 + a signal, which its peers follow, and no restart is made) and no
// rank had failed before it: the ranks' own exit status when they all exited with the same one
// (dtrain run's interrupt or requeue code passes through), else 128 + the signal number (130
// for SIGINT, 143 for SIGTERM). Throws UserError for bad options, std::runtime_error
// when a rank cannot be started (after killing the ranks already started). Installs signal handlers
// for its duration and restores them; one launch_local at a time per process.
struct LaunchReport {
  int stop_signal = 0;   // the signal that stopped the job (received here or by another node)
  bool stopped = false;  // by that signal, or a rank's own (a signal sent to a rank): the ranks
                         // checkpointed and the return value is their exit code
  int world_size = 0;    // of the last attempt
};
int launch_local(const LaunchOptions& o, LaunchReport* report = nullptr);

// A TCP port that was free on 127.0.0.1 a moment ago (bound, then closed), chosen at random outside
// the kernel's ephemeral port range (ip_local_port_range) so that no bind(0) or outgoing
// connection of another process can take it before rank 0 binds it; only a program naming that
// port can (the rendezvous then fails loudly, not silently). Falls back to a kernel-chosen port
// when no port outside the range is free.
int pick_free_port();

// A waitpid status in words: "exit status 3", "killed by signal SIGKILL" (" (core dumped)").
std::string describe_wait_status(int status);

}  // namespace dtrain
