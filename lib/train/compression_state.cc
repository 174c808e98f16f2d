#include "train/compression_state.h"

#include <array>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "util/check.h"
#include "util/rng.h"

namespace dtrain {

namespace {

// Point-to-point tag of the residuals (pipeline.cc uses 1 and 2; DDP and Local SGD, the only
// strategies that compress, use no other).
constexpr uint64_t kTagResidual = 0xC0FFEE;

// An Rng state as 8 floats (bit patterns: broadcast copies, never adds).
std::array<float, 8> rng_words(const std::string& text) {
  Rng r;
  r.from_string(text);
  const auto st = r.state();
  std::array<float, 8> w{};
  std::memcpy(w.data(), st.data(), sizeof(st));
  return w;
}
std::string rng_text(const std::array<float, 8>& w) {
  std::array<uint64_t, 4> st{};
  std::memcpy(st.data(), w.data(), sizeof(st));
  Rng r;
  r.set_state(st);
  return r.to_string();
}

// What rank 0 decides to restore, and why not the rest (the warnings it logs).
struct RestorePlan {
  bool residuals = false, q = false;
};

// The checkpoint stores the type and strategy as their config names; an unknown name (a newer
// dtrain's) matches nothing.
RestorePlan plan_restore(const GradReducer::State& fresh, int world, CompressionType type,
                         StrategyKind strategy, const CompressionState& saved) {
  RestorePlan p;
  const std::optional<CompressionType> saved_type = parse_enum<CompressionType>(saved.type);
  const bool wants_q = !fresh.q.empty();
  const std::string q_note = wants_q ? ", PowerSGD's Q starts from the run seed" : "";
  if (saved_type == CompressionType::kNone) {
    spdlog::warn(
        "the checkpoint holds no compression state (written without distributed.compression, "
        "or in checkpoint format 1): error-feedback residuals start at zero{}",
        q_note);
    return p;
  }
  if (!fresh.residual.empty()) {
    // What differs, first found (the warning named both sides, which could read the same).
    std::string differs;
    if (saved_type != type)
      differs = "the compression type";
    else if (parse_enum<StrategyKind>(saved.strategy) != strategy)
      differs = "the strategy";
    else if (saved.world_size != world)
      differs = "the world size";
    else if (saved.residuals.size() != static_cast<size_t>(world))
      differs =
          "the number of ranks' residuals stored (" + std::to_string(saved.residuals.size()) + ")";
    else if (saved.residuals[0].size() != fresh.residual.size())
      differs = "the residual's length";
    else if (saved.q.size() != fresh.q.size())  // powersgd: the same factor layout
      differs = "PowerSGD's factor layout (Q of " + std::to_string(saved.q.size()) +
                " floats, this run's " + std::to_string(fresh.q.size()) + ")";
    if (differs.empty()) {
      p.residuals = true;
    } else if (saved.residuals.empty()) {
      spdlog::warn(
          "the checkpoint's {} compression state has no error-feedback residuals "
          "(saved with error_feedback off): they start at zero",
          saved.type);
    } else {
      spdlog::warn(
          "the checkpoint's error-feedback residuals are for {} compression with strategy {} at "
          "world size {} ({} floats per rank); this run uses {} with {} at world size {} ({} "
          "floats), and {} differs: residuals dropped, error feedback starts at zero",
          saved.type, saved.strategy, saved.world_size,
          saved.residuals.empty() ? 0 : saved.residuals[0].size(), to_string(type),
          to_string(strategy), world, fresh.residual.size(), differs);
    }
  }
  if (wants_q) {
    p.q = saved_type == CompressionType::kPowersgd && saved.q.size() == fresh.q.size() &&
          !saved.rng.empty();
    if (!p.q)
      spdlog::warn(
          "the checkpoint's compression state has no PowerSGD Q of {} floats (it has {} of {} "
          "compression): Q starts from the run seed",
          fresh.q.size(), saved.q.size(), saved.type);
  }
  return p;
}

}  // namespace

CompressionState gather_compression_state(Communicator& comm, const GradReducer& reducer,
                                          CompressionType type) {
  const int world = comm.size(), rank = comm.rank();
  GradReducer::State mine = reducer.export_state();
  CompressionState out;
  if (rank != 0) {
    if (!mine.residual.empty())
      comm.send(0, kTagResidual, mine.residual.data(), mine.residual.size());
    return out;
  }
  out.type = to_string(type);
  out.world_size = world;
  out.q = std::move(mine.q);
  out.rng = std::move(mine.rng);
  if (!mine.residual.empty()) {
    out.residuals.resize(static_cast<size_t>(world));
    for (int r = 1; r < world; ++r) {
      auto& res = out.residuals[static_cast<size_t>(r)];
      res.resize(mine.residual.size());
      comm.recv(r, kTagResidual, res.data(), res.size());
    }
    out.residuals[0] = std::move(mine.residual);
  }
  return out;
}

void restore_compression_state(Communicator& comm, GradReducer& reducer, CompressionType type,
                               StrategyKind strategy, const CompressionState& saved) {
  const int world = comm.size(), rank = comm.rank();
  const GradReducer::State fresh = reducer.export_state();
  // Rank 0 decides; the others follow its flags.
  std::array<float, 2> flags{};
  if (rank == 0) {
    const RestorePlan p = plan_restore(fresh, world, type, strategy, saved);
    flags = {p.residuals ? 1.0f : 0.0f, p.q ? 1.0f : 0.0f};
  }
  if (world > 1) comm.broadcast(flags.data(), flags.size(), 0);
  GradReducer::State in;
  if (flags[0] != 0.0f) {
    if (rank == 0) {
      for (int r = 1; r < world; ++r) {
        const auto& res = saved.residuals[static_cast<size_t>(r)];
        comm.send(r, kTagResidual, res.data(), res.size());
      }
      in.residual = saved.residuals[0];
    } else {
      in.residual.resize(fresh.residual.size());
      comm.recv(0, kTagResidual, in.residual.data(), in.residual.size());
    }
  }
  if (flags[1] != 0.0f) {
    in.q = rank == 0 ? saved.q : std::vector<float>(fresh.q.size());
    std::array<float, 8> rw = rank == 0 ? rng_words(saved.rng) : std::array<float, 8>{};
    if (world > 1) {
      comm.broadcast(in.q.data(), in.q.size(), 0);
      comm.broadcast(rw.data(), rw.size(), 0);
    }
    in.rng = rng_text(rw);
  }
  reducer.import_state(in);
  if (rank == 0 && (flags[0] != 0.0f || flags[1] != 0.0f))
    spdlog::info("compression state restored:{}{}",
                 flags[0] != 0.0f ? fmt::format(" error-feedback residuals of {} rank(s)", world)
                                  : std::string(),
                 flags[1] != 0.0f ? " PowerSGD's Q and RNG" : "");
}

}  // namespace dtrain
