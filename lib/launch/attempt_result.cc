#include "launch/attempt_result.h"

#include <signal.h>
#include <sys/wait.h>

#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#include <spdlog/spdlog.h>

#include "launch/error_file.h"
#include "util/interrupt.h"

namespace dtrain::launch_detail {

std::string fmt_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

bool is_stop_code(int code) {
  return code == kExitPreempted || code == 128 + SIGINT || code == 128 + SIGTERM ||
         code == 128 + SIGHUP || code == 128 + SIGUSR1;
}

std::string failed_text(int status, const std::string& node_text, bool parens) {
  if (!node_text.empty() && WIFEXITED(status) && is_stop_code(WEXITSTATUS(status)))
    return " stopped (exit status " + std::to_string(WEXITSTATUS(status)) +
           ") with no signal to any launcher: a rank of this job was signalled alone and every "
           "rank stopped with it (which one it reached is not known), which a job of several "
           "nodes counts as a failure";
  return parens ? " failed (" + describe_wait_status(status) + ")"
                : " failed: " + describe_wait_status(status);
}

NodeOutcome node_outcome(const AttemptResult& r, int stop_rc, const std::string& node_text) {
  NodeOutcome n;
  if (r.stopped() && !r.failed) {
    n.kind = NodeOutcome::kStopped;
    n.rc = stop_rc;
    n.cause = r.stop_cause(node_text);
  } else if (r.failed) {
    n.kind = r.any_user_error ? NodeOutcome::kUserError : NodeOutcome::kFailed;
    n.rc = r.any_user_error ? 2 : 1;
    // A rank held stopped here is a cause from outside, as a rank killed by a signal is.
    // (not a rank this launcher killed itself because it hung: named_hung)
    n.killed = (WIFSIGNALED(r.first_failed_status) && !r.named_hung) || !r.stopped_ranks.empty();
    n.when_ms = r.first_failed_ms;
    n.cause = r.stopped_ranks.empty() && r.named_by < 0
                  ? "rank " + std::to_string(r.first_failed_rank) + node_text +
                        failed_text(r.first_failed_status, node_text, false)
                  : r.failure_cause(node_text);
    // This node's first failure named a rank of another node as its cause: that node's own
    // report comes first (unless it has none, when this one stands).
    if (r.remote_cause_rank >= 0) {
      n.when_ms = INT64_MAX - 2;
      n.cause += " (its error names rank " + std::to_string(r.remote_cause_rank) +
                 ", on another node, as the cause)";
    }
  } else if (!r.remote_failure.empty()) {
    n.kind = NodeOutcome::kFailed;  // stopped here for another node's failure: that is the cause
    n.rc = 1;
    n.when_ms = INT64_MAX - 1;
    n.cause = r.remote_failure;
  } else if (r.abandoned) {
    n.kind = NodeOutcome::kFailed;
    n.rc = 1;
    n.when_ms = INT64_MAX - 1;
    n.cause = "ranks" + node_text + " did not exit after SIGKILL";
  }
  return n;
}

int signal_after_failure(const AttemptResult& r, SignalGuard& signals) {
  int sig = r.late_signal;
  for (int s : signals.take_while_idle())  // (no rank runs now: a Ctrl-Z stops the launcher)
    if (sig == 0) sig = s;
  return sig;
}

std::optional<int> local_decision(const LaunchOptions& o, const AttemptResult& r, int attempt,
                                  int nproc, int stop_rc, SignalGuard& signals) {
  if (r.stopped() && !r.failed) {
    if (r.stop_signal == 0)
      spdlog::warn("not restarting: the ranks stopped on a signal sent to a rank (exit status {})",
                   r.rank_stop_code);
    return stop_rc;
  }
  // A rank signalled on its own before its peers failed: while the ranks start (before their
  // first step) they cannot yet agree to stop together, so it stopped alone and they failed
  // without it. The signal is the cause: a stop to pass through, not a failure to restart (bad
  // input found meanwhile still counts as such). (rank_stop_code is only recorded before any
  // failure.)
  if (r.rank_stop_code != 0 && r.failed && !r.any_user_error && !r.abandoned) {
    spdlog::warn(
        "not restarting: rank {} was signalled (exit status {}) and its peers then failed "
        "without it ({}): the job stops",
        r.rank_stop_rank, r.rank_stop_code, r.failure_cause());
    return r.rank_stop_code;
  }
  if (!r.failed && !r.abandoned) {
    if (attempt > 0)
      spdlog::info("all {} rank(s) finished after {} restart(s)", nproc, attempt);
    else
      spdlog::info("all {} rank(s) finished", nproc);
    return 0;
  }
  // A rank that failed on bad input (exit 2: config, data or checkpoint) makes the launch a
  // user error too, whatever the other ranks died of after it; otherwise a runtime failure.
  const int rc = r.failed && r.any_user_error ? 2 : 1;
  const std::string cause = r.failure_cause();
  if (o.max_restarts == 0) {
    spdlog::error("launch failed: {}", cause);
    return rc;
  }
  if (r.stop_signal != 0) {
    spdlog::warn("not restarting: stopped by {}", signal_name(r.stop_signal));
    return rc;
  }
  if (rc == 2) {
    spdlog::error(
        "not restarting: a rank failed on bad input (exit status 2), which a restart "
        "would repeat; {}",
        cause);
    return rc;
  }
  if (attempt >= o.max_restarts) {
    spdlog::error("giving up: {} in attempt {}, and all {} restart(s) are used", cause, attempt + 1,
                  o.max_restarts);
    return rc;
  }
  // Ctrl-C or SIGTERM while the failed attempt wound down: stop here.
  if (const int sig = signal_after_failure(r, signals); sig != 0) {
    spdlog::warn("received {}: not restarting", signal_name(sig));
    return rc;
  }
  spdlog::warn("restart {} of {}: {}; starting all {} rank(s) again", attempt + 1, o.max_restarts,
               cause, nproc);
  return std::nullopt;
}

// (attempt_result.h)
void follow_named_cause(AttemptResult& res, const ReapedRanks& reaped, int first_rank, int nproc,
                        const std::string& log_dir) {
  const int first = res.first_failed_rank;
  if (!res.failed || first < 0 || !res.stopped_ranks.empty() ||
      WIFSIGNALED(res.first_failed_status))
    return;
  int r = first;
  std::string why;
  std::set<int> seen = {first};
  for (int hops = 0; hops < nproc; ++hops) {
    const std::optional<RankErrorRecord> e = read_error_file(rank_error_path(log_dir, r));
    if (!e || e->caused_by < 0) break;
    const int c = e->caused_by;
    if (seen.count(c)) {
      // The ranks name each other (both lost their connection, say): no cause is known
      // beyond the order they were reaped in.
      spdlog::warn("rank {}'s error and rank {}'s name each other as the cause", r, c);
      r = first;
      break;
    }
    seen.insert(c);
    const bool local = c >= first_rank && c < first_rank + nproc;
    if (!local) {
      res.remote_cause_rank = c;
      why = e->message;
      break;
    }
    const auto st = reaped.status.find(c);
    if (st == reaped.status.end() || (WIFEXITED(st->second) && WEXITSTATUS(st->second) == 0))
      break;  // it did not fail
    why = e->message;
    r = c;
  }
  if (r == first && res.remote_cause_rank < 0) return;
  const std::string short_why = why.size() > 200 ? why.substr(0, 200) + "..." : why;
  if (r != first) {
    spdlog::error("rank {}'s error names rank {} as its cause: {}", first, r, short_why);
    res.first_failed_rank = r;
    res.first_failed_status = reaped.status.at(r);
    res.named_by = first;
    // Hung: still running when the launcher stopped the rest, and ended by that (its signal,
    // or the stop code its handler exits with), not by a failure of its own it was unwinding.
    const int st = reaped.status.at(r);
    res.named_hung = reaped.stopped_here.count(r) > 0 &&
                     (WIFSIGNALED(st) || (WIFEXITED(st) && is_stop_code(WEXITSTATUS(st))));
  } else {
    spdlog::error("rank {}'s error names rank {} (another node's) as its cause: {}", first,
                  res.remote_cause_rank, short_why);
  }
}

std::string encode_outcome(const NodeOutcome& o) {
  return std::to_string(static_cast<int>(o.kind)) + " " + std::to_string(o.rc) + " " +
         (o.killed ? "1" : "0") + " " + std::to_string(o.when_ms) + " " + o.cause;
}

NodeOutcome decode_outcome(const std::string& s, int node) {
  std::istringstream in(s);
  int kind = -1, killed = 0;
  NodeOutcome o;
  in >> kind >> o.rc >> killed >> o.when_ms;
  if (!in || kind < 0 || kind > 3)
    throw std::runtime_error("node " + std::to_string(node) +
                             "'s launcher sent a malformed report");
  o.kind = static_cast<NodeOutcome::Kind>(kind);
  o.killed = killed != 0;
  std::getline(in >> std::ws, o.cause);
  return o;
}

}  // namespace dtrain::launch_detail
