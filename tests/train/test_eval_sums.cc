// Evaluation sums each replica's share of the test set: the count exactly and the loss in double,
// so N ranks report what one process reports for the same parameters, and both what `dtrain
// eval` computes (a float all-reduce kept 24 bits: about 1e-8 relative on the loss and, past 2^24
// correct targets, a wrong count).
//
// The loss is compared to 1e-9 relative, not closer: a rank's shard ends in a shorter last batch
// than one process's, and some OpenBLAS kernels (Zen's, measured 2026-12-02) round rows of a
// partial GEMM tile differently in the last bit, which moves a mean over 20,000 samples by about
// 2e-10. A float all-reduce of the sums would be off by ~1e-8, so the check still tells them apart.
#include <doctest/doctest.h>

#include "data/dataset.h"
#include "nn/registry.h"
#include "test_util.h"
#include "train_test_util.h"

using dtrain::testing::TempDir;
using dtrain::testing::train_yaml;

namespace {

// lr 1e-30: an update far below float32's resolution of the weights (a zero bias moves by about
// 1e-31): every layout evaluates the initial parameters, to well within the tolerances below.
const char* kCfg = R"(seed: 5
model: {type: mlp, hidden: [32], activation: tanh}
data:
  format: synthetic
  synthetic: {samples: 40000, features: 24, classes: 7}
  test_fraction: 0.5
  batch_size: 12
optimizer: {type: sgd, lr: 1.0e-30}
train: {max_steps: 2}
runtime: {threads: 1}
)";

}  // namespace

TEST_CASE("eval over 1, 2, 3 and 5 ranks reports one process's test loss and accuracy") {
  TempDir dir;
  const auto one = train_yaml(kCfg, dir / "w1", {});
  const double loss = one["test_loss"], acc = one["test_accuracy"];
  REQUIRE(loss > 0.0);
  {  // one process's summary reports the double mean of dtrain eval's figures, not a float's
    const dtrain::Config c = dtrain::parse_config(kCfg, "t.yaml", {});
    const dtrain::DataSplits data = dtrain::load_data(c.data, c.seed);
    const dtrain::ModelShape shape = dtrain::resolve_model_shape(c, data);
    const dtrain::Model model = dtrain::build_model(c.model, {shape.sample, shape.num_classes});
    std::vector<float> p(static_cast<size_t>(model.param_count()));
    dtrain::load_checkpoint(dtrain::testing::as_file(dir / "w1", 2), model, p.data(), {});
    const dtrain::EvalResult e =
        dtrain::evaluate(model, p.data(), data.test, c.data.eval_batch_size, c.model.loss);
    CHECK(e.accuracy == acc);
    CHECK(std::abs(e.loss - loss) <= 1e-12 * loss);
  }
  for (const char* w : {"2", "3", "5"}) {
    for (const char* strategy : {"ddp", "fsdp"}) {
      INFO(("world " + std::string(w) + " " + strategy));
      const auto s = train_yaml(kCfg, dir / (std::string("w") + w + strategy),
                                {std::string("distributed.world_size=") + w,
                                 std::string("distributed.strategy=") + strategy});
      CHECK(s["test_accuracy"].get<double>() == acc);
      CHECK(std::abs(s["test_loss"].get<double>() - loss) <= 1e-9 * loss);
    }
  }
}
