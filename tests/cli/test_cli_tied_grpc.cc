// Tied embeddings over gRPC (train/tied_grads.h): the tie's all-reduces over the data and
// pipeline axes give what in-process ranks give, bitwise, and the copies stay equal.
#include <doctest/doctest.h>

#include <cstring>
#include <string>

#include "cli/cli_util.h"
#include "test_util.h"

using dtrain::testing::check_same_state;
using dtrain::testing::run_cmd;
using dtrain::testing::TempDir;

namespace {

const std::string kBin = DTRAIN_BIN;

}  // namespace

TEST_CASE("a tied GPT over gRPC (pp2 x dp2 zero2, dp3 fsdp) equals in-process ranks bitwise") {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 120; ++i)
    text += "the quick brown fox " + std::to_string(i % 7) + " jumps over the lazy dog.\n";
  const std::string corpus = dir.write("corpus.txt", text);
  const std::string cfg = dir.write("gpt.yaml", R"(seed: 5
model: {type: gpt, n_layer: 2, n_head: 2, n_embd: 16, block_size: 16}
data: {format: text, train: {path: )" + corpus + R"(}, batch_size: 4, eval_batch_size: 64}
optimizer: {type: adamw, lr: 0.003, weight_decay: 0.1, clip_grad_norm: 0.5}
train: {epochs: 0, max_steps: 10, log_every: 10}
distributed: {ddp: {bucket_mb: 0.01}, timeout_s: 30}
runtime: {threads: 1}
)");
  struct Case {
    std::string tag, sets;
    int world;
  };
  for (const Case& c :
       {Case{"zero2-pp2-dp2",
             " --set distributed.strategy=zero2 --set distributed.pipeline.stages=2", 4},
        Case{"fsdp-dp3", " --set distributed.strategy=fsdp", 3}}) {
    CAPTURE(c.tag);
    const std::string w = std::to_string(c.world);
    auto r = run_cmd(kBin + " launch --nproc " + w + " " + cfg + c.sets + " --out " +
                     dir / ("grpc-" + c.tag) + " --log-level warn");
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    r = run_cmd(kBin + " run " + cfg + c.sets + " --set distributed.world_size=" + w + " --out " +
                dir / ("inproc-" + c.tag) + " --log-level warn");
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    const dtrain::StFile g = dtrain::testing::latest_run_state(kBin, dir / ("grpc-" + c.tag));
    check_same_state(g, dtrain::testing::latest_run_state(kBin, dir / ("inproc-" + c.tag)), c.tag);
    for (const char* prefix : {"", "optim.exp_avg.", "optim.exp_avg_sq."}) {
      const auto& a = g.tensors.at(std::string(prefix) + "transformer.wte.weight").data;
      const auto& b = g.tensors.at(std::string(prefix) + "lm_head.weight").data;
      REQUIRE(a.size() == b.size());
      CHECK_MESSAGE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0, prefix);
    }
  }
}
