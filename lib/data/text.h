// Text data for language models (`data.format: text`): bytes are tokens (vocabulary 256).
//
// Files: `data.train.path` (and the optional `data.test.path`) is a file, a list of files or glob
// patterns. A list is read in the order given; a pattern's matches in byte order of their paths
// (so a run reads the same text on every machine); an entry that names an existing file is that
// file even if it contains glob characters. Each file is gunzipped when it starts with the gzip
// magic, whatever its name. The files' bytes are concatenated as they are (no separator).
//
// Splits: with no test files, the last `test_fraction` of the training bytes (rounded to whole
// bytes) is the validation split and the rest is the training split; test_fraction 0 means no
// validation set.
//
// Samples: a window is block_size + 1 consecutive bytes; a split of n bytes gives (n - 1) /
// block_size windows, window i starting at byte i * block_size (non-overlapping inputs: the last
// byte of one window is the first of the next; a tail shorter than a window is not used). Input
// positions are the window's bytes [0, block_size), targets its bytes [1, block_size + 1). Training
// and evaluation both use these windows, so the sampler, shuffling and rank slicing treat a window
// as one sample exactly as they treat an image.
//
// As a Dataset: kind SampleKind::kTokenWindow, one row per window, features = block_size + 1,
// tokens holding the split's bytes once (a window is a view at stride block_size), x and y EMPTY
// (a row carries its own targets), num_classes = 256. The sampler treats rows as it treats
// images; the batch gather (train/batch.h) takes a window's first block_size bytes as the float
// input and its last block_size as int32 targets.
//
// Errors are UserError, one line, naming the key and the file: a missing or unreadable file, a
// pattern that matches no file, an empty text, a split shorter than one window.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace dtrain {

inline constexpr int64_t kTextVocab = 256;

struct TextOptions {
  std::vector<std::string> train;  // data.train.path: files and/or glob patterns, >= 1 entry
  std::vector<std::string> test;   // data.test.path: same, empty = hold out test_fraction
  double test_fraction = 0.1;      // in [0, 1); only used without test files
  int64_t block_size = 0;          // model.block_size, >= 1
  // test_fraction is the format's default, not asked for: a held-out part too short for one
  // window then leaves no validation split, with a warning, instead of an error.
  bool default_fraction = false;
};

// The files `specs` name, in reading order (see above), each once: a file named again (a pattern
// matching a file also listed, two spellings of one path) is left out and, when `repeated` is
// given, added to it. `key` ("data.train.path") prefixes errors.
std::vector<std::string> expand_text_paths(const std::vector<std::string>& specs,
                                           const std::string& key,
                                           std::vector<std::string>* repeated = nullptr);

// The concatenated bytes of `files` (each gunzipped if it is gzip). UserError prefixed by `key`.
std::string read_text_files(const std::vector<std::string>& files, const std::string& key);

// Number of windows of block_size + 1 bytes at stride block_size in `n` bytes: (n - 1) / block_size
// (0 for n <= block_size).
int64_t text_window_count(int64_t n, int64_t block_size);

// The bytes the files hold once read, without reading them: a plain file's size, a gzip file's
// ISIZE trailer (its last member's length mod 2^32: at most the real length, so an estimate
// from it errs low). -1 when a file cannot be opened or a pattern matches nothing.
// `exact` (optional) is set false when a file is gzip (the trailer's length is only an estimate).
int64_t text_bytes_without_reading(const std::vector<std::string>& specs, bool* exact = nullptr);
// The exact bytes the files hold once read, gzip ones inflated and counted (their output not
// held; every member counted); -1 when a file cannot be opened or read, a pattern matches
// nothing, or the files take more than max_bytes on disk (decompressing them would take
// seconds). A corrupt, truncated or trailing-garbage gzip file: the loader's UserError, after
// "<key>: " (the config key that names the files).
int64_t text_bytes_by_decompressing(const std::vector<std::string>& specs, const std::string& key,
                                    int64_t max_bytes = int64_t{64} << 20);

// load_text's split of the n training bytes (without test files): the bytes held out for
// validation (0 when test files are given, or when the default test_fraction holds out less
// than a window: `no_split` then says so, for a warning). UserError as load_text's: an explicit
// fraction that holds out less than a window, a training split shorter than one.
struct TextSplit {
  int64_t held_out = 0;
  std::string no_split;
};
TextSplit plan_text_split(const TextOptions& opts, int64_t n, const std::string& train_desc);

// Refuses (UserError) a text file in a compression format dtrain does not read (by its first
// bytes), then, with the numbers, a text this process cannot hold once read, from the files'
// sizes before any is read (load_text and validate): its bytes read, and its tokens (2 bytes per
// byte of text). Unknown sizes pass (the reader names them).
void check_text_memory(const TextOptions& opts);

// load_text's refusals without reading the files (validate): a file in a compression format
// dtrain does not read (their first bytes), and from the files' sizes an empty
// text, a test or training split shorter than one window (gzip files counted by decompressing,
// text_bytes_by_decompressing; past its cap they are left to load_text, as is a file that cannot
// be read). UserError. Returns the training windows load_text would make (its
// train_rows_without_loading), or -1 when a size is unknown.
int64_t check_text_sizes(const TextOptions& opts);

// `bytes` as a Dataset of its windows (layout above).
Dataset text_windows(const std::string& bytes, int64_t block_size);

// The text options of `cfg.data` (its resolved test_fraction; defined in dataset.cc).
TextOptions text_options(const DataConfig& cfg);

// Reads, splits and windows the text per `opts`: train and test windows; normalizer none; test
// has 0 rows when test_fraction is 0 and no test files are given.
DataSplits load_text(const TextOptions& opts);

// For an evaluation only (dtrain eval): data.test.path's windows (opts.test not empty), without
// reading the training text, which it does not need; train holds no rows, only the windows'
// layout (features, vocabulary, kind) that the model's shape is read from.
DataSplits load_text_test_file(const TextOptions& opts);

}  // namespace dtrain
