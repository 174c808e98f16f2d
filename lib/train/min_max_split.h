// Splitting a sequence of costs into contiguous parts so that the largest part's cost is as small
// as possible: the pipeline's `balanced` partition (train/pipeline.h's partition_stages).
#pragma once

#include <vector>

namespace dtrain {

// The first index of each of `parts` non-empty contiguous parts of cost[0..n) (so the result
// starts with 0 and is strictly increasing), minimising the largest part's sum. Costs are >= 0
// and parts <= n. Among the splits that reach the minimum, the one a dynamic programme over
// (parts, prefix length) finds when it keeps the smallest cut at each level: each prefix's own
// last part starts as early as it can while that prefix stays optimal. A part's cost is the
// difference of prefix sums, as the programme computes it, so the split is the same one.
// O(parts x n x 64): a bisection on the answer with a greedy check, per part, instead of the
// programme's O(parts x n^2) time and memory (30,000 layers over 256 stages took minutes).
std::vector<int> min_max_split(const std::vector<double>& cost, int parts);

}  // namespace dtrain
