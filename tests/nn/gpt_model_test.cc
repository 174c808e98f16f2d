// The whole GPT against PyTorch (llm.c's test): tests/nn/data/torch_gpt_ref.txt holds a tiny
// nanoGPT's weights, tokens, logits, loss and every gradient (scripts/ref/torch_gpt_ref.py);
// dtrain's model from the same weights must agree to 1e-5 relative. Plus names, shapes, the tie
// and the builder's errors.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "nn/loss.h"
#include "nn/registry.h"
#include "torch_ref.h"
#include "util/check.h"

namespace dtrain {
namespace {

using testing::max_rel_error;
using testing::read_torch_ref;

ModelConfig gpt_config(int64_t layers, int64_t heads, int64_t embd, int64_t block) {
  ModelConfig c;
  c.type = ModelType::kGpt;
  c.n_layer = layers;
  c.n_head = heads;
  c.n_embd = embd;
  c.block_size = block;
  return c;
}

TEST_CASE("gpt: logits, loss and every gradient match PyTorch's nanoGPT") {
  const auto ref =
      read_torch_ref(std::string(DTRAIN_SOURCE_DIR) + "/tests/nn/data/torch_gpt_ref.txt");
  const ModelConfig cfg = gpt_config(ref.cfg("gpt", "n_layer"), ref.cfg("gpt", "n_head"),
                                     ref.cfg("gpt", "n_embd"), ref.cfg("gpt", "block_size"));
  const int64_t B = ref.cfg("gpt", "batch"), T = ref.cfg("gpt", "seq");
  const Model m = build_model(cfg, {{T}, ref.cfg("gpt", "vocab_size")});
  ParamStore store(m.param_count());
  for (const ParamEntry& e : m.params()) {
    // The tied head is the token embedding's copy.
    const std::string src = e.name == "lm_head.weight" ? "transformer.wte.weight" : e.name;
    const auto v = ref.at("gpt/param/" + src).as_float();
    REQUIRE(static_cast<int64_t>(v.size()) == e.numel);
    std::copy(v.begin(), v.end(), store.values.begin() + e.offset);
  }
  Tensor x({B, T});
  const auto tokens = ref.at("gpt/tokens").as_int();
  for (int64_t i = 0; i < B * T; ++i) x[i] = static_cast<float>(tokens[static_cast<size_t>(i)]);
  Activations acts;
  const Tensor& logits = m.forward(store.values.data(), x, acts, LayerCtx{false, nullptr});
  CHECK(logits.shape() == Shape{B, T, 256});
  CHECK(max_rel_error(logits.data(), ref.at("gpt/logits")) < 1e-5);
  const auto targets = ref.at("gpt/targets").as_int();
  Tensor dlogits;
  const double loss =
      softmax_cross_entropy(logits, targets.data(), &dlogits, 1.0f / static_cast<float>(B * T)) /
      static_cast<double>(B * T);
  CHECK(std::fabs(loss - ref.at("gpt/loss").values[0]) < 1e-5 * ref.at("gpt/loss").values[0]);
  m.backward(store.values.data(), store.grads.data(), x, acts, dlogits, nullptr);
  sum_tied_grads(m, store.grads.data());
  for (const ParamEntry& e : m.params()) {
    const std::string src = e.name == "lm_head.weight" ? "transformer.wte.weight" : e.name;
    INFO(e.name);
    CHECK(max_rel_error(store.grads.data() + e.offset, ref.at("gpt/grad/" + src)) < 1e-5);
  }
}

TEST_CASE("gpt: nanoGPT's names and shapes, the tie starts equal, builder errors") {
  const Model m = build_gpt(gpt_config(2, 4, 32, 16), 256, 16);
  const std::vector<std::pair<std::string, Shape>> some = {
      {"transformer.wte.weight", {256, 32}},
      {"transformer.wpe.weight", {16, 32}},
      {"transformer.h.0.ln_1.weight", {32}},
      {"transformer.h.0.attn.c_attn.weight", {96, 32}},
      {"transformer.h.0.attn.c_attn.bias", {96}},
      {"transformer.h.1.attn.c_proj.weight", {32, 32}},
      {"transformer.h.1.mlp.c_fc.weight", {128, 32}},
      {"transformer.h.1.mlp.c_proj.weight", {32, 128}},
      {"transformer.ln_f.bias", {32}},
      {"lm_head.weight", {256, 32}}};
  for (const auto& [name, shape] : some) {
    INFO(name);
    const ParamEntry* e = m.find(name);
    REQUIRE(e != nullptr);
    CHECK(e->shape == shape);
  }
  CHECK(m.find("lm_head.bias") == nullptr);
  CHECK(m.num_layers() == 5);  // embedding, 2 blocks, ln_f, head: the units of buckets and stages
  REQUIRE(m.ties().size() == 1);
  std::vector<float> p(static_cast<size_t>(m.param_count()));
  m.init(p.data(), 9);
  const ParamEntry& wte = *m.find("transformer.wte.weight");
  const ParamEntry& head = *m.find("lm_head.weight");
  CHECK(std::equal(p.begin() + wte.offset, p.begin() + wte.offset + wte.numel,
                   p.begin() + head.offset));
  // Init statistics: normal(0, 0.02), residual projections 0.02 / sqrt(2 n_layer).
  auto sd = [&](const std::string& name) {
    const ParamEntry& e = *m.find(name);
    double s = 0;
    for (int64_t i = 0; i < e.numel; ++i) s += p[e.offset + i] * p[e.offset + i];
    return std::sqrt(s / static_cast<double>(e.numel));
  };
  CHECK(sd("transformer.wte.weight") == doctest::Approx(0.02).epsilon(0.05));
  CHECK(sd("transformer.h.0.mlp.c_fc.weight") == doctest::Approx(0.02).epsilon(0.05));
  CHECK(sd("transformer.h.1.mlp.c_proj.weight") == doctest::Approx(0.01).epsilon(0.05));
  CHECK(sd("transformer.h.0.attn.c_attn.bias") == 0.0);
  // Untied: a separate head from its own stream.
  ModelConfig untied = gpt_config(1, 2, 8, 4);
  untied.tie_embeddings = false;
  CHECK(build_gpt(untied, 256, 4).ties().empty());
  // describe() totals distinct parameters as PyTorch does: the tied head once.
  const Model tied = build_gpt(gpt_config(1, 2, 8, 4), 256, 4);
  const int64_t copy = tied.find("lm_head.weight")->numel;
  CHECK(tied.describe().find("total parameters: " + std::to_string(tied.param_count() - copy) +
                             " (distinct") != std::string::npos);
  // summary.json's param_count is this count too.
  CHECK(tied.distinct_param_count() == tied.param_count() - copy);
  CHECK(build_gpt(untied, 256, 4).distinct_param_count() ==
        build_gpt(untied, 256, 4).param_count());
  CHECK_THROWS_WITH_AS(build_gpt(gpt_config(1, 3, 8, 4), 256, 4),
                       "model.n_head 3 does not divide model.n_embd 8 (each head gets n_embd / "
                       "n_head columns)",
                       UserError);
  CHECK_THROWS_AS(build_gpt(gpt_config(1, 2, 8, 4), 256, 5), UserError);
}

}  // namespace
}  // namespace dtrain
