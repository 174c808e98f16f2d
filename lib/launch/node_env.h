// Where this machine (node) sits in a multi-node `dtrain launch`: the node count, this node's
// index, the ranks per node and rank 0's address, from flags and from the environment a cluster
// engine sets for one launcher per node (Kubeflow Trainer's PET_ variables, a Kubernetes
// Indexed Job's JOB_COMPLETION_INDEX). Slurm's one-task-per-node mode passes flags
// (scripts/slurm.sbatch), as torchrun users do. Pure: reads the map it is given.
#pragma once

#include <map>
#include <optional>
#include <string>

namespace dtrain {

// `dtrain launch` flags; error messages name them by these spellings.
struct NodeOverrides {
  std::optional<int> nnodes;          // --nnodes
  std::optional<int> node_rank;       // --node-rank
  std::optional<int> nproc_per_node;  // --nproc-per-node
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
};

struct NodeEnv {
  int nnodes = 1;
  int node_rank = 0;
  int nproc_per_node = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: not given (a free one, single node only)
  // Per field, where it came from: a flag, a variable, or "default" (for messages).
  std::string nnodes_from = "default", node_rank_from = "default";
};

// Per field, flags > Kubeflow Trainer (PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE,
// PET_MASTER_ADDR, PET_MASTER_PORT) > JOB_COMPLETION_INDEX (the node rank only) > MASTER_ADDR /
// MASTER_PORT > defaults (1 node, rank 0, `default_nproc` ranks, 127.0.0.1, no port). With one
// node the ranks meet on loopback: the address variables are not read and only --master-port
// pins the port.
//
// Throws UserError naming the flag or variable for: a value that is not a whole integer,
// nnodes outside 1..1024, a node rank outside [0, nnodes), ranks per node outside 1..1024, a
// port outside 1..65535, an empty address; and with more than one node, a loopback or missing
// master address (rank 0's host must be reachable from every node) or no master port (every node
// must name the same one).
NodeEnv resolve_node_env(const std::map<std::string, std::string>& env, const NodeOverrides& flags,
                         int default_nproc);

// "MIN:MAX" or "N" (= N:N) ranks, 1 <= MIN <= MAX <= 1024; `flag` names the option in the
// UserError thrown for anything else.
struct RankRange {
  int min = 1, max = 1;
};
RankRange parse_rank_range(const std::string& text, const std::string& flag);

}  // namespace dtrain
