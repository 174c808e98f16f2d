// `dtrain bench tp`: the harness that times a tensor-parallel GPT step's regions on T in-process
// tensor ranks (bench_tp.h). The regions are run through the real layers (nn/gpt.h, nn/tp_gpt.h)
// and the real communicator; the residual and bias loops are the TP block's own (nn/tp_gpt.cc),
// restated here because the block keeps them private.
#include "dtrain/bench_tp.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/collectives.h"
#include "comm/communicator.h"
#include "comm/inproc.h"
#include "nn/gpt.h"
#include "nn/layer_util.h"
#include "nn/loss.h"
#include "nn/model.h"
#include "nn/tp_gpt.h"
#include "tensor/blas.h"
#include "train/trainer.h"
#include "util/check.h"
#include "util/rng.h"

namespace dtrain {
namespace {

constexpr int64_t kVocab = 256;

// The layers' TensorGroup over the tensor communicator, counting what the step sends.
class CountingGroup final : public TensorGroup {
 public:
  CountingGroup(Communicator* c, int rank, int size) : c_(c), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allreduce_sum(float* data, size_t n) override {
    ++calls;
    floats += static_cast<int64_t>(n);
    if (c_ != nullptr) c_->allreduce(data, n, ReduceOp::kSum);  // null: sizes only (no sum)
  }
  int64_t calls = 0, floats = 0;

 private:
  Communicator* c_;
  int rank_, size_;
};

// Median over `iters` repetitions of fn's time in ms, each repetition's slowest rank counting
// (every rank calls it, in the same order).
double timed(Communicator& comm, int iters, const std::function<void()>& fn) {
  fn();  // warm-up: buffers sized, caches filled
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(static_cast<float>(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()));
  }
  comm.allreduce(ms.data(), ms.size(), ReduceOp::kMax);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void fill_normal(Tensor& t, Rng& rng) {
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = rng.normal();
}

int64_t element_bytes(const Activations& a, size_t i) {
  return a.out[i].numel() * static_cast<int64_t>(sizeof(float)) + a.state[i].bytes();
}

// Bytes the blocks (elements 1..L) hold after one forward of `m` (tensor rank 0 of `tp`, the
// all-reduces skipped: the sizes do not depend on the values).
int64_t block_bytes_unreduced(const ModelConfig& mc, int64_t batch, int tp) {
  const Model m = build_gpt(mc, kVocab, mc.block_size, 0, tp);
  std::vector<float> p(static_cast<size_t>(m.param_count()));
  m.init(p.data(), 1);
  Tensor x({batch, mc.block_size});
  x.zero();
  CountingGroup g(nullptr, 0, tp);
  LayerCtx ctx;
  std::vector<int64_t> rows(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) rows[static_cast<size_t>(b)] = b;
  ctx.rows = rows.data();
  ctx.tensor = &g;
  Activations a;
  m.forward(p.data(), x, a, ctx);
  int64_t sum = 0;
  for (size_t i = 1; i + 2 < m.num_layers(); ++i) sum += element_bytes(a, i);
  return sum;
}

bool tp_fits(const ModelConfig& mc, int t) {
  return t > 1 && mc.n_head % t == 0 && (4 * mc.n_embd) % t == 0 && kVocab % t == 0;
}

// Whether the blocks alone can be split over t tensor ranks (the vocabulary need not be: the
// second size of the blocks' byte decomposition builds no tensor-parallel head).
bool blocks_fit(const ModelConfig& mc, int64_t t) {
  return t > 1 && mc.n_head % t == 0 && (4 * mc.n_embd) % t == 0;
}

// The second tensor size the blocks' bytes are measured at: 2T or T/2 when the blocks split so,
// else the smallest other size they split over (n_head 6 at T 2: 3); 0 when there is none.
int second_tp(const ModelConfig& mc, int tp) {
  if (blocks_fit(mc, 2 * static_cast<int64_t>(tp))) return 2 * tp;
  if (blocks_fit(mc, tp / 2)) return tp / 2;
  for (int64_t t = 2; t <= mc.n_head; ++t)
    if (t != tp && blocks_fit(mc, t)) return static_cast<int>(t);
  return 0;
}

// The TP block's elementwise loops, the same code (nn/layer_util.h).
using nn_detail::add_into;
using nn_detail::add_rows;
using nn_detail::sum_rows;

// (a): the replicated regions of one step, on [B, S, C] tensors of this rank.
void time_replicated(Communicator& comm, int iters, const ModelConfig& mc, int64_t batch,
                     const LayerCtx& ctx, TpRegions& r) {
  const int64_t S = mc.block_size, C = mc.n_embd, L = mc.n_layer, rows = batch * S;
  Rng rng(11);
  Tensor h({batch, S, C}), h2({batch, S, C}), y, dx, dy({batch, S, C}), mask({batch, S, C});
  fill_normal(h, rng);
  fill_normal(h2, rng);
  fill_normal(dy, rng);
  const auto ln = make_layer_norm({S, C});
  std::vector<float> lp(static_cast<size_t>(ln->param_count())), lg(lp.size(), 0.0f);
  ln->init(lp.data(), rng);
  LayerState st;
  r.ln_ms = timed(comm, iters, [&] {
    for (int64_t i = 0; i < 2 * L + 1; ++i) {  // ln_1, ln_2 per block; ln_f
      ln->forward(lp.data(), h, y, st, ctx);
      ln->backward(lp.data(), lg.data(), h, y, st, dy, &dx, ctx);
    }
  });
  Tensor out({batch, S, C});
  std::vector<float> bias(static_cast<size_t>(C), 0.5f), gb(bias.size(), 0.0f);
  r.resid_ms = timed(comm, iters, [&] {
    for (int64_t i = 0; i < 2 * L; ++i) {  // per block: 2 in forward, 2 in backward
      add_into(h, h2, out);
      add_into(out, dy, h2);
    }
    for (int64_t i = 0; i < 2 * L; ++i) {  // the two row-parallel biases per block
      add_rows(out.data(), bias.data(), rows, C);
      sum_rows(dy.data(), gb.data(), rows, C);
    }
  });
  if (!r.dropout) return;
  r.dropout_ms = timed(comm, iters, [&] {
    for (int64_t i = 0; i < 2 * L + 1; ++i) {  // resid_dropout x2 per block; transformer.drop
      nn_detail::dropout_mask(ctx, 1, mc.dropout, batch, S * C, mask.data());
      nn_detail::mul_into(out.data(), mask.data(), out.numel());  // forward
      for (int64_t j = 0; j < out.numel(); ++j) h2.data()[j] = dy.data()[j] * mask.data()[j];
    }
  });
}

// (d): the collectives over [B S, C] and [B S] floats.
void time_collectives(Communicator& comm, int iters, int64_t rows, int64_t C, TpRegions& r) {
  const size_t n = static_cast<size_t>(rows * C), w = static_cast<size_t>(comm.size());
  std::vector<float> buf(n, 1.0f), part(n / w + 1), small(static_cast<size_t>(rows), 1.0f);
  const std::vector<size_t> counts = even_counts(n, comm.size());
  r.ar_ms = timed(comm, iters, [&] { comm.allreduce(buf.data(), n, ReduceOp::kSum); });
  r.rs_ms = timed(comm, iters,
                  [&] { comm.reduce_scatter(buf.data(), n, part.data(), ReduceOp::kSum, counts); });
  r.ag_ms = timed(comm, iters, [&] { comm.allgather(part.data(), buf.data(), counts); });
  r.ar_rows_ms = timed(comm, iters, [&] { comm.allreduce(small.data(), small.size()); });
}

// One tensor rank's share of measure_tp_regions; rank 0 fills r.
void run_rank(const Config& cfg, Communicator& comm, int iters, TpRegions& r) {
  const ModelConfig& mc = cfg.model;
  const int rank = comm.rank(), tp = comm.size();
  const int64_t B = cfg.data.batch_size, S = mc.block_size, C = mc.n_embd;
  const Model m = build_gpt(mc, kVocab, S, rank, tp);
  const size_t n = m.num_layers();
  DT_CHECK_EQ(n, static_cast<size_t>(mc.n_layer + 3));  // embedding, blocks, ln_f, lm_head
  ParamStore ps(m.param_count());
  m.init(ps.values.data(), static_cast<uint64_t>(cfg.seed));
  Tensor x({B, S});
  std::vector<int32_t> labels(static_cast<size_t>(B * S));
  std::vector<int64_t> rows(static_cast<size_t>(B));
  Rng data(static_cast<uint64_t>(cfg.seed), 99);  // the same tokens on every tensor rank
  for (int64_t i = 0; i < B * S; ++i) {
    x.data()[i] = static_cast<float>(data.next_u64() % kVocab);
    labels[static_cast<size_t>(i)] = static_cast<int32_t>(data.next_u64() % kVocab);
  }
  for (int64_t b = 0; b < B; ++b) rows[static_cast<size_t>(b)] = b;
  CountingGroup group(&comm, rank, tp);
  LayerCtx ctx;
  ctx.rows = rows.data();
  ctx.mask_key = dropout_step_key(static_cast<uint64_t>(cfg.seed), 0);
  ctx.tensor = &group;
  Activations acts;
  Tensor dlogits, dh, demb;
  const float scale = 1.0f / static_cast<float>(B);
  float* p = ps.values.data();
  float* g = ps.grads.data();
  r.step_ms = timed(comm, iters, [&] {
    std::fill(ps.grads.begin(), ps.grads.end(), 0.0f);
    const Tensor& logits = m.forward(p, x, acts, ctx);
    softmax_cross_entropy(logits, labels.data(), &dlogits, scale);
    m.backward(p, g, x, acts, dlogits, nullptr);
    sum_tied_grads(m, g);
  });
  DT_CHECK_EQ(group.calls % (iters + 1), 0);  // every step (and the warm-up) issues the same
  r.step_allreduces = group.calls / (iters + 1);
  r.step_allreduce_floats = group.floats / (iters + 1);
  r.act_bytes = acts.bytes();
  r.head_act_bytes = element_bytes(acts, n - 1);
  const int64_t unsplit = element_bytes(acts, 0) + element_bytes(acts, n - 2);
  int64_t blocks = 0;
  for (size_t i = 1; i + 2 < n; ++i) blocks += element_bytes(acts, i);
  // (b): the head alone (its input is ln_f's output), the loss, the embedding.
  r.head_gemm_ms = timed(comm, iters, [&] {
    m.forward(p, acts.out[n - 2], acts, ctx, n - 1, n);
    m.backward(p, g, acts.out[n - 2], acts, dlogits, &dh, n - 1, n);
  });
  r.ce_ms = timed(comm, iters,
                  [&] { softmax_cross_entropy(acts.out[n - 1], labels.data(), &dlogits, scale); });
  demb = acts.out[0];
  r.emb_ms = timed(comm, iters, [&] {
    m.forward(p, x, acts, ctx, 0, 1);
    m.backward(p, g, x, acts, demb, nullptr, 0, 1);
  });
  time_replicated(comm, iters, mc, B, ctx, r);
  time_collectives(comm, iters, B * S, C, r);
  if (rank != 0) return;
  // The blocks' replicated bytes R from A(T) = R + S / T at two sizes.
  r.other_tp = second_tp(mc, tp);
  int64_t repl = 0;
  if (r.other_tp > 0) {
    const double a1 = static_cast<double>(blocks);
    const double a2 = static_cast<double>(block_bytes_unreduced(mc, B, r.other_tp));
    const double sharded = (a1 - a2) / (1.0 / tp - 1.0 / r.other_tp);
    repl = static_cast<int64_t>(a1 - sharded / tp + 0.5);
  }
  r.sp_split_bytes = repl + unsplit;
}

}  // namespace

double TpRegions::sp_saving_ms() const {
  const double t = tp;
  return (t - 1) / t * a_ms() - static_cast<double>(step_allreduces) * (rs_ms + ag_ms - ar_ms);
}

double TpRegions::vp_saving_ms() const {
  const double t = tp;
  return (t - 1) / t * (head_gemm_ms + ce_ms) - (2 * ar_ms + 3 * ar_rows_ms);
}

void check_tp_bench(const Config& cfg, int tp, int iters) {
  const ModelConfig& mc = cfg.model;
  if (mc.type != ModelType::kGpt) throw UserError("bench tp: the config's model is not a gpt");
  if (!tp_fits(mc, tp))
    throw UserError("bench tp: --tp " + std::to_string(tp) +
                    " must be > 1 and divide model.n_head, 4 x model.n_embd and 256");
  if (iters < 1) throw UserError("bench tp: --iters must be >= 1");
  // What its T ranks hold at once, as `dtrain run` counts a training rank's (the optimizer state
  // included, which the bench does not allocate): a size too large for this machine is refused
  // here, not ended by a failed allocation in a rank thread (exit 1).
  const Model m = build_gpt(mc, kVocab, mc.block_size, 0, tp);
  Config at = cfg;  // (the estimate's message names the tensor slices)
  at.distributed.tensor_parallel.size = tp;
  at.distributed.strategy = StrategyKind::kDdp;
  MemoryPlan plan;
  plan.stages = {{0, m.num_layers()}};
  plan.ranks_here = tp;
  plan.blas_threads = 1;
  plan.eval_rows = 0;
  try {
    check_training_memory(at, m, plan);
  } catch (const UserError& e) {
    throw UserError("bench tp: --tp " + std::to_string(tp) +
                    " would not fit, by dtrain run's estimate for its ranks: " + e.what() +
                    " (here: lower data.batch_size or model.block_size)");
  }
}

TpRegions measure_tp_regions(const Config& cfg, int tp, int iters) {
  const ModelConfig& mc = cfg.model;
  check_tp_bench(cfg, tp, iters);
  TpRegions r;
  r.tp = tp;
  r.batch = cfg.data.batch_size;
  r.seq = mc.block_size;
  r.embd = mc.n_embd;
  r.layers = mc.n_layer;
  r.vocab = kVocab;
  r.dropout = mc.dropout > 0.0;
  set_blas_threads(1);
  auto transports = make_inproc_group(tp);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<size_t>(tp));
  std::vector<TpRegions> per(static_cast<size_t>(tp), r);
  for (int k = 0; k < tp; ++k)
    threads.emplace_back([&, k] {
      Communicator comm(std::move(transports[static_cast<size_t>(k)]));
      try {
        run_rank(cfg, comm, iters, per[static_cast<size_t>(k)]);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(k)] = e.what();
        comm.abort(e.what());
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (!e.empty()) throw CommError(e);
  return per[0];
}

}  // namespace dtrain
