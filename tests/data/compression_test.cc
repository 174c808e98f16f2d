// Data files in a compression format dtrain does not read (data/compression.h) are refused by
// name: as text they would train on their compressed bytes, silently.
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include <doctest/doctest.h>

#include "data/compression.h"
#include "data/dataset.h"
#include "data/text.h"
#include "test_util.h"
#include "user_error.h"
#include "util/check.h"
#include "util/fs.h"

namespace dtrain {
namespace {

using namespace std::string_view_literals;
using testing::TempDir;
using testing::user_error_of;

std::string write_bytes(const std::string& path, std::string_view bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// The first bytes of real files of each format (xz, bzip2 -9, zstd, zip, 7z, lz4 frames).
constexpr std::pair<std::string_view, std::string_view> kMagics[] = {
    {"\xFD"
     "7zXZ\0\0\x04\xE6\xD6\xB4"sv,
     "xz"},
    {"BZh91AY&SY\x12\x34"sv, "bzip2"},
    {"BZh1\x17\x72\x45\x38\x50\x90\0\0"sv, "bzip2"},  // an empty bzip2 stream
    {"\x28\xB5\x2F\xFD\x24\x05\x29\0"sv, "zstd"},
    {"PK\x03\x04\x14\0\0\0\x08\0"sv, "zip"},
    {"7z\xBC\xAF\x27\x1C\0\x04"sv, "7z"},
    {"\x04\x22\x4D\x18\x64\x40\xA7"sv, "lz4"},
    {"\x02\x21\x4C\x18\x1B\0\0\0"sv, "lz4"},   // a legacy frame (lz4 -l)
    {"\x50\x2A\x4D\x18\x04\0\0\0"sv, "zstd"},  // a skippable frame first
    {"\x5E\x2A\x4D\x18\x04\0\0\0"sv, "zstd"},
};

TEST_CASE("compression: xz, bzip2, zstd, zip, 7z and lz4 are named by their magic") {
  for (const auto& [head, name] : kMagics) CHECK(unread_compression(head) == name);
  // gzip, plain text and near misses are read as they are
  CHECK(unread_compression("\x1f\x8b\x08\0"sv).empty());
  CHECK(unread_compression("hello world"sv).empty());
  CHECK(unread_compression("BZh9 is not a bzip2 file"sv).empty());
  CHECK(unread_compression("BZh"sv).empty());
  CHECK(unread_compression("PK is a name"sv).empty());
  CHECK(unread_compression("P*M is text"sv).empty());
  CHECK(unread_compression(""sv).empty());
}

TEST_CASE("compression: text and CSV readers refuse an xz or zstd file by name, exit 2") {
  TempDir dir;
  const std::string xz = write_bytes(dir.path() + "/corpus.txt.xz",
                                     "\xFD"
                                     "7zXZ\0\0\x04\xE6"
                                     "compressed bytes follow here, a few hundred of them"sv);
  const std::string zst = write_bytes(dir.path() + "/rows.csv", "\x28\xB5\x2F\xFD\x24\x05"sv);
  std::string e = user_error_of([&] { read_maybe_gzip(zst); });
  CHECK(e.find("'" + zst + "' is zstd-compressed") != std::string::npos);
  CHECK(e.find("zstd -d it, or recompress it with gzip") != std::string::npos);

  TextOptions o;
  o.train = {xz};
  o.block_size = 4;
  o.test_fraction = 0;
  // validate's check, from the first bytes only, and the loader's
  e = user_error_of([&] { check_text_sizes(o); });
  CHECK(e == "data.train.path: '" + xz +
                 "' is xz-compressed, and dtrain reads gzip or uncompressed files only: xz -d "
                 "it, or recompress it with gzip");
  CHECK(user_error_of([&] { load_text(o); }) == e);
  // a test file as well; a plain training text passes
  o.train = {write_bytes(dir.path() + "/plain.txt", "plain text, long enough for windows")};
  o.test = {xz};
  e = user_error_of([&] { check_text_sizes(o); });
  CHECK(e.starts_with("data.test.path: '" + xz + "' is xz-compressed"));
  CHECK(user_error_of([&] { load_text(o); }) == e);
  o.test = {};
  CHECK(user_error_of([&] { check_text_sizes(o); }).empty());
  // A large one (sparse) is named by its format too, not sized as text (run said it would take
  // 66 GiB once read: its compressed bytes counted as text).
  if (const int64_t avail = available_memory_bytes(); avail > 0) {
    std::filesystem::resize_file(xz, static_cast<uintmax_t>(avail / 10 * 4));
    o.train = {xz};
    CHECK(user_error_of([&] {
            load_text(o);
          }).starts_with("data.train.path: '" + xz + "' is xz-compressed"));
  }
}

TEST_CASE("compression: IDX images or labels in xz are refused by name") {
  // (the IDX reader gave "bad IDX magic 0xfd377a58")
  TempDir dir;
  const std::string xz = write_bytes(dir.path() + "/images.xz",
                                     "\xFD"
                                     "7zXZ\0\0\x04\xE6 more"sv);
  const std::string e = user_error_of([&] { load_idx(xz, xz); });
  CHECK(e.find("'" + xz + "' is xz-compressed") != std::string::npos);
}

}  // namespace
}  // namespace dtrain
