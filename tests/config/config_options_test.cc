// lib/config: a key that belongs to another choice of an option (another optimizer, schedule,
// compression type, strategy) is refused, naming the key, its place and the option it belongs
// to, as keys of another data format are; values at their defaults stay harmless, so every
// config.json loads back.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "config/config.h"
#include "config_test_util.h"
#include "util/check.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

using config_test::error_of;
using config_test::kSynthetic;

// The message of one --set on the synthetic base.
std::string set_error(const std::vector<std::string>& sets) {
  return error_of(kSynthetic, sets);
}

}  // namespace

TEST_CASE("optimizer keys of another optimizer type are refused, with file and line") {
  const std::string adam =
      "data: {format: synthetic}\n"
      "optimizer:\n"
      "  type: adam\n"
      "  momentum: 0.9\n";
  CHECK(error_of(adam) ==
        "x.yaml:4:13: optimizer.momentum: only used by optimizer sgd (optimizer.type is adam)");
  CHECK(error_of("data: {format: synthetic}\noptimizer: {type: adamw, nesterov: true}\n") ==
        "x.yaml:2:36: optimizer.nesterov: only used by optimizer sgd (optimizer.type is adamw)");
  CHECK(set_error({"optimizer.beta1=0.8"}) ==
        "--set optimizer.beta1=0.8: optimizer.beta1: only used by optimizers adam and adamw "
        "(optimizer.type is sgd)");
  CHECK(set_error({"optimizer.beta2=0.99"})
            .ends_with(
                "optimizer.beta2: only used by optimizers adam and adamw (optimizer.type is sgd)"));
  CHECK(set_error({"optimizer.eps=1e-6"})
            .ends_with(
                "optimizer.eps: only used by optimizers adam and adamw (optimizer.type is sgd)"));
  // Switching the type from the command line names the file's key that no longer applies.
  const std::string sgd =
      "data: {format: synthetic}\n"
      "optimizer: {type: sgd, lr: 0.1, momentum: 0.9}\n";
  CHECK(error_of(sgd, {"optimizer.type=adam"}) ==
        "x.yaml:2:43: optimizer.momentum: only used by optimizer sgd (optimizer.type is adam)");
  CHECK(error_of(sgd, {"optimizer={type: adam, lr: 0.001}"}) == "(no error)");
  // Their own optimizer takes them; another's defaults written out are harmless.
  CHECK(set_error({"optimizer={type: sgd, momentum: 0.9, nesterov: true}"}) == "(no error)");
  CHECK(set_error({"optimizer={type: adam, beta1: 0.8, beta2: 0.99, eps: 1e-6}"}) == "(no error)");
  CHECK(set_error({"optimizer={type: adam, momentum: 0, nesterov: false}"}) == "(no error)");
  CHECK(set_error({"optimizer={type: sgd, beta1: 0.9, beta2: 0.999, eps: 1e-8}"}) == "(no error)");
  // weight_decay, clip_grad_norm and scale_lr belong to every optimizer.
  for (const char* t : {"sgd", "adam", "adamw"})
    CHECK(set_error({std::string("optimizer={type: ") + t +
                     ", weight_decay: 0.01, clip_grad_norm: 1, scale_lr: linear}"}) ==
          "(no error)");
}

TEST_CASE("a gpt takes no class count, input width or loss: its vocabulary is 256 bytes") {
  const std::string gpt = "model: {type: gpt}\ndata: {format: text, train: {path: /t.txt}}\n";
  for (const std::string key :
       {"model.num_classes=300", "model.input_features=4", "model.loss=mse"}) {
    CAPTURE(key);
    const std::string e = error_of(gpt, {key});
    CHECK_MESSAGE(e.find("only used by model types mlp and sequential (model.type is gpt)") !=
                      std::string::npos,
                  e);
  }
  CHECK(error_of(gpt) == "(no error)");
}

TEST_CASE("schedule keys of another schedule type are refused") {
  CHECK(set_error({"optimizer.schedule={type: cosine, step_size: 50}"}) ==
        "--set optimizer.schedule={type: cosine, step_size: 50}: optimizer.schedule.step_size: "
        "only used by schedule step (optimizer.schedule.type is cosine)");
  CHECK(set_error({"optimizer.schedule.gamma=0.5"})
            .ends_with(
                "optimizer.schedule.gamma: only used by schedule step (optimizer.schedule.type is "
                "constant)"));
  CHECK(set_error({"optimizer.schedule={type: step, min_lr: 0.001}"})
            .ends_with("optimizer.schedule.min_lr: only used by schedule cosine "
                       "(optimizer.schedule.type is step)"));
  CHECK(error_of("data: {format: synthetic}\noptimizer: {schedule: {type: step, gamma: 0.5}}\n",
                 {"optimizer.schedule.type=cosine"}) ==
        "x.yaml:2:43: optimizer.schedule.gamma: only used by schedule step "
        "(optimizer.schedule.type is cosine)");
  CHECK(set_error({"optimizer.schedule={type: step, step_size: 5, gamma: 0.5}"}) == "(no error)");
  CHECK(set_error({"optimizer.schedule={type: cosine, min_lr: 0.001}"}) == "(no error)");
  for (const char* t : {"constant", "step", "cosine"})  // warmup belongs to every schedule
    CHECK(set_error({std::string("optimizer.schedule={type: ") + t + ", warmup_steps: 10}"}) ==
          "(no error)");
}

TEST_CASE("compression and strategy keys of another choice are refused") {
  struct Case {
    std::vector<std::string> sets;
    std::string message;  // after "--set LAST: "
  };
  const std::vector<Case> cases = {
      {{"distributed.compression.type=int8", "distributed.compression.ratio=0.1"},
       "distributed.compression.ratio: only used by compression topk "
       "(distributed.compression.type is int8)"},
      {{"distributed.compression.type=topk", "distributed.compression.rank=2"},
       "distributed.compression.rank: only used by compression powersgd "
       "(distributed.compression.type is topk)"},
      {{"distributed.compression.error_feedback=false"},
       "distributed.compression.error_feedback: only used with compression "
       "(distributed.compression.type is none)"},
      {{"distributed.local_sgd.sync_every=4"},
       "distributed.local_sgd.sync_every: only used by strategy local_sgd "
       "(distributed.strategy is ddp)"},
      {{"distributed.strategy=zero2", "distributed.fsdp.unit=model"},
       "distributed.fsdp.unit: only used by strategy fsdp (distributed.strategy is zero2)"},
      {{"distributed.fsdp.reshard_after_forward=false"},
       "distributed.fsdp.reshard_after_forward: only used by strategy fsdp "
       "(distributed.strategy is ddp)"},
      {{"distributed.world_size=2", "distributed.pipeline.stages=2",
        "distributed.compression.type=fp16"},
       "distributed.compression.type: compression does not apply with a pipeline "
       "(distributed.pipeline.stages is 2): compress a plain data-parallel run instead"},
      {{"distributed.strategy=pipeline", "distributed.pipeline.stages=1"},
       "distributed.pipeline.stages: is 1 with strategy pipeline: one stage is no pipeline (give "
       "2 or more stages, or strategy ddp)"},
      {{"distributed.strategy=fsdp", "distributed.pipeline.activation_checkpointing=true"},
       "distributed.pipeline.activation_checkpointing: only used with a pipeline "
       "(distributed.pipeline.stages is 1)"},
      {{"distributed.strategy=fsdp", "distributed.fsdp={unit: model, layers_per_unit: 2}"},
       "distributed.fsdp.layers_per_unit: only used with distributed.fsdp.unit layer (unit is "
       "model)"},
      {{"distributed.strategy=local_sgd", "distributed.local_sgd.outer_momentum=0.5"},
       "distributed.local_sgd.outer_momentum: only used with distributed.local_sgd.outer_lr > 0 "
       "(the outer optimizer; outer_lr is 0)"},
      // (cast to float32 at its first use: inf, and the weights went non-finite at the first
      // synchronisation, exit 1)
      {{"distributed.strategy=local_sgd", "distributed.local_sgd.outer_lr=1e39"},
       "distributed.local_sgd.outer_lr: must be at most 3.4e+38, float32's largest finite number "
       "(got 1e+39: the float32 update would make it inf)"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.sets.back());
    CHECK(set_error(c.sets) == "--set " + c.sets.back() + ": " + c.message);
  }
  // Located in the file when written there.
  CHECK(error_of("data: {format: synthetic}\n"
                 "distributed:\n"
                 "  strategy: ddp\n"
                 "  pipeline: {micro_batches: 3}\n") ==
        "x.yaml:4:29: distributed.pipeline.micro_batches: only used with a pipeline "
        "(distributed.pipeline.stages is 1)");
  // Each with its own choice is fine.
  for (const std::vector<std::string>& ok : std::vector<std::vector<std::string>>{
           {"distributed.compression={type: topk, ratio: 0.1, error_feedback: false}"},
           {"distributed.compression={type: powersgd, rank: 2}"},
           {"distributed.compression={type: fp16, error_feedback: false}"},
           {"distributed.strategy=local_sgd",
            "distributed.local_sgd={sync_every: 4, outer_lr: 0.7, outer_momentum: 0.5}"},
           {"distributed.strategy=fsdp",
            "distributed.fsdp={unit: layer, layers_per_unit: 2, reshard_after_forward: false}"},
           {"distributed.strategy=pipeline", "distributed.world_size=2",
            "distributed.pipeline={stages: 2, micro_batches: 2, schedule: gpipe}"},
           // A pipeline under any data-parallel strategy.
           {"distributed.strategy=fsdp", "distributed.world_size=4",
            "distributed.pipeline={stages: 2, micro_batches: 2, activation_checkpointing: true}"},
       }) {
    CAPTURE(ok.back());
    CHECK(set_error(ok) == "(no error)");
  }
  // ddp.bucket_mb is accepted with every strategy: DDP is the default strategy, zero1 and zero2
  // shard along its buckets, and configs tuned for it are switched to others with --set.
  for (const char* s : {"ddp", "zero1", "zero2", "fsdp", "local_sgd", "pipeline"})
    CHECK(set_error({std::string("distributed.strategy=") + s, "distributed.ddp.bucket_mb=0.5"}) ==
          "(no error)");
}

TEST_CASE("config.json of every option choice and every shipped config loads back unchanged") {
  std::vector<Config> configs;
  for (const char* opt : {"sgd", "adam", "adamw"})
    for (const char* sched : {"constant", "step", "cosine"})
      configs.push_back(parse_config(
          kSynthetic, "x",
          {std::string("optimizer.type=") + opt, std::string("optimizer.schedule.type=") + sched}));
  for (const char* strategy : {"ddp", "local_sgd", "zero1", "zero2", "zero3", "pipeline"})
    configs.push_back(parse_config(
        kSynthetic, "x",
        {std::string("distributed.strategy=") + strategy, "distributed.world_size=2"}));
  for (const char* comp : {"fp16", "bf16", "int8", "topk", "powersgd"})
    configs.push_back(
        parse_config(kSynthetic, "x", {std::string("distributed.compression.type=") + comp}));
  configs.push_back(
      parse_config(kSynthetic, "x", {"distributed.strategy=fsdp", "distributed.fsdp.unit=model"}));
  const fs::path dir = fs::path(DTRAIN_SOURCE_DIR) / "configs";
  int shipped = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    configs.push_back(load_config(entry.path().string()));
    ++shipped;
  }
  CHECK(shipped > 0);
  for (const Config& c : configs) {
    const nlohmann::json j = config_to_json(c);
    CAPTURE(j.dump());
    Config back;
    CHECK_NOTHROW(back = parse_config(j.dump(2), "config.json"));
    CHECK(config_to_json(back) == j);
  }
}

}  // namespace dtrain
