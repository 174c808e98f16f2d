// In-memory data sets: a dense float feature matrix and integer labels. Everything fits in RAM
// (Fashion-MNIST is 60000 x 784 floats = 180 MiB); loaders validate input and throw UserError
// naming the file (and line, for CSV) on anything malformed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/options.h"
#include "tensor/tensor.h"

namespace dtrain {

// What a row holds. kFeatures: a sample's features (in x), with its label in y. kTokenWindow:
// T + 1 consecutive token ids (features = T + 1; x and y empty): the input is the first T, the
// targets are the last T (each position predicts the next token). Windows are views of the
// split's bytes (tokens), at stride T: one byte per token held, not T + 1 floats per T bytes.
enum class SampleKind { kFeatures, kTokenWindow };

struct Dataset {
  int64_t rows = 0;
  int64_t features = 0;
  std::vector<float> x;  // rows * features, row-major (kFeatures)
  // kTokenWindow: the split's tokens, rows * (features - 1) + 1 of them (none without rows);
  // window i is tokens [i * T, i * T + T + 1).
  std::vector<uint8_t> tokens;
  std::vector<int32_t> y;   // rows, each in [0, num_classes) (kFeatures only)
  int64_t num_classes = 0;  // max label + 1 over train (and test) as loaded; the vocabulary
  SampleKind kind = SampleKind::kFeatures;
  // The shape of one model input when it is not flat: IDX images are [1, H, W] (one channel).
  // Empty: [input_features()].
  Shape sample;
  // CSV read with a header: its feature columns' names, in order (the label's left out); empty
  // without one. Files read for the same model must agree (a model reads columns by position).
  std::vector<std::string> columns;
  // CSV: the label's column in the file (0-based); -1 for other data.
  int64_t label_column = -1;

  const float* row(int64_t i) const { return x.data() + i * features; }  // kFeatures
  const uint8_t* window(int64_t i) const {  // kTokenWindow: features tokens
    return tokens.data() + i * (features - 1);
  }
  // Elements of one model input: the features, or the T input tokens of a window.
  int64_t input_features() const {
    return kind == SampleKind::kTokenWindow ? features - 1 : features;
  }
  Shape input_shape() const { return sample.empty() ? Shape{input_features()} : sample; }
  // Targets per row: 1 label, or T next tokens.
  int64_t targets_per_row() const { return kind == SampleKind::kTokenWindow ? features - 1 : 1; }
};

// Per-feature affine normalisation x' = (x - shift) * scale, fitted on the training set and
// applied to every split (and to predict inputs) so they share statistics.
struct Normalizer {
  Normalize method = Normalize::kNone;  // none | scale | standardize (resolved, never auto)
  std::vector<float> shift;             // per feature (empty for none)
  std::vector<float> scale;
  void apply(Dataset& d) const;
  void apply_rows(float* x, int64_t rows, int64_t features) const;
  bool operator==(const Normalizer&) const = default;
  // {"method", "shift", "scale"} (floats as the shortest decimals that read back exactly), for
  // checkpoints; from_json throws UserError naming `what` for a record that is not one for
  // `features` features.
  std::string to_json() const;
  static Normalizer from_json(const std::string& json, int64_t features, const std::string& what);
};

// A checkpoint's record of its model's inputs (CheckpointMeta::normalizer_json, "normalizer"): the
// normaliser's fields (Normalizer::to_json) and, since 2026-12-07, "sample_shape" (one input's
// shape, [F] or [C, H, W]), "columns" (the CSV training file's feature column names, [] without
// a header) and "label_column" (CSV: the label's 0-based column in the file). eval and predict from
// test files alone check their inputs' layout against it: a test set of another image shape with
// the same pixel count, or with its columns in another order, was evaluated without a word.
// Normalizer::from_json reads the same record (the extra fields ignored).
std::string input_record_json(const Normalizer& n, const Dataset& train);
struct InputRecord {
  bool known = false;  // false: a record written before these fields (nothing to check)
  std::vector<int64_t> sample_shape;
  std::vector<std::string> columns;
  int64_t label_column = -1;  // CSV: the label's column in the training file; -1 unknown
};
// The record's layout fields; UserError naming `what` when they are malformed.
InputRecord input_record_from_json(const std::string& json, const std::string& what);
// "" when `d` (whose: "data.test's", ...) is laid out as the record says its training data was
// (a record not `known`: nothing to check), else what differs: the sample shape; the feature
// columns' names where both have them (a model reads its inputs by position); where either has
// none, the label's column in the file (another data.csv.label_column, same feature count).
std::string input_layout_problem(const InputRecord& r, const Dataset& d, const std::string& whose);

struct DataSplits {
  Dataset train;
  Dataset test;  // rows == 0 when there is no test set
  Normalizer normalizer;
};

// A CRC-32 of a split's contents: its rows' values (after normalisation), labels and tokens,
// with the row count and width; the same data gives the same value on any machine. zlib's crc32,
// about 4 GB/s: 0.05 s for Fashion-MNIST's training set.
uint32_t data_fingerprint(const Dataset& d);

// The warning for a test file that is also a training file (the same file by any name; text:
// after expanding both lists), "" when the splits share none. load_data logs it; validate too.
std::string split_overlap_warning(const DataConfig& cfg);

// Whether every training file of an idx or csv config is a readable file (input_file_problem).
bool training_files_present(const DataConfig& cfg);

// An idx or csv config's test files alone (data.test required), not normalised (normalizer
// none: the caller scales them, with a checkpoint's normaliser); train holds no rows, only the
// test set's layout (features, sample shape, classes from the test labels, CSV columns). For
// dtrain eval where the training files are not.
DataSplits load_test_files(const DataConfig& cfg);

// Loads train (and test, or a held-out test_fraction) per `cfg.data`, fits the normaliser on
// train and applies it. `seed` is the run seed (synthetic data and the held-out split use it).
DataSplits load_data(const DataConfig& cfg, int64_t seed);
// data.normalize with `auto` resolved for the format: scale for idx, standardize otherwise
// (text is not normalised: its token ids pass as they are).
Normalize resolved_normalize(const DataConfig& cfg);

// Format loaders (raw, unnormalised). Exposed for tests.
Dataset load_idx(const std::string& images_path, const std::string& labels_path);
Dataset load_csv(const std::string& path, const CsvOptions& opts);
// Parses CSV of features only (no label column): predict inputs. Header per opts.header; a first
// row equal to `columns` (the training data's names) is a header in any case. When the file has
// a header and `columns` is not empty, the names must be those, in that order (UserError naming
// both).
std::vector<float> load_csv_features(const std::string& path, const CsvOptions& opts,
                                     int64_t expected_features, int64_t* rows_out,
                                     const std::vector<std::string>& columns = {});
// The same for CSV text read already (the standard input), named `name` in messages.
std::vector<float> load_csv_features_text(const std::string& name, std::string text,
                                          const CsvOptions& opts, int64_t expected_features,
                                          int64_t* rows_out,
                                          const std::vector<std::string>& columns = {});
// "" when `what` (a CSV file read with a header: its feature columns' names) agrees with the
// training data's names `train` (either empty: nothing to compare), else the message.
std::string csv_columns_problem(const std::string& what, const std::vector<std::string>& names,
                                const std::vector<std::string>& train);
// The item count in an unsigned-byte IDX labels file's header (magic 0x00000801), gzip or not,
// reading only the first 8 (decompressed) bytes; -1 when the file cannot be read or is not one.
int64_t idx_label_count(const std::string& labels_path);
// The largest label + 1 in an IDX labels file (read whole: one byte per sample), as load_idx
// counts classes; UserError as load_idx for a file that is not one (0 for no labels).
int64_t idx_label_classes(const std::string& labels_path);
// The image shape [1, rows, cols] in an IDX images file's header (magic 0x00000803), gzip or
// not, reading only its first 16 (decompressed) bytes; {} when it cannot be read or is not one
// (load_idx says what is wrong); UserError, as load_idx's, for images of 0 pixels or of more
// than INT32_MAX pixels.
Shape idx_image_shape(const std::string& images_path);
// What load_idx refuses from the files' headers and sizes alone (validate): a wrong magic, a file
// too short for its header, a header whose shape is not the (uncompressed) file's size, no
// images, image and label counts that differ. UserError.
void check_idx_headers(const std::string& images_path, const std::string& labels_path);
// What loading refuses of a test images file beside the training one, from the headers alone
// (validate): another pixel count, or the same count in another shape. UserError.
void check_idx_test_shape(const std::string& train_images, const std::string& test_images);
Dataset make_synthetic(const SyntheticOptions& opts, int64_t seed);
// make_synthetic's refusals (UserError) without generating anything: for validate.
void check_synthetic_options(const SyntheticOptions& opts);

// Test rows load_data holds out of `n` training rows for `fraction` (data.test_fraction, resolved):
// round(fraction * n), keeping at least one training row.
int64_t held_out_rows(int64_t n, double fraction);
// data.test_fraction with its format's default for -1 (synthetic 0.2, text 0.1, idx and csv 0).
double resolved_test_fraction(const DataConfig& cfg);

// The training set's sample count when it is known without reading the data: synthetic
// (data.synthetic.samples minus the held-out part) and IDX (the count in the labels file's 8-byte
// header, gzip or not, minus the held-out part); -1 for CSV or an unreadable IDX header (the
// loader then reports what is wrong).
int64_t train_rows_without_loading(const DataConfig& cfg);
// The same for the test set: 0 when there is none (no data.test and a test_fraction of 0), -1
// when only the data can tell (CSV, text).
int64_t test_rows_without_loading(const DataConfig& cfg);
// Why an explicit data.test_fraction of `n` samples (no data.test) is refused: it rounds to no
// test sample. "" when it holds some out, or is the format's default, or there is a data.test.
std::string empty_test_split_problem(const DataConfig& cfg, int64_t n);
// A training sample's input shape when it is known without reading the data: synthetic [F],
// IDX [1, rows, cols] (its images header), text [block_size] (token ids); {} for CSV or an
// unreadable header (the loader then reports what is wrong).
Shape train_sample_shape_without_loading(const DataConfig& cfg);

// "" when every data-parallel replica gets training samples; else a one-line warning that
// `world_size` ranks share `train_rows` samples and how many replicas get none (fewer samples
// than replicas: the sampler gives the extra replicas empty slices). A replica is
// `pipeline_stages` x `tensor_ranks` ranks (1 x 1: each rank is one).
std::string idle_ranks_warning(int64_t train_rows, int64_t world_size, int64_t pipeline_stages,
                               int64_t tensor_ranks = 1);

// Reads a whole file, gunzipping when it starts with the gzip magic. UserError when missing,
// in another compression format (refuse_unread_compression), corrupt, or larger (or inflating to
// more) than this process can allocate (available_memory_bytes), the last checked before reading.
std::string read_maybe_gzip(const std::string& path);
// The same for the standard input (predict --input -), read to its end, named `name` in
// messages.
std::string read_stdin_maybe_gzip(const std::string& name);
// The size read_maybe_gzip gives `bytes` (a whole file): as they are, or with the gzip magic what
// all its members inflate to, counted without holding the output (UserError as read_maybe_gzip's
// for a corrupt, truncated or trailing-garbage file).
int64_t size_once_read(const std::string& bytes, const std::string& path);

}  // namespace dtrain
