// A launcher's check-in value at node 0's store (job_agent.cc): what every node's launcher must
// agree on -- its protocol, its ranks per node, the options that shape the job -- and the
// refusal's text when they do not.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "comm/rendezvous/store.h"

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

// "0, 2, 3".
std::string fmt_ids(const std::vector<int>& ids);

// Node 0's side of an elastic check-in of `attempt`: waits for the nodes (node n's value at
// join_key(n)) by close_check_in's rule and returns their "<ranks per node> <shape> <host>"
// values by id; past `deadline` with too few, a runtime_error naming the missing ones and
// hint().
std::map<int, std::string> gather_check_ins(Store& s, const AgentOptions& o, int attempt,
                                            const std::vector<int>& expected,
                                            std::chrono::steady_clock::time_point deadline,
                                            const std::function<std::string(int)>& join_key,
                                            const std::function<std::string()>& hint);

}  // namespace dtrain::launch_detail
