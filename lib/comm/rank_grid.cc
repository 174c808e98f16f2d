#include "comm/rank_grid.h"

#include <fmt/format.h>

#include "comm/subgroup.h"
#include "util/check.h"

namespace dtrain {

const char* grid_axis_name(GridAxis a) {
  switch (a) {
    case GridAxis::kTensor:
      return "tp";
    case GridAxis::kData:
      return "dp";
    case GridAxis::kPipeline:
      return "pp";
  }
  return "?";
}

int GridCoord::operator[](GridAxis a) const {
  switch (a) {
    case GridAxis::kTensor:
      return tp;
    case GridAxis::kData:
      return dp;
    case GridAxis::kPipeline:
      return pp;
  }
  DT_CHECK_MSG(false, "unknown grid axis " << static_cast<int>(a));
  return 0;
}

GridLayout::GridLayout(int world, int tp, int pp) : world_(world), tp_(tp), dp_(0), pp_(pp) {
  if (world < 1 || tp < 1 || pp < 1)
    throw UserError(fmt::format(
        "rank grid: world size {}, tensor-parallel size {} and pipeline stages {} must each be "
        "at least 1",
        world, tp, pp));
  if (world % (static_cast<int64_t>(tp) * pp) != 0)
    throw UserError(fmt::format(
        "rank grid: tensor-parallel size {} x pipeline stages {} = {} does not divide the world "
        "size {} (world = tensor x data x pipeline; distributed.tensor_parallel.size, "
        "distributed.pipeline.stages)",
        tp, pp, static_cast<int64_t>(tp) * pp, world));
  dp_ = world / (tp * pp);
}

int GridLayout::size(GridAxis a) const {
  return GridCoord{tp_, dp_, pp_}[a];
}

int GridLayout::axes_in_use() const {
  return (tp_ > 1) + (dp_ > 1) + (pp_ > 1);
}

GridCoord GridLayout::coord(int rank) const {
  DT_CHECK(rank >= 0 && rank < world_);
  GridCoord c;
  c.tp = rank % tp_;
  c.dp = (rank / tp_) % dp_;
  c.pp = rank / (tp_ * dp_);
  return c;
}

int GridLayout::rank_of(const GridCoord& c) const {
  DT_CHECK(c.tp >= 0 && c.tp < tp_ && c.dp >= 0 && c.dp < dp_ && c.pp >= 0 && c.pp < pp_);
  return c.tp + tp_ * (c.dp + dp_ * c.pp);
}

std::vector<int> GridLayout::group(int rank, GridAxis a) const {
  GridCoord c = coord(rank);
  std::vector<int> out;
  const int n = size(a);
  out.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    (a == GridAxis::kTensor ? c.tp : a == GridAxis::kData ? c.dp : c.pp) = i;
    out.push_back(rank_of(c));  // ascending: rank_of grows with every coordinate
  }
  return out;
}

uint32_t GridLayout::group_id(int rank, GridAxis a) const {
  const uint64_t id = uint64_t{kGroupIdBase} +
                      static_cast<uint64_t>(a) * static_cast<uint64_t>(world_) +
                      static_cast<uint64_t>(group(rank, a).front());
  DT_CHECK_MSG(id < (uint64_t{1} << 20),
               "rank grid: world size " << world_ << " leaves no subgroup ids");
  return static_cast<uint32_t>(id);
}

std::string GridLayout::describe(int rank) const {
  if (axes_in_use() < 2) return fmt::format("rank {}", rank);
  const GridCoord c = coord(rank);
  return fmt::format("rank {} (tp {}, dp {}, pp {})", rank, c.tp, c.dp, c.pp);
}

std::string GridLayout::shape() const {
  return fmt::format("tp {} x dp {} x pp {} ({} ranks)", tp_, dp_, pp_, world_);
}

namespace {

// The transport of a one-rank axis: collectives on one rank return before touching it, so it
// never carries a message. abort() reaches the world transport, as a subgroup's does.
class SoloTransport final : public Transport {
 public:
  explicit SoloTransport(Transport& parent) : parent_(parent) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return parent_.backend(); }
  void send(int dst, const MsgHeader& h, const void*) override {
    DT_CHECK_MSG(false, "send of " << describe(h) << " to rank " << dst << " on a one-rank axis");
  }
  void recv(int src, const MsgHeader& h, void*, Deadline) override {
    DT_CHECK_MSG(false, "recv of " << describe(h) << " from rank " << src << " on a one-rank axis");
  }
  void abort(const std::string& why) override { parent_.abort(why); }

 private:
  Transport& parent_;
};

}  // namespace

RankGrid::RankGrid(Communicator& world, int tp, int pp)
    : layout_(world.size(), tp, pp), world_(world), coord_(layout_.coord(world.rank())) {
  const int W = layout_.world();
  for (GridAxis a : kGridAxes) {
    const int n = layout_.size(a);
    auto& slot = owned_[static_cast<size_t>(a)];
    if (n == W) continue;  // the world itself
    CommOptions opts = world.options();
    opts.trace_track = "comm " + std::string(grid_axis_name(a));
    if (n == 1) {
      slot =
          std::make_unique<Communicator>(std::make_unique<SoloTransport>(world.transport()), opts);
      continue;
    }
    const std::vector<int> members = layout_.group(world.rank(), a);
    slot = std::make_unique<Communicator>(
        make_subgroup_transport(world.transport(), members, layout_.group_id(world.rank(), a)),
        opts);
    // Errors on an axis name the world rank (and its coordinates), not the index in the group.
    slot->set_rank_namer([layout = layout_, members](int g) {
      return layout.describe(members[static_cast<size_t>(g)]);
    });
  }
  if (layout_.axes_in_use() > 1)
    world.set_rank_namer([layout = layout_](int r) { return layout.describe(r); });
}

Communicator& RankGrid::comm(GridAxis a) {
  const auto& slot = owned_[static_cast<size_t>(a)];
  return slot ? *slot : world_;
}

}  // namespace dtrain
