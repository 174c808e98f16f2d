// Local SGD's per-rank optimizer state in checkpoints: between the ranks' optimizers and the
// ReplicaState a checkpoint file holds (checkpoint/checkpoint.h).
//
// Without distributed.local_sgd.sync_optimizer_state each replica keeps its own momentum or Adam
// moments between (and across) synchronisations, so an exact resume needs every rank's. Saving:
// rank 0 writes the one file, so every other rank's state travels to rank 0 (point to point:
// rank 0 only receives) and is held there until the file is written, (world - 1) x the
// optimizer state. Resuming: rank 0's state comes from the file's "optim.*" tensors as for any
// strategy; each other rank's is sent to it when the checkpoint holds one per rank of this world
// size with this optimizer's state names. A checkpoint of per-rank state for another world size
// (a resume by hand on other ranks: elastic restarts refuse Local SGD) leaves every rank with rank
// 0's, with a warning that the resume is not exact; one without per-rank state (its ranks' states
// were equal, or it predates 2026-12-07) is continued from, said as info.
#pragma once

#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "comm/rank_grid.h"
#include "optim/optimizer.h"

namespace dtrain {

// Collective over `comm` (the data axis: local_sgd's is the world). Every rank's optimizer state
// on rank 0 (ranks 1 .. size - 1; rank 0's own is the checkpoint's "optim.*"); the other ranks
// get an empty ReplicaState.
ReplicaState gather_replica_state(Communicator& comm, const Optimizer& opt);

// Collective. Sets ranks 1 .. size - 1's optimizer state from `saved` (what rank 0 read from the
// checkpoint; ignored on the other ranks) when it fits this run, else leaves every rank with the
// state it has (rank 0's, from load_full) and rank 0 warns why the resume is not exact. Returns
// whether it restored, the same on every rank.
// from: the checkpoint's path (rank 0): a pipeline's sharded checkpoint holding its replicas'
// own states, which this layout cannot take, is said in a warning, not as "one state".
bool restore_replica_state(Communicator& comm, Optimizer& opt, const ReplicaState& saved,
                           const std::string& from = "");

// A pipeline's (or a tensor grid's) sharded checkpoint: saving, each stage's first replica (dp 0)
// gathers its stage's others over the data axis (gather_replica_state on that axis's
// communicator) and writes them into its shard (checkpoint.h's ShardReplicas). Resuming, after
// load_full gave every replica its stage's first replica's state, restore_shard_replica_state
// (collective over the world) gives each replica (dp > 0) its own: rank 0 reads every stage's
// shard and sends each replica its part, when the checkpoint was written by this very layout
// (tp x dp x pp), holds one state per replica with this optimizer's state names, and each
// replica's shard ranges (`mine`, in the whole layout) are those of its stage's shard; otherwise
// every replica keeps its stage's first replica's state and rank 0 says why the resume is not
// exact. Rank 0 decides from the shards' headers, then reads and sends one stage's shard at a
// time (it holds (dp - 1) x that stage's optimizer state). A checkpoint file (not a
// folder: a consolidated one, another layout's) has no state of these replicas; file_replicas:
// how many ranks' states it held (ReplicaState::world_size, 0: one state). Returns whether it
// restored, the same on every rank.
bool restore_shard_replica_state(Communicator& world, const GridLayout& layout, Optimizer& opt,
                                 const std::string& dir, const std::vector<ShardRange>& mine,
                                 int64_t file_replicas);

}  // namespace dtrain
