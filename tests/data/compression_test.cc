// Data files in a compression format dtrain does not read (data/compression.h) are refused by
// name: as text they would train on their compressed bytes, silently.
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include <doctest/doctest.h>

#include "data/compression.h"
#include "data/dataset.h"
#include "data/gzip_util.h"
#include "data/text.h"
#include "test_util.h"
#include "user_error.h"
#include "util/check.h"
#include "util/fs.h"

namespace dtrain {
namespace {

using namespace std::string_view_literals;
using testing::run_cmd;
using testing::TempDir;
using testing::user_error_of;

std::string write_bytes(const std::string& path, std::string_view bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

using dtrain::testing::gzip;

// A ustar archive of one file `name` holding `body`: its 512-byte header (POSIX ustar, checksum
// as tar(1) writes it), the body padded to 512 bytes, and the two zero blocks that end it.
std::string tar_of(const std::string& name, const std::string& body) {
  std::string h(512, '\0');
  const auto put = [&](size_t at, const std::string& v) { h.replace(at, v.size(), v); };
  char num[16];
  put(0, name);
  put(100, "0000644");
  put(108, "0001750");
  put(116, "0001750");
  std::snprintf(num, sizeof num, "%011o", static_cast<unsigned>(body.size()));
  put(124, num);
  put(136, "14712345670");
  h[156] = '0';
  put(257, std::string("ustar\0"
                       "00",
                       8));
  put(148, "        ");
  unsigned sum = 0;
  for (const char c : h) sum += static_cast<unsigned char>(c);
  std::snprintf(num, sizeof num, "%06o", sum);
  put(148, std::string(num) + std::string(1, '\0') + " ");
  std::string out = h + body;
  out.resize((out.size() + 511) / 512 * 512 + 1024, '\0');
  return out;
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

TEST_CASE("compression: a tar header is known by its magic and checksum, not by \"ustar\" alone") {
  const std::string tar = tar_of("corpus.txt", "hello, text\n");
  CHECK(is_tar_header(tar));
  CHECK_FALSE(is_tar_header(std::string_view(tar).substr(0, 511)));
  std::string text(600, 'a');
  text.replace(257, 5, "ustar");  // a text that holds "ustar" there: no checksum adds up
  CHECK_FALSE(is_tar_header(text));
  std::string broken = tar;
  broken[0] = 'X';  // the checksum no longer adds up
  CHECK_FALSE(is_tar_header(broken));
}

TEST_CASE("compression: gzip inside gzip, xz inside gzip and tar archives are refused by name") {
  // As text they trained silently on the deflate bytes or on the tar headers and NUL padding;
  // as CSV a gzip inside gzip was "a NUL byte at offset 8", as IDX "bad IDX magic 0x1f8b0800".
  TempDir dir;
  const std::string text = "plain text, long enough for a few windows of training bytes\n";
  const std::string twice = write_bytes(dir / "corpus.txt.gz", gzip(gzip(text)));
  const std::string xz_in_gz =
      write_bytes(dir / "corpus.xz.gz", gzip("\xFD"
                                             "7zXZ\0\0\x04\xE6 compressed bytes"sv));
  const std::string tar = write_bytes(dir / "corpus.tar", tar_of("corpus.txt", text));
  const std::string tgz = write_bytes(dir / "corpus.tar.gz", gzip(tar_of("corpus.txt", text)));

  const std::string twice_msg = "'" + twice +
                                "' is gzip-compressed twice (its gzip data inflates to "
                                "gzip-compressed data), and dtrain decompresses once: gunzip it "
                                "twice, or remove one layer (gunzip -c '" +
                                twice + "' > OUT, a gzip file dtrain reads)";
  CHECK(user_error_of([&] { read_maybe_gzip(twice); }) == twice_msg);
  CHECK(user_error_of([&] { read_maybe_gzip(xz_in_gz); }) ==
        "'" + xz_in_gz +
            "' holds xz-compressed data inside its gzip compression, and dtrain reads gzip or "
            "uncompressed files only: gunzip it, then xz -d it, or recompress the data with gzip "
            "alone");
  CHECK(user_error_of([&] { read_maybe_gzip(tar); }) ==
        "'" + tar + "' is a tar archive, not a data file: extract it (tar xf '" + tar +
            "') and give dtrain the files it holds");
  CHECK(user_error_of([&] { read_maybe_gzip(tgz); }) ==
        "'" + tgz + "' is a gzip-compressed tar archive (.tar.gz), not a data file: extract it " +
            "(tar xzf '" + tgz + "') and give dtrain the files it holds");
  // gzip once, and a text that mentions ustar, read as they are
  CHECK(read_maybe_gzip(write_bytes(dir / "once.gz", gzip(text))) == text);

  // Text: the loader and validate's check (from the first bytes, inflated) say the same.
  TextOptions o;
  o.block_size = 4;
  o.test_fraction = 0;
  for (const std::string& f : {twice, xz_in_gz, tar, tgz}) {
    CAPTURE(f);
    o.train = {f};
    const std::string e = user_error_of([&] { load_text(o); });
    CHECK(e.starts_with("data.train.path: '" + f + "' "));
    CHECK(user_error_of([&] { check_text_sizes(o); }) == e);
  }
  o.train = {twice};
  CHECK(user_error_of([&] { load_text(o); }) == "data.train.path: " + twice_msg);

  // A tar archive tar(1) wrote, when there is one here.
  write_bytes(dir / "a.txt", text);
  if (run_cmd("tar -C '" + dir.path() + "' -cf '" + dir.path() + "/real.tar' a.txt").exit_code ==
      0) {
    CHECK(user_error_of([&] {
            read_maybe_gzip(dir / "real.tar");
          }).starts_with("'" + dir / "real.tar" + "' is a tar archive"));
  }

  // CSV and IDX gzip-compressed twice: said so.
  const std::string csv = write_bytes(dir / "rows.csv.gz", gzip(gzip("a,b,y\n1,2,0\n3,4,1\n")));
  CsvOptions co;
  CHECK(user_error_of([&] {
          load_csv(csv, co);
        }).starts_with("'" + csv + "' is gzip-compressed twice"));
  const std::string idx =
      write_bytes(dir / "labels.gz", gzip(gzip(std::string("\0\0\x08\x01\0\0\0\x02\x01\x00", 10))));
  CHECK(user_error_of([&] {
          load_idx(idx, idx);
        }).starts_with("'" + idx + "' is gzip-compressed twice"));
}

}  // namespace
}  // namespace dtrain
