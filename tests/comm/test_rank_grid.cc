// The rank grid: coordinates and axis groups for many (world, TP, PP) against a brute-force
// enumeration, refusals, rank names, and collectives on each axis communicator summing exactly
// the ranks of that axis group (in-process ranks, and one layout over gRPC).
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "comm/rank_grid.h"
#include "comm_test_util.h"
#include "util/check.h"

using namespace dtrain;
using dtrain::testing::require_ok;
using dtrain::testing::run_ranks;

namespace {

// Every rank's coordinates, by counting through the grid with the tensor coordinate fastest,
// then data, then pipeline: independent of GridLayout's arithmetic.
std::vector<GridCoord> brute_force_coords(int tp, int dp, int pp) {
  std::vector<GridCoord> out;
  for (int p = 0; p < pp; ++p)
    for (int d = 0; d < dp; ++d)
      for (int t = 0; t < tp; ++t) out.push_back(GridCoord{t, d, p});
  return out;
}

// The ranks that share every coordinate with `rank` except the one on axis a, ascending.
std::vector<int> brute_force_group(const std::vector<GridCoord>& coords, int rank, GridAxis a) {
  std::vector<int> out;
  for (int r = 0; r < static_cast<int>(coords.size()); ++r) {
    bool same = true;
    for (GridAxis b : kGridAxes)
      if (b != a && coords[static_cast<size_t>(r)][b] != coords[static_cast<size_t>(rank)][b])
        same = false;
    if (same) out.push_back(r);
  }
  return out;
}

std::string refusal(int world, int tp, int pp) {
  try {
    GridLayout g(world, tp, pp);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("grid coordinates and axis groups match a brute-force enumeration") {
  int layouts = 0;
  for (int world = 1; world <= 24; ++world) {
    for (int tp = 1; tp <= world; ++tp) {
      for (int pp = 1; pp <= world; ++pp) {
        if (world % (tp * pp) != 0) continue;
        ++layouts;
        const int dp = world / (tp * pp);
        INFO("world ", world, " tp ", tp, " pp ", pp);
        const GridLayout g(world, tp, pp);
        REQUIRE(g.world() == world);
        REQUIRE(g.tp() == tp);
        REQUIRE(g.dp() == dp);
        REQUIRE(g.pp() == pp);
        CHECK(g.size(GridAxis::kTensor) == tp);
        CHECK(g.size(GridAxis::kData) == dp);
        CHECK(g.size(GridAxis::kPipeline) == pp);
        CHECK(g.axes_in_use() == (tp > 1) + (dp > 1) + (pp > 1));
        const std::vector<GridCoord> want = brute_force_coords(tp, dp, pp);
        REQUIRE(static_cast<int>(want.size()) == world);
        for (int r = 0; r < world; ++r) {
          INFO("rank ", r);
          REQUIRE(g.coord(r) == want[static_cast<size_t>(r)]);
          REQUIRE(g.rank_of(want[static_cast<size_t>(r)]) == r);
          for (GridAxis a : kGridAxes) {
            const std::vector<int> grp = g.group(r, a);
            REQUIRE(grp == brute_force_group(want, r, a));
            // The rank's index in its axis group is its coordinate on that axis.
            const auto at = std::find(grp.begin(), grp.end(), r) - grp.begin();
            REQUIRE(at == want[static_cast<size_t>(r)][a]);
          }
        }
        // Subgroup ids: the same on every member, different for different groups.
        std::map<uint32_t, std::vector<int>> by_id;
        for (int r = 0; r < world; ++r)
          for (GridAxis a : kGridAxes) {
            const uint32_t id = g.group_id(r, a);
            CHECK(id >= GridLayout::kGroupIdBase);
            CHECK(id < (1u << 20));
            const auto [it, fresh] = by_id.emplace(id, g.group(r, a));
            if (!fresh) REQUIRE(it->second == g.group(r, a));
          }
        // Each axis's groups partition the world into world / size groups of `size` ranks.
        for (GridAxis a : kGridAxes) {
          std::set<std::vector<int>> groups;
          for (int r = 0; r < world; ++r) groups.insert(g.group(r, a));
          CHECK(static_cast<int>(groups.size()) == world / g.size(a));
          std::multiset<int> seen;
          for (const auto& grp : groups) seen.insert(grp.begin(), grp.end());
          CHECK(static_cast<int>(seen.size()) == world);
          CHECK(static_cast<int>(std::set<int>(seen.begin(), seen.end()).size()) == world);
        }
      }
    }
  }
  CHECK(layouts == 203);  // every divisor pair of 1..24: the loops above ran them all
}

TEST_CASE("rank names carry grid coordinates only when more than one axis is in use") {
  CHECK(GridLayout(8, 2, 2).describe(5) == "rank 5 (tp 1, dp 0, pp 1)");
  CHECK(GridLayout(8, 2, 2).describe(0) == "rank 0 (tp 0, dp 0, pp 0)");
  CHECK(GridLayout(8, 1, 2).describe(5) == "rank 5 (tp 0, dp 1, pp 1)");
  CHECK(GridLayout(8, 2, 1).describe(7) == "rank 7 (tp 1, dp 3, pp 0)");
  CHECK(GridLayout(8, 1, 1).describe(5) == "rank 5");  // data only
  CHECK(GridLayout(8, 8, 1).describe(5) == "rank 5");  // tensor only
  CHECK(GridLayout(8, 1, 8).describe(5) == "rank 5");  // pipeline only
  CHECK(GridLayout(1, 1, 1).describe(0) == "rank 0");
  CHECK(GridLayout(12, 2, 3).shape() == "tp 2 x dp 2 x pp 3 (12 ranks)");
}

TEST_CASE("layouts whose tensor x pipeline size does not divide the world are refused") {
  const std::string m = refusal(8, 3, 2);
  CHECK(m.find("tensor-parallel size 3") != std::string::npos);
  CHECK(m.find("pipeline stages 2") != std::string::npos);
  CHECK(m.find("world size 8") != std::string::npos);
  CHECK(m.find("does not divide") != std::string::npos);
  for (auto [w, t, p] : {std::array{6, 4, 1}, std::array{6, 1, 4}, std::array{4, 2, 4},
                         std::array{7, 7, 7}, std::array{1, 2, 1}}) {
    INFO(w, " ", t, " ", p);
    const std::string e = refusal(w, t, p);
    CHECK(e.find("world size " + std::to_string(w)) != std::string::npos);
    CHECK(e.find("tensor-parallel size " + std::to_string(t)) != std::string::npos);
    CHECK(e.find("pipeline stages " + std::to_string(p)) != std::string::npos);
  }
  for (auto [w, t, p] : {std::array{0, 1, 1}, std::array{4, 0, 1}, std::array{4, 1, -2}}) {
    const std::string e = refusal(w, t, p);
    CHECK(e.find("must each be at least 1") != std::string::npos);
  }
  CHECK(refusal(12, 2, 3).empty());
  CHECK(refusal(12, 12, 1).empty());
}

namespace {

// On every rank of one grid: each axis communicator's rank and size are the rank's coordinate
// and the axis size, and all-reduces (float and int64) and an int64 all-gather on it see exactly
// the ranks of the brute-force axis group. Collectives on the three axes are in flight at once.
void check_axis_collectives(Communicator& world, int tp, int pp) {
  RankGrid grid(world, tp, pp);
  const GridLayout& g = grid.layout();
  const std::vector<GridCoord> coords = brute_force_coords(g.tp(), g.dp(), g.pp());
  const int me = world.rank();
  CHECK(grid.coord() == coords[static_cast<size_t>(me)]);
  CHECK(grid.describe() == g.describe(me));

  std::map<GridAxis, std::vector<float>> f;
  std::map<GridAxis, std::vector<int64_t>> big;
  std::vector<WorkPtr> works;
  for (GridAxis a : kGridAxes) {
    Communicator& c = grid.comm(a);
    REQUIRE(c.size() == g.size(a));
    REQUIRE(c.rank() == coords[static_cast<size_t>(me)][a]);
    // An axis that spans the world is the world communicator itself.
    CHECK((&c == &world) == (g.size(a) == g.world()));
    f[a] = {static_cast<float>(me), 1.0f};
    big[a] = {(int64_t{1} << 53) + 1 + me, -me};
    works.push_back(c.allreduce_async(f[a].data(), f[a].size(), ReduceOp::kSum));
    works.push_back(c.allreduce_async(big[a].data(), big[a].size(), ReduceOp::kSum));
  }
  for (auto& w : works) w->wait();
  for (GridAxis a : kGridAxes) {
    INFO("axis ", grid_axis_name(a), " rank ", me);
    const std::vector<int> grp = brute_force_group(coords, me, a);
    int64_t sum = 0;
    for (int r : grp) sum += r;
    const auto n = static_cast<int64_t>(grp.size());
    CHECK(f[a][0] == static_cast<float>(sum));
    CHECK(f[a][1] == static_cast<float>(n));
    CHECK(big[a][0] == ((int64_t{1} << 53) + 1) * n + sum);
    CHECK(big[a][1] == -sum);
    // The group's members, in axis order.
    Communicator& c = grid.comm(a);
    const int64_t mine = me;
    std::vector<int64_t> members(grp.size());
    c.allgather(&mine, members.data(), std::vector<size_t>(grp.size(), 1));
    CHECK(std::vector<int>(members.begin(), members.end()) == grp);
  }
  world.barrier();  // the world stays usable next to its axes
}

}  // namespace

TEST_CASE("axis communicators reduce over exactly their axis group (inproc)") {
  struct Layout {
    int world, tp, pp;
  };
  for (Layout l : {Layout{8, 2, 2}, Layout{8, 1, 2}, Layout{8, 2, 1}, Layout{4, 1, 1},
                   Layout{4, 4, 1}, Layout{6, 3, 1}, Layout{12, 2, 3}, Layout{1, 1, 1}}) {
    INFO("world ", l.world, " tp ", l.tp, " pp ", l.pp);
    require_ok(run_ranks(l.world, [&](Communicator& c) { check_axis_collectives(c, l.tp, l.pp); }));
  }
}

TEST_CASE("axis communicators over gRPC: 2 x 2 x 2 on shared memory, 2 x 1 x 2 on streams") {
  require_ok(run_ranks(
      8, [&](Communicator& c) { check_axis_collectives(c, 2, 2); }, {}, "shm"));
  require_ok(run_ranks(
      4, [&](Communicator& c) { check_axis_collectives(c, 2, 2); }, {}, "grpc"));
}

TEST_CASE("the dp axis of 2 x 2 x 2 sums the ranks that share tp and pp") {
  require_ok(run_ranks(8, [&](Communicator& world) {
    RankGrid grid(world, 2, 2);
    const GridCoord me = grid.coord();
    std::vector<int64_t> v = {world.rank()};
    grid.comm(GridAxis::kData).allreduce(v.data(), 1);
    // Partners: same tp and pp, the other dp: rank +- TP.
    const int partner = me.dp == 0 ? world.rank() + 2 : world.rank() - 2;
    CHECK(v[0] == world.rank() + partner);
  }));
}

TEST_CASE("a failed rank fails its grid partners on every axis") {
  CommOptions opts;
  opts.timeout_s = 30;
  const auto errors = run_ranks(
      4,
      [&](Communicator& world) {
        RankGrid grid(world, 2, 1);
        // Rank 3 leaves; its tensor partner (rank 2) fails, and through the shared world
        // transport so do ranks 0 and 1, which wait on the world.
        if (world.rank() == 3) throw std::runtime_error("rank 3 crashed");
        std::vector<float> x(4, 1.0f);
        if (world.rank() == 2) grid.comm(GridAxis::kTensor).allreduce(x.data(), x.size());
        world.barrier();
      },
      opts);
  for (size_t r = 0; r < 3; ++r) {
    INFO("rank ", r, ": ", errors[r]);
    CHECK(errors[r].find("rank 3 crashed") != std::string::npos);
  }
}

TEST_CASE("errors on an axis communicator name the world rank and its grid coordinates") {
  CommOptions opts;
  opts.timeout_s = 30;
  const auto errors = run_ranks(
      4,
      [&](Communicator& world) {
        RankGrid grid(world, 1, 2);  // dp 2 x pp 2: rank = dp + 2 pp
        Communicator& dp = grid.comm(GridAxis::kData);
        // The data axis's group index 1 of pipeline stage 1 is world rank 3.
        if (grid.coord().pp == 1) CHECK(dp.rank_name(1) == "rank 3 (tp 0, dp 1, pp 1)");
        CHECK(world.rank_name(2) == "rank 2 (tp 0, dp 0, pp 1)");
        if (world.rank() == 3) throw std::runtime_error("rank 3 crashed");
        std::vector<float> x(4, 1.0f);
        if (world.rank() == 2) dp.allreduce(x.data(), x.size());
        world.barrier();
      },
      opts);
  // Rank 2's own failure on its data axis names it by world rank and coordinates, not as the
  // axis's "rank 0".
  INFO(errors[2]);
  CHECK(errors[2].find("rank 2 (tp 0, dp 0, pp 1)") != std::string::npos);
}
