// `dtrain bench tp`'s output: one table line or JSON object per tensor-parallel size, with the
// savings derived from the measured regions (bench_tp.h).
#include <cstdio>

#include "dtrain/bench_tp.h"

namespace dtrain {

void print_tp_regions(const TpRegions& r, bool json, bool header) {
  const double step = r.step_ms > 0 ? r.step_ms : 1.0;
  const double t = r.tp;
  // Activation bytes sequence parallelism saves per rank: (T-1)/T of the replicated ones.
  const double sp_bytes = (t - 1) / t * static_cast<double>(r.sp_split_bytes);
  // The extra all-gathers it needs to keep the LayerNorm outputs split too (Megatron's choice):
  // 2 per block in backward.
  const double regather_ms = 2.0 * static_cast<double>(r.layers) * r.ag_ms;
  if (json) {
    std::printf(
        "{\"tp\": %d, \"batch\": %lld, \"seq\": %lld, \"embd\": %lld, \"layers\": %lld, "
        "\"vocab\": %lld, \"dropout\": %s, \"step_ms\": %.4g, \"ln_ms\": %.4g, "
        "\"resid_ms\": %.4g, \"dropout_ms\": %.4g, \"a_ms\": %.4g, \"head_gemm_ms\": %.4g, "
        "\"ce_ms\": %.4g, \"emb_ms\": %.4g, \"parts_ms\": %.4g, \"ar_ms\": %.4g, "
        "\"rs_ms\": %.4g, \"ag_ms\": %.4g, \"ar_rows_ms\": %.4g, \"step_allreduces\": %lld, "
        "\"step_allreduce_floats\": %lld, \"head_grad_allreduce_bytes\": 0, "
        "\"act_bytes\": %lld, \"sp_split_bytes\": %lld, \"head_act_bytes\": %lld, "
        "\"other_tp\": %d, \"sp_saving_ms\": %.4g, \"sp_saving_frac\": %.4g, "
        "\"sp_regather_ms\": %.4g, \"sp_act_bytes_saved\": %.0f, \"vp_saving_ms\": %.4g, "
        "\"vp_saving_frac\": %.4g}\n",
        r.tp, static_cast<long long>(r.batch), static_cast<long long>(r.seq),
        static_cast<long long>(r.embd), static_cast<long long>(r.layers),
        static_cast<long long>(r.vocab), r.dropout ? "true" : "false", r.step_ms, r.ln_ms,
        r.resid_ms, r.dropout_ms, r.a_ms(), r.head_gemm_ms, r.ce_ms, r.emb_ms, r.parts_ms(),
        r.ar_ms, r.rs_ms, r.ag_ms, r.ar_rows_ms, static_cast<long long>(r.step_allreduces),
        static_cast<long long>(r.step_allreduce_floats), static_cast<long long>(r.act_bytes),
        static_cast<long long>(r.sp_split_bytes), static_cast<long long>(r.head_act_bytes),
        r.other_tp, r.sp_saving_ms(), r.sp_saving_ms() / step, regather_ms, sp_bytes,
        r.vp_saving_ms(), r.vp_saving_ms() / step);
    std::fflush(stdout);
    return;
  }
  if (header)
    std::printf(
        "# dtrain bench tp: B %lld, S %lld, C %lld, L %lld, V %lld; ms per step on one "
        "tensor rank (median, slowest rank)\n"
        "%3s %9s %8s %8s %8s %8s %8s %8s %8s %8s %8s %6s %10s %9s %10s\n",
        static_cast<long long>(r.batch), static_cast<long long>(r.seq),
        static_cast<long long>(r.embd), static_cast<long long>(r.layers),
        static_cast<long long>(r.vocab), "T", "step", "(a)", "head", "xent", "emb", "AR", "RS",
        "AG", "AR[BS]", "SP save", "%step", "SP MB/rank", "VP save", "%step");
  std::printf(
      "%3d %9.2f %8.2f %8.2f %8.2f %8.2f %8.3f %8.3f %8.3f %8.3f %8.2f %5.1f%% %10.1f "
      "%9.2f %5.1f%%\n",
      r.tp, r.step_ms, r.a_ms(), r.head_gemm_ms, r.ce_ms, r.emb_ms, r.ar_ms, r.rs_ms, r.ag_ms,
      r.ar_rows_ms, r.sp_saving_ms(), 100.0 * r.sp_saving_ms() / step, sp_bytes / 1e6,
      r.vp_saving_ms(), 100.0 * r.vp_saving_ms() / step);
  std::fflush(stdout);
}

int bench_tp(const Config& cfg, const TpBenchOptions& o) {
  // Every size before any is measured: a bad one last was refused after the others had run.
  for (const int t : o.tp) check_tp_bench(cfg, t, o.iters);
  bool header = true;
  for (const int t : o.tp) {
    print_tp_regions(measure_tp_regions(cfg, t, o.iters), o.json, header);
    header = false;
  }
  return 0;
}

}  // namespace dtrain
