// Node 0's pure rules for the launchers' agreement (job_agent.h): one decision for an attempt
// from every node's outcome, and when an elastic check-in closes.
#include <algorithm>
#include <vector>

#include "launch/job_agent.h"

namespace dtrain {

JobDecision decide_attempt(const std::vector<NodeOutcome>& outcomes, int attempt,
                           int max_restarts) {
  JobDecision d;
  const NodeOutcome* cause = nullptr;
  const NodeOutcome* stopped = nullptr;
  bool user_error = false;
  for (const NodeOutcome& o : outcomes) {
    if (o.kind == NodeOutcome::kStopped && stopped == nullptr) stopped = &o;
    if (o.kind == NodeOutcome::kUserError) user_error = true;
    if (o.kind == NodeOutcome::kFailed || o.kind == NodeOutcome::kUserError) {
      // A rank killed by a signal did not fail on its own account of a peer: prefer it, then
      // the earliest.
      if (cause == nullptr || (o.killed && !cause->killed) ||
          (o.killed == cause->killed && o.when_ms < cause->when_ms))
        cause = &o;
    }
  }
  if (stopped != nullptr) {
    d.rc = stopped->rc;
    // (a node stopped with a failure's code, a signal after its failure: bad input elsewhere
    // still makes it 2)
    if (d.rc == 1 && user_error) d.rc = 2;
    d.reason = stopped->cause;
    return d;
  }
  if (cause == nullptr) return d;  // every node ok
  d.reason = cause->cause;
  if (user_error) {
    d.rc = 2;
  } else if (attempt < max_restarts) {
    d.restart = true;
  } else {
    d.rc = 1;
  }
  return d;
}

bool close_check_in(const std::vector<int>& joined, const std::vector<int>& expected, int min_nodes,
                    int max_nodes, double since_min_s, double last_call_s, double lost_after_s) {
  const int n = static_cast<int>(joined.size());
  if (n >= max_nodes) return true;
  if (n < min_nodes || since_min_s < last_call_s) return false;
  const bool all_back = std::all_of(expected.begin(), expected.end(), [&](int e) {
    return std::find(joined.begin(), joined.end(), e) != joined.end();
  });
  return all_back || since_min_s >= last_call_s + lost_after_s;
}

}  // namespace dtrain
