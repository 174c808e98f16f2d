#pragma once
// The data of one run, loaded once for all of its in-process ranks: each rank loaded its own
// copy (the same bytes: load_data depends on the config and the seed alone), so W ranks held W
// copies -- Fashion-MNIST's 0.2 GB per rank, a text's 4 bytes per byte then -- and read and
// decompressed the files W times.
#include <exception>
#include <memory>
#include <mutex>

#include "data/dataset.h"

namespace dtrain {

// Thread-safe. The first get() loads (the others wait for it); a load that throws throws the
// same exception to every caller, so every rank fails as it failed alone.
class SharedSplits {
 public:
  SharedSplits(const DataConfig& cfg, int64_t seed) : cfg_(cfg), seed_(seed) {}

  std::shared_ptr<const DataSplits> get();

 private:
  const DataConfig cfg_;
  const int64_t seed_;
  std::mutex mu_;
  bool tried_ = false;
  std::shared_ptr<const DataSplits> splits_;
  std::exception_ptr error_;
};

}  // namespace dtrain
