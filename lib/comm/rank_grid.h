// The rank grid: how a job's ranks are laid out over tensor-parallel (tp), data-parallel (dp) and
// pipeline (pp) axes, and one communicator per axis.
//
// Layout (Megatron-LM's order, tensor fastest, then data, then pipeline):
//     rank = tp + TP * (dp + DP * pp),   DP = world / (TP * PP)
// so the TP ranks of one tensor-parallel group are neighbours (one host when ranks are placed
// host by host), and the stages of one replica are DP * TP ranks apart.
//
// An axis group is the set of ranks that differ only in that coordinate; listed ascending, a
// rank's index in its axis group equals its coordinate on that axis, so the axis communicator's
// rank() is the coordinate (dp rank = dp, stage = pp).
//
// This lives in lib/comm, not lib/train: it depends on nothing but the communicator, and the
// layers that will talk on an axis (tensor-parallel layers in nn, #11/#14) and the checkpoint
// manifests that record coordinates can then use it without depending on the training loop.
#pragma once

#include <array>
#include <compare>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace dtrain {

enum class GridAxis { kTensor = 0, kData = 1, kPipeline = 2 };
inline constexpr std::array<GridAxis, 3> kGridAxes = {GridAxis::kTensor, GridAxis::kData,
                                                      GridAxis::kPipeline};
const char* grid_axis_name(GridAxis a);  // "tp" | "dp" | "pp"

struct GridCoord {
  int tp = 0, dp = 0, pp = 0;
  int operator[](GridAxis a) const;
  auto operator<=>(const GridCoord&) const = default;
};

// The arithmetic of a layout: a value, the same on every rank, no communication.
class GridLayout {
 public:
  // Throws UserError (naming world, TP and PP) when world, tp or pp is below 1 or tp * pp does
  // not divide world.
  GridLayout(int world, int tp, int pp);

  int world() const { return world_; }
  int tp() const { return tp_; }
  int dp() const { return dp_; }
  int pp() const { return pp_; }
  int size(GridAxis a) const;
  // Axes with more than one rank.
  int axes_in_use() const;

  GridCoord coord(int rank) const;
  int rank_of(const GridCoord& c) const;
  // The world ranks that differ from `rank` only on axis a, ascending (rank included).
  std::vector<int> group(int rank, GridAxis a) const;
  // The subgroup id (subgroup.h) of that group: kGroupIdBase + axis * world + the group's
  // lowest rank. Identical on every member, distinct for distinct groups (of any axis), so
  // unique among the groups a rank belongs to; at least kGroupIdBase, clear of the ids below it
  // that other subgroup users take (the pipeline's per-stage groups use the stage number).
  // DT_CHECK that it stays below subgroup.h's 2^20 (worlds up to ~327k ranks).
  static constexpr uint32_t kGroupIdBase = 1u << 16;
  uint32_t group_id(int rank, GridAxis a) const;

  // "rank 5 (tp 1, dp 0, pp 1)" when more than one axis has size > 1, else "rank 5": the name
  // of a rank in log lines, errors and desync reports.
  std::string describe(int rank) const;
  // "tp 2 x dp 2 x pp 2 (8 ranks)", for the start-up log line and summaries.
  std::string shape() const;

 private:
  int world_, tp_, dp_, pp_;
};

// One rank's grid: its layout, its coordinates, and a communicator per axis.
//
// Axis communicators, built over the world communicator's transport with the world's
// CommOptions and no communication at construction (every rank builds its own, in any order):
//  - an axis whose group is the whole world (the other two axes have size 1) is the world
//    communicator itself: no second transport, no second sequence, so a plain data-parallel
//    run sends exactly what it sent before the grid existed (a collective on that axis is one
//    of the world's sequence, on every rank alike);
//  - an axis of size 1 is a one-rank communicator over a local stub that never carries a
//    message (every collective on one rank returns at once, point-to-point to oneself is a
//    DT_CHECK), so callers never branch on an axis's size; it costs an idle worker thread and
//    takes no group id;
//  - any other axis is a subgroup transport (subgroup.h) with GridLayout::group_id. (Two ranks
//    share at most one axis group, so grid groups could not mix messages even with equal ids;
//    the ids are unique anyway, as subgroup.h asks, and stay clear of other subgroup users,
//    whose groups may share rank pairs with the grid's.)
// Lifetime: `world` must outlive the grid; one grid per world communicator at a time (two would
// build subgroups with the same ids). Thread-safety: as Communicator (the rank's thread).
class RankGrid {
 public:
  // Throws UserError as GridLayout does.
  RankGrid(Communicator& world, int tp, int pp);
  RankGrid(const RankGrid&) = delete;
  RankGrid& operator=(const RankGrid&) = delete;

  const GridLayout& layout() const { return layout_; }
  int rank() const { return world_.rank(); }
  const GridCoord& coord() const { return coord_; }
  Communicator& world() { return world_; }
  Communicator& comm(GridAxis a);
  // Records the axis communicators' collectives into t (null: stop), as the world's are when
  // its owner attaches a tracer: a trace then shows the tensor, data and pipeline groups'
  // collectives too. The caller keeps t alive until it detaches it or the grid is destroyed.
  void set_tracer(Tracer* t) {
    for (auto& c : owned_)
      if (c) c->set_tracer(t);
  }
  // layout().describe(rank()).
  std::string describe() const { return layout_.describe(rank()); }

 private:
  GridLayout layout_;
  Communicator& world_;
  GridCoord coord_;
  // Null where the axis is the world. Destroyed before anything of the world's: they send
  // through its transport.
  std::array<std::unique_ptr<Communicator>, 3> owned_;
};

}  // namespace dtrain
