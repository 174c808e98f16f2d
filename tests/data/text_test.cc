// Text data (data/text.h): windows, gzip by magic, files, lists and globs, the held-out split,
// errors, and the Jargon File when the jargon-text package is installed.
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "data/dataset.h"
#include "data/text.h"
#include "test_util.h"
#include "user_error.h"
#include "util/check.h"
#include "util/fs.h"

namespace dtrain {
namespace {

using testing::TempDir;
using testing::user_error;

// Writes `text` gzip-compressed to `path` (any name: detection is by the magic).
std::string write_gzip(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  if (!text.empty()) REQUIRE(gzwrite(f, text.data(), static_cast<unsigned>(text.size())) > 0);
  REQUIRE(gzclose(f) == Z_OK);
  return path;
}

// Row i of d as the bytes it holds.
std::string row_bytes(const Dataset& d, int64_t i) {
  std::string s;
  for (int64_t j = 0; j < d.features; ++j) s += static_cast<char>(d.window(i)[j]);
  return s;
}

// n bytes of varied, deterministic text (every byte value, in a scrambled order).
std::string pattern_text(int64_t n) {
  std::string s;
  for (int64_t i = 0; i < n; ++i) s += static_cast<char>((i * 37 + i / 256) % 256);
  return s;
}

TEST_CASE("text: windows of block_size + 1 bytes at stride block_size, the tail unused") {
  CHECK(text_window_count(10, 3) == 3);
  CHECK(text_window_count(10, 4) == 2);
  CHECK(text_window_count(5, 4) == 1);
  CHECK(text_window_count(4, 4) == 0);
  CHECK(text_window_count(0, 4) == 0);
  const Dataset d = text_windows("abcdefghij", 3);
  CHECK(d.rows == 3);
  CHECK(d.features == 4);
  CHECK(d.num_classes == 256);
  CHECK(d.y.empty());  // a window carries its own targets
  CHECK(d.kind == SampleKind::kTokenWindow);
  CHECK(d.input_features() == 3);
  CHECK(d.targets_per_row() == 3);
  CHECK(row_bytes(d, 0) == "abcd");
  CHECK(row_bytes(d, 1) == "defg");
  CHECK(row_bytes(d, 2) == "ghij");
  const Dataset e = text_windows("abcdefghij", 4);
  CHECK(e.rows == 2);
  CHECK(row_bytes(e, 1) == "efghi");  // 'j' would need a third window
}

TEST_CASE("text: bytes are tokens 0..255, high bytes included (unsigned)") {
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  const Dataset d = text_windows(all, 255);
  REQUIRE(d.rows == 1);
  for (int64_t j = 0; j < 256; ++j) CHECK(d.window(0)[j] == j);
}

TEST_CASE("text: gzip is detected by its magic, not its name: plain and gzip read the same") {
  TempDir dir;
  const std::string text = pattern_text(3000);
  const std::string plain = dir.write("plain.txt", text);
  const std::string gz = write_gzip(dir / "compressed.txt", text);  // no .gz suffix
  const std::string gz2 = write_gzip(dir / "also.gz", text);
  CHECK(read_text_files({plain}, "k") == text);
  CHECK(read_text_files({gz}, "k") == text);
  CHECK(read_text_files({gz2, plain}, "k") == text + text);
  TextOptions o;
  o.block_size = 16;
  o.test_fraction = 0;
  o.train = {plain};
  const DataSplits a = load_text(o);
  o.train = {gz};
  const DataSplits b = load_text(o);
  CHECK(a.train.rows == (3000 - 1) / 16);
  CHECK(a.train.tokens == b.train.tokens);
  CHECK(a.test.rows == 0);
  CHECK(a.test.features == 17);
  CHECK(a.test.kind == SampleKind::kTokenWindow);  // also the empty test set
  CHECK(a.train.kind == SampleKind::kTokenWindow);
  CHECK(a.normalizer.method == Normalize::kNone);
  // Sizes without holding the text: exact by decompressing (two members count as both), where
  // the gzip trailer only estimates (its last member's size).
  const std::string two = dir / "two.gz";
  {
    std::ofstream out(two, std::ios::binary);
    out << dtrain::testing::read_text(gz) << dtrain::testing::read_text(gz2);
  }
  bool exact = true;
  CHECK(text_bytes_without_reading({two}, &exact) == 3000);
  CHECK_FALSE(exact);
  CHECK(text_bytes_by_decompressing({two, plain}, "k") == 9000);
  CHECK(text_bytes_by_decompressing({dir / "missing"}, "k") == -1);
  // A gzip file shorter than its 18 bytes of header and trailer: counted 0 and inexact, so the
  // caller decompresses it and refuses it (it was "unknown" (-1), which validate let pass).
  const std::string cut = dir.write("cut.gz", dtrain::testing::read_text(gz).substr(0, 17));
  exact = true;
  CHECK(text_bytes_without_reading({cut}, &exact) == 0);
  CHECK_FALSE(exact);
  CHECK_THROWS_WITH_AS(text_bytes_by_decompressing({cut}, "k"),
                       doctest::Contains("truncated gzip file"), UserError);
}

TEST_CASE("text: a list keeps its order, a glob is sorted and skips directories") {
  TempDir dir;
  dir.write("b.txt", "BBBB");
  dir.write("c.txt", "CCCC");
  dir.write("a.txt", "AAAA");
  dir.write("a.dat", "DDDD");
  std::filesystem::create_directory(dir / "z.txt");  // matches *.txt but is no file
  CHECK(expand_text_paths({dir / "*.txt"}, "k") ==
        std::vector<std::string>{dir / "a.txt", dir / "b.txt", dir / "c.txt"});
  CHECK(read_text_files(expand_text_paths({dir / "*.txt"}, "k"), "k") == "AAAABBBBCCCC");
  CHECK(read_text_files(expand_text_paths({dir / "c.txt", dir / "a.txt"}, "k"), "k") == "CCCCAAAA");
  CHECK(read_text_files(expand_text_paths({dir / "a.dat", dir / "[bc].txt"}, "k"), "k") ==
        "DDDDBBBBCCCC");
  TextOptions o;
  o.train = {dir / "*.txt"};
  o.block_size = 3;
  o.test_fraction = 0;
  const DataSplits s = load_text(o);
  CHECK(s.train.rows == (12 - 1) / 3);
  CHECK(row_bytes(s.train, 1) == "ABBB");  // windows run across file boundaries
  // A name that exists is that file, even with glob characters in it.
  dir.write("odd[1].txt", "OOOO");
  CHECK(expand_text_paths({dir / "odd[1].txt"}, "k") ==
        std::vector<std::string>{dir / "odd[1].txt"});
  // A file named again -- by a pattern matching it too, or another spelling -- is read once (it
  // was read twice: 8 of 12 bytes repeated, the held-out tail a copy of trained bytes).
  std::vector<std::string> repeated;
  CHECK(
      expand_text_paths({dir / "*.txt", dir / "a.txt", dir.path() + "/./b.txt"}, "k", &repeated) ==
      std::vector<std::string>{dir / "a.txt", dir / "b.txt", dir / "c.txt", dir / "odd[1].txt"});
  CHECK(repeated == std::vector<std::string>{dir / "a.txt", dir.path() + "/./b.txt"});
  o.train = {dir / "[abc].txt", dir / "a.txt"};
  CHECK(load_text(o).train.rows == (12 - 1) / 3);
}

TEST_CASE("text: the last test_fraction of the bytes is the validation split") {
  TempDir dir;
  const std::string text = pattern_text(1000);
  const std::string path = dir.write("t.txt", text);
  TextOptions o;
  o.train = {path};
  o.block_size = 8;
  o.test_fraction = 0.1;  // the default
  const DataSplits s = load_text(o);
  CHECK(s.train.rows == (900 - 1) / 8);
  CHECK(s.test.rows == (100 - 1) / 8);
  CHECK(s.test.features == 9);
  CHECK(row_bytes(s.train, 0) == text.substr(0, 9));
  CHECK(row_bytes(s.test, 0) == text.substr(900, 9));
  CHECK(row_bytes(s.test, s.test.rows - 1) == text.substr(900 + 8 * (s.test.rows - 1), 9));
  // The training split ends before the validation split: no window reads past byte 900.
  CHECK(8 * (s.train.rows - 1) + 9 <= 900);

  o.test_fraction = 0.25;
  const DataSplits q = load_text(o);
  CHECK(q.train.rows == (750 - 1) / 8);
  CHECK(q.test.rows == (250 - 1) / 8);

  // With test files nothing is held out: all of train is training data.
  const std::string other = pattern_text(50).substr(10);
  o.test = {dir.write("v.txt", other)};
  const DataSplits t = load_text(o);
  CHECK(t.train.rows == (1000 - 1) / 8);
  CHECK(t.test.rows == (40 - 1) / 8);
  CHECK(row_bytes(t.test, 0) == other.substr(0, 9));
}

TEST_CASE("text: bad input is one UserError naming the key and the file") {
  TempDir dir;
  TextOptions o;
  o.block_size = 8;
  o.train = {dir / "missing.txt"};
  std::string e = user_error([&] { load_text(o); });
  CHECK(e.find("data.train.path") != std::string::npos);
  CHECK(e.find("missing.txt") != std::string::npos);

  o.train = {dir.write("empty.txt", "")};
  e = user_error([&] { load_text(o); });
  CHECK(e.find("empty.txt' is empty") != std::string::npos);
  o.train = {write_gzip(dir / "empty.gz", "")};
  CHECK(user_error([&] { load_text(o); }).find("empty.gz' is empty") != std::string::npos);

  o.test_fraction = 0;
  o.train = {dir.write("short.txt", "12345678")};  // 8 bytes: a window needs 9
  e = user_error([&] { load_text(o); });
  CHECK(e.find("short.txt") != std::string::npos);
  CHECK(e.find("fewer than one window of block_size + 1 = 9 bytes") != std::string::npos);

  o.train = {dir / "*.none"};
  e = user_error([&] { load_text(o); });
  CHECK(e.find("the pattern '" + dir.path() + "/*.none' matches no file") != std::string::npos);
  // A folder on the way that cannot be read (here a link to itself: ELOOP, as root too) is said,
  // not left as "matches no file" alone.
  std::filesystem::create_directory_symlink("loop", dir / "loop");
  o.train = {dir / "loop/*.txt"};
  e = user_error([&] { load_text(o); });
  CHECK(e.find("matches no file (cannot read '" + dir.path() + "/loop': ") != std::string::npos);

  // 100 bytes, 10% held out = 10 bytes: fewer than a window of 17.
  o.train = {dir.write("hundred.txt", pattern_text(100))};
  o.block_size = 16;
  o.test_fraction = 0.1;
  e = user_error([&] { load_text(o); });
  CHECK(e.find("data.test_fraction 0.1 holds out 10 bytes of '") != std::string::npos);
  // The same as the format's default (not asked for): no validation split, every byte trains.
  o.default_fraction = true;
  const DataSplits all = load_text(o);
  CHECK(all.test.rows == 0);
  CHECK(all.train.rows == (100 - 1) / 16);
  o.default_fraction = false;
  // ... and the held-out part is counted when training is too short.
  o.test_fraction = 0.9;
  e = user_error([&] { load_text(o); });
  CHECK(e.find("has 10 bytes for training after holding out 90 for validation") !=
        std::string::npos);

  o.test_fraction = 0;
  o.test = {dir.write("tiny.txt", "abc")};
  e = user_error([&] { load_text(o); });
  CHECK(e.find("data.test.path") != std::string::npos);
  CHECK(e.find("tiny.txt") != std::string::npos);

  o.test = {};
  o.block_size = 0;
  CHECK(user_error([&] { load_text(o); }).find("model.block_size") != std::string::npos);
  o.block_size = 4;
  o.test_fraction = 1.0;
  CHECK(user_error([&] { load_text(o); }).find("data.test_fraction") != std::string::npos);
  o.test_fraction = 0;
  o.train = {};
  CHECK(user_error([&] { load_text(o); }).find("data.train.path is required") != std::string::npos);
}

TEST_CASE("text: the Jargon File (jargon-text) as configs/lm_jargon.yaml reads it") {
  const std::string path = "/usr/share/doc/jargon-text/jargon.txt.gz";
  if (!std::filesystem::exists(path)) {
    MESSAGE("jargon-text not installed; skipped");
    return;
  }
  const std::string text = read_maybe_gzip(path);
  const int64_t n = static_cast<int64_t>(text.size());
  CHECK(n > 1000000);  // 1.68 MB of English (4.4.7: 1681817 bytes)
  CHECK(text.find("The Jargon File") != std::string::npos);
  TextOptions o;
  o.train = {path};
  o.block_size = 64;
  const DataSplits s = load_text(o);
  const int64_t n_test = std::llround(0.1 * static_cast<double>(n));
  CHECK(s.train.rows == (n - n_test - 1) / 64);
  CHECK(s.test.rows == (n_test - 1) / 64);
  CHECK(row_bytes(s.train, 0) == text.substr(0, 65));
  CHECK(row_bytes(s.test, 0) == text.substr(static_cast<size_t>(n - n_test), 65));
  // The text has UTF-8 (box drawing, accents): bytes above 127 arrive as tokens 128..255.
  REQUIRE(!s.train.tokens.empty());
  CHECK(*std::max_element(s.train.tokens.begin(), s.train.tokens.end()) >= 128);
}

TEST_CASE("text: the bytes a list of files holds, from sizes and gzip's trailer, without reading") {
  TempDir t;
  const std::string plain = t.write("a.txt", std::string(1000, 'a'));
  const std::string gz = write_gzip(t / "b.bin", std::string(70000, 'b'));
  CHECK(text_bytes_without_reading({plain}) == 1000);
  CHECK(text_bytes_without_reading({gz}) == 70000);
  CHECK(text_bytes_without_reading({plain, gz}) == 71000);
  CHECK(text_bytes_without_reading({t / "*.txt"}) == 1000);
  CHECK(text_bytes_without_reading({t / "missing.txt"}) == -1);
  CHECK(text_bytes_without_reading({t / "none*.txt"}) == -1);
}

}  // namespace
}  // namespace dtrain

namespace dtrain {
namespace {

TEST_CASE("text: a text this process cannot hold once read is refused from its size, unread") {
  // Its tokens take a byte per byte, the bytes read one more: a text of 60% of the memory there
  // is fits as bytes (read_maybe_gzip's own check) but not once tokenised. A sparse file:
  // nothing is written, and nothing may be read.
  const int64_t avail = available_memory_bytes();
  if (avail < 0) return;
  TempDir dir;
  const std::string big = dir.path() + "/big.txt";
  std::ofstream(big).put('x');
  std::filesystem::resize_file(big, static_cast<uintmax_t>(avail / 10 * 6));
  TextOptions o;
  o.train = {big};
  o.block_size = 64;
  const std::string want = "data: the text takes about ";
  std::string e = user_error([&] { load_text(o); });
  CHECK_MESSAGE(e.starts_with(want), e);
  CHECK_MESSAGE(e.find("read, then kept as one byte per token: 2 bytes per byte of text), more "
                       "than the ") != std::string::npos,
                e);
  CHECK(e.find("use a shorter text (fewer files) or free memory") != std::string::npos);
  CHECK(user_error([&] { check_text_sizes(o); }).starts_with(want));  // validate's
  // as a test file, named
  o.train = {dir.write("small.txt", pattern_text(1000))};
  o.test = {big};
  e = user_error([&] { load_text(o); });
  CHECK(e.starts_with(want));
  CHECK(e.find(" bytes: 1000 of data.train.path, " + std::to_string(avail / 10 * 6) +
               " of data.test.path, read, then kept as") != std::string::npos);
  o.test = {};
  CHECK(load_text(o).train.rows == text_window_count(900, 64));
}

TEST_CASE("text: validate counts gzip texts by decompressing: empty, short and multi-member") {
  // validate trusted only exact (plain) sizes: an empty or too short gzip text was 'ok' there and
  // refused by run; and a multi-member gzip's trailer (its last member's size) sized the test set.
  TempDir dir;
  TextOptions o;
  o.block_size = 16;
  o.test_fraction = 0;
  for (const std::string& text : {std::string(), std::string(16, 'a')}) {
    o.train = {write_gzip(dir.path() + "/t" + std::to_string(text.size()) + ".gz", text)};
    const std::string e = user_error([&] { load_text(o); });
    CHECK(e.starts_with("data.train.path: "));
    CHECK(user_error([&] { check_text_sizes(o); }) == e);
  }
  o.train = {dir.write("train.txt", pattern_text(400))};
  o.test = {write_gzip(dir.path() + "/test8.gz", std::string(8, 'b'))};
  const std::string e = user_error([&] { load_text(o); });
  CHECK(e.starts_with("data.test.path: the text "));
  CHECK(user_error([&] { check_text_sizes(o); }) == e);
  // 170 bytes, then an empty member: 10 windows of 17, not the trailer's 0.
  const std::string a = write_gzip(dir.path() + "/a.gz", pattern_text(170));
  const std::string b = write_gzip(dir.path() + "/b.gz", "");
  std::ofstream(dir.path() + "/multi.gz", std::ios::binary)
      << std::ifstream(a, std::ios::binary).rdbuf() << std::ifstream(b, std::ios::binary).rdbuf();
  DataConfig d;
  d.format = DataFormat::kText;
  d.block_size = 16;
  d.train.path = {dir.path() + "/train.txt"};
  d.test.path = {dir.path() + "/multi.gz"};
  CHECK(test_rows_without_loading(d) == 10);
  o.test = {dir.path() + "/multi.gz"};
  CHECK(load_text(o).test.rows == 10);
  // validate's count of the training windows (one decompression) is load_text's: the training
  // text a multi-member gzip too, with the default held-out fraction.
  o.train = o.test;
  o.test = {};
  o.test_fraction = 0.1;
  CHECK(check_text_sizes(o) == load_text(o).train.rows);
  CHECK(check_text_sizes(o) == text_window_count(170 - 17, 16));
}

TEST_CASE("text: validate refuses a corrupt gzip text as run does") {
  // validate said ok for a truncated file, an unknown compression method and trailing garbage
  // (zlib's gzread skips it), which run refused.
  TempDir dir;
  const std::string good =
      dtrain::testing::read_text(write_gzip(dir.path() + "/good.gz", pattern_text(400)));
  REQUIRE(good.size() > 40);
  std::string method = good;
  method[2] = 7;  // (deflate is 8)
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"truncated.gz", good.substr(0, good.size() - 20)},
      {"method.gz", method},
      {"garbage.gz", good + "junk"}};
  for (const auto& [name, bytes] : bad) {
    CAPTURE(name);
    TextOptions o;
    o.block_size = 16;
    o.train = {dir.write(name, bytes)};
    const std::string e = user_error([&] { load_text(o); });
    CHECK_MESSAGE(e.starts_with("data.train.path: "), e);
    CHECK(user_error([&] { check_text_sizes(o); }) == e);
  }
}

TEST_CASE("text: an evaluation reads data.test.path alone, not the training text") {
  // dtrain eval read (and refused) the training text it never uses.
  TempDir dir;
  TextOptions o;
  o.train = {dir.path() + "/missing.txt"};
  o.test = {dir.write("test.txt", pattern_text(100))};
  o.block_size = 16;
  const DataSplits s = load_text_test_file(o);
  CHECK(s.test.rows == text_window_count(100, 16));
  CHECK(row_bytes(s.test, 1) == pattern_text(100).substr(16, 17));
  CHECK(s.train.rows == 0);
  CHECK(s.train.input_features() == 16);
  CHECK(s.train.num_classes == 256);
  CHECK(s.train.kind == SampleKind::kTokenWindow);
  o.test = {dir.write("short.txt", "0123456789")};
  CHECK(user_error([&] { load_text_test_file(o); }).starts_with("data.test.path: the text "));
}

}  // namespace
}  // namespace dtrain
