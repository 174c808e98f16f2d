// A launcher's check-in value at node 0's store (job_agent.cc): what every node's launcher must
// agree on -- its protocol, its ranks per node, the options that shape the job -- and the
// refusal's text when they do not.
#pragma once

#include <string>

#include "launch/job_agent.h"

namespace dtrain::launch_detail {

// The launchers' protocol: raised when what they store, or its meaning, changes. Launchers of
// another dtrain then refuse each other at check-in instead of waiting on keys the other never
// writes. The check-in (its key, and a value's first two words) is what stays. Launchers before
// it wrote none: protocol 1.
inline constexpr int kLaunchProtocol = 2;

// The options every node's launcher must be given alike, and its protocol, as one word for a
// check-in value: "--nnodes=MIN:MAX,--max-restarts=R,launch-protocol=P" (MIN:MAX is one number
// for a fixed count).
std::string job_shape(const AgentOptions& o);

// A check-in value "<ranks per node> <job shape> <host>".
struct CheckIn {
  int per = 0;
  std::string shape, host;
};
CheckIn parse_check_in(const std::string& v);

// What node `n` checked in with that this node (`self`: "node 0", "this node") was not given
// alike, as the refusal's text; "" when it agrees. (Launchers given another --nnodes never met:
// each waited out its timeout for nodes that were not coming, then blamed a live one.)
std::string check_in_problem(int n, const CheckIn& c, int nproc_per_node, const std::string& shape,
                             const std::string& self);

}  // namespace dtrain::launch_detail
