// One attempt of `dtrain launch` on this node: its ranks started with the torchrun environment,
// their output teed and logged, their exits reaped, stop signals forwarded, a failure ending the
// others (SIGTERM, then SIGKILL), until every rank has exited. Internal to lib/launch
// (launcher.cc decides between attempts: restarts, elastic sizes, the other nodes).
#pragma once

#include <string>
#include <vector>

#include "launch/attempt_result.h"
#include "launch/job_agent.h"
#include "launch/launcher.h"
#include "launch/process.h"

namespace dtrain::launch_detail {

// How one attempt runs on this node: its ranks and the other nodes' agent.
struct AttemptPlan {
  int nproc = 1;       // ranks on this node
  int first_rank = 0;  // this node's first global rank
  int world = 1;       // ranks in the job
  int node_rank = 0;   // this node's place among the attempt's nodes, and their count
  int nnodes = 1;
  std::string master_addr = "127.0.0.1";
  JobAgent* agent = nullptr;  // multi-node only
  std::string run_id;         // TORCHELASTIC_RUN_ID, the same for every attempt
};

// Runs one attempt of `argv` on this node's ranks (rank r's port `port`, the job's `token`),
// supervised until every rank has exited; `signals`: the launcher's handlers, shared by its
// attempts. Throws UserError when a rank's log cannot be opened.
AttemptResult run_attempt(const LaunchOptions& o, const AttemptPlan& plan,
                          const std::vector<std::string>& argv, int attempt, int port,
                          const std::string& token, SignalGuard& signals);

}  // namespace dtrain::launch_detail
