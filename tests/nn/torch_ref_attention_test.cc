// The attention kernel against PyTorch (nanoGPT's manual causal attention, float64) through the
// committed reference file tests/nn/data/torch_gpt_ref.txt (scripts/ref/torch_gpt_ref.py writes
// it); and the file's GPT section checked for completeness, for the whole-model test.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "nn/kernels/attention.h"
#include "torch_ref.h"

namespace dtrain {
namespace {

using testing::max_rel_error;
using testing::read_torch_ref;
using testing::TorchRef;

// float32 against a float64 reference computed from the same float32 inputs: the kernel's own
// rounding (measured below 1e-6) is all that separates them.
constexpr double kRel = 1e-5;

const TorchRef& reference() {
  static const TorchRef ref =
      read_torch_ref(std::string(DTRAIN_SOURCE_DIR) + "/tests/nn/data/torch_gpt_ref.txt");
  return ref;
}

TEST_CASE("torch ref: the attention kernel matches PyTorch forward and backward (1e-5 relative)") {
  const TorchRef& ref = reference();
  for (const std::string s : {"attn1", "attn2"}) {
    INFO(s);
    const AttentionDims d{ref.cfg(s, "batch"), ref.cfg(s, "seq"), ref.cfg(s, "n_head"),
                          ref.cfg(s, "n_embd")};
    const std::vector<float> qkv = ref.at(s + "/qkv").as_float();
    const std::vector<float> dy = ref.at(s + "/dy").as_float();
    REQUIRE(qkv.size() == static_cast<size_t>(d.batch * d.seq * 3 * d.embd));
    REQUIRE(dy.size() == static_cast<size_t>(d.batch * d.seq * d.embd));
    std::vector<float> y(dy.size()), saved(static_cast<size_t>(attention_saved_floats(d)));
    std::vector<float> dqkv(qkv.size()), scratch(static_cast<size_t>(attention_scratch_floats(d)));
    attention_forward(d, qkv.data(), y.data(), saved.data());
    attention_backward(d, qkv.data(), saved.data(), dy.data(), dqkv.data(), scratch.data());
    const double ey = max_rel_error(y.data(), ref.at(s + "/y"));
    const double eg = max_rel_error(dqkv.data(), ref.at(s + "/dqkv"));
    MESSAGE(s, ": y error ", ey, ", dqkv error ", eg);
    CHECK(ey < kRel);
    CHECK(eg < kRel);
  }
}

TEST_CASE("torch ref: the GPT section is complete and its loss is the mean cross-entropy") {
  const TorchRef& ref = reference();
  const int64_t V = ref.cfg("gpt", "vocab_size"), B = ref.cfg("gpt", "batch");
  const int64_t T = ref.cfg("gpt", "seq"), C = ref.cfg("gpt", "n_embd");
  const int64_t L = ref.cfg("gpt", "n_layer");
  CHECK(V == 256);
  // Every parameter has a gradient of its shape: 2 embeddings, 12 per block, ln_f's 2.
  int64_t params = 0;
  for (const auto& [name, t] : ref.tensors) {
    if (name.rfind("gpt/param/", 0) != 0) continue;
    ++params;
    const std::string grad = "gpt/grad/" + name.substr(10);
    REQUIRE(ref.tensors.count(grad) == 1);
    CHECK(ref.at(grad).shape == t.shape);
  }
  CHECK(params == 2 + 12 * L + 2);
  CHECK(ref.at("gpt/param/transformer.wte.weight").shape == std::vector<int64_t>{V, C});
  CHECK(ref.at("gpt/param/transformer.h.0.attn.c_attn.weight").shape ==
        std::vector<int64_t>{3 * C, C});
  CHECK(ref.tensors.count("gpt/param/lm_head.weight") == 0);  // tied: wte is the head
  // The loss is the mean over all B*T positions of -log softmax(logits)[target].
  const auto& logits = ref.at("gpt/logits").values;
  const auto& targets = ref.at("gpt/targets").values;
  REQUIRE(logits.size() == static_cast<size_t>(B * T * V));
  double sum = 0.0;
  for (int64_t r = 0; r < B * T; ++r) {
    const double* row = logits.data() + r * V;
    double mx = row[0], z = 0.0;
    for (int64_t j = 1; j < V; ++j) mx = std::max(mx, row[j]);
    for (int64_t j = 0; j < V; ++j) z += std::exp(row[j] - mx);
    sum += mx + std::log(z) - row[static_cast<int64_t>(targets[static_cast<size_t>(r)])];
  }
  CHECK(sum / static_cast<double>(B * T) ==
        doctest::Approx(ref.at("gpt/loss").values.at(0)).epsilon(1e-9));
}

}  // namespace
}  // namespace dtrain
