#include "launch/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "comm/rendezvous/master_addr.h"
#include "comm/shm_ring.h"
#include "launch/attempt.h"
#include "launch/attempt_result.h"
#include "launch/dist_env.h"
#include "launch/error_file.h"
#include "launch/job_agent.h"
#include "launch/process.h"
#include "util/check.h"
#include "util/duration.h"
#include "util/interrupt.h"

namespace dtrain {

using launch_detail::AttemptPlan;
using launch_detail::AttemptResult;
using launch_detail::Child;
using launch_detail::ChildSet;
using launch_detail::Clock;
using launch_detail::Fd;
using launch_detail::fmt_ranks;
using launch_detail::follow_named_cause;
using launch_detail::is_stop_code;
using launch_detail::kAfterKill;
using launch_detail::local_decision;
using launch_detail::node_outcome;
using launch_detail::ReapedRanks;
using launch_detail::run_attempt;
using launch_detail::signal_after_failure;
using launch_detail::signal_name;
using launch_detail::SignalGuard;
using launch_detail::spawn_rank;
using launch_detail::sys_error;
using launch_detail::Tee;
using launch_detail::write_fully;

namespace {

// One launch_local at a time per process (the signal handlers are per process).
std::atomic<bool> g_active{false};

}  // namespace

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "killed by signal " + signal_name(WTERMSIG(status)) +
           (WCOREDUMP(status) ? " (core dumped)" : "");
  return "wait status " + std::to_string(status);
}

namespace {

// While the launcher waits for the other nodes, no rank runs: a stop signal then ends it at once
// (SignalGuard::default_stop_signals), instead of waiting out the check-in's timeout.
struct DefaultStopSignals {
  DefaultStopSignals(SignalGuard& g, int preempt_signal) : g_(g) {
    g_.default_stop_signals(preempt_signal);
  }
  ~DefaultStopSignals() { g_.catch_stop_signals(); }
  DefaultStopSignals(const DefaultStopSignals&) = delete;
  DefaultStopSignals& operator=(const DefaultStopSignals&) = delete;

 private:
  SignalGuard& g_;
};

// Elastic nodes: checks in for `attempt` and logs which nodes run it and what changed since
// `before` (the previous attempt's nodes).
Membership elastic_check_in(JobAgent& agent, const LaunchOptions& o, int attempt,
                            const Membership& before) {
  spdlog::info("node {}: checking in for attempt {} at {}:{} ({} to {} nodes)", o.node_rank,
               attempt + 1, o.master_addr, o.master_port + 1, o.min_nnodes, o.nnodes);
  Membership m = agent.rendezvous(attempt, o.nproc);
  std::string list;
  for (size_t i = 0; i < m.nodes.size(); ++i)
    list += (i ? ", " : "") + std::to_string(m.nodes[i]) + "=" + m.hosts[i];
  if (attempt == 0) {
    spdlog::info("{} of at most {} nodes checked in: {}; this node is node rank {}", m.nodes.size(),
                 o.nnodes, list, m.node_rank);
    return m;
  }
  std::vector<int> gone, added;
  for (int n : before.nodes)
    if (std::find(m.nodes.begin(), m.nodes.end(), n) == m.nodes.end()) gone.push_back(n);
  for (int n : m.nodes)
    if (std::find(before.nodes.begin(), before.nodes.end(), n) == before.nodes.end())
      added.push_back(n);
  if (gone.empty() && added.empty()) return m;
  spdlog::warn(
      "elastic restart {}: {} node(s) instead of {} ({}{}{}), {} rank(s) instead of {}; "
      "nodes {}; this node is node rank {}",
      attempt, m.nodes.size(), before.nodes.size(),
      gone.empty() ? "" : "node(s) " + fmt_ranks(gone) + " left",
      gone.empty() || added.empty() ? "" : ", ",
      added.empty() ? "" : "node(s) " + fmt_ranks(added) + " joined",
      m.nodes.size() * static_cast<size_t>(o.nproc),
      before.nodes.size() * static_cast<size_t>(o.nproc), list, m.node_rank);
  return m;
}

// A node's end of an attempt of a multi-node job: its outcome reported, node 0's decision taken;
// nullopt to restart, else the launcher's exit code.
std::optional<int> node_decision(const LaunchOptions& o, JobAgent& agent, SignalGuard& signals,
                                 const AttemptResult& r, const AttemptPlan& plan, int attempt,
                                 const std::string& token, const std::string& node_text) {
  const int stop_rc = r.stop_rc();
  NodeOutcome mine = node_outcome(r, stop_rc, node_text);
  // Ctrl-C or SIGTERM after the ranks were gone (while the failed attempt wound down) was
  // forwarded to no one: reported as this node's stop, with the failure's code, node 0
  // decides no restart, as one node does (local_decision), instead of the signal landing
  // on the ranks of a restart.
  if (mine.kind == NodeOutcome::kFailed || mine.kind == NodeOutcome::kUserError)
    if (const int late = signal_after_failure(r, signals); late != 0) {
      spdlog::warn("received {}: not restarting", signal_name(late));
      mine.kind = NodeOutcome::kStopped;
      mine.cause += "; then " + signal_name(late) + " on node " + std::to_string(plan.node_rank);
    }
  // Node 0 may wait minutes for the others' reports (their ranks finishing a checkpoint),
  // the others for its decision; no rank of this node runs then, so a stop signal ends the
  // launcher at once, as during the check-in. One already here ends it too (node 0 may yet
  // decide a restart), unless it is this attempt's own stop delivered twice; Ctrl-Z stops it.
  std::vector<int> pending = signals.take_while_idle();
  std::erase(pending, r.stop_signal);
  if (plan.node_rank == 0)
    spdlog::info("attempt {} ended on this node; waiting up to {} s for the other nodes' reports",
                 attempt + 1, launch_agent_options(o, token).report_timeout_s);
  else
    spdlog::info("attempt {} ended on this node; waiting for node 0's decision", attempt + 1);
  const JobDecision d = [&] {
    const DefaultStopSignals interruptible(signals, o.preempt_signal);
    for (int sig : pending) ::raise(sig);  // (their default action, or 75, ends it here)
    return agent.finish(attempt, mine, o.max_restarts);
  }();
  if (d.restart) {
    spdlog::warn("restart {} of {} (node 0's count): {}; starting this node's {} rank(s) again",
                 attempt + 1, o.max_restarts, d.reason, plan.nproc);
    return std::nullopt;
  }
  if (d.rc == 0)
    spdlog::info("all {} rank(s) on {} nodes finished{}", plan.world, plan.nnodes,
                 attempt > 0 ? " after " + std::to_string(attempt) + " restart(s)" : "");
  else if (!d.reason.empty())
    spdlog::error("the job ended in attempt {} (exit {}): {}", attempt + 1, d.rc, d.reason);
  return d.rc;
}

// launch_local's attempts; `blamed_record`: the error record of the rank the last failed attempt
// blamed (for publish_parent_error).
int launch_attempts(const LaunchOptions& o, LaunchReport* report, std::string* blamed_record) {
  check_launch_options(o);
  bool expected = false;
  DT_CHECK_MSG(g_active.compare_exchange_strong(expected, true),
               "launch_local is already running in this process");
  struct ActiveReset {
    ~ActiveReset() { g_active = false; }
  } active_reset;

  const std::string token = o.token.empty() ? random_token() : o.token;
  // (A random id of its own: the token is a secret, and the ranks' scripts may log the run id.)
  const std::string run_id =
      !o.run_id.empty() ? o.run_id : (o.nnodes > 1 ? std::string("none") : random_token());
  std::error_code ec;
  std::filesystem::create_directories(o.log_dir, ec);
  if (ec) throw UserError("cannot create log folder '" + o.log_dir + "': " + ec.message());

  // One set of handlers for every attempt: a signal between two attempts is not lost.
  SignalGuard signals;
  // --node-rank defaults to 0 (as torchrun's): a second node's launcher started without it takes
  // node 0's place on the wrong host, and both wait out the check-in for node 1 with no word.
  // (a name that does not resolve yet, as a Kubernetes service's before its pods are ready, is
  // no sign of that)
  if (o.nnodes > 1 && o.node_rank == 0 && master_addr_problem(o.master_addr, false).empty())
    if (const std::string why = master_addr_problem(o.master_addr, /*serving=*/true); !why.empty())
      spdlog::warn(
          "node 0 of {}: {}. Node 0 is the node at --master-addr: is this another node whose "
          "--node-rank (default 0) was left out?",
          o.nnodes, why);
  std::unique_ptr<JobAgent> agent;
  if (o.nnodes > 1) agent = std::make_unique<JobAgent>(launch_agent_options(o, token));
  const bool elastic_nodes = agent && o.min_nnodes > 0 && o.min_nnodes < o.nnodes;
  if (agent && !elastic_nodes) {
    spdlog::info("node {} of {}: waiting for every node's launcher at {}:{}", o.node_rank, o.nnodes,
                 o.master_addr, o.master_port + 1);
    const std::vector<std::string> hosts = [&] {
      const DefaultStopSignals interruptible(signals, o.preempt_signal);
      return agent->join(o.nproc);
    }();
    std::string list;
    for (size_t n = 0; n < hosts.size(); ++n)
      list += (n ? ", " : "") + std::to_string(n) + "=" + hosts[n];
    spdlog::info("all {} nodes checked in: {}", o.nnodes, list);
  }
  const std::string node_text =
      agent ? " on node " + std::to_string(o.node_rank) + " (" + agent->host_name() + ")" : "";
  int port = 0;
  int nproc = o.nproc;
  Membership members;  // elastic nodes: the attempt's
  for (int attempt = 0;; ++attempt) {
    if (o.master_port != 0) {
      port = o.master_port;
    } else {
      // A fresh port per attempt: the failed attempt's may linger (TIME_WAIT, a rank that
      // survived SIGKILL).
      const int old = port;
      for (int tries = 0; tries < 10 && port == old; ++tries) port = pick_free_port();
    }
    AttemptPlan plan;
    plan.node_rank = o.node_rank;
    plan.nnodes = o.nnodes;
    if (elastic_nodes) {
      {
        const DefaultStopSignals interruptible(signals, o.preempt_signal);
        members = elastic_check_in(*agent, o, attempt, members);
      }
      plan.node_rank = members.node_rank;
      plan.nnodes = static_cast<int>(members.nodes.size());
    }
    const int full_world = o.nnodes * o.nproc;
    std::vector<std::string> argv = o.child_argv;
    if (elastic_nodes && plan.nnodes * nproc != full_world && o.resize_argv)
      argv = o.resize_argv(attempt, plan.nnodes * nproc);
    else if (attempt > 0 && nproc != o.nproc && o.resize_argv)
      argv = o.resize_argv(attempt, nproc);
    else if (attempt > 0 && o.restart_argv)
      argv = o.restart_argv(attempt);
    if (argv.empty() || argv[0].empty())
      throw std::runtime_error("launch: no command to run for restart " + std::to_string(attempt));
    plan.nproc = nproc;
    plan.first_rank = plan.node_rank * nproc;
    plan.world = plan.nnodes * nproc;
    plan.master_addr = agent ? o.master_addr : "127.0.0.1";
    plan.agent = agent.get();
    plan.run_id = run_id;
    const AttemptResult r = run_attempt(o, plan, argv, attempt, port, token, signals);
    // (this attempt's: an earlier one's file is gone, deleted when this attempt started)
    blamed_record->clear();
    if (r.failed && r.first_failed_rank >= plan.first_rank &&
        r.first_failed_rank < plan.first_rank + plan.nproc) {
      // A rank that hung was killed and wrote nothing: the record of the rank that named it.
      const int writer = r.named_hung && r.named_by >= 0 ? r.named_by : r.first_failed_rank;
      *blamed_record = rank_error_path(o.log_dir, writer);
    }
    if (report != nullptr) {
      report->stop_signal = r.stop_signal;
      report->stopped = r.stopped();
      report->world_size = plan.world;
    }
    // Stopped by a signal: the ranks' own exit code passes through when they agree on one.
    const int stop_rc = r.stop_rc();

    if (agent) {
      if (const std::optional<int> rc =
              node_decision(o, *agent, signals, r, plan, attempt, token, node_text))
        return *rc;
      continue;
    }

    // Elastic: a rank killed from outside (an OOM kill, a lost device) gives up its slot.
    const bool shrink = o.min_nproc > 0 && !r.killed_ranks.empty() && !r.stopped();
    const int alive = shrink ? nproc - static_cast<int>(r.killed_ranks.size()) : nproc;
    const int cell = std::max(1, o.rank_multiple);
    const int left = shrink ? alive / cell * cell : nproc;  // whole cells of the rank grid
    if (shrink && left < o.min_nproc) {
      spdlog::error("giving up: rank(s) {} were killed, {} left{}, below the minimum {}",
                    fmt_ranks(r.killed_ranks), left,
                    left != alive ? fmt::format(" in cells of {} ranks", cell) : std::string(),
                    o.min_nproc);
      return 1;
    }
    if (const std::optional<int> rc = local_decision(o, r, attempt, left, stop_rc, signals))
      return *rc;
    if (shrink)
      spdlog::warn("elastic restart: rank(s) {} were killed; continuing with {} rank(s) (was {}){}",
                   fmt_ranks(r.killed_ranks), left, nproc,
                   left != alive ? fmt::format(": the rank grid takes multiples of {}", cell)
                                 : std::string());
    nproc = left;
  }
}

}  // namespace

int launch_local(const LaunchOptions& o, LaunchReport* report) {
  std::string blamed_record;  // the last failed attempt's blamed rank's error record
  const int rc = launch_attempts(o, report, &blamed_record);
  if (rc != 0 && !is_stop_code(rc)) publish_parent_error(blamed_record);
  return rc;
}

}  // namespace dtrain
