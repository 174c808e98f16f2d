// Distributed sampler. Per epoch a permutation of [0, n) derived only from (seed, epoch) (the
// identity when shuffle is off). Global batch k of size G = world * batch is the items
// [k*G, (k+1)*G) of that permutation; rank r takes the contiguous slice [r*b, (r+1)*b) of it.
// So W ranks with batch b see, together, exactly what one process with batch W*b sees.
// The last global batch of an epoch may be short (n % G != 0): with drop_last it is skipped;
// otherwise it is split into `world` contiguous slices whose sizes differ by at most one (a rank
// may get 0 items when fewer than `world` remain). Stateless apart from its arguments, so a
// resume needs only (epoch, batch index).
#pragma once

#include <cstdint>
#include <vector>

namespace dtrain {

class Sampler {
 public:
  Sampler(int64_t n, int64_t batch_per_rank, int world, int rank, bool shuffle, bool drop_last,
          uint64_t seed);

  // Number of global batches per epoch.
  int64_t batches_per_epoch() const;
  // Permutation for `epoch` (cached: recomputed only when the epoch changes).
  const std::vector<int64_t>& permutation(int64_t epoch);
  // This rank's item indices for global batch `k` of `epoch` (may be empty on a short batch).
  std::vector<int64_t> batch(int64_t epoch, int64_t k);
  // Items of global batch k across all ranks (what a single process with batch W*b would see).
  int64_t global_batch_size(int64_t k) const;
  // The fewest rows a rank holds of global batch k (a short batch is split as evenly as possible,
  // so the ranks' shares differ by at most one): the same answer on every rank.
  int64_t fewest_rows(int64_t k) const { return global_batch_size(k) / world_; }
  // The fraction of an epoch's items that global batches [0, k) hold (k <= batches_per_epoch()):
  // by items, not batches, so it does not depend on how the items are cut into batches (a short
  // last batch, gradient accumulation's smaller micro-batches).
  double epoch_fraction(int64_t k) const;

 private:
  int64_t n_, b_;
  int world_, rank_;
  bool shuffle_, drop_last_;
  uint64_t seed_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> perm_;
};

}  // namespace dtrain
