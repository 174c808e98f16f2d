// `dtrain bench gemm --config`: the GEMMs one training step issues, recorded through
// tensor/blas.h's GemmRecorder, against the --widths form's analytic MLP and a GPT's analytic
// count; and the command's JSON and its refusals. `dtrain bench step`: a real 1-rank run with its
// step's GEMMs replayed between blocks of steps, and the loop's after_step hook it is built on
// (train/trainer.h RunOptions::after_step).
#include <doctest/doctest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "dtrain/bench.h"
#include "test_util.h"
#include "train/trainer.h"

using dtrain::testing::contains;
using dtrain::testing::run_cmd;
using dtrain::testing::TempDir;

namespace {

const std::string kBin = DTRAIN_BIN;

nlohmann::json last_json(const std::string& out) {
  return nlohmann::json::parse(out.substr(out.rfind('{')));
}

// Some English, long enough for a few dozen windows of 8 bytes.
std::string some_text() {
  std::string t;
  for (int i = 0; i < 40; ++i)
    t += "The quick brown fox jumps over the lazy dog, line " + std::to_string(i) + ".\n";
  return t;
}

const char* kMlpCfg = R"(seed: 3
model: {type: mlp, hidden: [16, 8], activation: relu}
data:
  format: synthetic
  synthetic: {samples: 200, features: 20, classes: 5}
  batch_size: 7
runtime: {threads: 1}
)";

std::string gpt_cfg(const std::string& text_path, bool tie) {
  return "seed: 3\nmodel: {type: gpt, n_layer: 2, n_head: 2, n_embd: 16, block_size: 8, "
         "tie_embeddings: " +
         std::string(tie ? "true" : "false") +
         "}\ndata: {format: text, train: {path: " + text_path +
         "}, batch_size: 3}\nruntime: {threads: 1}\n";
}

// A GPT step's GEMM FLOPs from its shapes (B samples of T positions, width C, L blocks, vocabulary
// V, H heads of C / H): per block the four linear layers (c_attn C -> 3C, c_proj C -> C, c_fc
// C -> 4C, mlp.c_proj 4C -> C) cost 2 B T in out each in forward, dW and dx (every block's input
// needs its gradient); attention costs, per (sample, head), 2 T T hs for q k^T and for P v in
// forward and four such products in backward. The head (C -> V) costs the same three products
// (ln_f needs its dx). The embedding issues none.
double gpt_flops(double B, double T, double C, double L, double V) {
  const double rows = B * T;
  const double linear = 2.0 * rows * (3 * C * C + C * C + 4 * C * C + 4 * C * C);
  const double attention = 6.0 * 2.0 * B * T * T * C;  // summed over heads: H hs = C
  return L * (3.0 * linear + attention) + 3.0 * 2.0 * rows * C * V;
}

}  // namespace

TEST_CASE("bench gemm: a config's MLP step issues exactly the --widths form's GEMMs") {
  const dtrain::StepGemms rec =
      dtrain::record_step_gemms(dtrain::parse_config(kMlpCfg, "mlp", {}), 1, "test");
  const dtrain::StepGemms ref = dtrain::mlp_step_gemms({20, 16, 8, 5}, 7);
  CHECK(rec.batch == 7);
  CHECK(rec.tokens_per_sample == 0);
  REQUIRE(rec.calls.size() == ref.calls.size());
  REQUIRE(rec.calls.size() == 8);  // 3 forward, 3 dW, 2 dx (the first layer's is skipped)
  for (size_t i = 0; i < rec.calls.size(); ++i) {
    const dtrain::GemmCall &a = rec.calls[i], &b = ref.calls[i];
    INFO("call ", i);
    CHECK(a.trans_a == b.trans_a);
    CHECK(a.trans_b == b.trans_b);
    CHECK(a.m == b.m);
    CHECK(a.n == b.n);
    CHECK(a.k == b.k);
  }
  CHECK(rec.flops() == ref.flops());
  CHECK(ref.flops() == 2.0 * 7 * (20 * 16 * 2 + 16 * 8 * 3 + 8 * 5 * 3));
}

TEST_CASE("bench gemm: a tiny GPT step's recorded GEMM FLOPs are the analytic count") {
  TempDir dir;
  const std::string text = dir.write("t.txt", some_text());
  for (const bool tie : {true, false}) {
    INFO("tie_embeddings ", tie);
    const dtrain::StepGemms s =
        dtrain::record_step_gemms(dtrain::parse_config(gpt_cfg(text, tie), "gpt", {}), 1, "test");
    CHECK(s.batch == 3);
    CHECK(s.tokens_per_sample == 8);
    CHECK(s.flops() == gpt_flops(3, 8, 16, 2, 256));
    // Per block 4 linear layers x 3 products and 6 per (sample, head); the head's 3.
    CHECK(s.calls.size() == static_cast<size_t>(2 * (4 * 3 + 6 * 3 * 2) + 3));
  }
}

TEST_CASE("bench gemm --config prints the bound in the model's units, --widths stays as it was") {
  TempDir dir;
  const std::string text = dir.write("t.txt", some_text());
  const std::string cfg = dir.write("gpt.yaml", gpt_cfg(text, true));
  auto r = run_cmd(kBin + " bench gemm --config " + cfg + " --set data.batch_size=2 --iters 3");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  auto j = last_json(r.output);
  CHECK(j["unit"] == "tokens/s");
  CHECK(j["batch"] == 2);
  CHECK(j["tokens_per_sample"] == 8);
  CHECK(j["gemm_flops"].get<double>() == gpt_flops(2, 8, 16, 2, 256));
  const double samples = j["bound_samples_per_s"].get<double>();
  CHECK(samples > 0);
  CHECK(j["bound_tokens_per_s"].get<double>() == doctest::Approx(8 * samples).epsilon(1e-3));
  CHECK(j["bound_per_s"] == j["bound_tokens_per_s"]);

  r = run_cmd(kBin + " bench gemm --widths 20,16,8,5 --batch 7 --iters 3");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  j = last_json(r.output);
  CHECK(j["unit"] == "samples/s");
  CHECK(j["gemm_calls"] == 8);
  CHECK(j["gemm_flops"].get<double>() == 2.0 * 7 * (20 * 16 * 2 + 16 * 8 * 3 + 8 * 5 * 3));
  for (const char* k : {"gemm_step_ms", "gflops", "bound_samples_per_s", "blas_core"})
    CHECK_MESSAGE(j.contains(k), k);
}

TEST_CASE("bench gemm refuses what does not fit, with exit 2") {
  TempDir dir;
  const std::string cfg = dir.write("mlp.yaml", kMlpCfg);
  for (const std::string& args :
       {"--config " + cfg + " --widths 4,3", "--config " + cfg + " --batch 4",
        std::string("--set data.batch_size=3"), std::string("--widths 4"),
        std::string("--widths 4,0,3"), std::string("--widths 4,3 --batch 0"),
        std::string("--widths 4,,3"), std::string("--widths ''"), std::string("--widths 4,x"),
        std::string("--widths 4,3 --iters -1"), "--config " + cfg + " --set model.type=nope",
        "--config " + cfg + " --threads -1", std::string("--widths 4,3 --threads -1"),
        std::string("--config ") + dir.path() + "/missing.yaml"}) {
    INFO(args);
    const auto r = run_cmd(kBin + " bench gemm " + args);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "error"));
    CHECK_FALSE(contains(r.output, "internal error"));
  }
}

TEST_CASE("after_step is called once per optimizer step with the time train_s counts") {
  TempDir dir;
  dtrain::Config cfg = dtrain::parse_config(kMlpCfg, "mlp", {"train.max_steps=13"});
  dtrain::RunOptions ro;
  ro.out_dir = dir / "run";
  std::vector<int64_t> steps;
  double sum = 0.0;
  ro.after_step = [&](int rank, int64_t step, double step_s, int64_t micro) {
    CHECK(rank == 0);
    CHECK(step_s > 0.0);
    CHECK(micro == 1);
    steps.push_back(step);
    sum += step_s;
  };
  const nlohmann::json s = dtrain::run_training(cfg, ro);
  REQUIRE(steps.size() == 13);
  for (size_t i = 0; i < steps.size(); ++i) CHECK(steps[i] == static_cast<int64_t>(i) + 1);
  CHECK(s["train_s"].get<double>() == doctest::Approx(sum).epsilon(1e-9));
}

TEST_CASE("bench step: steps of fewer micro-batches than grad_accum_steps are replayed as run") {
  // 200 samples in batches of 7: 29 batches an epoch, so an accumulation of 1000 runs 29
  // micro-batches a step (was: 1000 replays against it, a "fraction of the bound" above 1000).
  TempDir dir;
  const std::string cfg = dir.write("mlp.yaml", kMlpCfg);
  const auto r = run_cmd(kBin + " --log-level warn bench step " + cfg +
                         " --steps 4 --block 2 --set train.grad_accum_steps=1000");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const auto j = nlohmann::json::parse(r.output.substr(r.output.rfind('{')));
  // The step contains its GEMMs: far from the bound's multiples.
  CHECK_MESSAGE(j["fraction_of_bound"].get<double>() < 3.0, r.output);
  CHECK(j["fraction_of_bound"].get<double>() > 0.0);
}

TEST_CASE("bench step times blocks of real steps against their GEMMs") {
  TempDir dir;
  const std::string cfg = dir.write("mlp.yaml", kMlpCfg);
  const auto r = run_cmd(kBin + " --log-level warn bench step " + cfg + " --steps 40 --block 10");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const auto j = nlohmann::json::parse(r.output.substr(r.output.rfind('{')));
  CHECK(j["blocks"] == 3);  // 4 blocks of 10, the first a warm-up
  CHECK(j["block"] == 10);
  CHECK(j["gemm_calls"] == 8);
  CHECK(j["unit"] == "samples/s");
  const double step = j["step_ms"], gemm = j["gemm_step_ms"];
  CHECK(step > 0.0);
  CHECK(gemm > 0.0);
  CHECK(j["per_s"].get<double>() == doctest::Approx(7.0 / (step * 1e-3)).epsilon(1e-6));
  CHECK(j["bound_per_s"].get<double>() == doctest::Approx(7.0 / (gemm * 1e-3)).epsilon(1e-6));
  CHECK(j["fraction_p25"].get<double>() <= j["fraction_of_bound"].get<double>());
  CHECK(j["fraction_of_bound"].get<double>() <= j["fraction_p75"].get<double>());
  // A config for `dtrain launch` (backend grpc) runs as it is: its one rank in-process (it was
  // refused with run's advice to start ranks with a launcher).
  const auto g = run_cmd(kBin + " --log-level warn bench step " + cfg +
                         " --steps 20 --block 10 --set distributed.backend=grpc");
  CHECK_MESSAGE(g.exit_code == 0, g.output);
}

TEST_CASE("bench step interrupted: the run stops, its temp folder goes, the exit is the signal's") {
  // Before, Ctrl-C or SIGTERM killed the process by the default action and the run folder stayed
  // in /tmp. (SIGTERM here: a background job of a non-interactive shell ignores SIGINT.) The
  // signal goes once the run's folder exists (and after 0.5 s more, training under way); a run
  // that ignored it would end by `timeout` (rc 124), not 143.
  TempDir dir;
  const std::string cfg = dir.write("mlp.yaml", kMlpCfg);
  const std::string tmp = dir / "tmp";
  std::filesystem::create_directories(tmp);
  const auto r = run_cmd(dtrain::testing::sigterm_once_in_tmp(
      kBin + " --log-level warn bench step " + cfg + " --steps 10000000 --block 20", tmp, 0.5));
  CHECK_MESSAGE(contains(r.output, "rc 143 seen yes"), r.output);
  CHECK_MESSAGE(contains(r.output, "left: 0"), r.output);
}

TEST_CASE("bench step times one rank of a data-parallel job, and refuses cells and bad blocks") {
  TempDir dir;
  const std::string cfg = dir.write("mlp.yaml", kMlpCfg);
  // One of 2 ddp ranks (a launch config such as configs/quickstart.yaml, which the README says
  // it takes; it was refused).
  const auto one = run_cmd(kBin + " bench step " + cfg +
                           " --steps 20 --block 10 --set distributed.world_size=2 2>&1");
  CHECK_MESSAGE(one.exit_code == 0, one.output);
  CHECK_MESSAGE(contains(one.output,
                         "timing one rank of the config's 2 (its batch of 7, 1 BLAS "
                         "thread(s), without their communication)"),
                one.output);
  for (const std::string& args :
       {cfg + " --set distributed.world_size=2 --set distributed.strategy=pipeline",
        cfg + " --block 0", cfg + " --steps 10 --block 10", dir / "missing.yaml"}) {
    INFO(args);
    const auto r = run_cmd(kBin + " bench step " + args);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "error"));
  }
}
