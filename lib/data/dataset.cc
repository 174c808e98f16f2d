// load_data (format dispatch, held-out split, class count) and the Normalizer.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <zlib.h>
#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "data/text.h"
#include "tensor/tensor.h"
#include "util/check.h"
#include "util/fs.h"
#include "util/rng.h"
#include "util/strings.h"

namespace dtrain {
namespace {

constexpr uint64_t kHoldoutStream = 0x686f6c646f7574ULL;  // "holdout"

// Rows `idx` of `d`, in the order given.
Dataset take_rows(const Dataset& d, const std::vector<int64_t>& idx) {
  DT_CHECK(d.kind == SampleKind::kFeatures);  // (text holds out its tail, not a sample of rows)
  Dataset out;
  out.rows = static_cast<int64_t>(idx.size());
  out.features = d.features;
  out.num_classes = d.num_classes;
  out.kind = d.kind;
  out.sample = d.sample;
  out.columns = d.columns;
  out.label_column = d.label_column;
  out.x.resize(idx.size() * static_cast<size_t>(d.features));
  out.y.resize(idx.size());
  for (size_t i = 0; i < idx.size(); ++i) {
    std::copy_n(d.row(idx[i]), d.features, out.x.data() + i * d.features);
    out.y[i] = d.y[idx[i]];
  }
  return out;
}

// Splits off round(fraction * rows) rows, chosen by a Fisher-Yates shuffle seeded from `seed`, as
// the test set. Both parts keep the original row order. At least one training row remains.
void hold_out(Dataset& train, Dataset& test, double fraction, int64_t seed) {
  const int64_t n = train.rows;
  const int64_t n_test = held_out_rows(n, fraction);
  if (n_test <= 0) return;
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  Rng rng(static_cast<uint64_t>(seed), kHoldoutStream);
  for (int64_t i = n - 1; i > 0; --i) {
    std::swap(perm[i], perm[rng.below(static_cast<uint64_t>(i) + 1)]);
  }
  std::vector<int64_t> test_idx(perm.begin(), perm.begin() + n_test);
  std::vector<int64_t> train_idx(perm.begin() + n_test, perm.end());
  std::sort(test_idx.begin(), test_idx.end());
  std::sort(train_idx.begin(), train_idx.end());
  test = take_rows(train, test_idx);
  train = take_rows(train, train_idx);
}

int64_t max_label_plus_one(const Dataset& d) {
  int32_t m = -1;
  for (int32_t y : d.y) m = std::max(m, y);
  return m + 1;
}

Normalizer fit_normalizer(Normalize method, DataFormat format, const Dataset& train) {
  Normalizer nz;
  nz.method = method;
  if (method == Normalize::kNone) return nz;
  const auto f = static_cast<size_t>(train.features);
  nz.shift.assign(f, 0.0f);
  nz.scale.assign(f, 1.0f);
  if (method == Normalize::kScale && format == DataFormat::kIdx) {
    // Pixels are bytes: a fixed 0..255 -> 0..1 map, independent of which values occur.
    nz.scale.assign(f, 1.0f / 255.0f);
    return nz;
  }
  if (method == Normalize::kScale) {
    std::vector<float> lo(train.row(0), train.row(0) + f), hi = lo;
    for (int64_t i = 1; i < train.rows; ++i) {
      const float* x = train.row(i);
      for (size_t j = 0; j < f; ++j) {
        lo[j] = std::min(lo[j], x[j]);
        hi[j] = std::max(hi[j], x[j]);
      }
    }
    for (size_t j = 0; j < f; ++j) {
      const double range = static_cast<double>(hi[j]) - lo[j];
      nz.shift[j] = lo[j];
      // (a range below float's smallest normal has no finite float inverse: taken as constant,
      // where 0 * inf made every value NaN)
      const auto inv = static_cast<float>(1.0 / range);
      nz.scale[j] = range > 0 && std::isfinite(inv) ? inv : 1.0f;
    }
    return nz;
  }
  DT_CHECK_MSG(method == Normalize::kStandardize, "normalize " << to_string(method));
  // Two passes in double: mean, then the population variance around it.
  std::vector<double> mean(f, 0.0), var(f, 0.0);
  for (int64_t i = 0; i < train.rows; ++i) {
    const float* x = train.row(i);
    for (size_t j = 0; j < f; ++j) mean[j] += x[j];
  }
  for (double& m : mean) m /= static_cast<double>(train.rows);
  for (int64_t i = 0; i < train.rows; ++i) {
    const float* x = train.row(i);
    for (size_t j = 0; j < f; ++j) {
      const double dlt = x[j] - mean[j];
      var[j] += dlt * dlt;
    }
  }
  for (size_t j = 0; j < f; ++j) {
    const double sd = std::sqrt(var[j] / static_cast<double>(train.rows));
    nz.shift[j] = static_cast<float>(mean[j]);
    // A (numerically) constant feature is only centred: dividing by ~0 would blow up noise. The
    // test is relative to the feature's own magnitude (an absolute 1e-12 left features of values
    // near 1e-13 unscaled), and the inverse must be a finite float.
    const auto inv = static_cast<float>(1.0 / sd);
    nz.scale[j] = sd > 1e-12 * std::abs(mean[j]) && sd > 0 && std::isfinite(inv) ? inv : 1.0f;
  }
  return nz;
}

}  // namespace

std::string Normalizer::to_json() const {
  return nlohmann::json{{"method", to_string(method)}, {"shift", shift}, {"scale", scale}}.dump();
}

std::string input_record_json(const Normalizer& n, const Dataset& train) {
  nlohmann::json j = nlohmann::json::parse(n.to_json());
  j["sample_shape"] = train.input_shape();
  j["columns"] = train.columns;
  if (train.label_column >= 0) j["label_column"] = train.label_column;
  return j.dump();
}

InputRecord input_record_from_json(const std::string& json, const std::string& what) {
  InputRecord r;
  try {
    const nlohmann::json j = nlohmann::json::parse(json);
    if (!j.is_object() || !j.contains("sample_shape")) return r;
    r.sample_shape = j.at("sample_shape").get<std::vector<int64_t>>();
    r.columns = j.value("columns", std::vector<std::string>{});
    r.label_column = j.value("label_column", int64_t{-1});
  } catch (const std::exception& e) {
    throw UserError(what + ": its input record is malformed (" + json_error_text(e.what()) + ")");
  }
  r.known = true;
  return r;
}

std::string input_layout_problem(const InputRecord& r, const Dataset& d, const std::string& whose) {
  if (!r.known) return "";
  const Shape got = d.input_shape();
  if (got != r.sample_shape)
    return fmt::format("{} samples are [{}], the model was trained on samples of [{}]", whose,
                       fmt::join(got, ", "), fmt::join(r.sample_shape, ", "));
  if (!r.columns.empty() && !d.columns.empty() && d.columns != r.columns)
    return fmt::format(
        "{} feature columns are {}, the model was trained on {}: a model reads its inputs by "
        "position",
        whose, shown_text(fmt::format("{}", fmt::join(d.columns, ", ")), 300),
        shown_text(fmt::format("{}", fmt::join(r.columns, ", ")), 300));
  if ((r.columns.empty() || d.columns.empty()) && r.label_column >= 0 && d.label_column >= 0 &&
      r.label_column != d.label_column)
    return fmt::format(
        "{} label is its column at index {} (as data.csv.label_column counts), the model was "
        "trained with the label at index {}",
        whose, d.label_column, r.label_column);
  return "";
}

Normalizer Normalizer::from_json(const std::string& json, int64_t features,
                                 const std::string& what) {
  Normalizer n;
  try {
    const nlohmann::json j = nlohmann::json::parse(json);
    const std::optional<Normalize> method =
        parse_enum<Normalize>(j.at("method").get<std::string>());
    if (!method) throw std::invalid_argument("unknown method");
    n.method = *method;
    n.shift = j.at("shift").get<std::vector<float>>();
    n.scale = j.at("scale").get<std::vector<float>>();
  } catch (const std::exception& e) {
    throw UserError(what + ": its normaliser record is malformed (" + json_error_text(e.what()) +
                    ")");
  }
  const auto f = static_cast<size_t>(features);
  const bool none = n.method == Normalize::kNone && n.shift.empty() && n.scale.empty();
  const auto finite = [](const std::vector<float>& v) {
    return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
  };
  if (n.method == Normalize::kAuto || (!none && (n.shift.size() != f || n.scale.size() != f)) ||
      !finite(n.shift) || !finite(n.scale))
    throw UserError(what + ": its normaliser record is not one for " + std::to_string(features) +
                    " features");
  return n;
}

void Normalizer::apply_rows(float* x, int64_t rows, int64_t features) const {
  if (method == Normalize::kNone) return;
  DT_CHECK_EQ(static_cast<int64_t>(shift.size()), features);
  DT_CHECK_EQ(static_cast<int64_t>(scale.size()), features);
  const float* sh = shift.data();
  const float* sc = scale.data();
  for (int64_t i = 0; i < rows; ++i) {
    float* r = x + i * features;
    for (int64_t j = 0; j < features; ++j) {
      const float v = (r[j] - sh[j]) * sc[j];
      // x - shift may pass float's range (2e38 - -2e38) though the result is in it: then in
      // double (only then, so every other value stays bitwise what it was).
      r[j] = std::isfinite(v) || !std::isfinite(r[j])
                 ? v
                 : static_cast<float>((static_cast<double>(r[j]) - sh[j]) * sc[j]);
    }
  }
}

void Normalizer::apply(Dataset& d) const {
  apply_rows(d.x.data(), d.rows, d.features);
}

int64_t held_out_rows(int64_t n, double fraction) {
  return std::max<int64_t>(
      0, std::min<int64_t>(std::llround(fraction * static_cast<double>(n)), n - 1));
}

double resolved_test_fraction(const DataConfig& cfg) {
  if (cfg.test_fraction >= 0) return cfg.test_fraction;
  return cfg.format == DataFormat::kSynthetic ? 0.2 : cfg.format == DataFormat::kText ? 0.1 : 0.0;
}

int64_t train_rows_without_loading(const DataConfig& cfg) {
  if (cfg.format == DataFormat::kText) {  // load_text's windows, from exact sizes
    bool exact = true;
    int64_t bytes = cfg.block_size > 0 ? text_bytes_without_reading(cfg.train.path, &exact) : -1;
    // gzip's trailer holds the size mod 2^32 of its last member only: counted by decompressing
    // (streamed, nothing held), so validate sizes the batch as run will.
    if (bytes >= 0 && !exact)
      bytes = text_bytes_by_decompressing(cfg.train.path, "data.train.path");
    if (bytes < 0) return -1;
    try {
      const TextSplit sp = plan_text_split(text_options(cfg), bytes, "the training text");
      return text_window_count(bytes - sp.held_out, cfg.block_size);
    } catch (const UserError&) {
      return -1;  // (check_text_sizes and load_text say what is wrong)
    }
  }
  int64_t n = -1;
  if (cfg.format == DataFormat::kSynthetic) n = cfg.synthetic.samples;
  if (cfg.format == DataFormat::kIdx) n = idx_label_count(cfg.train.labels);
  if (n < 0) return -1;
  return cfg.test.empty() ? n - held_out_rows(n, resolved_test_fraction(cfg)) : n;
}

std::string empty_test_split_problem(const DataConfig& cfg, int64_t n) {
  const double fraction = cfg.test_fraction;
  if (!cfg.test.empty() || !(fraction > 0) || held_out_rows(n, fraction) > 0) return "";
  return ::fmt::format(
      "data.test_fraction {} of the {} samples holds out none: use a larger fraction, or 0 for no "
      "test set",
      fraction, n);
}

int64_t test_rows_without_loading(const DataConfig& cfg) {
  const double fraction = resolved_test_fraction(cfg);
  if (cfg.test.empty() && fraction == 0.0) return 0;
  if (cfg.format == DataFormat::kText && cfg.block_size > 0) {  // load_text's split, from sizes
    const std::vector<std::string>& files = cfg.test.empty() ? cfg.train.path : cfg.test.path;
    bool exact = true;
    int64_t n = text_bytes_without_reading(files, &exact);
    // (gzip: a multi-member file's trailer holds its last member's size only)
    if (n >= 0 && !exact)
      n = text_bytes_by_decompressing(files,
                                      cfg.test.empty() ? "data.train.path" : "data.test.path");
    if (n < 0) return -1;
    return text_window_count(cfg.test.empty() ? std::llround(fraction * static_cast<double>(n)) : n,
                             cfg.block_size);
  }
  if (cfg.format == DataFormat::kIdx && !cfg.test.empty()) return idx_label_count(cfg.test.labels);
  int64_t n = -1;
  if (cfg.format == DataFormat::kSynthetic) n = cfg.synthetic.samples;
  if (cfg.format == DataFormat::kIdx) n = idx_label_count(cfg.train.labels);
  return n < 0 || !cfg.test.empty() ? -1 : held_out_rows(n, fraction);
}

Shape train_sample_shape_without_loading(const DataConfig& cfg) {
  switch (cfg.format) {
    case DataFormat::kSynthetic:
      return {cfg.synthetic.features};
    case DataFormat::kIdx:
      return idx_image_shape(cfg.train.images);
    case DataFormat::kText:
      return {cfg.block_size};
    default:
      return {};
  }
}

std::string idle_ranks_warning(int64_t train_rows, int64_t world_size, int64_t pipeline_stages,
                               int64_t tensor_ranks) {
  const int64_t S = std::max<int64_t>(1, pipeline_stages), T = std::max<int64_t>(1, tensor_ranks);
  const bool pipeline = S * T > 1;  // a replica is several ranks
  const int64_t replicas = world_size / (S * T);
  if (train_rows >= replicas) return "";
  const int64_t idle = replicas - train_rows;
  const char* verbs = idle == 1 ? " gets none and only waits" : " get none and only wait";
  std::string msg = std::to_string(world_size) + " ranks";
  if (pipeline)
    msg += " (" + std::to_string(replicas) +
           (T == 1 ? " pipeline replicas)"
                   : " replicas of " + std::to_string(S * T) + " tensor/pipeline ranks)");
  msg += " share " + std::to_string(train_rows) + " training samples: " + std::to_string(idle);
  msg += pipeline ? (idle == 1 ? " replica" : " replicas") : (idle == 1 ? " rank" : " ranks");
  return msg + verbs + " for the others (use fewer ranks or more data)";
}

Normalize resolved_normalize(const DataConfig& cfg) {
  if (cfg.normalize != Normalize::kAuto) return cfg.normalize;
  return cfg.format == DataFormat::kIdx ? Normalize::kScale : Normalize::kStandardize;
}

TextOptions text_options(const DataConfig& cfg) {
  return {cfg.train.path, cfg.test.path, resolved_test_fraction(cfg), cfg.block_size,
          cfg.test_fraction < 0};
}

namespace {

// One split's files of an idx or csv config, as they are (not normalised).
Dataset load_split(const DataConfig& cfg, const SplitFiles& files, const char* key) {
  if (cfg.format == DataFormat::kIdx) {
    if (files.images.empty() || files.labels.empty()) {
      throw UserError(std::string(key) + ".images and " + key +
                      ".labels are required for format idx");
    }
    return load_idx(files.images, files.labels);
  }
  if (files.path.size() != 1)
    throw UserError(std::string(key) + ".path: format csv reads exactly one file (got " +
                    std::to_string(files.path.size()) + ")");
  return load_csv(files.path[0], cfg.csv);
}

}  // namespace

bool training_files_present(const DataConfig& cfg) {
  const std::vector<std::string> files =
      cfg.format == DataFormat::kIdx ? std::vector<std::string>{cfg.train.images, cfg.train.labels}
                                     : cfg.train.path;
  return !files.empty() && std::all_of(files.begin(), files.end(), [](const std::string& f) {
    return !f.empty() && input_file_problem(f).empty();
  });
}

DataSplits load_test_files(const DataConfig& cfg) {
  DT_CHECK(!cfg.test.empty() && (cfg.format == DataFormat::kIdx || cfg.format == DataFormat::kCsv));
  DataSplits s;
  s.test = load_split(cfg, cfg.test, "data.test");
  s.test.num_classes = max_label_plus_one(s.test);
  // No training rows: the test set's layout, which the model's shape is read from.
  s.train.features = s.test.features;
  s.train.sample = s.test.sample;
  s.train.num_classes = s.test.num_classes;
  s.train.kind = s.test.kind;
  s.train.columns = s.test.columns;
  s.train.label_column = s.test.label_column;
  s.normalizer.method = Normalize::kNone;  // (the caller scales with the checkpoint's)
  return s;
}

uint32_t data_fingerprint(const Dataset& d) {
  uLong crc = crc32_z(0L, Z_NULL, 0);
  // (crc32_z takes a size_t length; given no buffer it returns the initial value, so an empty
  // part is skipped)
  const auto add = [&](const void* p, size_t n) {
    if (n > 0) crc = crc32_z(crc, static_cast<const Bytef*>(p), static_cast<z_size_t>(n));
  };
  const int64_t dims[2] = {d.rows, d.features};
  add(dims, sizeof dims);
  add(d.x.data(), d.x.size() * sizeof(float));
  add(d.y.data(), d.y.size() * sizeof(int32_t));
  add(d.tokens.data(), d.tokens.size());
  return static_cast<uint32_t>(crc);
}

std::string split_overlap_warning(const DataConfig& cfg) {
  if (cfg.test.empty() || cfg.format == DataFormat::kSynthetic) return "";
  std::vector<std::string> train, test;
  if (cfg.format == DataFormat::kIdx) {
    train = {cfg.train.images};
    test = {cfg.test.images};
    // Other images with the training labels (a copied line not edited): each test image scored
    // against a training image's label.
    if (!cfg.test.labels.empty() &&
        file_identity(cfg.train.images) != file_identity(cfg.test.images) &&
        file_identity(cfg.train.labels) == file_identity(cfg.test.labels))
      return ::fmt::format(
          "data.test.labels '{}' is also the training labels file (data.train.labels), while the "
          "test images are another file: the test figures score each test image against a "
          "training image's label",
          cfg.test.labels);
  } else if (cfg.format == DataFormat::kText) {
    try {  // (a pattern that matches nothing: the loader says so)
      train = expand_text_paths(cfg.train.path, "data.train.path");
      test = expand_text_paths(cfg.test.path, "data.test.path");
    } catch (const UserError&) {
      return "";
    }
  } else {
    train = cfg.train.path;
    test = cfg.test.path;
  }
  std::set<std::string> trained;
  for (const std::string& r : train) trained.insert(file_identity(r));
  for (const std::string& t : test)
    if (trained.count(file_identity(t)) != 0)
      return ::fmt::format(
          "data.test: '{}' is also a training file (data.train): the test figures are measured "
          "on data the model trains on",
          t);
  return "";
}

DataSplits load_data(const DataConfig& cfg, int64_t seed) {
  const DataFormat fmt = cfg.format;
  if (const std::string w = split_overlap_warning(cfg); !w.empty()) spdlog::warn("{}", w);
  if (fmt == DataFormat::kText) {
    // Token ids are not normalised; the split is the text's tail, not a seeded sample.
    return load_text(text_options(cfg));
  }
  const Normalize method = resolved_normalize(cfg);
  const double fraction = resolved_test_fraction(cfg);
  if (!(fraction >= 0 && fraction < 1)) {
    throw UserError("data.test_fraction must be in [0, 1), got " + std::to_string(fraction));
  }

  DataSplits s;
  auto load = [&](const SplitFiles& files, const char* key) { return load_split(cfg, files, key); };
  if (fmt == DataFormat::kSynthetic) {
    if (!cfg.test.empty()) {
      throw UserError("data.test is not used with format synthetic (use data.test_fraction)");
    }
    s.train = make_synthetic(cfg.synthetic, seed);
  } else {
    s.train = load(cfg.train, "data.train");
  }
  if (!cfg.test.empty()) {
    s.test = load(cfg.test, "data.test");
    if (s.test.features != s.train.features) {
      const std::string& name = fmt == DataFormat::kIdx ? cfg.test.images : cfg.test.path[0];
      throw UserError("test set '" + name + "' has " + std::to_string(s.test.features) +
                      " features but the training set has " + std::to_string(s.train.features));
    }
    if (const std::string why = csv_columns_problem(
            "test file '" + (cfg.test.path.empty() ? std::string() : cfg.test.path[0]) + "'",
            s.test.columns, s.train.columns);
        !why.empty())
      throw UserError(why);
    // Same size, other shape (2x8 against 4x4 images): a convolution would read it wrongly.
    if (fmt == DataFormat::kIdx && s.test.sample != s.train.sample)
      throw UserError("test images '" + cfg.test.images + "' are " + shape_str(s.test.sample) +
                      ", the training images " + shape_str(s.train.sample));
  } else if (fraction > 0) {
    // A fraction that rounds to no sample gives no test set: refused when the fraction was
    // asked for (data.test_fraction), said when it is the format's default.
    if (const std::string why = empty_test_split_problem(cfg, s.train.rows); !why.empty())
      throw UserError(why);
    if (const int64_t n = s.train.rows; held_out_rows(n, fraction) == 0)
      spdlog::warn(
          "data.test_fraction {} of the {} samples holds out none (the default for this format): "
          "no test set, no evaluation",
          fraction, n);
    hold_out(s.train, s.test, fraction, seed);
  }
  s.test.features = s.train.features;  // also for an empty test set, so shapes always agree
  s.test.sample = s.train.sample;

  const int64_t classes = std::max(max_label_plus_one(s.train), max_label_plus_one(s.test));
  s.train.num_classes = classes;
  s.test.num_classes = classes;

  s.normalizer = fit_normalizer(method, fmt, s.train);
  s.normalizer.apply(s.train);
  s.normalizer.apply(s.test);
  return s;
}

}  // namespace dtrain
