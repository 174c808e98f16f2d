#include "train/replica_state.h"

#include <cstdint>
#include <string>

#include <spdlog/spdlog.h>

#include "util/check.h"
#include "util/strings.h"

namespace dtrain {

namespace {

// Point-to-point tag of the per-rank state (compression_state.cc uses 0xC0FFEE, pipeline.cc 1 and
// 2; a checkpoint's transfers run one after another, each matched by sender and tag in order).
constexpr uint64_t kTagReplicaState = 0x5EEDA7E;

// Why `saved` does not fit this run ("" when it does), rank 0's words for the warning.
std::string misfit(const ReplicaState& saved, int world, const std::vector<std::string>& names) {
  if (saved.world_size != world)
    return "the checkpoint holds each of its " + std::to_string(saved.world_size) +
           " ranks' own state, and this run has " + std::to_string(world);
  if (saved.names != names)
    return "the checkpoint's per-rank state is [" + join(saved.names, ", ") + "], this run's [" +
           join(names, ", ") + "]";
  return "";
}

}  // namespace

ReplicaState gather_replica_state(Communicator& comm, const Optimizer& opt) {
  const int world = comm.size();
  const std::vector<std::string>& names = opt.state_names();
  ReplicaState out;
  if (world < 2 || names.empty()) return out;
  if (comm.rank() != 0) {
    for (size_t k = 0; k < names.size(); ++k)
      comm.send(0, kTagReplicaState, opt.state(k).data(), opt.state(k).size());
    return out;
  }
  out.world_size = world;
  out.names = names;
  out.ranks.resize(static_cast<size_t>(world - 1));
  for (int r = 1; r < world; ++r)
    for (size_t k = 0; k < names.size(); ++k) {
      std::vector<float>& buf = out.ranks[static_cast<size_t>(r - 1)].emplace_back();
      buf.resize(opt.state(k).size());
      comm.recv(r, kTagReplicaState, buf.data(), buf.size());
    }
  return out;
}

bool restore_replica_state(Communicator& comm, Optimizer& opt, const ReplicaState& saved) {
  const int world = comm.size(), rank = comm.rank();
  const std::vector<std::string>& names = opt.state_names();
  uint8_t fits = 0;
  if (rank == 0 && saved.world_size == 0) {
    // One state in the file: its ranks' were equal (another strategy, sync_optimizer_state on,
    // one rank) -- exact -- or a dtrain before 2026-12-07 kept rank 0's alone.
    spdlog::info(
        "resuming Local SGD: the checkpoint holds one optimizer state ({}), which all {} ranks "
        "continue from (exact when its ranks' states were equal; a checkpoint written before "
        "2026-12-07 by Local SGD without sync_optimizer_state held rank 0's alone)",
        join(names, ", "), world);
  } else if (rank == 0) {
    const std::string why = misfit(saved, world, names);
    fits = why.empty() ? 1 : 0;
    if (!fits)
      spdlog::warn(
          "resuming Local SGD: all {} ranks continue with rank 0's optimizer state ({}), {}; so "
          "this run does not continue exactly as the interrupted one would have "
          "(with distributed.local_sgd.sync_optimizer_state: true the ranks average their "
          "states at each synchronisation and a checkpoint holds that one state, which a "
          "resume on as many ranks continues exactly and one on another world size "
          "continues from)",
          world, join(names, ", "), why);
  }
  comm.broadcast(&fits, 1, 0);
  if (!fits) return false;
  if (rank == 0) {
    for (int r = 1; r < world; ++r)
      for (size_t k = 0; k < names.size(); ++k) {
        const std::vector<float>& buf = saved.ranks[static_cast<size_t>(r - 1)][k];
        DT_CHECK_EQ(buf.size(), opt.state(k).size());
        comm.send(r, kTagReplicaState, buf.data(), buf.size());
      }
    spdlog::info("resuming Local SGD: each of the {} ranks continues with its own optimizer state",
                 world);
  } else {
    for (size_t k = 0; k < names.size(); ++k)
      comm.recv(0, kTagReplicaState, opt.state(k).data(), opt.state(k).size());
  }
  return true;
}

}  // namespace dtrain
