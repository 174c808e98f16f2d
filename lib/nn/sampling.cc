#include "nn/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "util/check.h"

namespace dtrain {

int64_t sample_next(const float* logits, int64_t vocab, double temperature, int64_t top_k,
                    Rng& rng) {
  DT_CHECK_GE(vocab, 1);
  DT_CHECK_MSG(temperature >= 0 && std::isfinite(temperature), "temperature " << temperature);
  DT_CHECK_MSG(top_k >= 0 && top_k <= vocab, "top_k " << top_k << " of vocab " << vocab);
  int64_t best = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (!std::isfinite(logits[i]))
      throw UserError("the model's logits are not finite (logit " + std::to_string(i) + " is " +
                      std::to_string(logits[i]) + "): the checkpoint's weights have diverged");
    if (logits[i] > logits[best]) best = i;
  }
  if (temperature == 0 || top_k == 1) return best;

  // The kept tokens: all, or the top_k largest (value descending, index ascending).
  std::vector<int64_t> kept(static_cast<size_t>(vocab));
  std::iota(kept.begin(), kept.end(), int64_t{0});
  if (top_k > 0 && top_k < vocab) {
    std::partial_sort(kept.begin(), kept.begin() + top_k, kept.end(),
                      [logits](int64_t a, int64_t b) {
                        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
                      });
    kept.resize(static_cast<size_t>(top_k));
    std::sort(kept.begin(), kept.end());  // draw in index order, independent of the sort
  }
  // exp((l - max) / T) in double: the largest weight is 1, so the sum is in [1, vocab].
  const double max_logit = logits[best];
  std::vector<double> cum(kept.size());
  double total = 0;
  for (size_t j = 0; j < kept.size(); ++j) {
    total += std::exp((static_cast<double>(logits[kept[j]]) - max_logit) / temperature);
    cum[j] = total;
  }
  const double u = static_cast<double>(rng.next_u64() >> 11) * 0x1.0p-53 * total;  // [0, total)
  const size_t j = static_cast<size_t>(std::upper_bound(cum.begin(), cum.end(), u) - cum.begin());
  return kept[std::min(j, kept.size() - 1)];
}

}  // namespace dtrain
