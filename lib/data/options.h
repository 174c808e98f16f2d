// What lib/data needs: its option structs and enums. lib/config reads them from YAML (key schema,
// documentation and checks live there); nothing in lib/data parses config text.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "util/enum_names.h"

namespace dtrain {

// text: bytes as tokens (data/text.h), for language models.
enum class DataFormat { kIdx, kCsv, kSynthetic, kText };
// auto: scale for idx, standardize for csv/synthetic. scale: idx divides by 255; csv/synthetic
// map each feature's train min..max to 0..1. standardize: (x - mean) / std per feature, train
// statistics. none: raw values.
enum class Normalize { kAuto, kScale, kStandardize, kNone };
// auto: a first row with any non-numeric cell is a header; true | false force it.
enum class CsvHeader { kAuto, kTrue, kFalse };

inline constexpr EnumName<DataFormat> kDataFormatNames[] = {{DataFormat::kIdx, "idx"},
                                                            {DataFormat::kCsv, "csv"},
                                                            {DataFormat::kSynthetic, "synthetic"},
                                                            {DataFormat::kText, "text"}};
inline constexpr EnumName<Normalize> kNormalizeNames[] = {{Normalize::kAuto, "auto"},
                                                          {Normalize::kScale, "scale"},
                                                          {Normalize::kStandardize, "standardize"},
                                                          {Normalize::kNone, "none"}};
inline constexpr EnumName<CsvHeader> kCsvHeaderNames[] = {
    {CsvHeader::kAuto, "auto"}, {CsvHeader::kTrue, "true"}, {CsvHeader::kFalse, "false"}};

constexpr std::span<const EnumName<DataFormat>> enum_names(DataFormat) {
  return kDataFormatNames;
}
constexpr std::span<const EnumName<Normalize>> enum_names(Normalize) {
  return kNormalizeNames;
}
constexpr std::span<const EnumName<CsvHeader>> enum_names(CsvHeader) {
  return kCsvHeaderNames;
}

// One split's files. idx: images + labels. csv: path, exactly one file. text: path, files and
// glob patterns (data/text.h).
struct SplitFiles {
  std::string images;
  std::string labels;
  std::vector<std::string> path;
  bool empty() const { return images.empty() && labels.empty() && path.empty(); }
};

struct CsvOptions {
  CsvHeader header = CsvHeader::kAuto;
  // Label column: a header name, or a 0-based index as text; "" means the last column.
  std::string label_column;
  char delimiter = ',';
  // How messages name the header setting (predict's input has its own option).
  std::string header_hint = "data.csv.header:";
};

struct SyntheticOptions {
  int64_t samples = 10000;  // total, split by data.test_fraction (default 0.2 for synthetic)
  int64_t features = 32;
  int64_t classes = 4;
  double noise = 0.5;  // std-dev of the Gaussian around each class centre (centres ~ N(0,1))
  int64_t seed = -1;   // -1: the top-level seed
};

struct DataConfig {
  DataFormat format = DataFormat::kIdx;
  SplitFiles train;
  SplitFiles test;  // optional: without it, test_fraction of train is held out
  // Fraction of the training data held out as the test set when `test` is not given. -1 means
  // the default: 0 for idx/csv (no test set), 0.2 for synthetic, 0.1 for text.
  double test_fraction = -1.0;
  // text: the window length T (a sample is T + 1 bytes). Not a key of its own: load_config sets
  // it from model.block_size, so lib/data needs nothing from lib/nn.
  int64_t block_size = 0;
  int64_t batch_size = 128;  // per rank
  int64_t eval_batch_size = 1000;
  bool shuffle = true;
  bool drop_last = false;  // drop the last short global batch of each epoch
  Normalize normalize = Normalize::kAuto;
  CsvOptions csv;
  SyntheticOptions synthetic;
};

}  // namespace dtrain
