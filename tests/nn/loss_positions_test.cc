// Losses over per-position scores [B, T, C]: each position is a row with its own target, so the
// result equals the same scores read as [B * T, C].
#include <doctest/doctest.h>

#include <vector>

#include "nn/loss.h"
#include "util/rng.h"

namespace dtrain {
namespace {

TEST_CASE("loss: [B, T, C] scores are B * T rows with one target each") {
  Rng rng(3);
  Tensor seq({2, 3, 5});
  for (int64_t i = 0; i < seq.numel(); ++i) seq[i] = 4.0f * rng.uniform() - 2.0f;
  Tensor flat({6, 5});
  std::copy(seq.data(), seq.data() + seq.numel(), flat.data());
  const std::vector<int32_t> targets = {0, 4, 2, 1, 3, 4};
  Tensor g_seq, g_flat;
  const double l_seq = softmax_cross_entropy(seq, targets.data(), &g_seq, 0.25f);
  const double l_flat = softmax_cross_entropy(flat, targets.data(), &g_flat, 0.25f);
  CHECK(l_seq == l_flat);
  CHECK(g_seq.shape() == seq.shape());  // the gradient keeps the scores' shape
  for (int64_t i = 0; i < g_seq.numel(); ++i) CHECK(g_seq[i] == g_flat[i]);
  CHECK(count_correct(seq, targets.data()) == count_correct(flat, targets.data()));
  CHECK(mse_onehot(seq, targets.data(), nullptr, 1.0f) ==
        mse_onehot(flat, targets.data(), nullptr, 1.0f));
  Tensor p_seq, p_flat;
  softmax_rows(seq, p_seq);
  softmax_rows(flat, p_flat);
  CHECK(p_seq.shape() == seq.shape());
  for (int64_t i = 0; i < p_seq.numel(); ++i) CHECK(p_seq[i] == p_flat[i]);
}

}  // namespace
}  // namespace dtrain
