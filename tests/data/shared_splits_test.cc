// SharedSplits (data/shared_splits.h): one load for every in-process rank, its error for all.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "data/shared_splits.h"
#include "util/check.h"

namespace dtrain {
namespace {

TEST_CASE("shared splits: every rank thread gets the one copy, loaded once") {
  DataConfig cfg;
  cfg.format = DataFormat::kSynthetic;
  cfg.synthetic.samples = 500;
  cfg.synthetic.features = 8;
  SharedSplits shared(cfg, 3);
  std::vector<std::shared_ptr<const DataSplits>> got(4);
  std::vector<std::thread> ranks;
  for (size_t r = 0; r < got.size(); ++r) ranks.emplace_back([&, r] { got[r] = shared.get(); });
  for (std::thread& t : ranks) t.join();
  for (const auto& g : got) CHECK(g.get() == got[0].get());
  // the same data each rank loaded for itself
  const DataSplits own = load_data(cfg, 3);
  CHECK(got[0]->train.rows == own.train.rows);
  CHECK(got[0]->train.x == own.train.x);
  CHECK(got[0]->test.y == own.test.y);
}

TEST_CASE("shared splits: a load that fails fails every rank with its error") {
  DataConfig cfg;
  cfg.format = DataFormat::kIdx;
  cfg.train.images = "/nonexistent/images";
  cfg.train.labels = "/nonexistent/labels";
  SharedSplits shared(cfg, 1);
  std::string first;
  try {
    shared.get();
  } catch (const UserError& e) {
    first = e.what();
  }
  REQUIRE_FALSE(first.empty());
  CHECK_THROWS_WITH_AS(shared.get(), first.c_str(), UserError);  // (not loaded again)
}

}  // namespace
}  // namespace dtrain
