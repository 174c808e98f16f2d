// nanoGPT's GPT (nn/gpt.h): the embedding and block layers and the builder.
#include "nn/gpt.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "nn/kernels/attention.h"
#include "nn/kernels/embedding.h"
#include "nn/layer.h"
#include "nn/layer_util.h"
#include "nn/tp_gpt.h"
#include "util/check.h"

namespace dtrain {
namespace {

using nn_detail::add_into;
using nn_detail::batch_of;
using nn_detail::resize_batch;
using nn_detail::saved_slot;

constexpr double kInitStd = 0.02;

// y = a * m elementwise, y resized to [batch, sample...] (the masked gradient of a dropout site).
void masked(const Tensor& a, const Tensor& m, Tensor& y, int64_t batch, const Shape& sample) {
  DT_CHECK_EQ(a.numel(), m.numel());
  resize_batch(y, batch, sample);
  const float* pa = a.data();
  const float* pm = m.data();
  float* py = y.data();
  for (int64_t i = 0; i < a.numel(); ++i) py[i] = pa[i] * pm[i];
}

// Whether a forward under ctx drops (nanoGPT: dropout applies in training only).
bool drops(const LayerCtx& ctx, double p) {
  return ctx.training && p > 0.0;
}

// Token + position embedding: x [B, T] token ids (exact floats) -> [B, T, C], then nanoGPT's
// transformer.drop. State: the ids as int32 (index), which backward scatters the gradient by;
// saved[0] the dropout mask (empty when nothing was dropped).
class Embedding final : public Layer {
 public:
  Embedding(int64_t vocab, int64_t block, int64_t seq, int64_t embd, double dropout)
      : Layer({seq}, {seq, embd}),
        vocab_(vocab),
        block_(block),
        seq_(seq),
        embd_(embd),
        dropout_(dropout) {}

  std::string kind() const override { return "embedding"; }
  std::vector<ParamSpec> params() const override {
    return {{"wte.weight", {vocab_, embd_}}, {"wpe.weight", {block_, embd_}}};
  }
  double flops_per_sample() const override { return static_cast<double>(seq_ * embd_); }
  double state_values_per_sample() const override {  // the ids; the dropout mask
    return static_cast<double>(seq_) + (dropout_ > 0 ? static_cast<double>(seq_ * embd_) : 0.0);
  }
  void init(float* p, Rng& rng) const override {
    const float sd = static_cast<float>(kInitStd);
    for (int64_t i = 0; i < (vocab_ + block_) * embd_; ++i) p[i] = sd * rng.normal();
  }

  void forward(const float* p, const Tensor& x, Tensor& y, LayerState& st,
               const LayerCtx& ctx) const override {
    const int64_t batch = batch_of(x, seq_);
    resize_batch(y, batch, out_shape());
    st.index.resize(static_cast<size_t>(batch * seq_));
    for (int64_t i = 0; i < batch * seq_; ++i) {
      const float v = x.data()[i];
      DT_CHECK_MSG(v >= 0 && v < static_cast<float>(vocab_) && v == std::floor(v),
                   "token " << v << " is not an id below " << vocab_);
      st.index[static_cast<size_t>(i)] = static_cast<int32_t>(v);
    }
    embedding_forward(dims(batch), st.index.data(), p, p + vocab_ * embd_, y.data());
    Tensor& mask = saved_slot(st, 0);
    if (!drops(ctx, dropout_)) {
      nn_detail::clear(mask);
      return;
    }
    resize_batch(mask, batch, out_shape());
    nn_detail::dropout_mask(ctx, 0, dropout_, batch, seq_ * embd_, mask.data());
    nn_detail::mul_into(y.data(), mask.data(), y.numel());
  }

  void backward(const float* p, float* g, const Tensor& x, const Tensor& y, const LayerState& st,
                const Tensor& dy, Tensor* dx, const LayerCtx& ctx) const override {
    (void)p, (void)y, (void)ctx;
    const int64_t batch = batch_of(x, seq_);
    DT_CHECK_EQ(dy.numel(), batch * seq_ * embd_);
    const Tensor* d = &dy;
    if (!st.saved.empty() && st.saved[0].numel() > 0) {
      st.work.resize(1);
      masked(dy, st.saved[0], st.work[0], batch, out_shape());
      d = &st.work[0];
    }
    embedding_backward(dims(batch), st.index.data(), d->data(), g, g + vocab_ * embd_);
    if (dx != nullptr) {  // token ids have no gradient
      resize_batch(*dx, batch, in_shape());
      dx->zero();
    }
  }

 private:
  EmbeddingDims dims(int64_t batch) const { return {batch, seq_, vocab_, block_, embd_}; }
  int64_t vocab_, block_, seq_, embd_;
  double dropout_;
};

// One pre-LayerNorm transformer block over [T, C]: x += attn(ln_1(x)); x += mlp(ln_2(x)).
// Children (in parameter order): ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, gelu, mlp.c_proj.
// Dropout as nanoGPT's (training only, each site its own mask): on the attention probabilities
// (attn_dropout, sub-site 0), after attn.c_proj (resid_dropout, 1) and after mlp.c_proj (the
// MLP's dropout, 2); the residual paths themselves are not dropped.
class Block final : public Layer {
 public:
  enum Child { kLn1, kAttn, kAttnProj, kLn2, kFc, kGelu, kMlpProj, kChildren };
  // Saved tensors: the children's inputs and outputs that backward reads, and the masks (empty
  // when nothing was dropped; kAttnDrop holds the dropped probabilities, attention.h).
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
  // Backward's buffers.
  enum Work { kDGelu, kDFc, kDH2, kDX1, kDAttn, kDQkv, kDH1, kDTmp, kScratch, kDMasked, kWork };

  Block(int64_t seq, int64_t embd, int64_t n_head, int64_t n_layer, double dropout)
      : Layer({seq, embd}, {seq, embd}),
        seq_(seq),
        embd_(embd),
        n_head_(n_head),
        dropout_(dropout),
        tc_{seq, embd},
        qkv_{seq, 3 * embd},
        probs_{n_head, seq, seq} {
    const double proj_std = kInitStd / std::sqrt(2.0 * static_cast<double>(n_layer));
    add("ln_1", make_layer_norm(tc_));
    add("attn.c_attn", make_linear(tc_, 3 * embd, Init::kNormal, true, kInitStd));
    add("attn.c_proj", make_linear(tc_, embd, Init::kNormal, true, proj_std));
    add("ln_2", make_layer_norm(tc_));
    add("mlp.c_fc", make_linear(tc_, 4 * embd, Init::kNormal, true, kInitStd));
    add("gelu", make_activation(Activation::kGelu, {seq, 4 * embd}));
    add("mlp.c_proj", make_linear({seq, 4 * embd}, embd, Init::kNormal, true, proj_std));
  }

  std::string kind() const override { return "block"; }
  std::vector<ParamSpec> params() const override {
    std::vector<ParamSpec> out;
    for (size_t k = 0; k < kids_.size(); ++k)
      for (ParamSpec s : kids_[k]->params()) out.push_back({names_[k] + "." + s.name, s.shape});
    return out;
  }
  double flops_per_sample() const override {
    double f = 2.0 * static_cast<double>(seq_ * seq_ * embd_);  // q k^T and P v
    for (const auto& k : kids_) f += k->flops_per_sample();
    return f;
  }
  void init(float* p, Rng& rng) const override {
    for (size_t k = 0; k < kids_.size(); ++k) kids_[k]->init(p + off_[k], rng);
  }
  // Saved: 16 [T, C]-sized tensors (h1, qkv 3, attn_out, proj_out, x1, h2, fc_out 4, gelu_out 4)
  // and the probabilities [n_head, T, T]; with dropout the masks (2 [T, C], one [n_head, T, T]).
  // Backward's work: 17 [T, C]-sized buffers and a [T, T] scratch (per block: each block's state
  // keeps its own). The children's own state (the layer norms' statistics).
  double state_values_per_sample() const override {
    const double tc = static_cast<double>(seq_ * embd_);
    const double probs = static_cast<double>(n_head_ * seq_ * seq_);
    double v = 33.0 * tc + probs + static_cast<double>(seq_ * seq_);
    if (dropout_ > 0) v += 2.0 * tc + probs;
    for (const auto& k : kids_) v += k->state_values_per_sample();
    return v;
  }
  // An evaluation forward saves the 16 [T, C]-sized tensors and the probabilities, no masks.
  double eval_values_per_sample() const override {
    double v =
        16.0 * static_cast<double>(seq_ * embd_) + static_cast<double>(n_head_ * seq_ * seq_);
    for (const auto& k : kids_) v += k->eval_values_per_sample();
    return v;
  }

  // Steady-state calls do not allocate: every buffer keeps its shape (members tc_, qkv_,
  // probs_ rather than temporaries: a Shape is a vector).
  void forward(const float* p, const Tensor& x, Tensor& y, LayerState& st,
               const LayerCtx& ctx) const override {
    const int64_t batch = batch_of(x, seq_ * embd_);
    const bool drop = drops(ctx, dropout_);
    st.children.resize(kChildren);
    st.saved.resize(kSaved);
    std::vector<Tensor>& s = st.saved;
    run(kLn1, p, x, s[kH1], st, ctx);
    run(kAttn, p, s[kH1], s[kQkv], st, ctx);
    const AttentionDims d = dims(batch);
    resize_batch(s[kAttnOut], batch, tc_);
    resize_batch(s[kProbs], batch, probs_);
    mask(drop, ctx, 0, batch, probs_, s[kAttnDrop]);
    attention_forward(d, s[kQkv].data(), s[kAttnOut].data(), s[kProbs].data(),
                      drop ? s[kAttnDrop].data() : nullptr);
    run(kAttnProj, p, s[kAttnOut], s[kProjOut], st, ctx);
    if (mask(drop, ctx, 1, batch, tc_, s[kMask1]))
      nn_detail::mul_into(s[kProjOut].data(), s[kMask1].data(), s[kProjOut].numel());
    resize_batch(s[kX1], batch, tc_);
    add_into(x, s[kProjOut], s[kX1]);
    run(kLn2, p, s[kX1], s[kH2], st, ctx);
    run(kFc, p, s[kH2], s[kFcOut], st, ctx);
    run(kGelu, p, s[kFcOut], s[kGeluOut], st, ctx);
    run(kMlpProj, p, s[kGeluOut], y, st, ctx);
    if (mask(drop, ctx, 2, batch, tc_, s[kMask2]))
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
    // The MLP half: y = x1 + m2 * c_proj(gelu(c_fc(ln_2(x1)))).
    back(kMlpProj, p, g, s[kGeluOut], y, through(s[kMask2], dy, w[kDMasked], batch), &w[kDGelu], st,
         ctx);
    back(kGelu, p, g, s[kFcOut], s[kGeluOut], w[kDGelu], &w[kDFc], st, ctx);
    back(kFc, p, g, s[kH2], s[kFcOut], w[kDFc], &w[kDH2], st, ctx);
    back(kLn2, p, g, s[kX1], s[kH2], w[kDH2], &w[kDTmp], st, ctx);
    resize_batch(w[kDX1], batch, tc_);
    add_into(dy, w[kDTmp], w[kDX1]);
    // The attention half: x1 = x + m1 * c_proj(attn(c_attn(ln_1(x)))).
    back(kAttnProj, p, g, s[kAttnOut], s[kProjOut], through(s[kMask1], w[kDX1], w[kDMasked], batch),
         &w[kDAttn], st, ctx);
    const AttentionDims d = dims(batch);
    resize_batch(w[kDQkv], batch, qkv_);
    nn_detail::resize_1d(w[kScratch], attention_scratch_floats(d));
    attention_backward(d, s[kQkv].data(), s[kProbs].data(), w[kDAttn].data(), w[kDQkv].data(),
                       w[kScratch].data(),
                       s[kAttnDrop].numel() > 0 ? s[kAttnDrop].data() : nullptr);
    back(kAttn, p, g, s[kH1], s[kQkv], w[kDQkv], &w[kDH1], st, ctx);
    back(kLn1, p, g, x, s[kH1], w[kDH1], dx != nullptr ? &w[kDTmp] : nullptr, st, ctx);
    if (dx == nullptr) return;
    resize_batch(*dx, batch, in_shape());
    add_into(w[kDX1], w[kDTmp], *dx);
  }

 private:
  void add(std::string name, std::unique_ptr<Layer> l) {
    off_.push_back(total_);
    total_ += l->param_count();
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
  // Dropout site `sub`: draws m [batch, sample...] when drop, else empties it; returns drop.
  bool mask(bool drop, const LayerCtx& ctx, int sub, int64_t batch, const Shape& sample,
            Tensor& m) const {
    if (!drop) {
      nn_detail::clear(m);
      return false;
    }
    resize_batch(m, batch, sample);
    nn_detail::dropout_mask(ctx, sub, dropout_, batch, shape_numel(sample), m.data());
    return true;
  }
  // The gradient that reaches a dropped output: d * m into buf, or d itself without a mask.
  const Tensor& through(const Tensor& m, const Tensor& d, Tensor& buf, int64_t batch) const {
    if (m.numel() == 0) return d;
    masked(d, m, buf, batch, tc_);
    return buf;
  }
  AttentionDims dims(int64_t batch) const { return {batch, seq_, n_head_, embd_}; }

  int64_t seq_, embd_, n_head_;
  double dropout_;
  Shape tc_, qkv_, probs_;  // per sample: [T, C], [T, 3C], [n_head, T, T]
  std::vector<std::unique_ptr<Layer>> kids_;
  std::vector<std::string> names_;
  std::vector<int64_t> off_;
  int64_t total_ = 0;
};

}  // namespace

std::unique_ptr<Layer> make_gpt_block(int64_t seq, int64_t embd, int64_t n_head, int64_t n_layer,
                                      double dropout) {
  return std::make_unique<Block>(seq, embd, n_head, n_layer, dropout);
}

Model build_gpt(const ModelConfig& cfg, int64_t vocab, int64_t seq, int tp_rank, int tp_size) {
  const int64_t C = cfg.n_embd, L = cfg.n_layer, H = cfg.n_head;
  if (C % H != 0)
    throw UserError("model.n_head " + std::to_string(H) + " does not divide model.n_embd " +
                    std::to_string(C) + " (each head gets n_embd / n_head columns)");
  if (seq < 1 || seq > cfg.block_size)
    throw UserError("a context of " + std::to_string(seq) + " positions does not fit " +
                    "model.block_size " + std::to_string(cfg.block_size));
  if (!(cfg.dropout >= 0.0 && cfg.dropout < 1.0))
    throw UserError("model.dropout: " + std::to_string(cfg.dropout) + " is not in [0, 1)");
  std::vector<ModelElement> e;
  e.push_back(
      {"transformer", std::make_unique<Embedding>(vocab, cfg.block_size, seq, C, cfg.dropout)});
  for (int64_t i = 0; i < L; ++i)
    e.push_back({"transformer.h." + std::to_string(i),
                 tp_size > 1 ? make_tp_block(seq, C, H, L, cfg.dropout, tp_rank, tp_size)
                             : std::make_unique<Block>(seq, C, H, L, cfg.dropout)});
  e.push_back({"transformer.ln_f", make_layer_norm({seq, C})});
  // The tied head draws from the embedding's stream (element 0), whose first draws are wte's:
  // the two copies start bitwise equal.
  e.push_back({"lm_head", make_linear({seq, C}, vocab, Init::kNormal, false, kInitStd),
               cfg.tie_embeddings ? 0 : -1});
  std::vector<std::pair<std::string, std::string>> ties;
  if (cfg.tie_embeddings) ties.emplace_back("transformer.wte.weight", "lm_head.weight");
  return Model(std::move(e), ties);
}

}  // namespace dtrain
