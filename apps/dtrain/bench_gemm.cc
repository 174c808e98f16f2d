// `dtrain bench gemm`: the GEMMs of one training step with nothing around them, the bound on
// what the step can cost (bench.h).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "dtrain/bench.h"
#include "nn/registry.h"
#include "tensor/fp_mode.h"
#include "train/batch.h"
#include "train/trainer.h"
#include "util/check.h"
#include "util/rng.h"

namespace dtrain {

double StepGemms::flops() const {
  double f = 0.0;
  for (const GemmCall& c : calls) f += c.flops();
  return f;
}

StepGemms mlp_step_gemms(const std::vector<int64_t>& widths, int64_t batch) {
  if (widths.size() < 2) throw UserError("bench gemm: --widths needs at least two sizes");
  for (const int64_t w : widths)
    if (w < 1 || w > (int64_t{1} << 24))
      throw UserError("bench gemm: widths must be in [1, 2^24], got " + std::to_string(w));
  if (batch < 1 || batch > (int64_t{1} << 24))
    throw UserError("bench gemm: --batch must be in [1, 2^24]");
  for (size_t l = 0; l < widths.size(); ++l) {
    const int64_t big = std::max(batch, l + 1 < widths.size() ? widths[l + 1] : 1);
    if (static_cast<double>(widths[l]) * static_cast<double>(big) > static_cast<double>(1 << 28))
      throw UserError("bench gemm: a matrix of width " + std::to_string(widths[l]) +
                      " would exceed 2^28 floats (1 GiB)");
  }
  const size_t L = widths.size() - 1;
  std::vector<std::vector<float>> W, dW, act, grad;
  for (size_t l = 0; l < L; ++l) {
    W.emplace_back(static_cast<size_t>(widths[l + 1] * widths[l]));
    dW.emplace_back(static_cast<size_t>(widths[l + 1] * widths[l]));
  }
  for (size_t l = 0; l <= L; ++l) {
    act.emplace_back(static_cast<size_t>(batch * widths[l]));
    grad.emplace_back(static_cast<size_t>(batch * widths[l]));
  }
  // Issued once under a recorder: the calls and where their operands live, as a model's would be.
  StepGemms s;
  s.batch = batch;
  GemmRecorder rec;
  for (size_t l = 0; l < L; ++l)
    gemm(false, true, batch, widths[l + 1], widths[l], 1.0f, act[l].data(), widths[l], W[l].data(),
         widths[l], 0.0f, act[l + 1].data(), widths[l + 1]);
  for (size_t l = L; l-- > 0;) {
    gemm(true, false, widths[l + 1], widths[l], batch, 1.0f, grad[l + 1].data(), widths[l + 1],
         act[l].data(), widths[l], 1.0f, dW[l].data(), widths[l]);
    if (l > 0)
      gemm(false, false, batch, widths[l], widths[l + 1], 1.0f, grad[l + 1].data(), widths[l + 1],
           W[l].data(), widths[l], 0.0f, grad[l].data(), widths[l]);
  }
  s.calls = rec.calls();
  return s;
}

StepGemms record_step_gemms(const Config& cfg) {
  const DataSplits data = load_data(cfg.data, cfg.seed);
  const ModelShape shape = resolve_model_shape(cfg, data);
  const Model model = build_model(cfg.model, {shape.sample, shape.num_classes});
  ParamStore ps(model.param_count());
  model.init(ps.values.data(), static_cast<uint64_t>(cfg.seed));
  StepGemms s;
  s.batch = std::min(cfg.data.batch_size, data.train.rows);
  if (data.train.kind == SampleKind::kTokenWindow)
    s.tokens_per_sample = data.train.targets_per_row();
  Batch b;
  std::vector<int64_t> idx;
  consecutive_rows(0, s.batch, idx);
  gather_batch(data.train, idx, b);
  Rng rng(static_cast<uint64_t>(cfg.seed), 1);
  Activations acts;
  Tensor dlogits;
  const float scale = 1.0f / static_cast<float>(s.batch);
  // As the one-stage executor runs a micro-batch (train/single_stage.cc).
  auto step = [&] {
    const Tensor& out = model.forward(ps.values.data(), b.x, acts, {.training = true, .rng = &rng});
    loss_and_grad(cfg.model.loss, out, b.targets.data(), &dlogits, scale);
    model.backward(ps.values.data(), ps.grads.data(), b.x, acts, dlogits, nullptr);
  };
  step();  // sizes every buffer: the recorded step is a steady-state one
  GemmRecorder rec;
  step();
  s.calls = rec.calls();
  return s;
}

namespace {

// The bytes [lo, hi) an operand spans: `rows` rows of `cols` floats at a stride of `ld` floats.
struct Span {
  uintptr_t lo = 0, hi = 0;
};

Span operand(uintptr_t p, int64_t rows, int64_t cols, int64_t ld) {
  DT_CHECK_EQ(p % sizeof(float), 0u);
  if (rows == 0 || cols == 0) return {p, p};
  return {p, p + static_cast<uintptr_t>((rows - 1) * ld + cols) * sizeof(float)};
}

std::vector<Span> spans_of(const GemmCall& c) {
  return {operand(c.a, c.trans_a ? c.k : c.m, c.trans_a ? c.m : c.k, c.lda),
          operand(c.b, c.trans_b ? c.n : c.k, c.trans_b ? c.k : c.n, c.ldb),
          operand(c.c, c.m, c.n, c.ldc)};
}

// The recorded calls on memory of their own. Every maximal run of overlapping operands becomes one
// region of an arena, at the same offset modulo 64 bytes as it was (the same cache-line
// alignment), so calls that shared memory in the step share it here (a layer's output read by the
// next GEMM, the heads' slices of one q/k/v buffer) and the replay touches as much memory as the
// step's GEMMs did.
class GemmReplay {
 public:
  explicit GemmReplay(const std::vector<GemmCall>& calls) {
    std::vector<Span> all;
    for (const GemmCall& c : calls)
      for (const Span& s : spans_of(c))
        if (s.hi > s.lo) all.push_back(s);
    std::sort(all.begin(), all.end(), [](const Span& x, const Span& y) { return x.lo < y.lo; });
    for (const Span& s : all) {
      if (!regions_.empty() && s.lo < regions_.back().span.hi)
        regions_.back().span.hi = std::max(regions_.back().span.hi, s.hi);
      else
        regions_.push_back({s, 0});
    }
    size_t at = 0;
    for (Region& r : regions_) {
      at = (at + 63) / 64 * 64 + r.span.lo % 64;
      r.offset = at;
      at += r.span.hi - r.span.lo;
    }
    arena_.resize(at / sizeof(float) + 16);
    base_ = reinterpret_cast<char*>(arena_.data());
    base_ += (64 - reinterpret_cast<uintptr_t>(base_) % 64) % 64;
    // Small normal values: finite, no subnormals, and reset before each timed step, so values
    // cannot grow over the repetitions of accumulating (beta = 1) calls.
    Rng rng(1);
    for (float& v : arena_) v = 0.05f * rng.normal();
    start_ = arena_;
    recorded_ = calls;
    for (const GemmCall& c : calls) {
      const std::vector<Span> sp = spans_of(c);
      calls_.push_back({c, at_(sp[0]), at_(sp[1]), at_(sp[2])});
    }
  }

  size_t bytes() const { return arena_.size() * sizeof(float); }
  const std::vector<GemmCall>& calls() const { return recorded_; }
  void reset() { std::memcpy(arena_.data(), start_.data(), bytes()); }
  // All calls in order; with `seconds`, adds each call's time to seconds[call].
  void run(std::vector<double>* seconds = nullptr) const {
    for (size_t i = 0; i < calls_.size(); ++i) {
      const Call& x = calls_[i];
      const GemmCall& c = x.g;
      const auto t0 = std::chrono::steady_clock::now();
      gemm(c.trans_a, c.trans_b, c.m, c.n, c.k, c.alpha, x.a, c.lda, x.b, c.ldb, c.beta, x.c,
           c.ldc);
      if (seconds != nullptr)
        (*seconds)[i] +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  }

 private:
  struct Region {
    Span span;
    size_t offset = 0;  // bytes from base_
  };
  struct Call {
    GemmCall g;
    float* a;
    float* b;
    float* c;
  };
  // Where operand span s lives in the arena (an empty one, K = 0: anywhere, it is not read).
  float* at_(const Span& s) const {
    if (s.hi == s.lo) return reinterpret_cast<float*>(base_);
    auto it = std::upper_bound(regions_.begin(), regions_.end(), s.lo,
                               [](uintptr_t v, const Region& r) { return v < r.span.lo; });
    DT_CHECK(it != regions_.begin());
    --it;
    DT_CHECK(s.hi <= it->span.hi);
    return reinterpret_cast<float*>(base_ + it->offset + (s.lo - it->span.lo));
  }

  std::vector<GemmCall> recorded_;
  std::vector<Region> regions_;
  std::vector<float> arena_, start_;
  char* base_ = nullptr;
  std::vector<Call> calls_;
};

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// --shapes: `iters` more steps with every call timed on its own, summed by shape (transposes,
// M, N, K, beta), largest first: where a step's GEMM time goes.
void print_shapes(GemmReplay& replay, int iters) {
  const std::vector<GemmCall>& calls = replay.calls();
  std::vector<double> sec(calls.size(), 0.0);
  for (int i = 0; i < iters; ++i) {
    replay.reset();
    replay.run(&sec);
  }
  struct Row {
    int count = 0;
    double seconds = 0.0, flops = 0.0;
  };
  std::map<std::string, Row> rows;
  for (size_t i = 0; i < calls.size(); ++i) {
    const GemmCall& c = calls[i];
    char key[96];
    std::snprintf(key, sizeof key, "%c%c %lldx%lldx%lld beta %g", c.trans_a ? 'T' : 'N',
                  c.trans_b ? 'T' : 'N', static_cast<long long>(c.m), static_cast<long long>(c.n),
                  static_cast<long long>(c.k), static_cast<double>(c.beta));
    Row& r = rows[key];
    ++r.count;
    r.seconds += sec[i] / iters;
    r.flops += c.flops();
  }
  std::vector<std::pair<std::string, Row>> sorted(rows.begin(), rows.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  std::printf("%-28s %6s %10s %8s %9s\n", "shape (op(A) op(B) MxNxK)", "calls", "ms/step",
              "GFLOP/s", "us/call");
  for (const auto& [key, r] : sorted)
    std::printf("%-28s %6d %10.3f %8.1f %9.2f\n", key.c_str(), r.count, r.seconds * 1e3,
                r.flops / std::max(r.seconds, 1e-12) * 1e-9, r.seconds / r.count * 1e6);
}

}  // namespace

int bench_gemm(const StepGemms& s, int threads, int iters, bool shapes) {
  if (iters < 0 || iters > 100000) throw UserError("bench gemm: --iters must be in [0, 100000]");
  if (threads < 0 || threads > 1024) throw UserError("bench gemm: --threads must be in [0, 1024]");
  set_blas_threads(threads);
  GemmReplay replay(s.calls);
  FlushSubnormals ftz;  // as Model::forward and backward run their layers (tensor/fp_mode.h)
  double warm = 0.0;
  for (int i = 0; i < 3; ++i) {
    replay.reset();
    const auto t0 = std::chrono::steady_clock::now();
    replay.run();
    warm = seconds(t0);
  }
  if (iters == 0) iters = static_cast<int>(std::clamp(5.0 / std::max(warm, 1e-6), 10.0, 300.0));
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    replay.reset();
    const auto t0 = std::chrono::steady_clock::now();
    replay.run();
    t.push_back(seconds(t0));
  }
  std::sort(t.begin(), t.end());
  const double med = std::max(t[t.size() / 2], 1e-9);
  const double flops = s.flops();
  const double samples = static_cast<double>(s.batch) / med;
  const bool text = s.tokens_per_sample > 0;
  const double per_s = text ? samples * static_cast<double>(s.tokens_per_sample) : samples;
  const char* unit = text ? "tokens/s" : "samples/s";
  if (shapes) print_shapes(replay, std::min(iters, 30));
  const std::string core = blas_core();
  std::printf(
      "gemm-only step (%zu GEMMs, %.3f GFLOP, batch %lld, %d BLAS thread(s), OpenBLAS kernels "
      "%s): median %.3f ms of %d, %.1f GFLOP/s, bound %.0f %s\n",
      s.calls.size(), flops * 1e-9, static_cast<long long>(s.batch), blas_threads(), core.c_str(),
      med * 1e3, iters, flops / med * 1e-9, per_s, unit);
  std::printf(
      "{\"gemm_step_ms\": %.4f, \"gflops\": %.2f, \"bound_samples_per_s\": %.1f, "
      "\"blas_core\": \"%s\", \"gemm_calls\": %zu, \"gemm_flops\": %.0f, \"batch\": %lld, "
      "\"unit\": \"%s\", \"bound_per_s\": %.1f",
      med * 1e3, flops / med * 1e-9, samples, core.c_str(), s.calls.size(), flops,
      static_cast<long long>(s.batch), unit, per_s);
  if (text)
    std::printf(", \"tokens_per_sample\": %lld, \"bound_tokens_per_s\": %.1f",
                static_cast<long long>(s.tokens_per_sample), per_s);
  std::printf("}\n");
  return 0;
}

}  // namespace dtrain
