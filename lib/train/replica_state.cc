#include "train/replica_state.h"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

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

// int64 words as float pairs, bit for bit (send and recv carry floats; they copy, never convert).
std::vector<float> as_floats(const std::vector<int64_t>& w) {
  std::vector<float> f(w.size() * 2);
  std::memcpy(f.data(), w.data(), w.size() * sizeof(int64_t));
  return f;
}
std::vector<int64_t> as_words(const std::vector<float>& f) {
  std::vector<int64_t> w(f.size() / 2);
  std::memcpy(w.data(), f.data(), w.size() * sizeof(int64_t));
  return w;
}

std::vector<int64_t> range_words(const std::vector<ShardRange>& rs) {
  std::vector<int64_t> w;
  for (const ShardRange& r : rs) w.insert(w.end(), {r.begin, r.end, r.offset});
  return w;
}

// Rank 0: the headers of every stage's first replica's shard of `dir` (ShardReplicas without
// data), keyed by its rank, when each says it holds the state of this layout's replicas with
// these state names; else why not ("" and an empty map: the shards hold one state per stage,
// its replicas' were equal -- or a dtrain before 2026-12-07 wrote them).
std::map<int, ShardReplicas> read_stage_shards(const GridLayout& layout, const std::string& dir,
                                               const std::vector<std::string>& names,
                                               std::string& why) {
  std::map<int, ShardReplicas> got;
  int plain = 0;
  try {
    for (int t = 0; t < layout.tp() && why.empty(); ++t)
      for (int p = 0; p < layout.pp() && why.empty(); ++p) {
        const int w = layout.rank_of(GridCoord{t, 0, p});
        ShardReplicas s = read_shard_replicas(dir, w, /*with_data=*/false);
        // (one state per stage first: a manifest of before layouts were recorded says dp 0)
        if (s.state.world_size == 0) {
          ++plain;
        } else if (s.dp != layout.dp() || s.pp != layout.pp() || s.tp != layout.tp()) {
          why = "the checkpoint was written by another layout (tp " + std::to_string(s.tp) +
                " x dp " + std::to_string(s.dp) + " x pp " + std::to_string(s.pp) +
                "; this run: " + layout.shape() + ")";
        } else if (const std::string m = misfit(s.state, layout.dp(), names); !m.empty()) {
          why = m;
        } else {
          got.emplace(w, std::move(s));
        }
      }
  } catch (const UserError& e) {
    why = e.what();
  }
  if (why.empty() && plain > 0 && !got.empty())
    why = "some of its stages' shards hold their replicas' states and some do not";
  if (!why.empty() || plain > 0) got.clear();
  return got;
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

bool restore_replica_state(Communicator& comm, Optimizer& opt, const ReplicaState& saved,
                           const std::string& from) {
  const int world = comm.size(), rank = comm.rank();
  const std::vector<std::string>& names = opt.state_names();
  uint8_t fits = 0;
  if (rank == 0 && saved.world_size == 0 && holds_replica_states(from)) {
    spdlog::warn(
        "resuming Local SGD: {} is a pipeline's checkpoint holding each stage's replicas' own "
        "optimizer states, which this layout cannot take: all {} ranks continue with its first "
        "replicas' ({}), so this run does not continue exactly as the interrupted one would have",
        from, world, join(names, ", "));
  } else if (rank == 0 && saved.world_size == 0) {
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

bool restore_shard_replica_state(Communicator& world, const GridLayout& layout, Optimizer& opt,
                                 const std::string& dir, const std::vector<ShardRange>& mine,
                                 int64_t file_replicas) {
  const std::vector<std::string>& names = opt.state_names();
  const int rank = world.rank();
  if (layout.dp() < 2 || names.empty()) {  // (one state per stage: load_full's)
    if (rank == 0 && !names.empty() && (file_replicas > 0 || holds_replica_states(dir)))
      spdlog::warn(
          "resuming Local SGD: the checkpoint holds its replicas' own optimizer states and this "
          "run has one replica per stage, which continues with the first replica's ({})",
          join(names, ", "));
    return true;
  }
  const GridCoord me = layout.coord(rank);
  std::string why;
  std::map<int, ShardReplicas> got;
  uint8_t fits = 0;
  if (rank == 0 && !std::filesystem::is_directory(dir)) {
    // One checkpoint file (another layout's, or a consolidated one): one state, or its ranks'
    if (file_replicas > 0)
      why = "the checkpoint is one file of " + std::to_string(file_replicas) +
            " ranks' own states, not a sharded checkpoint of this layout";
    else
      spdlog::info(
          "resuming Local SGD: the checkpoint file holds one optimizer state ({}), which each "
          "stage's {} replicas continue from (exact when their states were equal; a consolidated "
          "checkpoint keeps each stage's first replica's alone: resume from the sharded folder "
          "to continue each replica's own)",
          join(names, ", "), layout.dp());
  } else if (rank == 0) {
    got = read_stage_shards(layout, dir, names, why);
    fits = got.empty() ? 0 : 1;
    if (!fits && why.empty())
      spdlog::info(
          "resuming Local SGD: the checkpoint holds one optimizer state ({}) per stage, which its "
          "{} replicas continue from (exact when their states were equal; a checkpoint written "
          "before 2026-12-07 by Local SGD without sync_optimizer_state held each stage's first "
          "replica's alone)",
          join(names, ", "), layout.dp());
  }
  world.broadcast(&fits, 1, 0);
  // Each replica: its stage's shard size and ranges, then its states (kTagReplicaState).
  float ok = 1.0f;
  std::vector<std::vector<float>> in;
  // One stage's shard at a time (rank 0 holds one stage's replicas' states, not all of them): a
  // shard whose data fails its read (a checksum, a missing tensor) sends its replicas the head
  // {-1, 0} instead, and the agreement below keeps every replica on its first one's state.
  if (fits && rank == 0) {
    for (const auto& entry : got) {
      const int w = entry.first;
      const GridCoord c = layout.coord(w);
      ShardReplicas s;
      try {
        s = read_shard_replicas(dir, w);
        if (const std::string m = misfit(s.state, layout.dp(), names); !m.empty())
          throw UserError(m);
      } catch (const UserError& e) {
        if (why.empty()) why = e.what();
        s = ShardReplicas{};
      }
      const bool good = s.state.world_size > 0;
      const std::vector<int64_t> rw = range_words(s.global_ranges);
      const int64_t n = good ? static_cast<int64_t>(s.state.ranks[0][0].size()) : 0;
      for (int i = 1; i < layout.dp(); ++i) {
        const int dst = layout.rank_of(GridCoord{c.tp, i, c.pp});
        const std::vector<float> head =
            as_floats({good ? static_cast<int64_t>(rw.size()) : int64_t{-1}, n});
        world.send(dst, kTagReplicaState, head.data(), head.size());
        if (!good) continue;
        const std::vector<float> rf = as_floats(rw);
        world.send(dst, kTagReplicaState, rf.data(), rf.size());
        for (const std::vector<float>& b : s.state.ranks[static_cast<size_t>(i - 1)])
          world.send(dst, kTagReplicaState, b.data(), b.size());
      }
      if (!good) ok = 0.0f;
    }
  } else if (fits && me.dp > 0) {
    std::vector<float> head(4);
    world.recv(0, kTagReplicaState, head.data(), head.size());
    const std::vector<int64_t> h = as_words(head);
    // (rank 0 read these from its file: the ranges' words are 3 per range, -1 when the shard
    // could not be read; the size is a shard's)
    DT_CHECK((h[0] == -1 || (h[0] >= 0 && h[0] % 3 == 0)) && h[1] >= 0);
    if (h[0] < 0) {
      ok = 0.0f;
    } else {
      std::vector<float> rf(static_cast<size_t>(h[0]) * 2);
      world.recv(0, kTagReplicaState, rf.data(), rf.size());
      for (size_t k = 0; k < names.size(); ++k) {
        in.emplace_back(static_cast<size_t>(h[1]));
        world.recv(0, kTagReplicaState, in.back().data(), in.back().size());
      }
      // Another split into stages (or tensor slices) than the checkpoint's: the ranges differ.
      if (as_words(rf) != range_words(mine) || static_cast<size_t>(h[1]) != opt.state(0).size())
        ok = 0.0f;
    }
  }
  if (fits) world.allreduce(&ok, 1, ReduceOp::kMin);
  if (!fits || ok < 1.0f) {
    if (rank == 0 && (!why.empty() || ok < 1.0f))
      spdlog::warn(
          "resuming Local SGD: each stage's {} replicas continue with its first replica's "
          "optimizer state ({}), {}; so this run does not continue exactly as the interrupted "
          "one would have (with distributed.local_sgd.sync_optimizer_state: true the replicas "
          "average their states at each synchronisation, and a resume continues that one state "
          "exactly)",
          layout.dp(), join(names, ", "),
          !why.empty() ? why
                       : "the checkpoint's stages hold other parts of the model than this run's");
    return false;
  }
  for (size_t k = 0; k < in.size(); ++k)
    std::copy(in[k].begin(), in[k].end(), opt.state(k).begin());
  if (rank == 0)
    spdlog::info(
        "resuming Local SGD: each of the {} replicas of each stage continues with its own "
        "optimizer state",
        layout.dp());
  return true;
}

}  // namespace dtrain
