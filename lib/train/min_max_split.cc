#include "train/min_max_split.h"

#include <bit>
#include <cstdint>

#include "util/check.h"

namespace dtrain {
namespace {

// Prefix sums of the costs: a part [a, b) costs prefix[b] - prefix[a].
struct Prefix {
  std::vector<double> p;
  double seg(int a, int b) const { return p[static_cast<size_t>(b)] - p[static_cast<size_t>(a)]; }
};

// Whether [0, b) splits into at most `parts` parts of cost <= limit each: greedy, each part as
// long as it can be (part costs grow with the part, so the fewest parts come first this way).
bool fits(const Prefix& pre, int b, int parts, double limit) {
  int used = 0;
  for (int a = 0; a < b;) {
    if (pre.seg(a, a + 1) > limit || ++used > parts) return false;
    int e = a + 1;
    while (e < b && pre.seg(a, e + 1) <= limit) ++e;
    a = e;
  }
  return true;
}

// The smallest largest-part cost over splits of [0, b) into `parts` non-empty parts (b >= parts):
// a bisection over the bit patterns of non-negative doubles, which order as their values, so
// the result is the exact double the dynamic programme reaches.
double best_limit(const Prefix& pre, int b, int parts) {
  uint64_t lo = 0, hi = std::bit_cast<uint64_t>(pre.seg(0, b));  // one part: always fits
  if (fits(pre, b, parts, 0.0)) return 0.0;
  while (hi - lo > 1) {  // fits(hi), !fits(lo)
    const uint64_t mid = lo + (hi - lo) / 2;
    (fits(pre, b, parts, std::bit_cast<double>(mid)) ? hi : lo) = mid;
  }
  return std::bit_cast<double>(hi);
}

}  // namespace

std::vector<int> min_max_split(const std::vector<double>& cost, int parts) {
  const int n = static_cast<int>(cost.size());
  DT_CHECK_GE(parts, 1);
  DT_CHECK_LE(parts, n);
  Prefix pre;
  pre.p.assign(static_cast<size_t>(n) + 1, 0.0);
  for (int i = 0; i < n; ++i) {
    DT_CHECK_GE(cost[static_cast<size_t>(i)], 0.0);
    pre.p[static_cast<size_t>(i) + 1] =
        pre.p[static_cast<size_t>(i)] + cost[static_cast<size_t>(i)];
  }
  // From the last part back: prefix [0, b) in s parts reaches its own optimum `limit`; its last
  // part starts at the smallest a that keeps it within the limit. Every a from there up to the
  // largest whose prefix [0, a) still fits s - 1 parts within the limit is optimal (part costs
  // shrink as a grows, the prefix's optimum grows), so the smallest is one (at least s - 1:
  // every earlier part holds a block).
  std::vector<int> cut(static_cast<size_t>(parts), 0);
  int b = n;
  for (int s = parts; s >= 2; --s) {
    const double limit = best_limit(pre, b, s);
    int a = s - 1;
    while (pre.seg(a, b) > limit) ++a;
    DT_CHECK_LT(a, b);
    cut[static_cast<size_t>(s) - 1] = a;
    b = a;
  }
  return cut;
}

}  // namespace dtrain
