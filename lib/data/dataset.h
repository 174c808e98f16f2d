// In-memory data sets: a dense float feature matrix and integer labels. Everything fits in RAM
// (Fashion-MNIST is 60000 x 784 floats = 180 MiB); loaders validate input and throw UserError
// naming the file (and line, for CSV) on anything malformed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"

namespace dtrain {

struct Dataset {
  int64_t rows = 0;
  int64_t features = 0;
  std::vector<float> x;     // rows * features, row-major
  std::vector<int32_t> y;   // rows, each in [0, num_classes)
  int64_t num_classes = 0;  // max label + 1 over train (and test) as loaded

  const float* row(int64_t i) const { return x.data() + i * features; }
};

// Per-feature affine normalisation x' = (x - shift) * scale, fitted on the training set and
// applied to every split (and to predict inputs) so they share statistics.
struct Normalizer {
  std::string method = "none";  // none | scale | standardize (resolved, never "auto")
  std::vector<float> shift;     // per feature (empty for none)
  std::vector<float> scale;
  void apply(Dataset& d) const;
  void apply_rows(float* x, int64_t rows, int64_t features) const;
};

struct DataSplits {
  Dataset train;
  Dataset test;  // rows == 0 when there is no test set
  Normalizer normalizer;
};

// Loads train (and test, or a held-out test_fraction) per `cfg.data`, fits the normaliser on
// train and applies it. `seed` is the run seed (synthetic data and the held-out split use it).
DataSplits load_data(const DataConfig& cfg, int64_t seed);

// Format loaders (raw, unnormalised). Exposed for tests.
Dataset load_idx(const std::string& images_path, const std::string& labels_path);
Dataset load_csv(const std::string& path, const CsvOptions& opts);
// Parses CSV of features only (no label column): predict inputs. Header per opts.header.
std::vector<float> load_csv_features(const std::string& path, const CsvOptions& opts,
                                     int64_t expected_features, int64_t* rows_out);
Dataset make_synthetic(const SyntheticOptions& opts, int64_t seed);

// Reads a whole file, gunzipping when it starts with the gzip magic. UserError when missing or
// corrupt.
std::string read_maybe_gzip(const std::string& path);

}  // namespace dtrain
