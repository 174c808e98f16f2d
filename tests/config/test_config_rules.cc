// lib/config's value rules: every range and enum bound with the location, key, bound and value
// in its message, reached through the file and through --set.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "config/config.h"
#include "config_test_util.h"
#include "test_util.h"
#include "util/check.h"

namespace dtrain {
namespace {

using config_test::error_of;
using config_test::kSynthetic;
using config_test::set_error;
using dtrain::testing::contains;

}  // namespace

TEST_CASE("out-of-range values: location of the value, key, bound and value") {
  CHECK(error_of("seed: 1\ndata:\n  format: synthetic\nmodel:\n  type: mlp\noptimizer:\n"
                 "  lr: -0.1\n") == "x.yaml:7:7: optimizer.lr: must be > 0 (got -0.1)");
  CHECK(error_of("data: {format: synthetic}\ntrain: {log_every: 0}\n") ==
        "x.yaml:2:20: train.log_every: must be >= 1 (got 0)");
}

TEST_CASE("every range and enum rule, via --set") {
  struct Case {
    std::string set;
    std::string message;  // after "--set SET: "
  };
  const std::vector<Case> cases = {
      {"seed=-1", "seed: must be >= 0 (got -1)"},
      {"model.type=cnn", "model.type: must be one of mlp, sequential, gpt (got 'cnn')"},
      {"model.complexity=huge",
       "model.complexity: must be one of simple, medium, complex (got 'huge')"},
      {"model.complexity=medum",
       "model.complexity: must be one of simple, medium, complex (got 'medum'; did you mean "
       "'medium'?)"},
      {"model.hidden=[64, 0]", "model.hidden[1]: must be >= 1 (got 0)"},
      {"model.activation=rleu",
       "model.activation: must be one of relu, gelu, tanh, sigmoid (got 'rleu'; did you mean "
       "'relu'?)"},
      {"model.dropout=1", "model.dropout: must be in [0, 1) (got 1)"},
      {"model.dropout=-0.1", "model.dropout: must be in [0, 1) (got -0.1)"},
      {"model.init=he", "model.init: must be one of auto, kaiming, xavier (got 'he')"},
      {"model.loss=l2", "model.loss: must be one of cross_entropy, mse (got 'l2')"},
      {"model.input_features=-1", "model.input_features: must be >= 0 (got -1)"},
      {"model.num_classes=-2", "model.num_classes: must be >= 0 (got -2)"},
      {"data.format=cvs",
       "data.format: must be one of idx, csv, synthetic, text (got 'cvs'; did you mean 'csv'?)"},
      {"data.test_fraction=1", "data.test_fraction: must be -1 (the default) or in [0, 1) (got 1)"},
      {"data.test_fraction=-0.5",
       "data.test_fraction: must be -1 (the default) or in [0, 1) (got -0.5)"},
      {"data.batch_size=0", "data.batch_size: must be in [1, 16777216] (got 0)"},
      {"data.batch_size=1000000000000",
       "data.batch_size: must be in [1, 16777216] (got 1000000000000)"},
      {"data.eval_batch_size=0", "data.eval_batch_size: must be in [1, 16777216] (got 0)"},
      {"data.normalize=minmax",
       "data.normalize: must be one of auto, scale, standardize, none (got 'minmax')"},
      {"data.synthetic.samples=1", "data.synthetic.samples: must be >= 2 (got 1)"},
      {"data.synthetic.features=0", "data.synthetic.features: must be >= 1 (got 0)"},
      {"data.synthetic.classes=1", "data.synthetic.classes: must be in [2, 1048576] (got 1)"},
      {"data.synthetic.classes=1048577",
       "data.synthetic.classes: must be in [2, 1048576] (got 1048577)"},
      {"model.n_layer=4097", "model.n_layer: must be in [1, 4096] (got 4097)"},
      {"model.n_embd=4611686018427387904",
       "model.n_embd: must be in [1, 65536] (got 4611686018427387904)"},
      {"model.block_size=1048577", "model.block_size: must be in [1, 1048576] (got 1048577)"},
      {"data.synthetic.noise=-1", "data.synthetic.noise: must be in [0, 1e+06] (got -1)"},
      {"data.synthetic.noise=1e39", "data.synthetic.noise: must be in [0, 1e+06] (got 1e+39)"},
      {"data.synthetic.seed=-2", "data.synthetic.seed: must be >= -1 (got -2)"},
      {"optimizer.type=sgdd",
       "optimizer.type: must be one of sgd, adam, adamw (got 'sgdd'; did you mean 'sgd'?)"},
      {"optimizer.lr=0", "optimizer.lr: must be > 0 (got 0)"},
      {"optimizer.lr=1e-50",
       "optimizer.lr: must be at least 1.2e-38, float32's smallest normal number (got 1e-50: the "
       "float32 update would round it to 0)"},
      {"optimizer.lr=1e39",
       "optimizer.lr: must be at most 3.4e+38, float32's largest finite number (got 1e+39: the "
       "float32 update would make it inf)"},
      {"optimizer.eps=1e39",
       "optimizer.eps: must be at most 3.4e+38, float32's largest finite number (got 1e+39: the "
       "float32 update would make it inf)"},
      {"optimizer.momentum=1", "optimizer.momentum: must be in [0, 1) (got 1)"},
      {"optimizer.nesterov=true",
       "optimizer.nesterov: needs optimizer.momentum > 0 (got momentum 0)"},
      {"optimizer.weight_decay=-1", "optimizer.weight_decay: must be >= 0 (got -1)"},
      {"optimizer.weight_decay=1e39",
       "optimizer.weight_decay: must be at most 3.4e+38, float32's largest finite number (got "
       "1e+39: the float32 update would make it inf)"},
      {"optimizer.beta1=1", "optimizer.beta1: must be in [0, 1) (got 1)"},
      {"optimizer.beta2=-0.1", "optimizer.beta2: must be in [0, 1) (got -0.1)"},
      {"optimizer.eps=0", "optimizer.eps: must be > 0 (got 0)"},
      {"optimizer.scale_lr=sqrt", "optimizer.scale_lr: must be one of none, linear (got 'sqrt')"},
      {"optimizer.clip_grad_norm=-1", "optimizer.clip_grad_norm: must be >= 0 (got -1)"},
      {"optimizer.schedule.type=cosin",
       "optimizer.schedule.type: must be one of constant, step, cosine (got 'cosin'; did you "
       "mean 'cosine'?)"},
      {"optimizer.schedule.warmup_steps=-1",
       "optimizer.schedule.warmup_steps: must be >= 0 (got -1)"},
      {"optimizer.schedule.step_size=0", "optimizer.schedule.step_size: must be >= 1 (got 0)"},
      {"optimizer.schedule.gamma=0", "optimizer.schedule.gamma: must be in (0, 1] (got 0)"},
      {"optimizer.schedule.gamma=1.5", "optimizer.schedule.gamma: must be in (0, 1] (got 1.5)"},
      {"optimizer.schedule.min_lr=-1", "optimizer.schedule.min_lr: must be >= 0 (got -1)"},
      {"optimizer.schedule={type: cosine, min_lr: 0.01}",
       "optimizer.schedule.min_lr: must be < optimizer.lr for a cosine schedule (got 0.01, lr "
       "0.01)"},
      {"train.epochs=-1", "train.epochs: must be >= 0 (got -1)"},
      {"train.max_steps=-1", "train.max_steps: must be >= 0 (got -1)"},
      {"train.epochs=0",
       "train.epochs: nothing to train: epochs and max_steps are both 0 (set one of them > 0)"},
      {"train.log_every=0", "train.log_every: must be >= 1 (got 0)"},
      {"train.eval_every=-1", "train.eval_every: must be >= 0 (got -1)"},
      {"train.grad_accum_steps=0", "train.grad_accum_steps: must be >= 1 (got 0)"},
      {"train.checkpoint.every_steps=-1", "train.checkpoint.every_steps: must be >= 0 (got -1)"},
      {"train.checkpoint.keep_last=0", "train.checkpoint.keep_last: must be >= 1 (got 0)"},
      {"distributed.backend=mpi", "distributed.backend: must be one of inproc, grpc (got 'mpi')"},
      {"distributed.world_size=0", "distributed.world_size: must be in [1, 1024] (got 0)"},
      {"distributed.world_size=1025", "distributed.world_size: must be in [1, 1024] (got 1025)"},
      {"distributed.strategy=tp",
       "distributed.strategy: must be one of ddp, local_sgd, zero1, zero2, fsdp, pipeline (got "
       "'tp')"},
      {"distributed.pipeline.schedule=zb",
       "distributed.pipeline.schedule: must be one of gpipe, 1f1b (got 'zb')"},
      {"distributed.pipeline.micro_batches=0",
       "distributed.pipeline.micro_batches: must be >= 1 (got 0)"},
      {"distributed.fsdp.unit=block",
       "distributed.fsdp.unit: must be one of layer, model (got 'block')"},
      {"distributed.fsdp.layers_per_unit=0",
       "distributed.fsdp.layers_per_unit: must be >= 1 (got 0)"},
      {"distributed.compression.type=powersdg",
       "distributed.compression.type: must be one of none, fp16, bf16, int8, topk, powersgd (got "
       "'powersdg'; did you mean 'powersgd'?)"},
      {"distributed.compression.ratio=0",
       "distributed.compression.ratio: must be in (0, 1] (got 0)"},
      {"distributed.compression.rank=0",
       "distributed.compression.rank: must be >= 1: the number of columns of the PowerSGD "
       "factors (got 0)"},
      {"runtime.threads=-1", "runtime.threads: must be in [0, 1024] (got -1)"},
      {"runtime.threads=1025", "runtime.threads: must be in [0, 1024] (got 1025)"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.set);
    CHECK(set_error(c.set) == "--set " + c.set + ": " + c.message);
  }
  // A pasted megabyte as an enum value: its size shown, not its bytes, and no |value| x |choice|
  // table for the "did you mean" (it took seconds and ~100 bytes of memory per byte).
  const std::string huge = set_error("model.activation=" + std::string(size_t{1} << 20, 'r'));
  CHECK_MESSAGE(huge.find("r... (1048576 bytes)')") != std::string::npos,
                huge.substr(huge.size() - 200));
  // The boundary values themselves are accepted.
  for (const char* ok :
       {"optimizer.momentum=0", "model.dropout=0", "data.test_fraction=0", "seed=0",
        "optimizer.schedule={type: step, gamma: 1}", "distributed.world_size=1024",
        "runtime.threads=1024", "train.max_steps=5", "data.synthetic.seed=-1", "model.hidden=[1]",
        "distributed.compression={type: powersgd, rank: 1}",
        "distributed.compression.type=powersgd"}) {
    CAPTURE(ok);
    CHECK(set_error(ok) == "(no error)");
  }
  CHECK(error_of(kSynthetic, {"train.epochs=0", "train.max_steps=10"}) == "(no error)");
  // Pipelines that cannot be built are refused at validation.
  CHECK(error_of(kSynthetic, {"distributed.strategy=pipeline", "model.hidden=[8]",
                              "distributed.pipeline.stages=3", "distributed.world_size=3"})
            .find("distributed.pipeline.stages: the model has 2 layers with parameters, fewer than "
                  "3 stages") != std::string::npos);
  // An mlp's LayerNorms have parameters too: hidden [16] with layer_norm is 3 such layers.
  CHECK(error_of(kSynthetic,
                 {"distributed.strategy=pipeline", "model.hidden=[16]", "model.layer_norm=true",
                  "distributed.pipeline.stages=3", "distributed.world_size=3"}) == "(no error)");
  CHECK(error_of(kSynthetic,
                 {"distributed.strategy=pipeline", "model.hidden=[16]", "model.layer_norm=true",
                  "distributed.pipeline.stages=4", "distributed.world_size=4"})
            .find("the model has 3 layers with parameters, fewer than 4 stages") !=
        std::string::npos);
  // The default 4 with a batch of 3: one micro-batch per row, not an error for a key not set.
  CHECK(error_of(kSynthetic, {"distributed.strategy=pipeline", "distributed.world_size=2",
                              "data.batch_size=3"}) == "(no error)");
  CHECK(error_of(kSynthetic, {"distributed.strategy=pipeline", "distributed.world_size=2",
                              "data.batch_size=3", "distributed.pipeline.micro_batches=5"})
            .find("distributed.pipeline.micro_batches: must be at most data.batch_size (3): "
                  "micro-batches "
                  "split a batch by samples") != std::string::npos);
  // zero3 is read as fsdp.
  CHECK(parse_config(kSynthetic, "x.yaml", {"distributed.strategy=zero3"}).distributed.strategy ==
        StrategyKind::kFsdp);
}

TEST_CASE("powersgd compression: rank defaults to 4, is an integer and reaches config.json") {
  const Config d = parse_config(kSynthetic, "x.yaml", {"distributed.compression.type=powersgd"});
  CHECK(d.distributed.compression.type == CompressionType::kPowersgd);
  CHECK(d.distributed.compression.rank == 4);
  const Config c = parse_config(
      "data: {format: synthetic}\n"
      "distributed: {compression: {type: powersgd, rank: 2, error_feedback: false}}\n",
      "x.yaml");
  CHECK(c.distributed.compression.rank == 2);
  CHECK_FALSE(c.distributed.compression.error_feedback);
  CHECK(config_to_json(c)["distributed"]["compression"]["rank"] == 2);
  CHECK(config_hash(c) !=
        config_hash(
            parse_config(kSynthetic, "x.yaml",
                         {"distributed.compression.type=powersgd", "distributed.compression.rank=3",
                          "distributed.compression.error_feedback=false"})));
  const std::string e = set_error("distributed.compression.rank=1.5");
  CHECK(e.find("distributed.compression.rank") != std::string::npos);
  CHECK(e != "(no error)");
}

TEST_CASE("rules: distributed.bind is a host alone, no port, URL or whitespace") {
  // (a bind of 127.0.0.1:80 made rank 0 listen on "[127.0.0.1:80]:PORT": exit 1, and restarts)
  const auto bind = [](const std::string& v) {
    return error_of(std::string(config_test::kSynthetic) + "distributed: {bind: '" + v + "'}\n");
  };
  CHECK(bind("127.0.0.1:80") ==
        "x.yaml:2:21: distributed.bind: '127.0.0.1:80' holds a port (host:port): give the host "
        "alone, "
        "and the port as MASTER_PORT (rank 0's; the other ranks pick their own)");
  CHECK(contains(bind("[::1]:80"), "holds a port (host:port)"));
  CHECK(contains(bind("http://h"), "is a URL"));
  CHECK(contains(bind("a b"), "holds whitespace"));
  CHECK(contains(bind("[::1"), "unbalanced"));
  for (const char* ok : {"0.0.0.0", "::", "::1", "[::1]", "10.1.2.3", "node-1.example", ""})
    CHECK_MESSAGE(bind(ok) == "(no error)", ok);
}

TEST_CASE(
    "rules: --set of a section to nothing is refused, and a value starting with a comma named") {
  // `--set optimizer=$OPT` with OPT unset reset every optimizer key to its default in silence.
  for (const char* v : {"optimizer=", "model=null", "model=~", "data.csv=", "train.checkpoint="}) {
    const std::string e = set_error(v);
    const std::string section = std::string(v).substr(0, std::string(v).find('='));
    CHECK_MESSAGE(contains(e, "'" + section +
                                  "' is a section, and an empty or null value would "
                                  "reset all its keys to their defaults"),
                  e);
  }
  CHECK(set_error("optimizer={}") == "(no error)");  // an explicit mapping is taken as given
  // A leading ',' stops yaml-cpp's reader in place: it was "more than 100000 YAML values".
  for (const char* v : {"seed=,", "model.activation=,relu"})
    CHECK(contains(set_error(v), "the value is not valid YAML: unexpected ','"));
}

TEST_CASE("data.synthetic.seed equal to the top-level seed hashes as its default, -1") {
  // (the same data: a run spelling it out was reported as another config at resume and eval)
  const auto hash = [](const std::vector<std::string>& sets) {
    return config_hash(parse_config("seed: 7\ndata: {format: synthetic}\n", "x.yaml", sets));
  };
  CHECK(hash({"data.synthetic.seed=7"}) == hash({}));
  CHECK(hash({"data.synthetic.seed=8"}) != hash({}));
  CHECK(hash({"data.synthetic.seed=7", "seed=8"}) != hash({"seed=8"}));
  // config.json keeps the value as given
  CHECK(config_to_json(parse_config("seed: 7\ndata: {format: synthetic, synthetic: {seed: 7}}\n",
                                    "x.yaml"))["data"]["synthetic"]["seed"] == 7);
}

}  // namespace dtrain
