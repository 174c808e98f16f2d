// SGD, Adam and AdamW with torch.optim semantics (dampening 0, no amsgrad, no maximize), float32
// arithmetic in PyTorch's operation order so results track a PyTorch run closely. The update
// loops are the hot path of every step (one pass over the owned range, memory-bandwidth bound):
// they are specialised by template on the options so the inner loops have no branches.
#include "optim/optimizer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numbers>

#if defined(__SSE__)
#include <immintrin.h>
#endif

#include "util/check.h"

namespace dtrain {

Optimizer::Optimizer(int64_t begin, int64_t n, std::vector<std::string> names)
    : begin_(begin), n_(n), names_(std::move(names)) {
  DT_CHECK_GE(begin, 0);
  DT_CHECK_GE(n, 0);
  // Each buffer allocated in place: assign(count, prototype) built an n-float prototype first --
  // even for no state at all -- a transient copy of the parameters' size above what the memory
  // check counts (a tester's SGD MLP peaked at 3x its parameter bytes where 2x was planned).
  state_.resize(names_.size());
  for (std::vector<float>& s : state_) s.assign(static_cast<size_t>(n), 0.0f);
}

int64_t Optimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& s : state_) bytes += static_cast<int64_t>(s.size() * sizeof(float));
  return bytes;
}

namespace {

// ---------------------------------------------------------------------------------------------
// SGD. PyTorch: d = g + wd*p; buf = momentum*buf + d (buf = d on the first step, identical with a
// zero-initialised buffer); d = nesterov ? d + momentum*buf : buf; p += -lr*d.

template <bool kDecay, bool kMomentum, bool kNesterov>
void sgd_update(float* __restrict p, const float* __restrict g, float* __restrict buf, int64_t n,
                float lr, float wd, float momentum) {
  const float neg_lr = -lr;
  for (int64_t i = 0; i < n; ++i) {
    float d = g[i];
    if constexpr (kDecay) d = d + wd * p[i];
    if constexpr (kMomentum) {
      const float b = buf[i] * momentum + d;
      buf[i] = b;
      if constexpr (kNesterov) {
        d = d + momentum * b;
      } else {
        d = b;
      }
    }
    p[i] = p[i] + neg_lr * d;
  }
}

class Sgd final : public Optimizer {
 public:
  Sgd(const OptimizerConfig& cfg, int64_t begin, int64_t n)
      : Optimizer(
            begin, n,
            cfg.momentum > 0 ? std::vector<std::string>{"momentum"} : std::vector<std::string>{}),
        wd_(static_cast<float>(cfg.weight_decay)),
        momentum_(static_cast<float>(cfg.momentum)),
        nesterov_(cfg.nesterov) {}

  void update(float* params, const float* grads, int64_t off, int64_t n, double lr,
              bool decay_here) override {
    if (n == 0) return;
    const float lrf = static_cast<float>(lr);
    const bool decay = decay_here && wd_ != 0.0f;
    if (momentum_ > 0.0f) {
      float* buf = state_[0].data() + off;
      if (nesterov_) {
        if (decay) {
          sgd_update<true, true, true>(params, grads, buf, n, lrf, wd_, momentum_);
        } else {
          sgd_update<false, true, true>(params, grads, buf, n, lrf, wd_, momentum_);
        }
      } else if (decay) {
        sgd_update<true, true, false>(params, grads, buf, n, lrf, wd_, momentum_);
      } else {
        sgd_update<false, true, false>(params, grads, buf, n, lrf, wd_, momentum_);
      }
    } else if (decay) {
      sgd_update<true, false, false>(params, grads, nullptr, n, lrf, wd_, 0.0f);
    } else {
      sgd_update<false, false, false>(params, grads, nullptr, n, lrf, wd_, 0.0f);
    }
  }

 private:
  float wd_, momentum_;
  bool nesterov_;
};

// ---------------------------------------------------------------------------------------------
// Adam / AdamW. Per element, in PyTorch's (_single_tensor_adam) order:
//   AdamW only:  p = p * (1 - lr*wd)
//   Adam only:   g = g + wd*p
//   m = b1*m + (1-b1)*g;  v = b2*v + ((1-b2)*g)*g
//   denom = sqrt(v) / sqrt(bc2) + eps;  p = p + (-lr/bc1 * m) / denom
// with bc1 = 1 - b1^t, bc2 = 1 - b2^t computed in double once per step. (Algebraically
// p -= lr * mhat / (sqrt(vhat) + eps).)

struct AdamCoeffs {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float bc2_sqrt;  // sqrt(1 - beta2^t)
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^t)
  float wd;             // Adam: L2 coefficient
  float decay;          // AdamW: 1 - lr*wd
};

template <bool kL2, bool kDecoupled>
inline void adam_scalar(float* p, const float* g, float* m, float* v, int64_t i,
                        const AdamCoeffs& c) {
  float pi = p[i];
  if constexpr (kDecoupled) pi = pi * c.decay;
  float gi = g[i];
  if constexpr (kL2) gi = gi + c.wd * pi;
  const float mi = c.beta1 * m[i] + c.one_minus_beta1 * gi;
  const float vi = c.beta2 * v[i] + c.one_minus_beta2 * gi * gi;
  m[i] = mi;
  v[i] = vi;
  const float denom = std::sqrt(vi) / c.bc2_sqrt + c.eps;
  p[i] = pi + c.neg_step_size * mi / denom;
}

#if defined(__x86_64__) && defined(__GNUC__)
// adam_update's body 16 lanes at a time, for CPUs with AVX-512 (the division and square root
// bound the SSE loop): elements [0, 16 * floor(n / 16)); returns where it stopped. The same
// IEEE operations in the same order as adam_scalar, so every CPU gets the same bits: AVX-512
// implies FMA, and GCC would contract the intrinsics' multiply-adds into it (-ffp-contract=fast
// is its default), hence fp-contract=off here. (Clang contracts only within one source
// expression, which the intrinsics are not, and has no optimize attribute.)
#if defined(__clang__)
#define DT_AVX512_NO_CONTRACT __attribute__((target("avx512f")))
#else
#define DT_AVX512_NO_CONTRACT __attribute__((target("avx512f"), optimize("fp-contract=off")))
#endif
template <bool kL2, bool kDecoupled>
DT_AVX512_NO_CONTRACT int64_t adam_update_avx512(float* __restrict p, const float* __restrict g,
                                                 float* __restrict m, float* __restrict v,
                                                 int64_t n, const AdamCoeffs& c) {
  const __m512 beta1 = _mm512_set1_ps(c.beta1), omb1 = _mm512_set1_ps(c.one_minus_beta1);
  const __m512 beta2 = _mm512_set1_ps(c.beta2), omb2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 bc2_sqrt = _mm512_set1_ps(c.bc2_sqrt), eps = _mm512_set1_ps(c.eps);
  const __m512 neg_step = _mm512_set1_ps(c.neg_step_size), wd = _mm512_set1_ps(c.wd);
  const __m512 decay = _mm512_set1_ps(c.decay);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 pi = _mm512_loadu_ps(p + i);
    if constexpr (kDecoupled) pi = _mm512_mul_ps(pi, decay);
    __m512 gi = _mm512_loadu_ps(g + i);
    if constexpr (kL2) gi = _mm512_add_ps(gi, _mm512_mul_ps(wd, pi));
    const __m512 mi =
        _mm512_add_ps(_mm512_mul_ps(beta1, _mm512_loadu_ps(m + i)), _mm512_mul_ps(omb1, gi));
    const __m512 vi = _mm512_add_ps(_mm512_mul_ps(beta2, _mm512_loadu_ps(v + i)),
                                    _mm512_mul_ps(_mm512_mul_ps(omb2, gi), gi));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    // (The masked form with every lane set: GCC 12 warns about _mm512_sqrt_ps's undefined
    // pass-through operand.)
    const __m512 root = _mm512_mask_sqrt_ps(vi, static_cast<__mmask16>(0xffff), vi);
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(root, bc2_sqrt), eps);
    _mm512_storeu_ps(p + i, _mm512_add_ps(pi, _mm512_div_ps(_mm512_mul_ps(neg_step, mi), denom)));
  }
  return i;
}

// Whether this CPU (and its OS) runs AVX-512 F; asked once.
bool have_avx512() {
  static const bool yes = (__builtin_cpu_init(), __builtin_cpu_supports("avx512f"));
  return yes;
}
#endif

// GCC does not vectorise std::sqrt without -fno-math-errno (it keeps the errno slow path), so
// the main loop uses intrinsics (AVX-512 where the CPU has it, else SSE); the same IEEE
// operations in the same order as adam_scalar, so the vector bodies and the scalar tail give
// identical results.
template <bool kL2, bool kDecoupled>
void adam_update(float* __restrict p, const float* __restrict g, float* __restrict m,
                 float* __restrict v, int64_t n, const AdamCoeffs& c) {
  int64_t i = 0;
#if defined(__x86_64__) && defined(__GNUC__)
  if (have_avx512()) i = adam_update_avx512<kL2, kDecoupled>(p, g, m, v, n, c);
#endif
#if defined(__SSE__)
  const __m128 beta1 = _mm_set1_ps(c.beta1), omb1 = _mm_set1_ps(c.one_minus_beta1);
  const __m128 beta2 = _mm_set1_ps(c.beta2), omb2 = _mm_set1_ps(c.one_minus_beta2);
  const __m128 bc2_sqrt = _mm_set1_ps(c.bc2_sqrt), eps = _mm_set1_ps(c.eps);
  const __m128 neg_step = _mm_set1_ps(c.neg_step_size), wd = _mm_set1_ps(c.wd);
  const __m128 decay = _mm_set1_ps(c.decay);
  for (; i + 4 <= n; i += 4) {
    __m128 pi = _mm_loadu_ps(p + i);
    if constexpr (kDecoupled) pi = _mm_mul_ps(pi, decay);
    __m128 gi = _mm_loadu_ps(g + i);
    if constexpr (kL2) gi = _mm_add_ps(gi, _mm_mul_ps(wd, pi));
    const __m128 mi = _mm_add_ps(_mm_mul_ps(beta1, _mm_loadu_ps(m + i)), _mm_mul_ps(omb1, gi));
    const __m128 vi =
        _mm_add_ps(_mm_mul_ps(beta2, _mm_loadu_ps(v + i)), _mm_mul_ps(_mm_mul_ps(omb2, gi), gi));
    _mm_storeu_ps(m + i, mi);
    _mm_storeu_ps(v + i, vi);
    const __m128 denom = _mm_add_ps(_mm_div_ps(_mm_sqrt_ps(vi), bc2_sqrt), eps);
    _mm_storeu_ps(p + i, _mm_add_ps(pi, _mm_div_ps(_mm_mul_ps(neg_step, mi), denom)));
  }
#endif
  for (; i < n; ++i) adam_scalar<kL2, kDecoupled>(p, g, m, v, i, c);
}

class Adam final : public Optimizer {
 public:
  Adam(const OptimizerConfig& cfg, int64_t begin, int64_t n, bool decoupled)
      : Optimizer(begin, n, {"exp_avg", "exp_avg_sq"}),
        beta1_(cfg.beta1),
        beta2_(cfg.beta2),
        eps_(cfg.eps),
        wd_(cfg.weight_decay),
        decoupled_(decoupled) {}

  void update(float* params, const float* grads, int64_t off, int64_t n, double lr,
              bool decay) override {
    if (n == 0) return;
    const double t = static_cast<double>(steps_);
    const double bc1 = 1.0 - std::pow(beta1_, t);
    const double bc2 = 1.0 - std::pow(beta2_, t);
    AdamCoeffs c;
    c.beta1 = static_cast<float>(beta1_);
    c.one_minus_beta1 = static_cast<float>(1.0 - beta1_);
    c.beta2 = static_cast<float>(beta2_);
    c.one_minus_beta2 = static_cast<float>(1.0 - beta2_);
    c.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    c.eps = static_cast<float>(eps_);
    c.neg_step_size = static_cast<float>(-(lr / bc1));
    c.wd = static_cast<float>(wd_);
    c.decay = static_cast<float>(1.0 - lr * wd_);
    float* m = state_[0].data() + off;
    float* v = state_[1].data() + off;
    // AdamW without decay here multiplies by nothing (not by 1.0f: the same result, one
    // multiplication less).
    if (decoupled_ && decay) {
      adam_update<false, true>(params, grads, m, v, n, c);
    } else if (!decoupled_ && decay && wd_ != 0.0) {
      adam_update<true, false>(params, grads, m, v, n, c);
    } else {
      adam_update<false, false>(params, grads, m, v, n, c);
    }
  }

 private:
  double beta1_, beta2_, eps_, wd_;
  bool decoupled_;  // AdamW
};

}  // namespace

void Optimizer::update_slice(float* params, const float* grads, int64_t state_offset, int64_t n,
                             double lr) {
  DT_CHECK_GE(state_offset, 0);
  DT_CHECK_GE(n, 0);
  DT_CHECK_LE(state_offset + n, n_);
  update_split(params, grads, state_offset, n, lr);
}

void Optimizer::update_split(float* params, const float* grads, int64_t off, int64_t n, double lr) {
  if (decay_all_) {  // today's path: one call, no search
    update(params, grads, off, n, lr, true);
    return;
  }
  const int64_t end = off + n;
  // The first decayed range that ends after off.
  auto it = std::upper_bound(decayed_.begin(), decayed_.end(), off,
                             [](int64_t v, const FlatRange& r) { return v < r.end; });
  int64_t pos = off;
  while (pos < end) {
    const int64_t lo = it == decayed_.end() ? end : std::clamp(it->begin, pos, end);
    if (lo > pos) {  // the gap before the next decayed range
      update(params + (pos - off), grads + (pos - off), pos, lo - pos, lr, false);
      pos = lo;
    }
    if (pos == end) break;
    const int64_t hi = std::min(end, it->end);
    update(params + (pos - off), grads + (pos - off), pos, hi - pos, lr, true);
    pos = hi;
    ++it;
  }
}

void Optimizer::set_decayed(const std::vector<StatePiece>& pieces,
                            const std::vector<FlatRange>& decayed) {
  for (size_t i = 1; i < decayed.size(); ++i) DT_CHECK_LE(decayed[i - 1].end, decayed[i].begin);
  std::vector<FlatRange> out;
  int64_t owned = 0, covered = 0;
  for (const StatePiece& p : pieces) {
    DT_CHECK_LE(p.begin, p.end);
    DT_CHECK_GE(p.offset, 0);
    DT_CHECK_LE(p.offset + (p.end - p.begin), n_);
    owned += p.end - p.begin;
    for (const FlatRange& d : decayed) {
      const int64_t lo = std::max(p.begin, d.begin), hi = std::min(p.end, d.end);
      if (lo >= hi) continue;
      out.push_back({p.offset + (lo - p.begin), p.offset + (hi - p.begin)});
      covered += hi - lo;
    }
  }
  std::sort(out.begin(), out.end(),
            [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
  decayed_.clear();
  for (const FlatRange& r : out) {  // merge ranges that touch (adjacent tensors, pieces)
    DT_CHECK(decayed_.empty() || decayed_.back().end <= r.begin);
    if (!decayed_.empty() && decayed_.back().end == r.begin) {
      decayed_.back().end = r.end;
    } else {
      decayed_.push_back(r);
    }
  }
  // Every owned element decays: keep the unsplit path (state outside the pieces, a shard's
  // padding, is never read as a parameter, so decaying it too changes nothing).
  decay_all_ = covered == owned;
  if (decay_all_) decayed_.clear();
}

void Optimizer::step_and_zero_grads(float* params, float* grads, double lr) {
  ++steps_;
  // 4096 floats: the slice of each buffer (params, grads, up to two states) stays in cache from
  // the update to the zeroing. Every update rule is elementwise, so slicing changes no result.
  constexpr int64_t kSlice = 4096;
  for (int64_t off = 0; off < n_; off += kSlice) {
    const int64_t len = std::min(kSlice, n_ - off);
    update_split(params + off, grads + off, off, len, lr);
    std::fill(grads + off, grads + off + len, 0.0f);
  }
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, int64_t begin, int64_t n) {
  DT_CHECK_GE(begin, 0);
  DT_CHECK_GE(n, 0);
  switch (cfg.type) {
    case OptimizerType::kSgd:
      return std::make_unique<Sgd>(cfg, begin, n);
    case OptimizerType::kAdam:
      return std::make_unique<Adam>(cfg, begin, n, /*decoupled=*/false);
    case OptimizerType::kAdamw:
      return std::make_unique<Adam>(cfg, begin, n, /*decoupled=*/true);
  }
  DT_CHECK_MSG(false, "unknown optimizer type " << static_cast<int>(cfg.type));
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, int64_t n,
                                          const std::vector<StatePiece>& pieces,
                                          const std::vector<FlatRange>& decayed) {
  std::unique_ptr<Optimizer> opt = make_optimizer(cfg, 0, n);
  opt->set_decayed(pieces, decayed);
  return opt;
}

// The post-warmup schedule's clock starts at the end of warmup for both step and cosine (as
// torch's SequentialLR([LinearLR, StepLR | CosineAnnealingLR], milestones=[warmup]) does), so
// the lr right after warmup is always the base lr.
double lr_at(const ScheduleConfig& s, double base_lr, int64_t step, int64_t total_steps) {
  DT_CHECK_GE(step, 0);
  if (s.warmup_steps > 0 && step < s.warmup_steps) {
    return base_lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  }
  const int64_t warmup = std::max<int64_t>(s.warmup_steps, 0);
  const int64_t since = step - warmup;
  switch (s.type) {
    case ScheduleType::kConstant:
      return base_lr;
    case ScheduleType::kStep:
      DT_CHECK_GT(s.step_size, 0);
      return base_lr * std::pow(s.gamma, static_cast<double>(since / s.step_size));
    case ScheduleType::kCosine: {
      const double span = static_cast<double>(std::max<int64_t>(1, total_steps - warmup));
      const double t = std::clamp(static_cast<double>(since) / span, 0.0, 1.0);
      return s.min_lr + (base_lr - s.min_lr) * (1.0 + std::cos(std::numbers::pi * t)) / 2.0;
    }
  }
  DT_CHECK_MSG(false, "unknown schedule type " << static_cast<int>(s.type));
}

// Four independent accumulators: the compiler may not reassociate a single double sum, and one
// dependency chain would make this latency-bound. The order is fixed, so the result is
// deterministic for a given n.
double sum_squares(const float* g, int64_t n) {
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const double x0 = g[i], x1 = g[i + 1], x2 = g[i + 2], x3 = g[i + 3];
    a0 += x0 * x0;
    a1 += x1 * x1;
    a2 += x2 * x2;
    a3 += x3 * x3;
  }
  for (; i < n; ++i) {
    const double x = g[i];
    a0 += x * x;
  }
  return (a0 + a1) + (a2 + a3);
}

// A float is not finite when its exponent bits are all ones: its bits with the sign cleared (an
// int32 >= 0) exceed FLT_MAX's. The SSE2 loop ORs integer compares into four accumulators: no
// floating-point dependency chain (the earlier form, x * 0 summed into 8 float lanes, was bound
// by the adds' latency and ran 1.6x slower over mlp-ref's gradients). Every element is read:
// a NaN step is rare, so no early exit.
bool any_nonfinite(const float* g, int64_t n) {
  constexpr int32_t kFltMaxBits = 0x7f7fffff;
  int64_t i = 0;
  int32_t any = 0;
#if defined(__SSE2__)
  const __m128i abs = _mm_set1_epi32(0x7fffffff), lim = _mm_set1_epi32(kFltMaxBits);
  __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;
  const auto bad = [&](int64_t k) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g + k));
    return _mm_cmpgt_epi32(_mm_and_si128(x, abs), lim);
  };
  for (; i + 16 <= n; i += 16) {
    a0 = _mm_or_si128(a0, bad(i));
    a1 = _mm_or_si128(a1, bad(i + 4));
    a2 = _mm_or_si128(a2, bad(i + 8));
    a3 = _mm_or_si128(a3, bad(i + 12));
  }
  any = _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(a0, a1), _mm_or_si128(a2, a3)));
#endif
  for (; i < n; ++i) any |= (std::bit_cast<int32_t>(g[i]) & 0x7fffffff) > kFltMaxBits ? 1 : 0;
  return any != 0;
}

void scale_inplace(float* g, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) g[i] *= s;
}

// A NaN norm gives 1 (std::min keeps its first argument when the comparison is false): clipping
// cannot repair NaN gradients; detecting them is the trainer's job.
float clip_factor(double norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0f;
  return static_cast<float>(std::min(1.0, max_norm / (norm + 1e-6)));
}

}  // namespace dtrain
