#include "train/tied_grads.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "util/check.h"
#include "util/duration.h"

namespace dtrain {

namespace {

size_t stage_of(const std::vector<LayerRange>& stages, int layer) {
  for (size_t s = 0; s < stages.size(); ++s)
    if (static_cast<size_t>(layer) >= stages[s].first &&
        static_cast<size_t>(layer) < stages[s].second)
      return s;
  DT_CHECK_MSG(false, "layer " << layer << " is in no stage");
  return 0;
}

// Calls f(tensor index, span pointer, count) for each part of tensor `e` that `held` holds.
template <typename F>
void for_held_parts(const HeldGrads& held, const ParamEntry& e, F&& f) {
  const int64_t lo = e.offset, hi = e.offset + e.numel;
  for (const GradSpan& s : held.spans) {
    const int64_t a = std::max(lo, s.begin), b = std::min(hi, s.end);
    if (a < b) f(a - lo, s.data + (a - s.begin), b - a);
  }
}

}  // namespace

TiedGrads::TiedGrads(const Model& m, const std::vector<LayerRange>& stages, int stage,
                     Communicator& dp, Communicator& pp)
    : dp_(dp), pp_(pp) {
  DT_CHECK_GE(stage, 0);
  DT_CHECK_LT(static_cast<size_t>(stage), stages.size());
  DT_CHECK_EQ(static_cast<size_t>(pp.size()), stages.size());
  for (const TiedParam& t : m.ties()) {
    Tie x;
    x.primary = &m.params()[t.primary];
    x.mirror = &m.params()[t.mirror];
    const size_t sp = stage_of(stages, x.primary->layer), sm = stage_of(stages, x.mirror->layer);
    x.has_primary = sp == static_cast<size_t>(stage);
    x.has_mirror = sm == static_cast<size_t>(stage);
    x.across_stages = sp != sm;
    // A stage that holds neither copy of a tie within one stage takes no part in it.
    if (x.has_primary || x.has_mirror || x.across_stages)
      x.buf.assign(static_cast<size_t>(x.primary->numel), 0.0f);
    ties_.push_back(std::move(x));
  }
}

void TiedGrads::allreduce(Communicator& c, std::vector<float>& b) {
  const auto t0 = std::chrono::steady_clock::now();
  c.allreduce(b.data(), b.size(), ReduceOp::kSum);
  wait_s_ += seconds_since(t0);
}

double TiedGrads::sum(const HeldGrads& held) {
  double mirror_sq = 0.0;
  for (Tie& t : ties_) {
    if (t.buf.empty()) continue;
    std::fill(t.buf.begin(), t.buf.end(), 0.0f);
    float* B = t.buf.data();
    const bool mine = t.has_primary || t.has_mirror;
    if (mine) {
      auto add = [B](int64_t at, const float* g, int64_t n) {
        for (int64_t i = 0; i < n; ++i) B[at + i] += g[i];
      };
      if (t.has_primary) for_held_parts(held, *t.primary, add);
      if (t.has_mirror) for_held_parts(held, *t.mirror, add);
      // Shards: each element of each copy is held by one rank of the axis.
      if (held.shards && dp_.size() > 1) allreduce(dp_, t.buf);
    }
    // Every stage of the replica joins (communicator.h: the same collectives in the same order
    // on every rank); the stages between contribute zeros.
    if (t.across_stages) allreduce(pp_, t.buf);
    if (!mine) continue;
    auto put = [B](int64_t at, float* g, int64_t n) {
      std::memcpy(g, B + at, static_cast<size_t>(n) * sizeof(float));
    };
    if (t.has_primary) for_held_parts(held, *t.primary, put);
    if (t.has_mirror) {
      for_held_parts(held, *t.mirror, put);
      mirror_sq += sum_squares(B, static_cast<int64_t>(t.buf.size()));
    }
  }
  return mirror_sq;
}

std::vector<FlatRange> tie_aligned_pieces(const Model& m, int64_t begin, int64_t end) {
  std::vector<int64_t> cuts = {0, end - begin};
  for (const TiedParam& t : m.ties())
    for (size_t i : {t.primary, t.mirror}) {
      const ParamEntry& e = m.params()[i];
      if (e.offset < begin || e.offset + e.numel > end) continue;
      cuts.push_back(e.offset - begin);
      cuts.push_back(e.offset + e.numel - begin);
    }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<FlatRange> out;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) out.push_back({cuts[i], cuts[i + 1]});
  return out;
}

void check_tied_copies(const Model& m, const float* params, const std::vector<const float*>& state,
                       const std::string& from) {
  std::vector<const float*> bufs = {params};
  bufs.insert(bufs.end(), state.begin(), state.end());
  for (const TiedParam& t : m.ties()) {
    const ParamEntry& p = m.params()[t.primary];
    const ParamEntry& q = m.params()[t.mirror];
    for (const float* b : bufs)
      if (std::memcmp(b + p.offset, b + q.offset, static_cast<size_t>(p.numel) * sizeof(float)) !=
          0)
        throw UserError("checkpoint '" + from + "': " + q.name + " differs from " + p.name +
                        (b == params ? "" : " in the optimizer state") +
                        ", so a model with untied copies wrote it: give model.tie_embeddings: "
                        "false");
  }
}

}  // namespace dtrain
