// Tensor parallelism with the real binary: TP 2 x DP 2 over gRPC equals the same layout's
// in-process ranks bitwise (ddp and fsdp on the data axis); `eval`, `generate` and `checkpoint
// consolidate` read a tensor-parallel run's checkpoint as the one-process run's; a
// tensor-parallel layout of a model without tensor-parallel layers exits 2 with one line.
#include <doctest/doctest.h>

#include <string>

#include "cli/cli_util.h"
#include "test_util.h"

using dtrain::testing::check_same_state;
using dtrain::testing::contains;
using dtrain::testing::run_cmd;
using dtrain::testing::TempDir;

namespace {

const std::string kBin = DTRAIN_BIN;

std::string tp_cfg(const TempDir& dir) {
  std::string text;
  for (int i = 0; i < 120; ++i)
    text += "the quick brown fox " + std::to_string(i % 7) + " jumps over the lazy dog.\n";
  const std::string corpus = dir.write("corpus.txt", text);
  return dir.write("gpt.yaml", R"(seed: 5
model: {type: gpt, n_layer: 2, n_head: 4, n_embd: 16, block_size: 16, dropout: 0.1}
data: {format: text, train: {path: )" +
                                   corpus + R"(}, batch_size: 4, eval_batch_size: 64}
optimizer: {type: adamw, lr: 0.003, weight_decay: 0.1, clip_grad_norm: 0.5}
train: {epochs: 0, max_steps: 10, log_every: 10}
distributed: {tensor_parallel: {size: 2}, ddp: {bucket_mb: 0.01}, timeout_s: 30}
runtime: {threads: 1}
)");
}

}  // namespace

TEST_CASE("TP 2 x DP 2 over gRPC (ddp, fsdp) equals in-process ranks bitwise") {
  TempDir dir;
  const std::string cfg = tp_cfg(dir);
  for (const std::string strategy : {"ddp", "fsdp"}) {
    CAPTURE(strategy);
    const std::string sets = " --set distributed.strategy=" + strategy;
    auto r = run_cmd(kBin + " launch --nproc 4 " + cfg + sets + " --out " +
                     dir / ("grpc-" + strategy) + " --log-level warn");
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    r = run_cmd(kBin + " run " + cfg + sets + " --set distributed.world_size=4 --out " +
                dir / ("inproc-" + strategy) + " --log-level warn");
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    check_same_state(dtrain::testing::latest_run_state(kBin, dir / ("grpc-" + strategy)),
                     dtrain::testing::latest_run_state(kBin, dir / ("inproc-" + strategy)),
                     strategy);
  }
}

TEST_CASE("eval, generate and consolidate read a TP 2 checkpoint as one process's") {
  TempDir dir;
  const std::string cfg = tp_cfg(dir);
  auto r = run_cmd(kBin + " run " + cfg + " --set distributed.world_size=2 --out " + dir / "tp" +
                   " --no-progress");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  // The model table is the whole model's, as the checkpoint holds it, and says what a rank holds.
  const auto one =
      run_cmd(kBin + " run " + cfg +
              " --set distributed.tensor_parallel.size=1 --set distributed.world_size=1 --out " +
              dir / "one" + " --no-progress");
  REQUIRE_MESSAGE(one.exit_code == 0, one.output);
  const auto total = [](const std::string& log) {
    const size_t at = log.find("total parameters: ");
    return at == std::string::npos ? std::string("?") : log.substr(at, log.find('\n', at) - at);
  };
  CHECK(total(r.output) == total(one.output));
  CHECK_MESSAGE(contains(r.output, "(each of the 2 tensor ranks holds "), r.output);
  const std::string ck = dir / "tp/checkpoints/step-10";
  // The same weights in one file; eval and generate on the folder and on the file agree.
  r = run_cmd(kBin + " checkpoint consolidate " + ck + " -o " + dir / "one.safetensors");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const auto eval = [&](const std::string& c) {
    const auto e = run_cmd(kBin + " eval " + cfg + " --checkpoint " + c + " 2>/dev/null");
    REQUIRE_MESSAGE(e.exit_code == 0, e.output);
    return e.output.substr(e.output.find('{'));  // the result line, after the log line
  };
  const std::string e = eval(ck);
  CHECK(e.find("loss") != std::string::npos);
  CHECK(e == eval(dir / "one.safetensors"));
  const auto gen = [&](const std::string& c) {
    const auto g = run_cmd(kBin + " generate " + cfg + " --checkpoint " + c +
                           " --prompt 'the quick' --tokens 20 --temperature 0 2>/dev/null");
    REQUIRE_MESSAGE(g.exit_code == 0, g.output);
    return g.output;
  };
  const std::string g = gen(ck);
  CHECK(g.size() > 20);
  CHECK(g == gen(dir / "one.safetensors"));
}

TEST_CASE("a tensor-parallel layout of a model without tensor-parallel layers exits 2") {
  TempDir dir;
  const std::string cfg = dir.write("mlp.yaml", R"(model: {type: mlp, hidden: [8]}
data: {format: synthetic}
train: {epochs: 1}
distributed: {world_size: 2, tensor_parallel: {size: 2}}
)");
  const auto r = run_cmd(kBin + " run " + cfg + " --out " + dir / "out");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(r.output.find("distributed.tensor_parallel.size") != std::string::npos, r.output);
  CHECK_MESSAGE(r.output.find("has no tensor-parallel layers") != std::string::npos, r.output);
}
