// The launchers of a multi-node `dtrain launch` agree on one job: node 0's launcher hosts a
// rendezvous store (comm/rendezvous/store.h, served over gRPC under the job token at
// master_port + 1, next to rank 0's rendezvous at master_port) and every launcher, node 0's
// included, uses it to
//   - check in once (join): every node present, all with the same ranks per node; or, elastic
//     (min_nodes > 0), check in before every attempt (rendezvous): the attempt runs on the nodes
//     that checked in, at least min_nodes and at most nnodes, and node ranks are given anew;
//   - tell the others, during an attempt, that one of its ranks failed or that it received a
//     signal, so every node stops its ranks at once (not only when their heartbeats notice);
//   - report how the attempt ended on its node; node 0's launcher collects every node's report
//     and decides for the whole job: restart (the restart count is node 0's, so every node
//     runs the same attempt) or exit with one code and one cause, which every launcher prints.
// Store keys, all under "launch/": join/<node>, a<A>/failures (a counter) and a<A>/failure/<n>,
// a<A>/stops and a<A>/stop/<n>, a<A>/outcome/<node>, a<A>/decision, a<A>/ack/<node>; elastic:
// a<A>/join/<node>, a<A>/members, alive/<node> (a counter each launcher but node 0's bumps while
// its ranks run, so node 0 notices a launcher that is gone). <node> is the node's id (its
// --node-rank), which stays; an elastic attempt's node rank is the id's place among its members.
// Node 0 refusing the whole job (refuse_job) writes "refused: <why>" as its attempt-0 check-in
// and members list, and each node marks it read (join-read/<node>, a0/members-read/<node>).
//
// Every call has a deadline: a lost node 0 is reported (poll) or thrown (join, finish), never
// waited on forever. The channel is authenticated by the token, not encrypted.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dtrain {

struct AgentOptions {
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;      // node 0's host as every node reaches it
  int port = 0;                 // the store's port on node 0
  std::string token;            // the job token, required
  double join_timeout_s = 300;  // how long a launcher waits for every node to check in
  // How long node 0 waits, once its own attempt ended, for every other node's report (their
  // ranks may be finishing a checkpoint after a signal), and the others for its decision.
  double report_timeout_s = 180;
  // Elastic node count: 0 (fixed: all nnodes nodes, always) or MIN, with nnodes the maximum.
  int min_nodes = 0;
  // Elastic: once min_nodes have checked in for an attempt, how long node 0 waits for more (up
  // to nnodes) before the attempt starts without them (torchrun's last call).
  double last_call_s = 30;
  // A member's launcher that has not been heard from this long is lost (node 0; fixed or
  // elastic node count, a member that has reported its outcome excepted), and node 0's to the
  // others once their polls, or a fixed check-in's waits, go unanswered this long.
  double lost_after_s = 10;
  // --max-restarts: node 0's decides, so every node must be given the same (checked at check-in,
  // with the node count).
  int max_restarts = 0;
};

// The nodes of one elastic attempt.
struct Membership {
  std::vector<int> nodes;          // their ids, ascending; nodes[0] is 0 (node 0 hosts the store)
  std::vector<std::string> hosts;  // their host names, in the same order
  int node_rank = 0;               // this node's place in `nodes`: its node rank for the attempt
};

// How an attempt ended on one node.
struct NodeOutcome {
  enum Kind { kOk = 0, kFailed = 1, kUserError = 2, kStopped = 3 };
  Kind kind = kOk;
  int rc = 0;            // the node's exit code for it alone (launch_local's rules)
  bool killed = false;   // the first failed rank died by a signal (most likely the cause)
  int64_t when_ms = 0;   // wall-clock time of the first failure (ms since the epoch)
  std::string cause;     // "rank 3 on node 1 (host): killed by signal SIGKILL"; "" when ok
  bool reported = true;  // node 0 only: false for a node whose launcher never reported
};

// Node 0's verdict on an attempt, the same on every node.
struct JobDecision {
  bool restart = false;
  int rc = 0;          // when not restarting: every launcher's exit code
  std::string reason;  // the cause (a failure on some node, a signal), "" when all went well
};

// What the other nodes said during an attempt, new since the last poll.
struct RemoteNews {
  std::vector<std::string> failures;  // each node's first failure, in the order reported
  int stop_signal = 0;                // a signal some node's launcher received, 0: none
  std::string lost;                   // node 0's launcher cannot be reached (why), "": fine
};

class JobAgent {
 public:
  // Node 0 starts serving the store here (UserError when the port cannot be bound).
  explicit JobAgent(const AgentOptions& o);
  ~JobAgent();
  JobAgent(const JobAgent&) = delete;
  JobAgent& operator=(const JobAgent&) = delete;

  // Checks in and waits for every node; returns their host names by node rank. Throws
  // UserError when a node runs another number of ranks, std::runtime_error naming the nodes
  // that did not check in by the join timeout or when node 0 cannot be reached.
  std::vector<std::string> join(int nproc_per_node);
  // Elastic (min_nodes > 0): checks in for `attempt` and returns node 0's choice of its nodes
  // (close_check_in's rule). Throws UserError when a node runs another number of ranks (node 0),
  // std::runtime_error when fewer than min_nodes checked in within the join timeout (node 0), when
  // node 0 cannot be reached, or when this node came too late to be chosen.
  Membership rendezvous(int attempt, int nproc_per_node);
  // Node 0, in place of join or rendezvous: refuses the whole job for `why` (an input only node
  // 0 checks, such as an --out that holds a run). Publishes the refusal where every launcher,
  // fixed or elastic, reads node 0's check-in, and serves the store until each other node has
  // read it or the join timeout passed (elastic: once min_nodes have read it, last_call_s more).
  // Returns the ids of the nodes that never read it. The others' join or rendezvous throws
  // UserError("node 0 refused this job: <why>"), at once.
  std::vector<int> refuse_job(const std::string& why);
  // This node's first rank failure in `attempt` (later ones are not reported).
  void report_failure(int attempt, const std::string& what);
  // A signal this node's launcher received and forwarded to its ranks.
  void report_stop(int attempt, int sig);
  // Never blocks for more than about two seconds.
  RemoteNews poll(int attempt);
  // Publishes this node's outcome and returns node 0's decision. `max_restarts` counts only on
  // node 0. Throws std::runtime_error when a report or the decision does not come in time.
  // Elastic: node 0 counts a member whose launcher was lost (no report, not heard from for
  // lost_after_s) as failed, and does not restart when fewer than min_nodes would be left.
  JobDecision finish(int attempt, const NodeOutcome& mine, int max_restarts);

  const std::string& host_name() const { return host_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string host_;
};

// Node 0's decision from every node's outcome (pure; what JobAgent::finish runs on node 0):
// all ok: exit 0; a stopped node: no restart, exit with the first stopped node's code (the
// ranks' code passes through); a user error: no restart, exit 2; another failure: restart while
// attempt < max_restarts, else exit 1. The reason names the likeliest cause: the earliest
// failure among ranks killed by a signal, else the earliest failure.
JobDecision decide_attempt(const std::vector<NodeOutcome>& outcomes, int attempt, int max_restarts);

// Node 0's rule for closing an elastic attempt's check-in (pure): close once max_nodes have
// checked in; else once at least min_nodes have, the last call (last_call_s from the moment
// min_nodes were there, `since_min_s`) is over, and every node in `expected` (the previous
// attempt's survivors, who rejoin at once) is in -- or, for a survivor that never comes, once
// lost_after_s more have passed.
bool close_check_in(const std::vector<int>& joined, const std::vector<int>& expected, int min_nodes,
                    int max_nodes, double since_min_s, double last_call_s, double lost_after_s);

}  // namespace dtrain
