#include "train/straggler.h"

#include <algorithm>
#include <vector>

#include <spdlog/spdlog.h>

namespace dtrain {

void StragglerCheck::check(double compute_s, int64_t steps) {
  const int W = dp_.size();
  const float mine = static_cast<float>(compute_s - at_last_);
  at_last_ = compute_s;
  std::vector<float> all(static_cast<size_t>(W));
  dp_.allgather(&mine, all.data(), std::vector<size_t>(static_cast<size_t>(W), 1));
  if (steps <= 0) return;
  const auto it = std::max_element(all.begin(), all.end());
  const int r = static_cast<int>(it - all.begin());
  const double worst = *it / static_cast<double>(steps);
  std::vector<float> others = all;
  others.erase(others.begin() + r);
  std::sort(others.begin(), others.end());
  const size_t m = others.size() / 2;  // even sizes: the mean of the two middle values
  const double median = (others.size() % 2 == 1 ? others[m] : 0.5 * (others[m - 1] + others[m])) /
                        static_cast<double>(steps);
  if (worst > 1.25 * median && worst - median > 1e-3) {
    streak_ = r == slow_rank_ ? streak_ + 1 : 1;
    slow_rank_ = r;
  } else {
    streak_ = 0;
    slow_rank_ = -1;
  }
  if (streak_ < 2) return;
  ++warnings_;
  if (lead_)
    spdlog::warn(
        "straggler: {} computes {:.1f} ms per step against a median of {:.1f} ms of the other "
        "ranks over the last {} steps (every rank waits for it)",
        grid_.describe(grid_.rank_of({me_.tp, r, me_.pp})), worst * 1e3, median * 1e3, steps);
}

}  // namespace dtrain
