// LaunchOptions' checks (launcher.h): what a user gives `dtrain launch` that cannot run.
#include <cmath>
#include <string>

#include "launch/launcher.h"
#include "util/check.h"

namespace dtrain {

void check_launch_options(const LaunchOptions& o) {
  if (o.nproc < 1 || o.nproc > 1024)
    throw UserError("--nproc " + std::to_string(o.nproc) + ": must be in 1..1024");
  if (o.master_port < 0 || o.master_port > 65535)
    throw UserError("--master-port " + std::to_string(o.master_port) +
                    ": not a TCP port (1..65535, or 0 for a free one)");
  if (o.child_argv.empty() || o.child_argv[0].empty())
    throw UserError("launch: no command to run for the ranks");
  if (o.log_dir.empty()) throw UserError("launch: no log folder");
  if (!(o.grace_s >= 0) || !std::isfinite(o.grace_s))
    throw UserError("launch: the grace period must be >= 0 seconds");
  if (o.max_restarts < 0)
    throw UserError("--max-restarts " + std::to_string(o.max_restarts) + ": must be >= 0");
  if (o.nnodes < 1 || o.nnodes > 1024 || o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw UserError("--node-rank " + std::to_string(o.node_rank) + " of --nnodes " +
                    std::to_string(o.nnodes) + ": need 0 <= node rank < nodes <= 1024");
  if (o.min_nproc < 0 || o.min_nproc > o.nproc)
    throw UserError("--nproc " + std::to_string(o.min_nproc) + ":" + std::to_string(o.nproc) +
                    ": need 1 <= MIN <= MAX");
  if (o.nnodes > 1) {
    if (o.master_port < 1 || o.master_port > 65534)
      throw UserError(
          "a multi-node launch needs --master-port (1..65534; the launchers use the "
          "next port too)");
    if (o.master_addr.empty()) throw UserError("a multi-node launch needs --master-addr");
    if (o.token.empty())
      throw UserError(
          "a multi-node launch needs the job token, the same on every node: set "
          "DTRAIN_JOB_TOKEN or give --token-file (it is never generated per node)");
    if (o.min_nproc > 0 && o.min_nproc < o.nproc)
      throw UserError("elastic ranks (--nproc MIN:MAX) are for one node");
  }
  if (o.min_nnodes < 0 || o.min_nnodes > o.nnodes)
    throw UserError("--nnodes " + std::to_string(o.min_nnodes) + ":" + std::to_string(o.nnodes) +
                    ": need 1 <= MIN <= MAX");
  if (!(o.last_call_s >= 0 && o.last_call_s <= 1e7))
    throw UserError("--last-call: must be between 0 and 1e7 seconds");
}

}  // namespace dtrain
