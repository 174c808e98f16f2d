// Tensor-parallel GPT blocks (nn/tp_gpt.h) against the whole model, on in-process ranks: the
// shards start as slices of the whole model's initial values, the logits and every gradient
// equal the whole model's (dropout on), and the replicated parameters' gradients are bitwise
// identical on every tensor rank.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "comm/comm_test_util.h"
#include "nn/gpt.h"
#include "nn/tp_gpt.h"
#include "train/tp_train.h"
#include "util/rng.h"

using namespace dtrain;

namespace {

ModelConfig tiny_gpt() {
  ModelConfig c;
  c.type = ModelType::kGpt;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 16;
  c.block_size = 8;
  c.dropout = 0.1;
  c.tie_embeddings = true;
  return c;
}

constexpr int64_t kBatch = 3, kSeq = 8, kVocab = 256;

// Max |a - b| / max |b|.
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
    m = std::max(m, static_cast<double>(std::fabs(b[i])));
  }
  return d / m;
}

struct Pass {
  std::vector<float> params, logits, grads;
  // Per block element: the floats its state holds (saved, work, scratch, children; the larger
  // of after forward and after backward) per sample, and its own estimate of them.
  std::vector<double> held, estimate;
  std::vector<double> eval_held, eval_estimate;  // the same for an evaluation forward
};

double state_floats(const LayerState& st) {
  double n = static_cast<double>(st.index.size() + st.scratch.size());
  for (const Tensor& t : st.saved) n += static_cast<double>(t.numel());
  for (const Tensor& t : st.work) n += static_cast<double>(t.numel());
  for (const LayerState& c : st.children) n += state_floats(c);
  return n;
}

// The block elements' held floats per sample (transformer.h.<i>).
std::vector<double> block_floats(const Model& m, const Activations& acts) {
  std::vector<double> v;
  for (size_t i = 0; i < m.num_layers(); ++i)
    if (m.layer_prefix(i).rfind("transformer.h.", 0) == 0)
      v.push_back(state_floats(acts.state[i]) / static_cast<double>(kBatch));
  return v;
}

// One training forward and backward of `m` on fixed tokens with loss sum(logits * R).
Pass run(const Model& m, TensorGroup* tensor) {
  Pass p;
  p.params.resize(static_cast<size_t>(m.param_count()));
  p.grads.assign(p.params.size(), 0.0f);
  m.init(p.params.data(), 11);
  Tensor x({kBatch, kSeq});
  Rng rng(5);
  for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = static_cast<float>(rng.below(kVocab));
  const std::vector<int64_t> rows = {4, 9, 17};
  ForwardCtx ctx{
      .training = true, .rng = nullptr, .rows = rows.data(), .mask_key = 123, .tensor = tensor};
  Activations acts;
  const Tensor& out = m.forward(p.params.data(), x, acts, ctx);
  p.logits.assign(out.data(), out.data() + out.numel());
  p.held = block_floats(m, acts);
  Tensor dy(out.shape());
  for (int64_t i = 0; i < dy.numel(); ++i) dy.data()[i] = rng.normal();
  m.backward(p.params.data(), p.grads.data(), x, acts, dy, nullptr);
  const std::vector<double> after = block_floats(m, acts);
  for (size_t i = 0; i < after.size(); ++i) p.held[i] = std::max(p.held[i], after[i]);
  for (size_t i = 0; i < m.num_layers(); ++i)
    if (m.layer_prefix(i).rfind("transformer.h.", 0) == 0) {
      p.estimate.push_back(m.layer(i).state_values_per_sample());
      p.eval_estimate.push_back(m.layer(i).eval_values_per_sample());
    }
  Activations eval_acts;
  ForwardCtx eval_ctx{.training = false, .rng = nullptr, .tensor = tensor};
  m.forward(p.params.data(), x, eval_acts, eval_ctx);
  p.eval_held = block_floats(m, eval_acts);
  return p;
}

void check_against_whole(int T) {
  const ModelConfig cfg = tiny_gpt();
  const Model whole = build_gpt(cfg, kVocab, kSeq);
  const Pass ref = run(whole, nullptr);
  std::vector<Pass> got(static_cast<size_t>(T));
  std::vector<std::vector<TpPiece>> pieces(static_cast<size_t>(T));
  std::vector<std::vector<bool>> replicated(static_cast<size_t>(T));
  std::mutex mu;
  testing::require_ok(testing::run_ranks(T, [&](Communicator& comm) {
    const int r = comm.rank();
    const Model local = build_gpt(cfg, kVocab, kSeq, r, T);
    GridTensorGroup g(comm);
    Pass p = run(local, &g);
    std::lock_guard<std::mutex> lock(mu);
    got[static_cast<size_t>(r)] = std::move(p);
    pieces[static_cast<size_t>(r)] = tp_pieces(local, whole, r, T);
    replicated[static_cast<size_t>(r)] = tp_replicated(local, r, T);
    CHECK(local.params().size() == whole.params().size());
    CHECK(local.param_count() < whole.param_count());
  }));
  std::vector<float> params(ref.params.size(), NAN), grads(ref.grads.size(), NAN);
  std::vector<int> covered(ref.params.size(), 0);
  for (int r = 0; r < T; ++r) {
    const Pass& p = got[static_cast<size_t>(r)];
    // Initial values: exactly the whole model's slice.
    std::vector<float> slice(p.params.size());
    tp_slice(pieces[static_cast<size_t>(r)], ref.params.data(), slice.data());
    CHECK(std::memcmp(slice.data(), p.params.data(), slice.size() * sizeof(float)) == 0);
    // The logits: every tensor rank computes the whole model's.
    CHECK(rel_diff(p.logits, ref.logits) < 1e-5);
    tp_unslice(pieces[static_cast<size_t>(r)], p.grads.data(), grads.data());
    tp_unslice(pieces[static_cast<size_t>(r)], p.params.data(), params.data());
    for (const TpPiece& q : pieces[static_cast<size_t>(r)])
      if (!q.replicated)
        for (int64_t i = 0; i < q.n; ++i) ++covered[static_cast<size_t>(q.global + i)];
  }
  // The start-up memory check's estimate of a block's state (Layer::state_values_per_sample) is
  // what the block holds, within 10% over (allocation granularity aside): a tensor rank's, not
  // the whole block's, which it was before (4x over at T = 4).
  for (const Pass* p : std::vector<const Pass*>{&ref, &got[0], &got.back()}) {
    REQUIRE(p->held.size() == static_cast<size_t>(cfg.n_layer));
    REQUIRE(p->estimate.size() == p->held.size());
    for (size_t b = 0; b < p->held.size(); ++b) {
      CAPTURE(b);
      CHECK(p->held[b] <= p->estimate[b]);
      CHECK(p->estimate[b] <= 1.1 * p->held[b]);
      CHECK(p->eval_held[b] <= p->eval_estimate[b]);
      CHECK(p->eval_estimate[b] <= 1.1 * p->eval_held[b]);
    }
  }
  CHECK(got[0].estimate[0] < ref.estimate[0]);
  // Every sharded element has exactly one owner; together the ranks hold the whole model.
  for (size_t i = 0; i < covered.size(); ++i) CHECK(covered[i] <= 1);
  CHECK(std::memcmp(params.data(), ref.params.data(), params.size() * sizeof(float)) == 0);
  CHECK(rel_diff(grads, ref.grads) < 1e-5);
  // The replicated parameters' gradients: bitwise the same on every tensor rank.
  const Model local0 = build_gpt(cfg, kVocab, kSeq, 0, T);
  int64_t replicated_tensors = 0;
  for (size_t i = 0; i < local0.params().size(); ++i) {
    if (!replicated[0][i]) continue;
    ++replicated_tensors;
    const ParamEntry& e = local0.params()[i];
    CAPTURE(e.name);
    for (int r = 1; r < T; ++r)
      CHECK(std::memcmp(got[0].grads.data() + e.offset,
                        got[static_cast<size_t>(r)].grads.data() + e.offset,
                        static_cast<size_t>(e.numel) * sizeof(float)) == 0);
  }
  // wte, wpe, ln_1/ln_2 (2 each) and both c_proj biases per block, ln_f (2), lm_head.
  CHECK(replicated_tensors == 2 + 2 * 6 + 2 + 1);
}

}  // namespace

TEST_CASE("tensor-parallel GPT blocks equal the whole model at T = 2 and T = 4") {
  SUBCASE("T = 2") {
    check_against_whole(2);
  }
  SUBCASE("T = 4") {
    check_against_whole(4);
  }
}

TEST_CASE("tensor-parallel shard table: column, row and replicated shards of the whole tensors") {
  const ModelConfig cfg = tiny_gpt();
  const Model local = build_gpt(cfg, kVocab, kSeq, 1, 2);
  int column = 0, row = 0;
  for (const TpShard& s : tp_shard_table(local, 1, 2)) {
    CAPTURE(s.name);
    if (s.name == "transformer.h.0.attn.c_attn.weight") {
      CHECK(s.dim == 0);
      CHECK(s.chunks == 3);
      CHECK(s.global == Shape{48, 16});
      CHECK(s.local == Shape{24, 16});
      CHECK(s.offset == 8);  // rows [8, 16) of each of q, k and v
      ++column;
    } else if (s.name == "transformer.h.1.mlp.c_proj.weight") {
      CHECK(s.dim == 1);
      CHECK(s.global == Shape{16, 64});
      CHECK(s.local == Shape{16, 32});
      CHECK(s.offset == 32);
      ++row;
    } else if (s.name == "transformer.h.1.mlp.c_proj.bias" || s.name == "lm_head.weight") {
      CHECK(s.dim == -1);
      CHECK(s.local == s.global);
    }
  }
  CHECK(column == 1);
  CHECK(row == 1);
}
