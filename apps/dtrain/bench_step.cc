// `dtrain bench step`: a config's real training run against its own GEMM bound, interleaved in one
// process (bench.h).
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "dtrain/bench.h"
#include "dtrain/gemm_replay.h"
#include "tensor/fp_mode.h"
#include "train/loop.h"
#include "train/trainer.h"
#include "util/check.h"
#include "util/fs.h"
#include "util/interrupt.h"
#include "util/strings.h"

namespace fs = std::filesystem;

namespace dtrain {

namespace {

double median(std::vector<double> v) {
  DT_CHECK(!v.empty());
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double quantile(std::vector<double> v, double q) {
  DT_CHECK(!v.empty());
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

// The hook's state: steps of the current block, then as many replays; one ratio per block.
// Times are per micro-batch (a step of k micro-batches: its time / k against k replays / k): a
// step at an epoch's end runs fewer than train.grad_accum_steps, and one epoch of fewer batches
// than that runs them all in one step.
struct Interleave {
  GemmReplay* replay;
  int block;
  std::vector<double> steps_now, all_steps, all_gemm, ratios;
  std::vector<int64_t> micro_now, all_micro;
  int blocks_seen = 0;

  void after_step(double step_s, int64_t micro) {
    micro = std::max<int64_t>(1, micro);
    steps_now.push_back(step_s / static_cast<double>(micro));
    micro_now.push_back(micro);
    if (static_cast<int>(steps_now.size()) < block) return;
    std::vector<double> g;
    {
      FlushSubnormals ftz;  // as Model::forward and backward run their layers
      for (int i = 0; i < block; ++i) {
        const int64_t k = micro_now[static_cast<size_t>(i)];
        double t = 0.0;
        for (int64_t a = 0; a < k; ++a) t += replay->timed_step();
        g.push_back(t / static_cast<double>(k));
      }
    }
    // The first block pays for first touches of every buffer and the data: a warm-up.
    if (blocks_seen++ > 0) {
      ratios.push_back(median(g) / median(steps_now));
      all_steps.insert(all_steps.end(), steps_now.begin(), steps_now.end());
      all_gemm.insert(all_gemm.end(), g.begin(), g.end());
      all_micro.insert(all_micro.end(), micro_now.begin(), micro_now.end());
    }
    steps_now.clear();
    micro_now.clear();
  }
};

}  // namespace

int bench_step(const Config& cfg_in, const StepBenchOptions& o) {
  if (o.block < 1 || o.block > 10000) throw UserError("bench step: --block must be in [1, 10000]");
  if (o.steps < 2 * o.block || o.steps > 10000000)
    throw UserError(
        "bench step: --steps must be in [2 x --block, 10000000] (the first block "
        "warms up), got " +
        std::to_string(o.steps));
  // One rank of a data-parallel layout trains as the config's ranks each do (its per-rank
  // batch, no communication); a tensor x pipeline cell of several ranks has no one-rank form.
  const int64_t cell = cfg_in.distributed.tensor_parallel.size * pipeline_stages(cfg_in);
  if (cell > 1)
    throw UserError(
        "bench step: times one rank, and this config's tensor x pipeline cell needs " +
        std::to_string(cell) +
        " (--set distributed.tensor_parallel.size=1 --set distributed.pipeline.stages=1 times "
        "the whole model on one rank)");
  Config cfg = cfg_in;
  if (cfg.distributed.world_size != 1) {
    // (runtime.threads 0: the BLAS threads of one of that many ranks on this machine)
    cfg.runtime.threads = run_blas_threads(cfg_in, static_cast<int>(cfg_in.distributed.world_size));
    const bool sharded = cfg.distributed.strategy == StrategyKind::kZero1 ||
                         cfg.distributed.strategy == StrategyKind::kZero2 ||
                         cfg.distributed.strategy == StrategyKind::kFsdp;
    spdlog::info(
        "bench step: timing one rank of the config's {} (its batch of {}, {} BLAS "
        "thread(s), without their communication{})",
        cfg.distributed.world_size, cfg.data.batch_size, cfg.runtime.threads,
        sharded ? "; alone it updates the whole optimizer state, not its 1/N shard" : "");
    cfg.distributed.world_size = 1;
  }
  cfg.train.epochs = 0;  // max_steps alone bounds the run (epochs repeat)
  cfg.train.max_steps = o.steps;
  cfg.train.checkpoint.every_steps = 0;
  // One rank in-process trains as one gRPC rank would (its collectives are no-ops either way):
  // a config for `dtrain launch` runs here as it is.
  cfg.distributed.backend = Backend::kInproc;
  StepGemms s = record_step_gemms(cfg, run_blas_threads(cfg, 1), "bench step");
  GemmReplay replay(s.calls);
  Interleave il{&replay, o.block, {}, {}, {}, {}, {}, {}, 0};

  std::string where = temp_folder_template("dtrain-bench-step");
  if (!valid_utf8(where))
    throw UserError("bench step: the temp folder '" + where +
                    "' ($TMPDIR) is not valid UTF-8 (the run records its folder as JSON text): "
                    "set TMPDIR to a UTF-8 folder");
  make_temp_folder(where, "bench step: cannot create a temp folder for the run");
  RunOptions ro;
  ro.out_dir = where;
  ro.evaluate = false;
  ro.final_save = false;
  ro.after_step = [&](int, int64_t, double step_s, int64_t micro) { il.after_step(step_s, micro); };
  // Ctrl-C (or SIGTERM) stops the run after its step, as `dtrain run` stops, so the temp folder
  // goes too; the process then ends by that signal.
  StopRequest stop;
  ro.stop = &stop;
  nlohmann::json summary;
  {
    InterruptGuard guard(stop);
    try {
      summary = run_training(cfg, ro);
    } catch (...) {
      std::error_code ec;
      fs::remove_all(where, ec);
      throw;
    }
  }
  std::error_code ec;
  fs::remove_all(where, ec);
  if (const int sig = stop.signal.load(); sig != 0) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return 128 + sig;  // (as PID 1 the kernel drops the signal: a shell's status for it)
  }
  if (il.ratios.empty()) throw UserError("bench step: the run ended before its second block");

  // A step: its usual micro-batch count (the median one), each of s.batch samples.
  std::vector<double> micro(il.all_micro.begin(), il.all_micro.end());
  const double k = median(micro);
  const double per_step = static_cast<double>(s.batch) * k;
  const double unit_per_sample = s.tokens_per_sample > 0 ? s.tokens_per_sample : 1.0;
  const char* unit = s.tokens_per_sample > 0 ? "tokens/s" : "samples/s";
  const double step_ms = median(il.all_steps) * k * 1e3, gemm_ms = median(il.all_gemm) * k * 1e3;
  const double frac = median(il.ratios);
  const double rate = per_step * unit_per_sample / (step_ms * 1e-3);
  const double bound = per_step * unit_per_sample / (gemm_ms * 1e-3);
  std::printf(
      "%zu block(s) of %d steps, each followed by %d replays of the step's %zu GEMMs (%s kernels, "
      "%d BLAS thread(s)): step %.3f ms (%.0f %s), GEMMs alone %.3f ms (bound %.0f %s); "
      "the step runs at %.1f%% of its GEMM bound (median of per-block ratios; quartiles "
      "%.1f%%-%.1f%%)\n",
      il.ratios.size(), o.block, o.block, s.calls.size(), blas_core().c_str(), blas_threads(),
      step_ms, rate, unit, gemm_ms, bound, unit, frac * 100, quantile(il.ratios, 0.25) * 100,
      quantile(il.ratios, 0.75) * 100);
  nlohmann::json j = {{"step_ms", step_ms},
                      {"gemm_step_ms", gemm_ms},
                      {"fraction_of_bound", frac},
                      {"fraction_p25", quantile(il.ratios, 0.25)},
                      {"fraction_p75", quantile(il.ratios, 0.75)},
                      {"blocks", il.ratios.size()},
                      {"block", o.block},
                      {"unit", unit},
                      {"per_s", rate},
                      {"bound_per_s", bound},
                      {"train_samples_per_s", summary.value("train_samples_per_s", 0.0)},
                      {"blas_core", blas_core()},
                      {"gemm_calls", s.calls.size()}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace dtrain
