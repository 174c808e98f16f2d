#include "data/sampler.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "util/check.h"
#include "util/rng.h"

namespace dtrain {

Sampler::Sampler(int64_t n, int64_t batch_per_rank, int world, int rank, bool shuffle,
                 bool drop_last, uint64_t seed)
    : n_(n),
      b_(batch_per_rank),
      world_(world),
      rank_(rank),
      shuffle_(shuffle),
      drop_last_(drop_last),
      seed_(seed) {
  DT_CHECK_GE(n, 0);
  DT_CHECK_GE(batch_per_rank, 1);
  DT_CHECK_GE(world, 1);
  DT_CHECK_GE(rank, 0);
  DT_CHECK_LT(rank, world);
}

int64_t Sampler::batches_per_epoch() const {
  const int64_t g = b_ * world_;
  return drop_last_ ? n_ / g : (n_ + g - 1) / g;
}

const std::vector<int64_t>& Sampler::permutation(int64_t epoch) {
  DT_CHECK_GE(epoch, 0);
  if (epoch == cached_epoch_) return perm_;
  perm_.resize(static_cast<size_t>(n_));
  std::iota(perm_.begin(), perm_.end(), int64_t{0});
  if (shuffle_) {
    Rng rng(seed_, static_cast<uint64_t>(epoch));
    for (int64_t i = n_ - 1; i > 0; --i) {
      std::swap(perm_[i], perm_[rng.below(static_cast<uint64_t>(i) + 1)]);
    }
  }
  cached_epoch_ = epoch;
  return perm_;
}

int64_t Sampler::global_batch_size(int64_t k) const {
  DT_CHECK_GE(k, 0);
  DT_CHECK_LT(k, batches_per_epoch());
  const int64_t g = b_ * world_;
  return std::min(g, n_ - k * g);
}

double Sampler::epoch_fraction(int64_t k) const {
  const int64_t g = b_ * world_, batches = batches_per_epoch();
  const int64_t items = drop_last_ ? batches * g : n_;  // what one epoch trains on
  if (items <= 0) return 0.0;
  return static_cast<double>(std::min(k * g, items)) / static_cast<double>(items);
}

std::vector<int64_t> Sampler::batch(int64_t epoch, int64_t k) {
  const int64_t size = global_batch_size(k);
  const std::vector<int64_t>& perm = permutation(epoch);
  const int64_t start = k * b_ * world_;
  int64_t begin, len;
  if (size == b_ * world_) {
    begin = start + rank_ * b_;
    len = b_;
  } else {
    // Short last batch: `world` contiguous parts, the first size % world one item longer.
    const int64_t base = size / world_, extra = size % world_;
    begin = start + rank_ * base + std::min<int64_t>(rank_, extra);
    len = base + (rank_ < extra ? 1 : 0);
  }
  return std::vector<int64_t>(perm.begin() + begin, perm.begin() + begin + len);
}

}  // namespace dtrain
