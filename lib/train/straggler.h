// Straggler detection on the data axis: the ranks of one data-parallel group do the same work
// (the same stage of every replica), so compute time tells a slow one. Pipeline stages do
// different work by design and are not compared with each other.
#pragma once

#include <cstdint>

#include "comm/communicator.h"
#include "comm/rank_grid.h"

namespace dtrain {

// At every train record the ranks of the axis all-gather their compute time since the last one
// (synchronous steps give every rank the same wall time, so compute time is what tells a slow
// rank); the lead warns, naming the rank and its grid coordinates, when the same rank is 25%
// (and 1 ms per step) above the median of the other ranks in two records running. The slowest
// rank is left out of the median it is compared with: with it, W = 2 would compare it with
// itself (the upper median) or with its own mean with the other rank (a 67% threshold instead
// of 25%). Collective over `dp`: every rank calls check() at the same records.
class StragglerCheck {
 public:
  StragglerCheck(Communicator& dp, const GridLayout& grid, GridCoord me, bool lead)
      : dp_(dp), grid_(grid), me_(me), lead_(lead) {}
  // compute_s: this rank's compute seconds so far; steps: steps since the last check.
  void check(double compute_s, int64_t steps);
  int64_t warnings() const { return warnings_; }

 private:
  Communicator& dp_;
  const GridLayout& grid_;
  GridCoord me_;
  bool lead_;
  double at_last_ = 0.0;
  int slow_rank_ = -1, streak_ = 0;
  int64_t warnings_ = 0;
};

}  // namespace dtrain
