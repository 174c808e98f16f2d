// The launchers' keys in node 0's store (job_agent.cc), and the check-in's claims and refusals
// that several of JobAgent's steps share: one node rank per launcher, and a refusal that waits
// for the refused node to have read it.
#pragma once

#include <string>
#include <vector>

#include "comm/rendezvous/store.h"
#include "util/check.h"

namespace dtrain::launch_detail {

inline constexpr char kAgentPrefix[] = "launch/";
// A members list (or, from refuse_job, node 0's attempt-0 check-in) that starts with this is node
// 0's refusal, the reason after it.
inline constexpr char kRefused[] = "refused: ";

// "launch/a<attempt>/<rest>": a key of one attempt.
std::string attempt_key(int attempt, const std::string& rest);
// Whether `k` is set in node 0's store now (no wait).
bool key_set(Store& s, const std::string& k);

// Node 0 refuses a node that checked in (`read_keys`: what that node sets once it has read node
// 0's answer -- a fixed launcher one key, an elastic one another, and node 0 cannot tell which it
// is): the store lives in node 0's process, so node 0 waits for that node to have read the
// answer, at most 3 s, before it exits with the refusal -- else the node's next call finds no
// store and waits out its whole join timeout for a node 0 that is gone.
[[noreturn]] void refuse_after_read(Store& s, const std::vector<std::string>& read_keys,
                                    const UserError& e);
// What a fixed launcher sets once it has read node 0's check-in; an elastic one's is
// attempt_key(attempt, "members-read/<n>").
std::string fixed_read_key(int n);
// Node 0 refuses node `n` at its check-in for `attempt` (a fixed launcher's is attempt 0): the
// members list carries the refusal to an elastic launcher (a fixed one finds it by comparing
// node 0's check-in itself), then refuse_after_read.
[[noreturn]] void refuse_node(Store& s, int attempt, int n, const UserError& e);
// Claims node rank `node` at node 0's store under `claim_key`: a second launcher given the same
// --node-rank is refused (UserError, exit 2) instead of overwriting the first one's check-in,
// starting ranks of its own and ending the job for everyone (it did, and could leave the real
// node hanging). A claimant that trained (it beat "alive/<node>" at each poll) and has been
// silent for lost_after_s was lost, and this is its replacement: std::runtime_error (exit 1), a
// failure to retry rather than bad input.
void claim_node_rank(Store& s, const std::string& claim_key, int node, double lost_after_s);

}  // namespace dtrain::launch_detail
