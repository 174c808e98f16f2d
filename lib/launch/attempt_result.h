// How one attempt of `dtrain launch` (one start of this node's ranks) ended, and what follows
// from it: the node's outcome for the other nodes' launchers, and a single node's own decision
// to stop or restart. Internal to lib/launch (launcher.cc runs the attempts).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "launch/job_agent.h"
#include "launch/launcher.h"
#include "launch/process.h"

namespace dtrain::launch_detail {

// Exit codes of `dtrain run` stopped by a signal (128 + SIGINT, SIGTERM, SIGHUP, SIGUSR1) or for
// a preemption (75, EX_TEMPFAIL: checkpointed, run again).
bool is_stop_code(int code);

// What a rank that failed with wait status `status` did, after "rank R<node_text>": " failed
// (exit status 1)", or " failed: exit status 1" (parens false). In a job of several nodes
// (node_text not empty) a rank that exited with a stop code with no signal to this launcher is no
// failure of its own: a rank of the job was signalled alone, every rank stopped with it (which one
// it reached is not known: they all exit alike), and such a job counts that as a failure -- said
// so, not "failed (exit status 75)".
std::string failed_text(int status, const std::string& node_text, bool parens = true);

// How one attempt (one start of all ranks) ended.
struct AttemptResult {
  bool failed = false;          // a rank exited non-zero or by a signal on its own
  bool any_user_error = false;  // some rank exited with status 2 (bad config, data, checkpoint)
  bool abandoned = false;       // ranks survived SIGKILL and were left behind
  int stop_signal = 0;          // the signal received here (or by another node) that stopped
                                // the ranks, 0: none
  int late_signal = 0;  // a signal received here while a failure already stopped the ranks (it
                        // killed them): no restart follows, 0: none
  int first_failed_rank = -1;  // the rank that failed first, and its wait status: the cause
  int first_failed_status = 0;
  int64_t first_failed_ms = 0;     // its wall-clock time (ms since the epoch)
  std::vector<int> failed_ranks;   // every rank that failed on its own, in order
  std::vector<int> killed_ranks;   // those of them killed by a signal not sent from here
  std::vector<int> stopped_ranks;  // ranks found stopped (state T) when the rest were stopped
  std::string remote_failure;      // multi-node: the first failure another node reported
  int common_exit = -1;  // the exit status every rank exited with (-1: none yet, -2: mixed or
                         // killed by a signal)
  // A rank stopped by a signal sent to it alone (not to a launcher): it exited with an
  // interrupt's or the preemption's code, and its peers follow at the step they agreed on.
  int rank_stop_rank = -1, rank_stop_code = 0;
  // The cause as the failed ranks' error files name it (Attempt::follow_named_cause): the rank
  // first reaped, when its error named first_failed_rank (-1: it named none); whether that rank
  // did not exit on its own (the launcher stopped it: it hung); and a rank of another node that
  // this node's first failure named (-1: none), whose own node reports it.
  int named_by = -1;
  bool named_hung = false;
  int remote_cause_rank = -1;

  bool stopped() const { return stop_signal != 0 || rank_stop_code != 0; }
  // What a failed attempt is blamed on: a rank found stopped (its peers failed waiting for it)
  // before the first rank that exited.
  std::string failure_cause(const std::string& node_text = "") const {
    if (!stopped_ranks.empty())
      return "rank " + std::to_string(stopped_ranks.front()) + node_text +
             " was stopped (process state T) and its peers failed waiting for it";
    if (first_failed_rank < 0) return "ranks" + node_text + " did not exit after SIGKILL";
    if (named_by >= 0)
      return "rank " + std::to_string(first_failed_rank) + node_text +
             (named_hung ? " did not exit on its own (stopped by the launcher)"
                         : failed_text(first_failed_status, node_text)) +
             ", named as the cause by rank " + std::to_string(named_by) + "'s error";
    return "rank " + std::to_string(first_failed_rank) + node_text +
           failed_text(first_failed_status, node_text);
  }
  // The launch's exit code for a stop: the ranks' own when they agree on one.
  int stop_rc() const {
    if (common_exit >= 0) return common_exit;
    return stop_signal != 0 ? 128 + stop_signal : rank_stop_code;
  }
  std::string stop_cause(const std::string& node_text = "") const {
    if (stop_signal != 0) return "stopped by " + signal_name(stop_signal);
    return "rank " + std::to_string(rank_stop_rank) + node_text + " stopped: exit status " +
           std::to_string(rank_stop_code);
  }
};

// What the launcher saw of each rank it reaped in an attempt.
struct ReapedRanks {
  std::map<int, int> status;   // every reaped rank's wait status
  std::set<int> stopped_here;  // those reaped after the launcher began stopping the rest
};

// The rank first reaped with a failure may have failed for another's: its error (the error file
// it wrote, rank_error_path(log_dir, r)) names that rank -- a peer's abort it relayed, a
// connection it lost, a shard write the other could not make. Follows the names, through ranks
// of this node (first_rank .. + nproc) that failed too or that the launcher had to stop (hung),
// to a rank whose error is its own, and makes it res.first_failed_rank (res.named_by, named_hung);
// one on another node is left to that node's report (res.remote_cause_rank). A rank killed by a
// signal, or found stopped, stays the cause; ranks that name each other leave the first.
void follow_named_cause(AttemptResult& res, const ReapedRanks& reaped, int first_rank, int nproc,
                        const std::string& log_dir);

// "0, 2, 5".
std::string fmt_ranks(const std::vector<int>& ranks);

// How an attempt ended on this node, for the job agent. node_text: " on node N (host)".
NodeOutcome node_outcome(const AttemptResult& r, int stop_rc, const std::string& node_text);

// The signal that asked to stop after a failed attempt's ranks were already being stopped (it
// killed them: r.late_signal), else one received since the attempt ended (taken from `signals`
// by take_while_idle); 0: none. Either means no restart, on one node or several.
int signal_after_failure(const AttemptResult& r, SignalGuard& signals);

// Single node: the launcher's own restart decision after attempt `attempt` ended as `r`
// (launch_local's contract). Returns the exit code, or nullopt to restart. Logs why.
std::optional<int> local_decision(const LaunchOptions& o, const AttemptResult& r, int attempt,
                                  int nproc, int stop_rc, SignalGuard& signals);

// A node's outcome as the value node 0's store holds ("kind rc killed when_ms cause..."), and
// back; decode_outcome throws runtime_error naming node `node` for a malformed value.
std::string encode_outcome(const NodeOutcome& o);
NodeOutcome decode_outcome(const std::string& s, int node);

}  // namespace dtrain::launch_detail
