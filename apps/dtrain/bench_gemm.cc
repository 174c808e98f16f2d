// `dtrain bench gemm`: the GEMMs of one training step with nothing around them, the bound on
// what the step can cost (bench.h).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include <spdlog/spdlog.h>

#include "dtrain/bench.h"
#include "dtrain/gemm_replay.h"
#include "nn/registry.h"
#include "tensor/fp_mode.h"
#include "train/batch.h"
#include "train/trainer.h"
#include "util/check.h"
#include "util/fs.h"
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
  // The weights and their gradients, the activations and theirs, and the replay's two copies of
  // them all (GemmReplay): refused before any is allocated, as --config's step is.
  double floats = 0;
  for (size_t l = 0; l < L; ++l)
    floats += 2.0 * static_cast<double>(widths[l + 1]) * static_cast<double>(widths[l]);
  for (size_t l = 0; l <= L; ++l)
    floats += 2.0 * static_cast<double>(batch) * static_cast<double>(widths[l]);
  if (const int64_t avail = available_memory_bytes();
      avail >= 0 && 3.0 * 4.0 * floats > static_cast<double>(avail)) {
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    throw UserError(fmt::format(
        "bench gemm: --widths and --batch need about {:.2f} GiB here ({:.2f} GiB of weights, "
        "activations and their gradients, and the replay's two copies), more than the {:.2f} "
        "GiB this process can allocate; use smaller --widths or --batch",
        3.0 * 4.0 * floats / kGiB, 4.0 * floats / kGiB, static_cast<double>(avail) / kGiB));
  }
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

namespace {

// Refuses (UserError naming `who`) a step this process cannot hold, before the model's buffers
// are allocated: the parameters and gradients (ParamStore), one batch's activations and
// conv2d's scratch as the training estimate counts them (trainer.h), and the replay's two copies
// of the step's operands (GemmReplay's arena and its starting copy): about 3 times the first
// two. Under ulimit -v, OpenBLAS's buffers too (require_address_space). Not run's estimate: the
// bench holds no optimizer state, compression residual or second rank.
void check_bench_memory(const Model& model, int64_t batch, int blas_threads,
                        const std::string& who) {
  const size_t layers = model.num_layers();
  const double state = 4.0 * 2.0 * static_cast<double>(model.param_count());
  const double acts =
      4.0 * (activation_values_per_sample(model, 0, layers, false) * static_cast<double>(batch) +
             scratch_values(model, 0, layers));
  const double replay = 2.0 * (state + acts);
  const double need = state + acts + replay;
  const int64_t avail = available_memory_bytes();
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  if (avail >= 0 && need > static_cast<double>(avail))
    throw UserError(fmt::format(
        "{}: the config's step needs about {:.2f} GiB here ({:.2f} GiB for the {} parameters and "
        "their gradients, {:.2f} GiB for the activations of a batch of {} (data.batch_size), "
        "and the replay's two copies of them), more than the {:.2f} GiB this process can "
        "allocate; use a smaller model or data.batch_size",
        who, need / kGiB, state / kGiB, model.distinct_param_count(), acts / kGiB, batch,
        static_cast<double>(avail) / kGiB));
  require_address_space(state + replay, acts, fmt::format("a batch of {}", batch), 1, blas_threads,
                        MemoryTask::kBench);
}

}  // namespace

StepGemms record_step_gemms(const Config& cfg, int blas_threads, const std::string& who) {
  const DataSplits data = load_data(cfg.data, cfg.seed);
  const ModelShape shape = resolve_model_shape(cfg, data);
  const Model model = build_model(cfg.model, {shape.sample, shape.num_classes});
  check_bench_memory(model, std::min(cfg.data.batch_size, data.train.rows), blas_threads, who);
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
  if (threads > 0 && blas_threads() != threads)  // (OpenBLAS caps them at its build's maximum)
    spdlog::warn("bench gemm: --threads {}: OpenBLAS runs at most {} thread(s), timing with {}",
                 threads, blas_threads(), blas_threads());
  GemmReplay replay(s.calls);
  FlushSubnormals ftz;  // as Model::forward and backward run their layers (tensor/fp_mode.h)
  double warm = 0.0;
  for (int i = 0; i < 3; ++i) warm = replay.timed_step();
  if (iters == 0) iters = static_cast<int>(std::clamp(5.0 / std::max(warm, 1e-6), 10.0, 300.0));
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) t.push_back(replay.timed_step());
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
