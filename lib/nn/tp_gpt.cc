// The tensor-parallel GPT block and the shard map (nn/tp_gpt.h).
#include "nn/tp_gpt.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "nn/gpt.h"
#include "nn/kernels/attention.h"
#include "nn/layer_util.h"
#include "util/check.h"

namespace dtrain {
namespace {

using nn_detail::add_into;
using nn_detail::add_rows;
using nn_detail::batch_of;
using nn_detail::resize_batch;
using nn_detail::sum_rows;

constexpr double kInitStd = 0.02;  // nanoGPT's (nn/gpt.cc)

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The shard rule of a parameter name (block-relative or model-wide): {dim, chunks}.
std::pair<int, int64_t> shard_rule(const std::string& name) {
  if (ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_attn.bias")) return {0, 3};
  if (ends_with(name, "mlp.c_fc.weight") || ends_with(name, "mlp.c_fc.bias")) return {0, 1};
  if (ends_with(name, "attn.c_proj.weight") || ends_with(name, "mlp.c_proj.weight")) return {1, 1};
  return {-1, 1};
}

TpShard shard_of(const std::string& name, const Shape& local, int rank, int size) {
  TpShard s;
  s.name = name;
  s.local = s.global = local;
  // Only a tensor-parallel block's parameters are sharded: a size-1 group shards nothing.
  const auto [dim, chunks] = size > 1 ? shard_rule(name) : std::pair<int, int64_t>{-1, 1};
  s.dim = dim;
  s.chunks = chunks;
  if (dim < 0) return s;
  DT_CHECK_LT(static_cast<size_t>(dim), local.size());
  DT_CHECK_EQ(local[static_cast<size_t>(dim)] % chunks, 0);
  s.extent = local[static_cast<size_t>(dim)] / chunks;
  s.offset = rank * s.extent;
  s.global[static_cast<size_t>(dim)] *= size;
  return s;
}

// Appends the pieces of one parameter at local offset lo / global offset go.
void add_pieces(const TpShard& s, int64_t lo, int64_t go, std::vector<TpPiece>& out) {
  const int64_t n = shape_numel(s.local);
  if (s.dim < 0) {
    out.push_back({lo, go, n, true});
  } else if (s.dim == 0) {
    const int64_t inner = n / s.local[0];
    const int64_t grows = s.global[0] / s.chunks;  // rows of one chunk of the whole weight
    for (int64_t j = 0; j < s.chunks; ++j)
      out.push_back(
          {lo + j * s.extent * inner, go + (j * grows + s.offset) * inner, s.extent * inner});
  } else {
    DT_CHECK_EQ(s.local.size(), 2u);
    DT_CHECK_EQ(s.dim, 1);
    for (int64_t i = 0; i < s.local[0]; ++i)
      out.push_back({lo + i * s.local[1], go + i * s.global[1] + s.offset, s.local[1]});
  }
}

// The pieces of parameter lists `local` (a tensor rank's) and `global` (the whole model's),
// which name the same tensors in the same order.
std::vector<TpPiece> pieces_of(const std::vector<ParamSpec>& local,
                               const std::vector<ParamSpec>& global, int rank, int size) {
  DT_CHECK_EQ(local.size(), global.size());
  std::vector<TpPiece> out;
  int64_t lo = 0, go = 0;
  for (size_t i = 0; i < local.size(); ++i) {
    DT_CHECK_EQ(local[i].name, global[i].name);
    const TpShard s = shard_of(local[i].name, local[i].shape, rank, size);
    DT_CHECK_MSG(s.global == global[i].shape,
                 "tensor-parallel shard of " << local[i].name << " does not fit");
    add_pieces(s, lo, go, out);
    lo += shape_numel(local[i].shape);
    go += shape_numel(global[i].shape);
  }
  return out;
}

// Block forward/backward as nn/gpt.cc's Block, with c_attn and mlp.c_fc column-parallel and the
// two c_proj row-parallel (their biases kept by the block, added after the all-reduce).
class TpBlock final : public Layer {
 public:
  enum Child { kLn1, kAttn, kAttnProj, kLn2, kFc, kGelu, kMlpProj, kChildren };
  enum Saved {
    kH1,
    kQkv,
    kProbs,
    kAttnOut,
    kProjOut,
    kX1,
    kH2,
    kFcOut,
    kGeluOut,
    kAttnDrop,
    kMask1,
    kMask2,
    kSaved
  };
  enum Work { kDGelu, kDFc, kDH2, kDX1, kDAttn, kDQkv, kDH1, kDTmp, kScratch, kDMasked, kWork };

  TpBlock(int64_t seq, int64_t embd, int64_t n_head, int64_t n_layer, double dropout, int rank,
          int size)
      : Layer({seq, embd}, {seq, embd}),
        seq_(seq),
        embd_(embd),
        n_head_(n_head),
        cl_(embd / size),
        hl_(n_head / size),
        fl_(4 * embd / size),
        rank_(rank),
        size_(size),
        dropout_(dropout),
        tc_{seq, embd},
        qkv_{seq, 3 * (embd / size)},
        probs_{n_head / size, seq, seq},
        whole_(make_gpt_block(seq, embd, n_head, n_layer, dropout)) {
    DT_CHECK(size > 1 && rank >= 0 && rank < size);
    DT_CHECK_EQ(n_head % size, 0);
    DT_CHECK_EQ(embd % n_head, 0);
    DT_CHECK_EQ(4 * embd % size, 0);
    const double proj_std = kInitStd / std::sqrt(2.0 * static_cast<double>(n_layer));
    add("ln_1", make_layer_norm(tc_), 0);
    add("attn.c_attn", make_linear(tc_, 3 * cl_, Init::kNormal, true, kInitStd), 0);
    add("attn.c_proj", make_linear({seq, cl_}, embd, Init::kNormal, false, proj_std), embd);
    add("ln_2", make_layer_norm(tc_), 0);
    add("mlp.c_fc", make_linear(tc_, fl_, Init::kNormal, true, kInitStd), 0);
    add("gelu", make_activation(Activation::kGelu, {seq, fl_}), 0);
    add("mlp.c_proj", make_linear({seq, fl_}, embd, Init::kNormal, false, proj_std), embd);
    init_pieces_ = pieces_of(params(), whole_->params(), rank, size);
  }

  std::string kind() const override {
    return "block (tensor rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ")";
  }
  std::vector<ParamSpec> params() const override {
    std::vector<ParamSpec> out;
    for (size_t k = 0; k < kids_.size(); ++k) {
      for (ParamSpec s : kids_[k]->params()) out.push_back({names_[k] + "." + s.name, s.shape});
      if (bias_[k] > 0) out.push_back({names_[k] + ".bias", {bias_[k]}});
    }
    return out;
  }
  double flops_per_sample() const override {
    double f = 2.0 * static_cast<double>(seq_ * seq_ * cl_);  // q k^T and P v of the local heads
    for (const auto& k : kids_) f += k->flops_per_sample();
    return f;
  }
  // This tensor rank's (in [T, C] units tc; S = size_): saved h1, proj_out, x1, h2 (4 tc) and
  // qkv, attn_out, fc_out, gelu_out (12 tc / S) and its heads' probabilities; backward's work
  // d_masked, dh2, dtmp, dx1, dh1 (5 tc), dgelu, dfc, dattn, dqkv (12 tc / S) and a [T, T]
  // scratch. With dropout: the masks (2 tc and the heads' [T, T]s), and the scratch grows to the
  // whole block's attention mask drawn per row (every head's [T, T]). The children's own state
  // (the layer norms' statistics). At S = 1 without dropout this is the whole block's count
  // (nn/gpt.cc).
  double state_values_per_sample() const override {
    const double tc = static_cast<double>(seq_ * embd_), S = static_cast<double>(size_);
    const double tt = static_cast<double>(seq_ * seq_);
    const double probs = static_cast<double>(hl_) * tt;
    double v = 9.0 * tc + 24.0 * tc / S + probs + tt;
    if (dropout_ > 0) v += 2.0 * tc + probs + static_cast<double>(n_head_ - 1) * tt;
    for (const auto& k : kids_) v += k->state_values_per_sample();
    return v;
  }
  // An evaluation forward's saved tensors only (4 tc + 12 tc / S and the heads' probabilities).
  double eval_values_per_sample() const override {
    const double tc = static_cast<double>(seq_ * embd_);
    double v =
        4.0 * tc + 12.0 * tc / static_cast<double>(size_) + static_cast<double>(hl_ * seq_ * seq_);
    for (const auto& k : kids_) v += k->eval_values_per_sample();
    return v;
  }
  // The whole block's values from rng (the T = 1 model's draws), then this rank's shards.
  void init(float* p, Rng& rng) const override {
    std::vector<float> whole(static_cast<size_t>(whole_->param_count()));
    whole_->init(whole.data(), rng);
    tp_slice(init_pieces_, whole.data(), p);
  }

  void forward(const float* p, const Tensor& x, Tensor& y, LayerState& st,
               const LayerCtx& ctx) const override {
    const int64_t batch = batch_of(x, seq_ * embd_);
    const bool drop = ctx.training && dropout_ > 0.0;
    st.children.resize(kChildren);
    st.saved.resize(kSaved);
    st.work.resize(kWork);
    std::vector<Tensor>& s = st.saved;
    run(kLn1, p, x, s[kH1], st, ctx);
    run(kAttn, p, s[kH1], s[kQkv], st, ctx);  // f: identity forward
    const AttentionDims d = dims(batch);
    resize_batch(s[kAttnOut], batch, {seq_, cl_});
    resize_batch(s[kProbs], batch, probs_);
    attn_mask(drop, ctx, batch, s[kAttnDrop], st.work[kScratch]);
    attention_forward(d, s[kQkv].data(), s[kAttnOut].data(), s[kProbs].data(),
                      drop ? s[kAttnDrop].data() : nullptr);
    run(kAttnProj, p, s[kAttnOut], s[kProjOut], st, ctx);
    reduce_add_bias(p + bias_off_[kAttnProj], s[kProjOut], ctx, batch);  // g
    if (mask(drop, ctx, 1, batch, s[kMask1]))
      nn_detail::mul_into(s[kProjOut].data(), s[kMask1].data(), s[kProjOut].numel());
    resize_batch(s[kX1], batch, tc_);
    add_into(x, s[kProjOut], s[kX1]);
    run(kLn2, p, s[kX1], s[kH2], st, ctx);
    run(kFc, p, s[kH2], s[kFcOut], st, ctx);  // f: identity forward
    run(kGelu, p, s[kFcOut], s[kGeluOut], st, ctx);
    run(kMlpProj, p, s[kGeluOut], y, st, ctx);
    reduce_add_bias(p + bias_off_[kMlpProj], y, ctx, batch);  // g
    if (mask(drop, ctx, 2, batch, s[kMask2]))
      nn_detail::mul_into(y.data(), s[kMask2].data(), y.numel());
    add_into(y, s[kX1], y);
  }

  void backward(const float* p, float* g, const Tensor& x, const Tensor& y, const LayerState& st,
                const Tensor& dy, Tensor* dx, const LayerCtx& ctx) const override {
    const int64_t batch = batch_of(x, seq_ * embd_);
    DT_CHECK_EQ(st.saved.size(), static_cast<size_t>(kSaved));
    const std::vector<Tensor>& s = st.saved;
    std::vector<Tensor>& w = st.work;
    w.resize(kWork);
    const int64_t rows = batch * seq_;
    // The MLP half: y = x1 + m2 * (c_proj(gelu(c_fc(ln_2(x1)))) + b).
    const Tensor& d2 = through(s[kMask2], dy, w[kDMasked], batch);
    sum_rows(d2.data(), g + bias_off_[kMlpProj], rows, embd_);
    back(kMlpProj, p, g, s[kGeluOut], y, d2, &w[kDGelu], st, ctx);
    back(kGelu, p, g, s[kFcOut], s[kGeluOut], w[kDGelu], &w[kDFc], st, ctx);
    back(kFc, p, g, s[kH2], s[kFcOut], w[kDFc], &w[kDH2], st, ctx);
    reduce(w[kDH2], ctx);  // f: the input gradient summed over the tensor ranks
    back(kLn2, p, g, s[kX1], s[kH2], w[kDH2], &w[kDTmp], st, ctx);
    resize_batch(w[kDX1], batch, tc_);
    add_into(dy, w[kDTmp], w[kDX1]);
    // The attention half: x1 = x + m1 * (c_proj(attn(c_attn(ln_1(x)))) + b).
    const Tensor& d1 = through(s[kMask1], w[kDX1], w[kDMasked], batch);
    sum_rows(d1.data(), g + bias_off_[kAttnProj], rows, embd_);
    back(kAttnProj, p, g, s[kAttnOut], s[kProjOut], d1, &w[kDAttn], st, ctx);
    const AttentionDims d = dims(batch);
    resize_batch(w[kDQkv], batch, qkv_);
    nn_detail::resize_1d(w[kScratch], attention_scratch_floats(d));
    attention_backward(d, s[kQkv].data(), s[kProbs].data(), w[kDAttn].data(), w[kDQkv].data(),
                       w[kScratch].data(),
                       s[kAttnDrop].numel() > 0 ? s[kAttnDrop].data() : nullptr);
    back(kAttn, p, g, s[kH1], s[kQkv], w[kDQkv], &w[kDH1], st, ctx);
    reduce(w[kDH1], ctx);  // f
    back(kLn1, p, g, x, s[kH1], w[kDH1], dx != nullptr ? &w[kDTmp] : nullptr, st, ctx);
    if (dx == nullptr) return;
    resize_batch(*dx, batch, in_shape());
    add_into(w[kDX1], w[kDTmp], *dx);
  }

 private:
  void add(std::string name, std::unique_ptr<Layer> l, int64_t bias) {
    off_.push_back(total_);
    total_ += l->param_count();
    bias_off_.push_back(total_);
    bias_.push_back(bias);
    total_ += bias;
    names_.push_back(std::move(name));
    kids_.push_back(std::move(l));
  }
  void run(Child k, const float* p, const Tensor& in, Tensor& out, LayerState& st,
           const LayerCtx& ctx) const {
    kids_[k]->forward(p + off_[k], in, out, st.children[k], ctx);
  }
  void back(Child k, const float* p, float* g, const Tensor& in, const Tensor& out,
            const Tensor& dout, Tensor* din, const LayerState& st, const LayerCtx& ctx) const {
    kids_[k]->backward(p + off_[k], g + off_[k], in, out, st.children[k], dout, din, ctx);
  }
  TensorGroup& group(const LayerCtx& ctx) const {
    DT_CHECK_MSG(ctx.tensor != nullptr, "a tensor-parallel block runs without LayerCtx::tensor");
    DT_CHECK_EQ(ctx.tensor->size(), size_);
    DT_CHECK_EQ(ctx.tensor->rank(), rank_);
    return *ctx.tensor;
  }
  void reduce(Tensor& t, const LayerCtx& ctx) const {
    group(ctx).allreduce_sum(t.data(), static_cast<size_t>(t.numel()));
  }
  // g of a row-parallel layer: y (partial sums) summed over the group, then its bias added.
  void reduce_add_bias(const float* b, Tensor& y, const LayerCtx& ctx, int64_t batch) const {
    reduce(y, ctx);
    add_rows(y.data(), b, batch * seq_, embd_);
  }
  // Dropout site `sub` over [batch, T, C] (replicated: the same mask on every tensor rank).
  bool mask(bool drop, const LayerCtx& ctx, int sub, int64_t batch, Tensor& m) const {
    if (!drop) {
      nn_detail::clear(m);
      return false;
    }
    resize_batch(m, batch, tc_);
    nn_detail::dropout_mask(ctx, sub, dropout_, batch, seq_ * embd_, m.data());
    return true;
  }
  // Attention dropout (sub-site 0): the whole block's mask of each row, this rank's heads kept.
  void attn_mask(bool drop, const LayerCtx& ctx, int64_t batch, Tensor& m, Tensor& full) const {
    if (!drop) {
      nn_detail::clear(m);
      return;
    }
    const int64_t whole = n_head_ * seq_ * seq_, mine = hl_ * seq_ * seq_;
    nn_detail::resize_1d(full, batch * whole);
    nn_detail::dropout_mask(ctx, 0, dropout_, batch, whole, full.data());
    resize_batch(m, batch, probs_);
    for (int64_t b = 0; b < batch; ++b)
      std::copy_n(full.data() + b * whole + rank_ * mine, mine, m.data() + b * mine);
  }
  const Tensor& through(const Tensor& m, const Tensor& d, Tensor& buf, int64_t batch) const {
    if (m.numel() == 0) return d;
    DT_CHECK_EQ(d.numel(), m.numel());
    resize_batch(buf, batch, tc_);
    for (int64_t i = 0; i < d.numel(); ++i) buf.data()[i] = d.data()[i] * m.data()[i];
    return buf;
  }
  AttentionDims dims(int64_t batch) const { return {batch, seq_, hl_, cl_}; }

  int64_t seq_, embd_, n_head_, cl_, hl_, fl_;
  int rank_, size_;
  double dropout_;
  Shape tc_, qkv_, probs_;        // per sample: [T, C], [T, 3C/T], [H/T, T, T]
  std::unique_ptr<Layer> whole_;  // the T = 1 block: initial values
  std::vector<TpPiece> init_pieces_;
  std::vector<std::unique_ptr<Layer>> kids_;
  std::vector<std::string> names_;
  std::vector<int64_t> off_, bias_off_, bias_;
  int64_t total_ = 0;
};

std::vector<ParamSpec> specs(const Model& m) {
  std::vector<ParamSpec> out;
  for (const ParamEntry& e : m.params()) out.push_back({e.name, e.shape});
  return out;
}

}  // namespace

std::unique_ptr<Layer> make_tp_block(int64_t seq, int64_t embd, int64_t n_head, int64_t n_layer,
                                     double dropout, int rank, int size) {
  return std::make_unique<TpBlock>(seq, embd, n_head, n_layer, dropout, rank, size);
}

std::vector<TpShard> tp_shard_table(const Model& local, int rank, int size) {
  std::vector<TpShard> out;
  for (const ParamEntry& e : local.params()) out.push_back(shard_of(e.name, e.shape, rank, size));
  return out;
}

std::vector<TpPiece> tp_pieces(const Model& local, const Model& global, int rank, int size) {
  return pieces_of(specs(local), specs(global), rank, size);
}

void tp_slice(const std::vector<TpPiece>& pieces, const float* global, float* local) {
  for (const TpPiece& p : pieces) std::copy_n(global + p.global, p.n, local + p.local);
}

void tp_unslice(const std::vector<TpPiece>& pieces, const float* local, float* global) {
  for (const TpPiece& p : pieces) std::copy_n(local + p.local, p.n, global + p.global);
}

std::vector<TpRange> tp_global_ranges(const std::vector<TpPiece>& pieces, int64_t begin,
                                      int64_t end, bool skip_replicated) {
  std::vector<TpRange> out;
  // Pieces ascend in local offsets: find the first that ends after begin.
  auto it = std::lower_bound(pieces.begin(), pieces.end(), begin,
                             [](const TpPiece& p, int64_t v) { return p.local + p.n <= v; });
  for (; it != pieces.end() && it->local < end; ++it) {
    if (skip_replicated && it->replicated) continue;
    const int64_t lo = std::max(begin, it->local), hi = std::min(end, it->local + it->n);
    const int64_t g = it->global + (lo - it->local);
    if (!out.empty() && out.back().gend == g &&
        out.back().lbegin + (out.back().gend - out.back().gbegin) == lo)
      out.back().gend = g + (hi - lo);  // contiguous in both layouts: merge
    else
      out.push_back({g, g + (hi - lo), lo});
  }
  return out;
}

std::vector<bool> tp_replicated(const Model& local, int rank, int size) {
  std::vector<bool> out;
  for (const TpShard& s : tp_shard_table(local, rank, size)) out.push_back(s.dim < 0);
  return out;
}

}  // namespace dtrain
