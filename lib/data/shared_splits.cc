#include "data/shared_splits.h"

namespace dtrain {

std::shared_ptr<const DataSplits> SharedSplits::get() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!tried_) {
    tried_ = true;
    try {
      splits_ = std::make_shared<const DataSplits>(load_data(cfg_, seed_));
    } catch (...) {
      error_ = std::current_exception();
    }
  }
  if (error_) std::rethrow_exception(error_);
  return splits_;
}

}  // namespace dtrain
