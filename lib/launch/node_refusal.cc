// A multi-node launcher's JobAgent options, and node 0's refusal of a job it cannot start
// (launcher.h).
#include <algorithm>
#include <memory>

#include "launch/launcher.h"

#include <spdlog/spdlog.h>

#include "comm/grpc/common.h"

namespace dtrain {

AgentOptions launch_agent_options(const LaunchOptions& o, const std::string& token) {
  AgentOptions ao;
  ao.nnodes = o.nnodes;
  ao.node_rank = o.node_rank;
  ao.master_addr = o.master_addr;
  ao.port = o.master_port + 1;
  ao.token = token;
  ao.join_timeout_s = o.join_timeout_s;
  ao.report_timeout_s = std::max(o.grace_s, o.interrupt_grace_s) + 30;
  ao.min_nodes = o.min_nnodes < o.nnodes ? o.min_nnodes : 0;
  ao.last_call_s = o.last_call_s;
  ao.max_restarts = o.max_restarts;
  return ao;
}

void refuse_launch(const LaunchOptions& o, const UserError& why) {
  DT_CHECK_GT(o.nnodes, 1);
  DT_CHECK_EQ(o.node_rank, 0);
  // Without the job's token no launcher can join (each refuses that itself, exit 2).
  if (o.token.empty()) throw why;
  // Said at once: the other nodes may be minutes away from checking in.
  spdlog::warn("node 0 refuses this job: {}", why.what());
  std::unique_ptr<JobAgent> agent;
  try {
    agent = std::make_unique<JobAgent>(launch_agent_options(o, o.token));
  } catch (const UserError& e) {  // (its port is taken: the refusal is still the error)
    spdlog::warn("cannot tell the other nodes' launchers ({}); they wait out their join timeout",
                 e.what());
    throw why;
  }
  spdlog::info(
      "telling the other nodes' launchers as they check in at {}:{} (at most {} s; Ctrl-C "
      "stops now)",
      o.master_addr, o.master_port + 1, grpc_detail::seconds_str(o.join_timeout_s));
  const std::vector<int> unread = agent->refuse_job(why.what());
  if (!unread.empty()) {
    std::string ids;
    for (int n : unread) ids += (ids.empty() ? "" : ", ") + std::to_string(n);
    spdlog::warn("node(s) {} did not read the refusal (not checked in within {} s{})", ids,
                 grpc_detail::seconds_str(o.join_timeout_s),
                 o.min_nnodes > 0 && o.min_nnodes < o.nnodes
                     ? ", or past the last call once --nnodes' minimum had read it"
                     : "");
  }
  throw why;
}

}  // namespace dtrain
