// Text data: path expansion (files, lists, globs), reading (gzip by magic), the held-out split and
// the windows. See text.h for the contract.
#include "data/text.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "data/compression.h"
#include "util/check.h"
#include "util/fs.h"
#include "util/strings.h"
#include "util/warn_once.h"

namespace dtrain {

namespace fs = std::filesystem;
namespace {

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool has_glob_chars(const std::string& s) {
  return s.find_first_of("*?[") != std::string::npos;
}

// What a path that is not a regular file is, for messages.
std::string not_a_file_kind(const std::string& path) {
  std::error_code ec;
  switch (std::filesystem::status(path, ec).type()) {
    case std::filesystem::file_type::directory:
      return "a folder";
    case std::filesystem::file_type::fifo:
      return "a FIFO";
    case std::filesystem::file_type::character:
    case std::filesystem::file_type::block:
      return "a device";
    case std::filesystem::file_type::socket:
      return "a socket";
    case std::filesystem::file_type::not_found:
      return "a symbolic link to nothing";
    default:
      return "not a regular file";
  }
}

// The first folder glob(3) could not read while expanding, with its error (glob skips it and
// goes on: a pattern in an unreadable folder otherwise "matches no file", leaving the cause
// unsaid). Thread-local: glob's error callback takes no context, and ranks may be threads.
thread_local std::string t_glob_error;

int note_glob_error(const char* path, int err) {
  if (t_glob_error.empty()) t_glob_error = fmt::format("cannot read '{}': {}", path, strerror(err));
  return 0;  // (go on: the matches elsewhere stand)
}

// The regular files matching `pattern`, in byte order of their paths; the other matches are left
// out with a warning.
std::vector<std::string> glob_files(const std::string& pattern, const std::string& key) {
  glob_t g{};
  t_glob_error.clear();
  const int rc = ::glob(pattern.c_str(), GLOB_NOSORT, note_glob_error, &g);
  struct Freer {
    glob_t* g;
    ~Freer() { ::globfree(g); }
  } freer{&g};
  if (rc != 0 && rc != GLOB_NOMATCH) {
    throw UserError(key + ": cannot expand the pattern '" + pattern + "'");
  }
  std::vector<std::string> out, skipped;
  for (size_t i = 0; i < g.gl_pathc; ++i) {
    if (!is_regular_file(g.gl_pathv[i])) {
      skipped.push_back(fmt::format("'{}' ({})", g.gl_pathv[i], not_a_file_kind(g.gl_pathv[i])));
      continue;
    }
    // A match is an input file as a named one is (a /proc file would read without end).
    if (const std::string why = input_file_problem(g.gl_pathv[i]); !why.empty())
      throw UserError(key + ": '" + g.gl_pathv[i] + "' (matching '" + pattern + "') " + why);
    out.emplace_back(g.gl_pathv[i]);
  }
  std::sort(skipped.begin(), skipped.end());
  const std::string skipped_text = skipped.size() <= 3
                                       ? join(skipped, ", ")
                                       : fmt::format("{}, {}, {} and {} more", skipped[0],
                                                     skipped[1], skipped[2], skipped.size() - 3);
  if (out.empty())
    throw UserError(key + ": the pattern '" + pattern + "' matches no file" +
                    (skipped.empty() ? "" : ", only what is not one: " + skipped_text) +
                    (t_glob_error.empty() ? "" : " (" + t_glob_error + ")"));
  // (a named fifo or folder is refused: matched by a pattern, it is left out, said)
  if (!skipped.empty())
    warn_once("glob " + pattern,  // (once: the paths are expanded by each check and the load)
              fmt::format("{}: the pattern '{}' matches {} path(s) that are not regular files, "
                          "left out: {}",
                          key, pattern, skipped.size(), skipped_text));
  std::sort(out.begin(), out.end());
  return out;
}

// "'a'" or "'a' and 2 more files": the files an error is about.
std::string describe(const std::vector<std::string>& files) {
  std::string s = "'" + files.front() + "'";
  if (files.size() > 1) {
    const size_t more = files.size() - 1;
    s += " and " + std::to_string(more) + (more == 1 ? " more file" : " more files");
  }
  return s;
}

std::string window_text(int64_t block_size) {
  return "one window of block_size + 1 = " + std::to_string(block_size + 1) + " bytes";
}

// "0.1", not std::to_string's "0.100000".
std::string show(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

// The windows of the n bytes at `bytes` as a Dataset (text.h's layout).
Dataset windows_of(const char* bytes, int64_t n, int64_t block_size) {
  Dataset d;
  d.rows = text_window_count(n, block_size);
  d.features = block_size + 1;
  d.num_classes = kTextVocab;
  d.kind = SampleKind::kTokenWindow;
  const auto* u = reinterpret_cast<const uint8_t*>(bytes);
  if (d.rows > 0) d.tokens.assign(u, u + d.rows * block_size + 1);
  return d;
}

}  // namespace

std::vector<std::string> expand_text_paths(const std::vector<std::string>& specs,
                                           const std::string& key,
                                           std::vector<std::string>* repeated) {
  if (specs.empty()) throw UserError(key + " is required for format text (a file, list or glob)");
  std::vector<std::string> files;
  // A file named again (by a pattern that matches it too, or by another spelling of its path) is
  // read once: it was read twice, and the held-out tail then repeated bytes the model trained on.
  // Known by file_identity (one stat per file: a corpus of many shards stays linear).
  std::set<std::string> seen_files;
  const auto add = [&](const std::string& f) {
    if (seen_files.insert(file_identity(f)).second)
      files.push_back(f);
    else if (repeated != nullptr)
      repeated->push_back(f);
  };
  for (const std::string& s : specs) {
    if (s.empty()) throw UserError(key + ": an empty path");
    if (has_glob_chars(s) && !is_regular_file(s)) {
      for (const std::string& f : glob_files(s, key)) add(f);
    } else {
      add(s);  // read_text_files reports a missing file
    }
  }
  return files;
}

namespace {

// data.test.path's files hold `bytes`, fewer than one window (test_file_windows, and
// check_text_sizes from their sizes).
UserError short_test_text(const std::vector<std::string>& files, int64_t bytes, int64_t T) {
  return UserError("data.test.path: the text " + describe(files) + " has " + std::to_string(bytes) +
                   " bytes, fewer than " + window_text(T));
}

void check_block_size(const TextOptions& opts) {
  if (opts.block_size < 1) {
    throw UserError("model.block_size must be >= 1 for text data, got " +
                    std::to_string(opts.block_size));
  }
}

// The files of `key` hold no byte (read_text_files, and check_text_sizes from their sizes).
UserError empty_text(const std::string& key, const std::vector<std::string>& files) {
  return UserError(key + (files.size() == 1 ? ": the text " : ": the texts ") + describe(files) +
                   (files.size() == 1 ? " is empty" : " are empty"));
}

}  // namespace

std::string read_text_files(const std::vector<std::string>& files, const std::string& key) {
  DT_CHECK(!files.empty());
  std::string text;
  for (const std::string& f : files) {
    try {
      // (the first file's bytes are moved in, not copied: the peak is the text once)
      if (text.empty())
        text = read_maybe_gzip(f);
      else
        text += read_maybe_gzip(f);
    } catch (const UserError& e) {
      throw UserError(key + ": " + e.what());
    }
  }
  if (text.empty()) throw empty_text(key, files);
  return text;
}

namespace {

// The regular files `specs` name (expand_text_paths), or nullopt when a pattern matches nothing
// or one is not a regular file: the sizes below are then unknown (-1), the loader says why.
std::optional<std::vector<std::string>> regular_text_files(const std::vector<std::string>& specs) {
  std::vector<std::string> files;
  try {
    files = expand_text_paths(specs, "data");
  } catch (const UserError&) {
    return std::nullopt;
  }
  for (const std::string& f : files) {
    struct stat st {};
    if (::stat(f.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  }
  return files;
}

// The files' sizes on disk, summed (compressed ones as they are).
int64_t bytes_on_disk(const std::vector<std::string>& files) {
  int64_t on_disk = 0;
  std::error_code ec;
  for (const std::string& f : files) on_disk += static_cast<int64_t>(fs::file_size(f, ec));
  return on_disk;
}

}  // namespace

int64_t text_bytes_without_reading(const std::vector<std::string>& specs, bool* exact) {
  const auto files = regular_text_files(specs);
  if (!files) return -1;
  int64_t total = 0;
  for (const std::string& f : *files) {
    struct stat st {};
    if (::stat(f.c_str(), &st) != 0) return -1;
    std::FILE* in = std::fopen(f.c_str(), "rb");
    if (in == nullptr) return -1;
    char magic[2] = {0, 0};
    unsigned char isize[4] = {0, 0, 0, 0};
    const bool gz = is_gzip(std::string_view(magic, std::fread(magic, 1, 2, in)));
    bool ok = true;
    // (shorter than gzip's 18 bytes of header and trailer: truncated, counted 0 and inexact, so
    // the caller decompresses it and refuses it as the loader does; validate said ok)
    if (gz && st.st_size >= 18)
      ok = std::fseek(in, -4, SEEK_END) == 0 && std::fread(isize, 1, 4, in) == 4;
    std::fclose(in);
    if (!ok) return -1;
    if (gz && exact != nullptr) *exact = false;
    total += gz ? static_cast<int64_t>(isize[0] | isize[1] << 8 | isize[2] << 16 |
                                       static_cast<uint32_t>(isize[3]) << 24)
                : static_cast<int64_t>(st.st_size);
  }
  return total;
}

int64_t text_bytes_by_decompressing(const std::vector<std::string>& specs, const std::string& key,
                                    int64_t max_bytes) {
  const auto files = regular_text_files(specs);
  if (!files) return -1;
  if (bytes_on_disk(*files) > max_bytes) return -1;
  int64_t total = 0;
  for (const std::string& f : *files) {
    std::string bytes;
    try {
      bytes = read_file(f);
    } catch (const UserError&) {
      return -1;  // (the loader names the problem)
    }
    // A corrupt, truncated or trailing-garbage gzip file: the loader's own UserError, so
    // validate refuses what run would (it said ok).
    try {
      total += size_once_read(bytes, f);
    } catch (const UserError& e) {
      throw UserError(key + ": " + e.what());
    }
  }
  return total;
}

int64_t text_window_count(int64_t n, int64_t block_size) {
  DT_CHECK_GE(block_size, 1);
  return n <= block_size ? 0 : (n - 1) / block_size;
}

Dataset text_windows(const std::string& bytes, int64_t block_size) {
  return windows_of(bytes.data(), static_cast<int64_t>(bytes.size()), block_size);
}

TextSplit plan_text_split(const TextOptions& opts, int64_t n, const std::string& train_desc) {
  const int64_t T = opts.block_size;
  TextSplit sp;
  sp.held_out = opts.test.empty() ? std::llround(opts.test_fraction * static_cast<double>(n)) : 0;
  if (opts.test.empty() && opts.test_fraction > 0 && text_window_count(sp.held_out, T) == 0) {
    const std::string held = "data.test_fraction " + show(opts.test_fraction) + " holds out " +
                             std::to_string(sp.held_out) + " bytes of " + train_desc +
                             ", fewer than " + window_text(T);
    if (!opts.default_fraction)
      throw UserError(held + " (use a larger fraction or a smaller model.block_size)");
    sp.no_split = held;
    sp.held_out = 0;
  }
  const int64_t n_train = n - sp.held_out;
  if (text_window_count(n_train, T) == 0) {
    const std::string held =
        sp.held_out > 0 ? " after holding out " + std::to_string(sp.held_out) + " for validation"
                        : "";
    throw UserError("data.train.path: the text " + train_desc + " has " + std::to_string(n_train) +
                    " bytes for training" + held + ", fewer than " + window_text(T));
  }
  return sp;
}

void check_text_memory(const TextOptions& opts) {
  // A file in a compression format dtrain does not read, named before any size is trusted (its
  // size is not the text's).
  for (const auto& [specs, key] :
       {std::pair{&opts.train, "data.train.path"}, std::pair{&opts.test, "data.test.path"}})
    if (const auto files = regular_text_files(*specs)) try {
        for (const std::string& f : *files) refuse_unread_compression(f);
      } catch (const UserError& e) {
        throw UserError(std::string(key) + ": " + e.what());
      }
  if (opts.block_size < 1) return;  // (load_text refuses it)
  const int64_t avail = available_memory_bytes();
  // A gzip file's trailer holds its length mod 4 GiB: one that may hold 4 GiB or more (deflate
  // inflates 1032x at most) is counted by decompressing it (streamed, nothing held), or a 4 GiB
  // + 10 bytes file would count as 10 bytes.
  const auto bytes = [&](const std::vector<std::string>& specs, const char* key) -> int64_t {
    if (specs.empty()) return 0;
    bool exact = true;
    const int64_t n = text_bytes_without_reading(specs, &exact);
    if (n < 0 || exact) return n;
    const auto files = regular_text_files(specs);
    if (!files || bytes_on_disk(*files) <= (int64_t{1} << 32) / 1032) return n;
    return text_bytes_by_decompressing(specs, key, std::numeric_limits<int64_t>::max());
  };
  const int64_t n = bytes(opts.train, "data.train.path");
  const int64_t m = bytes(opts.test, "data.test.path");
  if (avail < 0 || n < 0 || m < 0) return;
  // Peak while loading: the training bytes read, the test bytes read, and both splits' tokens
  // (one byte each, the windows views of them).
  const double total = 2.0 * static_cast<double>(n + m);
  if (total <= static_cast<double>(avail)) return;
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  throw UserError(fmt::format(
      "data: the text takes about {:.1f} GiB while it is read ({} bytes{}, read, then kept as "
      "one byte per token: 2 bytes per byte of text), more than the {:.1f} GiB this process "
      "can allocate; use a shorter text (fewer files) or free "
      "memory (each process holds one copy, shared by its in-process ranks)",
      total / kGiB, n + m,
      n > 0 && m > 0 ? fmt::format(": {} of data.train.path, {} of data.test.path", n, m)
      : m > 0        ? std::string(" of data.test.path")
                     : std::string(" of data.train.path"),
      static_cast<double>(avail) / kGiB));
}

int64_t check_text_sizes(const TextOptions& opts) {
  check_text_memory(opts);
  // Each side where its sizes are known (load_text names what it cannot read; gzip is counted by
  // decompressing, streamed, as train_rows_without_loading counts it): a test file is checked
  // whatever the training files are.
  if (!opts.test.empty()) {
    bool test_exact = true;
    int64_t t = text_bytes_without_reading(opts.test, &test_exact);
    if (t >= 0 && !test_exact) t = text_bytes_by_decompressing(opts.test, "data.test.path");
    if (t >= 0) {
      const std::vector<std::string> tf = expand_text_paths(opts.test, "data.test.path");
      if (t == 0) throw empty_text("data.test.path", tf);
      if (text_window_count(t, opts.block_size) == 0) throw short_test_text(tf, t, opts.block_size);
    }
  }
  bool exact = true;
  int64_t n = text_bytes_without_reading(opts.train, &exact);
  if (n >= 0 && !exact) n = text_bytes_by_decompressing(opts.train, "data.train.path");
  if (n < 0) return -1;
  const std::vector<std::string> files = expand_text_paths(opts.train, "data.train.path");
  if (n == 0) throw empty_text("data.train.path", files);
  const TextSplit sp = plan_text_split(opts, n, describe(files));
  if (!sp.no_split.empty())
    spdlog::warn("{} (the default for text): no validation split, every byte trains", sp.no_split);
  return text_window_count(n - sp.held_out, opts.block_size);
}

namespace {

// The windows of data.test.path's files (not empty), refused when shorter than one.
Dataset test_file_windows(const TextOptions& opts) {
  const int64_t T = opts.block_size;
  const std::vector<std::string> test_files = expand_text_paths(opts.test, "data.test.path");
  const std::string test = read_text_files(test_files, "data.test.path");
  if (text_window_count(static_cast<int64_t>(test.size()), T) == 0)
    throw short_test_text(test_files, static_cast<int64_t>(test.size()), T);
  return text_windows(test, T);
}

}  // namespace

DataSplits load_text_test_file(const TextOptions& opts) {
  DT_CHECK(!opts.test.empty());
  check_block_size(opts);
  TextOptions test_only = opts;
  test_only.train.clear();
  check_text_memory(test_only);
  DataSplits s;
  s.normalizer.method = Normalize::kNone;
  s.test = test_file_windows(opts);
  // No training rows, the layout of the training windows (the model's shape is read from it).
  s.train.features = opts.block_size + 1;
  s.train.num_classes = kTextVocab;
  s.train.kind = SampleKind::kTokenWindow;
  return s;
}

DataSplits load_text(const TextOptions& opts) {
  check_block_size(opts);
  if (!(opts.test_fraction >= 0 && opts.test_fraction < 1)) {
    throw UserError("data.test_fraction must be in [0, 1), got " + show(opts.test_fraction));
  }
  const int64_t T = opts.block_size;
  std::vector<std::string> repeated;
  const std::vector<std::string> train_files =
      expand_text_paths(opts.train, "data.train.path", &repeated);
  if (!repeated.empty())
    spdlog::warn(
        "data.train.path names {} more than once (a file and a pattern that matches it, "
        "say): read once",
        describe(repeated));
  check_text_memory(opts);
  const std::string train = read_text_files(train_files, "data.train.path");
  const int64_t n = static_cast<int64_t>(train.size());
  DataSplits s;
  s.normalizer.method = Normalize::kNone;  // token ids are used as they are
  if (!opts.test.empty()) s.test = test_file_windows(opts);
  const TextSplit sp = plan_text_split(opts, n, describe(train_files));
  const int64_t n_test = sp.held_out, n_train = n - n_test;
  const std::string& no_split = sp.no_split;
  if (!no_split.empty())
    spdlog::warn("{} (the default for text): no validation split, every byte trains", no_split);
  s.train = windows_of(train.data(), n_train, T);
  if (n_test > 0) s.test = windows_of(train.data() + n_train, n_test, T);
  s.test.features = T + 1;  // also for an empty test set, so shapes always agree
  s.test.num_classes = kTextVocab;
  s.test.kind = SampleKind::kTokenWindow;
  return s;
}

}  // namespace dtrain
