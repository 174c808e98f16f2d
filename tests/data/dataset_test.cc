// Synthetic generator, load_data (splits, class count, format dispatch) and the Normalizer.
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "data/dataset.h"
#include "test_util.h"
#include "user_error.h"
#include "util/check.h"

namespace dtrain {
namespace {

using testing::TempDir;
using testing::user_error;

namespace fs = std::filesystem;

// Accuracy of a nearest-class-mean classifier fitted on `train` and scored on `test`: a cheap
// stand-in for "a small MLP can learn this".
double nearest_mean_accuracy(const Dataset& train, const Dataset& test) {
  const int64_t k = train.num_classes, f = train.features;
  std::vector<double> mean(k * f, 0.0);
  std::vector<int64_t> count(k, 0);
  for (int64_t i = 0; i < train.rows; ++i) {
    ++count[train.y[i]];
    for (int64_t j = 0; j < f; ++j) mean[train.y[i] * f + j] += train.row(i)[j];
  }
  for (int64_t c = 0; c < k; ++c) {
    for (int64_t j = 0; j < f; ++j) mean[c * f + j] /= std::max<int64_t>(count[c], 1);
  }
  int64_t correct = 0;
  for (int64_t i = 0; i < test.rows; ++i) {
    int64_t best = 0;
    double best_d = 1e300;
    for (int64_t c = 0; c < k; ++c) {
      double d = 0;
      for (int64_t j = 0; j < f; ++j) {
        const double e = test.row(i)[j] - mean[c * f + j];
        d += e * e;
      }
      if (d < best_d) best_d = d, best = c;
    }
    correct += best == test.y[i];
  }
  return static_cast<double>(correct) / static_cast<double>(test.rows);
}

std::vector<int64_t> class_counts(const Dataset& d) {
  std::vector<int64_t> c(d.num_classes, 0);
  for (int32_t y : d.y) ++c[y];
  return c;
}

TEST_CASE("synthetic: deterministic from the seed, balanced, shuffled") {
  SyntheticOptions o;  // defaults: 10000 x 32, 4 classes, noise 0.5
  const Dataset a = make_synthetic(o, 42), b = make_synthetic(o, 42), c = make_synthetic(o, 43);
  CHECK(a.rows == 10000);
  CHECK(a.features == 32);
  CHECK(a.num_classes == 4);
  CHECK(a.x.size() == 10000u * 32u);
  CHECK(a.x == b.x);
  CHECK(a.y == b.y);
  CHECK(a.x != c.x);
  CHECK(a.y != c.y);
  CHECK(class_counts(a) == std::vector<int64_t>{2500, 2500, 2500, 2500});
  int64_t in_cycle = 0;  // labels are not left in the i % classes order
  for (int64_t i = 0; i < a.rows; ++i) in_cycle += a.y[i] == i % 4;
  CHECK(in_cycle < 5000);

  o.samples = 10;
  o.classes = 3;
  const Dataset small = make_synthetic(o, 1);
  CHECK(class_counts(small) == std::vector<int64_t>{4, 3, 3});

  // An explicit synthetic seed overrides the run seed.
  SyntheticOptions fixed;
  fixed.seed = 7;
  CHECK(make_synthetic(fixed, 1).x == make_synthetic(SyntheticOptions{}, 7).x);
  CHECK(make_synthetic(fixed, 1).x == make_synthetic(fixed, 2).x);
}

TEST_CASE("synthetic: noise around class centres, learnable") {
  SyntheticOptions o;
  const Dataset d = make_synthetic(o, 5);
  // Within-class spread per feature is the noise std-dev (0.5).
  std::vector<double> sum(d.features, 0.0), sq(d.features, 0.0);
  int64_t n0 = 0;
  for (int64_t i = 0; i < d.rows; ++i) {
    if (d.y[i] != 0) continue;
    ++n0;
    for (int64_t j = 0; j < d.features; ++j) {
      sum[j] += d.row(i)[j];
      sq[j] += double(d.row(i)[j]) * d.row(i)[j];
    }
  }
  double mean_sd = 0;
  for (int64_t j = 0; j < d.features; ++j) {
    const double m = sum[j] / n0;
    mean_sd += std::sqrt(sq[j] / n0 - m * m) / d.features;
  }
  CHECK(mean_sd == doctest::Approx(0.5).epsilon(0.05));

  DataConfig cfg;
  cfg.format = DataFormat::kSynthetic;
  const DataSplits s = load_data(cfg, 5);
  CHECK(nearest_mean_accuracy(s.train, s.test) > 0.9);  // chance is 0.25

  o.noise = -1;
  CHECK(user_error([&] { make_synthetic(o, 1); }).find("noise") != std::string::npos);
  o.noise = 0.5;
  o.samples = 0;
  CHECK(user_error([&] { make_synthetic(o, 1); }).find("samples") != std::string::npos);
  o.samples = int64_t{1} << 40;
  CHECK(user_error([&] { make_synthetic(o, 1); }).find("too large") != std::string::npos);
}

TEST_CASE("load_data: synthetic held-out split and standardize") {
  DataConfig cfg;
  cfg.format = DataFormat::kSynthetic;
  cfg.normalize = Normalize::kNone;
  const DataSplits raw = load_data(cfg, 11);
  CHECK(raw.train.rows == 8000);  // default test_fraction 0.2 for synthetic
  CHECK(raw.test.rows == 2000);
  CHECK(raw.train.num_classes == 4);
  CHECK(raw.test.num_classes == 4);
  CHECK(raw.normalizer.method == Normalize::kNone);
  CHECK(raw.normalizer.shift.empty());
  // The split is a partition of the generated rows.
  const Dataset all = make_synthetic(cfg.synthetic, 11);
  std::multiset<float> first_all, first_split;
  for (int64_t i = 0; i < all.rows; ++i) first_all.insert(all.row(i)[0]);
  for (int64_t i = 0; i < raw.train.rows; ++i) first_split.insert(raw.train.row(i)[0]);
  for (int64_t i = 0; i < raw.test.rows; ++i) first_split.insert(raw.test.row(i)[0]);
  CHECK(first_all == first_split);

  cfg.normalize = Normalize::kAuto;  // standardize for synthetic
  const DataSplits s = load_data(cfg, 11);
  CHECK(s.normalizer.method == Normalize::kStandardize);
  REQUIRE(s.normalizer.shift.size() == 32);
  for (int64_t j = 0; j < 32; ++j) {
    double m = 0, v = 0;
    for (int64_t i = 0; i < raw.train.rows; ++i) m += raw.train.row(i)[j];
    m /= raw.train.rows;
    for (int64_t i = 0; i < raw.train.rows; ++i) {
      v += (raw.train.row(i)[j] - m) * (raw.train.row(i)[j] - m);
    }
    const double sd = std::sqrt(v / raw.train.rows);
    CHECK(s.normalizer.shift[j] == doctest::Approx(m).epsilon(1e-5));
    CHECK(s.normalizer.scale[j] == doctest::Approx(1.0 / sd).epsilon(1e-5));
    double nm = 0, nv = 0;
    for (int64_t i = 0; i < s.train.rows; ++i) nm += s.train.row(i)[j];
    nm /= s.train.rows;
    for (int64_t i = 0; i < s.train.rows; ++i) nv += std::pow(s.train.row(i)[j] - nm, 2);
    CHECK(std::abs(nm) < 1e-4);
    CHECK(std::sqrt(nv / s.train.rows) == doctest::Approx(1.0).epsilon(1e-4));
  }
  // The test split uses the train statistics, exactly.
  for (int64_t i = 0; i < 50; ++i) {
    for (int64_t j = 0; j < 32; ++j) {
      CHECK(s.test.row(i)[j] ==
            (raw.test.row(i)[j] - s.normalizer.shift[j]) * s.normalizer.scale[j]);
    }
  }

  // Different seed, different split and data; same seed, same result.
  CHECK(load_data(cfg, 11).train.x == s.train.x);
  CHECK(load_data(cfg, 12).train.x != s.train.x);
  cfg.test_fraction = 0.5;
  CHECK(load_data(cfg, 11).test.rows == 5000);
  cfg.test_fraction = 0;
  CHECK(load_data(cfg, 11).test.rows == 0);
  CHECK(load_data(cfg, 11).train.rows == 10000);
}

TEST_CASE("load_data: csv scale uses train min/max, test shares them") {
  TempDir t;
  DataConfig cfg;
  cfg.format = DataFormat::kCsv;
  cfg.normalize = Normalize::kScale;
  // Feature a spans 0..4, b is constant 7, c spans -2..2.
  cfg.train.path = {t.write("train.csv", "a,b,c,y\n0,7,-2,0\n4,7,2,1\n2,7,0,1\n")};
  cfg.test.path = {t.write("test.csv", "a,b,c,y\n8,9,1,4\n")};
  const DataSplits s = load_data(cfg, 1);
  CHECK(s.normalizer.method == Normalize::kScale);
  CHECK(s.normalizer.shift == std::vector<float>{0, 7, -2});
  CHECK(s.normalizer.scale == std::vector<float>{0.25f, 1.0f, 0.25f});
  CHECK(s.train.x == std::vector<float>{0, 0, 0, 1, 0, 1, 0.5f, 0, 0.5f});
  CHECK(s.test.x == std::vector<float>{2, 2, 0.75f});  // outside 0..1: train statistics
  // Class count over both splits.
  CHECK(s.train.num_classes == 5);
  CHECK(s.test.num_classes == 5);
  // Predict inputs get the same map.
  std::vector<float> p = {4, 8, 2};
  s.normalizer.apply_rows(p.data(), 1, 3);
  CHECK(p == std::vector<float>{1, 1, 1});
  // A range wider than float's largest value (-2e38..2e38) still maps into 0..1.
  DataConfig wide = cfg;
  wide.train.path = {t.write("wide.csv", "a,y\n2e38,0\n-2e38,1\n0,1\n")};
  wide.test.path.clear();
  const DataSplits w = load_data(wide, 1);
  REQUIRE(w.train.x.size() == 3);
  CHECK(w.train.x[0] == doctest::Approx(1.0));
  CHECK(w.train.x[1] == doctest::Approx(0.0));
  CHECK(w.train.x[2] == doctest::Approx(0.5));

  cfg.normalize = Normalize::kAuto;  // standardize for csv
  const DataSplits st = load_data(cfg, 1);
  CHECK(st.normalizer.method == Normalize::kStandardize);
  CHECK(st.normalizer.shift[0] == doctest::Approx(2.0));
  CHECK(st.normalizer.scale[0] == doctest::Approx(1.0 / std::sqrt(8.0 / 3.0)));
  CHECK(st.normalizer.shift[1] == 7.0f);  // constant feature: centred only
  CHECK(st.normalizer.scale[1] == 1.0f);

  cfg.normalize = Normalize::kNone;
  const DataSplits none = load_data(cfg, 1);
  CHECK(none.train.x == load_csv(cfg.train.path[0], cfg.csv).x);
}

TEST_CASE("load_data: features of tiny magnitude are normalised like any other, never to NaN") {
  TempDir t;
  DataConfig cfg;
  cfg.format = DataFormat::kCsv;
  cfg.test_fraction = 0;
  // Values near 1e-13 are standardised (an absolute 1e-12 threshold left them as they were, and
  // nothing could be learned from them); a range below float's smallest normal, under scale, is
  // taken as constant (its inverse overflowed to inf and 0 * inf made every value NaN).
  cfg.train.path = {t.write("tiny.csv", "a,b,y\n1e-13,0,0\n-1e-13,1e-39,1\n3e-13,0,1\n")};
  cfg.normalize = Normalize::kStandardize;
  const DataSplits st = load_data(cfg, 1);
  CHECK(st.normalizer.scale[0] > 1e12f);
  for (float v : st.train.x) CHECK(std::isfinite(v));
  CHECK(st.train.x[0] == doctest::Approx(0.0).epsilon(1e-5));
  CHECK(std::abs(st.train.x[2]) == doctest::Approx(1.2247).epsilon(1e-3));  // -2/sqrt(8/3)
  cfg.normalize = Normalize::kScale;
  const DataSplits sc = load_data(cfg, 1);
  for (float v : sc.train.x) CHECK(std::isfinite(v));
  CHECK(sc.normalizer.scale[1] == 1.0f);
  CHECK(sc.train.x[0] == doctest::Approx(0.5));
}

TEST_CASE("load_data: csv held-out split and test/train mismatch") {
  TempDir t;
  std::string text = "x1,x2,y\n";
  for (int i = 0; i < 100; ++i) {
    text += std::to_string(i) + "," + std::to_string(i * 2) + "," + std::to_string(i % 3) + "\n";
  }
  DataConfig cfg;
  cfg.format = DataFormat::kCsv;
  cfg.normalize = Normalize::kNone;
  cfg.train.path = {t.write("train.csv", text)};
  const DataSplits no_split = load_data(cfg, 3);  // default fraction 0 for csv
  CHECK(no_split.train.rows == 100);
  CHECK(no_split.test.rows == 0);
  CHECK(no_split.test.features == 2);

  cfg.test_fraction = 0.25;
  const DataSplits a = load_data(cfg, 3), b = load_data(cfg, 3), c = load_data(cfg, 4);
  CHECK(a.train.rows == 75);
  CHECK(a.test.rows == 25);
  CHECK(a.test.x == b.test.x);
  CHECK(a.test.x != c.test.x);
  // Disjoint, covering, each in file order.
  std::vector<float> ids;
  for (int64_t i = 0; i < a.train.rows; ++i) ids.push_back(a.train.row(i)[0]);
  CHECK(std::is_sorted(ids.begin(), ids.end()));
  for (int64_t i = 0; i < a.test.rows; ++i) ids.push_back(a.test.row(i)[0]);
  std::sort(ids.begin(), ids.end());
  for (int i = 0; i < 100; ++i) CHECK(ids[i] == static_cast<float>(i));
  for (int64_t i = 0; i < a.test.rows; ++i) {
    CHECK(a.test.y[i] == static_cast<int32_t>(a.test.row(i)[0]) % 3);
    CHECK(a.test.row(i)[1] == 2 * a.test.row(i)[0]);
  }

  // A fraction asked for that rounds to no row: refused (no test set, no evaluation, before).
  cfg.test_fraction = 0.001;
  CHECK(user_error([&] { load_data(cfg, 3); }) ==
        "data.test_fraction 0.001 of the 100 samples holds out none: use a larger fraction, or 0 "
        "for no test set");
  cfg.test_fraction = 1.5;
  CHECK(user_error([&] { load_data(cfg, 3); }).find("test_fraction") != std::string::npos);
  cfg.test_fraction = -1;
  // A test file whose header names the columns in another order: refused (evaluated with
  // swapped features before).
  cfg.test.path = {t.write("swapped.csv", "x2,x1,y\n2,1,0\n")};
  CHECK(user_error([&] {
          load_data(cfg, 3);
        }).find("names its feature columns x2, x1, the training data's are x1, x2") !=
        std::string::npos);
  cfg.test.path = {t.write("test.csv", "x1,y\n1,0\n")};
  const std::string msg = user_error([&] { load_data(cfg, 3); });
  CHECK(msg.find(cfg.test.path[0]) != std::string::npos);
  CHECK(msg.find("1 features") != std::string::npos);
}

TEST_CASE("load_data: idx auto scale divides by 255") {
  TempDir t;
  std::string img("\0\0\x08\x03\0\0\0\x02\0\0\0\x01\0\0\0\x02", 16);
  img += std::string("\x00\xff\x33\x66", 4);
  std::string lab("\0\0\x08\x01\0\0\0\x02\x01\x00", 10);
  DataConfig cfg;  // format idx, normalize auto
  cfg.train.images = t.write("img", img);
  cfg.train.labels = t.write("lab", lab);
  const DataSplits s = load_data(cfg, 1);
  CHECK(s.normalizer.method == Normalize::kScale);
  CHECK(s.normalizer.shift == std::vector<float>{0, 0});
  CHECK(s.normalizer.scale == std::vector<float>{1 / 255.0f, 1 / 255.0f});
  CHECK(s.train.x[0] == 0.0f);
  CHECK(s.train.x[1] == doctest::Approx(1.0f));
  CHECK(s.train.x[2] == doctest::Approx(0.2f));
  CHECK(s.test.rows == 0);  // default fraction 0 for idx
  CHECK(s.train.num_classes == 2);

  DataConfig missing;
  CHECK(user_error([&] { load_data(missing, 1); }).find("data.train.images") != std::string::npos);

  // Test images of the same size but another shape (2x1 against 1x2): refused, not reshaped.
  std::string tall("\0\0\x08\x03\0\0\0\x01\0\0\0\x02\0\0\0\x01", 16);
  tall += std::string("\x10\x20", 2);
  cfg.test.images = t.write("tall", tall);
  cfg.test.labels = t.write("tlab", std::string("\0\0\x08\x01\0\0\0\x01\x01", 9));
  const std::string msg = user_error([&] { load_data(cfg, 1); });
  CHECK_MESSAGE(msg.find("are [1, 2, 1], the training images [1, 1, 2]") != std::string::npos, msg);
}

TEST_CASE("load_data: real Fashion-MNIST with scale") {
  const std::string dir = "/usr/share/datasets/fashion-mnist/";
  if (!fs::exists(dir + "t10k-images-idx3-ubyte.gz")) return;
  DataConfig cfg;
  cfg.train.images = dir + "t10k-images-idx3-ubyte.gz";  // the small file keeps this fast
  cfg.train.labels = dir + "t10k-labels-idx1-ubyte.gz";
  cfg.test_fraction = 0.1;
  const DataSplits s = load_data(cfg, 42);
  CHECK(s.train.rows == 9000);
  CHECK(s.test.rows == 1000);
  CHECK(s.train.num_classes == 10);
  CHECK(*std::max_element(s.train.x.begin(), s.train.x.end()) == doctest::Approx(1.0f));
  CHECK(*std::min_element(s.test.x.begin(), s.test.x.end()) == 0.0f);
}

TEST_CASE("idle_ranks_warning counts replicas of stages x tensor ranks") {
  CHECK(idle_ranks_warning(4, 4, 1) == "");
  CHECK(idle_ranks_warning(3, 4, 1) ==
        "4 ranks share 3 training samples: 1 rank gets none and only waits for the others (use "
        "fewer ranks or more data)");
  CHECK(idle_ranks_warning(2, 8, 2, 2) == "");  // 2 replicas of 4 ranks, 2 samples: all busy
  CHECK(idle_ranks_warning(1, 8, 1, 2) ==
        "8 ranks (4 replicas of 2 tensor/pipeline ranks) share 1 training samples: 3 replicas "
        "get none and only wait for the others (use fewer ranks or more data)");
  CHECK(idle_ranks_warning(3, 8, 2) ==
        "8 ranks (4 pipeline replicas) share 3 training samples: 1 replica gets none and only "
        "waits for the others (use fewer ranks or more data)");
}

TEST_CASE("Normalizer: a JSON record that reads back exactly, and malformed ones refused") {
  Normalizer n;
  n.method = Normalize::kStandardize;
  n.shift = {1.3082f, -0.1916f, 1e-30f};
  n.scale = {1.3817f, 3.2783684f, 7e30f};
  const Normalizer back = Normalizer::from_json(n.to_json(), 3, "checkpoint 'c'");
  CHECK(back == n);  // every float bit for bit
  Normalizer none;
  CHECK(Normalizer::from_json(none.to_json(), 5, "c") == none);
  for (const std::string& bad :
       {std::string("{"), std::string(R"({"method": "zap", "shift": [], "scale": []})"),
        std::string(R"({"method": "auto", "shift": [1], "scale": [1]})"),
        std::string(R"({"method": "scale", "shift": [1, 2], "scale": [1, 2]})"),
        std::string(R"({"method": "scale", "shift": [1, 2, 3], "scale": "x"})")}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(Normalizer::from_json(bad, 3, "checkpoint 'c'"), UserError);
  }
}

TEST_CASE("split_overlap_warning: a test file that is also a training file, by any name") {
  // Trained and tested on one file without a word (CSV, IDX, and text through a glob).
  TempDir dir;
  const std::string a = dir.write("a.csv", "x,y\n1,0\n"), b = dir.write("b.csv", "x,y\n2,1\n");
  DataConfig c;
  c.format = DataFormat::kCsv;
  c.train.path = {a};
  c.test.path = {b};
  CHECK(split_overlap_warning(c) == "");
  c.test.path = {dir.path() + "/./a.csv"};
  CHECK(split_overlap_warning(c) ==
        "data.test: '" + dir.path() +
            "/./a.csv' is also a training file (data.train): the test figures "
            "are measured on data the model trains on");
  c.format = DataFormat::kText;
  c.train.path = {dir / "*.csv"};
  c.test.path = {b};
  CHECK(split_overlap_warning(c).starts_with("data.test: '" + b + "' is also a training file"));
  c.test.path = {dir / "none.csv"};
  CHECK(split_overlap_warning(c) == "");
  c.format = DataFormat::kIdx;
  c.train.images = a;
  c.test.images = a;
  CHECK(split_overlap_warning(c) != "");
  // Other test images with the training labels: said too (it was not, the images being apart).
  c.test.images = b;
  c.train.labels = dir.write("train-labels", "");
  c.test.labels = dir.write("test-labels", "");
  CHECK(split_overlap_warning(c) == "");
  c.test.labels = dir.path() + "/./train-labels";
  CHECK(split_overlap_warning(c).starts_with("data.test.labels '" + c.test.labels +
                                             "' is also the training labels file"));
}

}  // namespace
}  // namespace dtrain
