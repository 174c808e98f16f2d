// `dtrain launch`: the subcommand's work after parsing (one node or several, restarts, elastic
// rank counts). cli.cc parses the options into LaunchCmd.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"
#include "launch/node_env.h"

namespace dtrain {

struct LaunchCmd {
  std::string nproc = "2";  // --nproc: N or MIN:MAX
  bool nproc_given = false;
  // --node-rank, --nproc-per-node, --master-addr, --master-port; nodes.nnodes stays unset
  // (cmd_launch sets it from `nnodes`)
  NodeOverrides nodes;
  std::string nnodes;       // --nnodes: N or MIN:MAX (elastic), "" when not given
  double last_call_s = 30;  // --last-call: elastic nodes, node 0's wait for more than MIN
  std::string token_file;   // --token-file
  std::string rdzv_id;      // --rdzv-id (TORCHELASTIC_RUN_ID), "" when not given
  int max_restarts = 0;
  std::string out_dir;  // resolved (--out or runs/<stem>)
  std::string resume;
  bool overwrite = false;
  // Every rank's `dtrain run` command without --resume.
  std::vector<std::string> run_argv;
};

// Runs the launch; returns dtrain's exit code (0, 2 for a user error, 1 for a failure; when the
// job was stopped by a signal, the ranks' code as launch_local returns it).
int cmd_launch(const Config& cfg, const LaunchCmd& c);

}  // namespace dtrain
