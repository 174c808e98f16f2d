// IDX loader and read_maybe_gzip: round trips (raw and gzip), the real Fashion-MNIST files, and
// every malformed-input class.
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "data/dataset.h"
#include "data/gzip_util.h"
#include "test_util.h"
#include "user_error.h"
#include "util/check.h"

namespace dtrain {
namespace {

using testing::TempDir;
using testing::user_error;

namespace fs = std::filesystem;

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

using dtrain::testing::gzip;

void put_be32(std::string& s, uint32_t v) {
  s.push_back(static_cast<char>(v >> 24));
  s.push_back(static_cast<char>(v >> 16));
  s.push_back(static_cast<char>(v >> 8));
  s.push_back(static_cast<char>(v));
}

std::string idx_images(uint32_t n, uint32_t rows, uint32_t cols, const std::vector<uint8_t>& px) {
  std::string s;
  put_be32(s, 0x00000803);
  put_be32(s, n);
  put_be32(s, rows);
  put_be32(s, cols);
  s.append(px.begin(), px.end());
  return s;
}

std::string idx_labels(const std::vector<uint8_t>& y) {
  std::string s;
  put_be32(s, 0x00000801);
  put_be32(s, static_cast<uint32_t>(y.size()));
  s.append(y.begin(), y.end());
  return s;
}

// 3 images of 2x3 pixels with distinct values (0, 10, 20, ..., 170) and labels 0, 7, 2.
const std::vector<uint8_t> kPixels = {0,  10,  20,  30,  40,  50,  60,  70,  80,
                                      90, 100, 110, 120, 130, 140, 150, 255, 170};
const std::vector<uint8_t> kLabels = {0, 7, 2};

void check_small(const Dataset& d) {
  CHECK(d.rows == 3);
  CHECK(d.features == 6);
  REQUIRE(d.x.size() == 18);
  for (size_t i = 0; i < kPixels.size(); ++i) CHECK(d.x[i] == static_cast<float>(kPixels[i]));
  CHECK(d.row(2)[4] == 255.0f);
  CHECK(d.y == std::vector<int32_t>{0, 7, 2});
  CHECK(d.num_classes == 8);
}

TEST_CASE("idx: raw round trip") {
  TempDir t;
  write_bytes((t / "img"), idx_images(3, 2, 3, kPixels));
  write_bytes((t / "lab"), idx_labels(kLabels));
  check_small(load_idx((t / "img"), (t / "lab")));
}

TEST_CASE("idx: gzip round trip, mixed with raw") {
  TempDir t;
  write_bytes((t / "img.gz"), gzip(idx_images(3, 2, 3, kPixels)));
  write_bytes((t / "lab"), idx_labels(kLabels));
  check_small(load_idx((t / "img.gz"), (t / "lab")));
  write_bytes((t / "lab.gz"), gzip(idx_labels(kLabels)));
  check_small(load_idx((t / "img.gz"), (t / "lab.gz")));
}

TEST_CASE("read_maybe_gzip: raw passthrough, multi-member gzip, large output") {
  TempDir t;
  write_bytes((t / "raw"), "hello");
  CHECK(read_maybe_gzip((t / "raw")) == "hello");
  write_bytes((t / "two.gz"), gzip("abc") + gzip("defg"));
  CHECK(read_maybe_gzip((t / "two.gz")) == "abcdefg");
  // Highly compressible: the output grows far beyond the input.
  std::string big(3'000'000, 'z');
  for (size_t i = 0; i < big.size(); i += 997) big[i] = static_cast<char>('a' + i % 7);
  write_bytes((t / "big.gz"), gzip(big));
  CHECK(read_maybe_gzip((t / "big.gz")) == big);
  write_bytes((t / "empty.gz"), gzip(""));
  CHECK(read_maybe_gzip((t / "empty.gz")).empty());
}

TEST_CASE("idx: real Fashion-MNIST") {
  const std::string dir = "/usr/share/datasets/fashion-mnist/";
  if (!fs::exists(dir + "train-images-idx3-ubyte.gz")) {
    MESSAGE("Fashion-MNIST not installed; skipped");
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const Dataset train =
      load_idx(dir + "train-images-idx3-ubyte.gz", dir + "train-labels-idx1-ubyte.gz");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("Fashion-MNIST train loaded in " << secs << " s");
  CHECK(secs < 5.0);  // budget is < 2 s; slack for loaded CI machines
  CHECK(train.rows == 60000);
  CHECK(train.features == 784);
  CHECK(train.x.size() == 60000u * 784u);
  CHECK(train.num_classes == 10);
  std::vector<int64_t> count(10, 0);
  for (int32_t y : train.y) {
    REQUIRE(y >= 0);
    REQUIRE(y < 10);
    ++count[y];
  }
  for (int64_t c : count) CHECK(c == 6000);  // Fashion-MNIST train is balanced
  float lo = 1e9f, hi = -1e9f;
  for (float v : train.x) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  CHECK(lo == 0.0f);
  CHECK(hi == 255.0f);

  const Dataset test =
      load_idx(dir + "t10k-images-idx3-ubyte.gz", dir + "t10k-labels-idx1-ubyte.gz");
  CHECK(test.rows == 10000);
  CHECK(test.features == 784);
  CHECK(test.num_classes == 10);
}

TEST_CASE("idx: missing file names the path") {
  TempDir t;
  write_bytes((t / "lab"), idx_labels(kLabels));
  const std::string msg = user_error([&] { load_idx((t / "nope-images"), (t / "lab")); });
  CHECK(msg.find((t / "nope-images")) != std::string::npos);
  write_bytes((t / "img"), idx_images(3, 2, 3, kPixels));
  const std::string msg2 = user_error([&] { load_idx((t / "img"), (t / "nope-labels")); });
  CHECK(msg2.find((t / "nope-labels")) != std::string::npos);
}

TEST_CASE("idx: corrupt, truncated and trailing-garbage gzip") {
  TempDir t;
  std::vector<uint8_t> px(3 * 28 * 28);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i * 31 + i / 7);
  const std::string gz = gzip(idx_images(3, 28, 28, px));
  write_bytes((t / "lab"), idx_labels(kLabels));

  SUBCASE("truncated") {
    write_bytes((t / "img.gz"), gz.substr(0, gz.size() / 2));
    const std::string msg = user_error([&] { load_idx((t / "img.gz"), (t / "lab")); });
    CHECK(msg.find("truncated") != std::string::npos);
    CHECK(msg.find((t / "img.gz")) != std::string::npos);
  }
  SUBCASE("truncated trailer") {
    write_bytes((t / "img.gz"), gz.substr(0, gz.size() - 3));
    const std::string msg = user_error([&] { load_idx((t / "img.gz"), (t / "lab")); });
    CHECK(msg.find("truncated") != std::string::npos);
  }
  SUBCASE("corrupt body") {
    std::string bad = gz;
    for (size_t i = 20; i < 60; ++i) bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    write_bytes((t / "img.gz"), bad);
    const std::string msg = user_error([&] { load_idx((t / "img.gz"), (t / "lab")); });
    CHECK(msg.find("corrupt gzip") != std::string::npos);
    CHECK(msg.find((t / "img.gz")) != std::string::npos);
  }
  SUBCASE("bad CRC") {
    std::string bad = gz;
    bad[bad.size() - 6] = static_cast<char>(bad[bad.size() - 6] ^ 1);
    write_bytes((t / "img.gz"), bad);
    const std::string msg = user_error([&] { load_idx((t / "img.gz"), (t / "lab")); });
    CHECK(msg.find("corrupt gzip") != std::string::npos);
  }
  SUBCASE("trailing garbage") {
    write_bytes((t / "img.gz"), gz + "garbage");
    const std::string msg = user_error([&] { load_idx((t / "img.gz"), (t / "lab")); });
    CHECK(msg.find("trailing garbage") != std::string::npos);
  }
  SUBCASE("only the magic") {
    write_bytes((t / "img.gz"), "\x1f\x8b");
    const std::string msg = user_error([&] { load_idx((t / "img.gz"), (t / "lab")); });
    CHECK(msg.find("truncated") != std::string::npos);
  }
}

TEST_CASE("idx: bad headers") {
  TempDir t;
  const std::string img = (t / "images.idx"), lab = (t / "labels.idx");
  write_bytes(lab, idx_labels(kLabels));

  SUBCASE("labels file given as images: bad magic") {
    write_bytes(img, idx_labels(kLabels));
    const std::string msg = user_error([&] { load_idx(img, lab); });
    CHECK(msg.find("bad IDX magic 0x00000801") != std::string::npos);
    CHECK(msg.find(img) != std::string::npos);
  }
  SUBCASE("images file given as labels: bad magic") {
    write_bytes(img, idx_images(3, 2, 3, kPixels));
    const std::string msg = user_error([&] { load_idx(img, img); });
    CHECK(msg.find("bad IDX magic 0x00000803") != std::string::npos);
  }
  SUBCASE("a valid IDX file of another type or rank is named as such") {
    std::string four = idx_images(3, 2, 3, kPixels);
    four[3] = 4;  // [N, C, H, W]: what a colour dataset's IDX holds
    write_bytes(img, four);
    const std::string msg = user_error([&] { load_idx(img, lab); });
    CHECK_MESSAGE(
        msg.find("holds unsigned byte values of 4 dimension(s) (magic 0x00000804); "
                 "dtrain reads unsigned-byte images of 3 dimension(s)") != std::string::npos,
        msg);
    four[2] = 0x0D;  // floats
    write_bytes(img, four);
    CHECK(user_error([&] { load_idx(img, lab); }).find("holds float values") != std::string::npos);
  }
  SUBCASE("not IDX at all") {
    write_bytes(img, "P5\n28 28\n255\n" + std::string(784, 'x'));
    const std::string msg = user_error([&] { load_idx(img, lab); });
    CHECK(msg.find("bad IDX magic") != std::string::npos);
  }
  SUBCASE("too short") {
    write_bytes(img, std::string("\0\0", 2));
    CHECK(user_error([&] { load_idx(img, lab); }).find("too short") != std::string::npos);
  }
  SUBCASE("truncated header") {
    std::string s;
    put_be32(s, 0x00000803);
    put_be32(s, 3);
    write_bytes(img, s);
    const std::string msg = user_error([&] { load_idx(img, lab); });
    CHECK(msg.find("truncated") != std::string::npos);
    CHECK(msg.find(img) != std::string::npos);
  }
  SUBCASE("count larger than the data") {
    write_bytes(img, idx_images(100, 2, 3, kPixels));
    const std::string msg = user_error([&] { load_idx(img, lab); });
    CHECK(msg.find("size mismatch") != std::string::npos);
    CHECK(msg.find("100x2x3") != std::string::npos);
    CHECK(msg.find(img) != std::string::npos);
  }
  SUBCASE("a gzipped file shorter than its header says: the sizes in numbers") {
    write_bytes(img, gzip(idx_images(100, 2, 3, kPixels)));
    const std::string msg = user_error([&] { load_idx(img, lab); });
    CHECK_MESSAGE(msg.find("header says 100x2x3 (600 bytes of data) but the file has 18 bytes") !=
                      std::string::npos,
                  msg);
  }
  SUBCASE("absurd dims are rejected before allocating") {
    write_bytes(img, idx_images(0xffffffffu, 0xffffffffu, 0xffffffffu, kPixels));
    CHECK(user_error([&] { load_idx(img, lab); }).find("size mismatch") != std::string::npos);
  }
  SUBCASE("trailing bytes") {
    std::vector<uint8_t> more = kPixels;
    more.push_back(1);
    write_bytes(img, idx_images(3, 2, 3, more));
    CHECK(user_error([&] { load_idx(img, lab); }).find("size mismatch") != std::string::npos);
  }
  SUBCASE("labels count disagrees with the file size") {
    write_bytes(img, idx_images(3, 2, 3, kPixels));
    std::string s;
    put_be32(s, 0x00000801);
    put_be32(s, 5);
    s += std::string(3, '\1');
    write_bytes(lab, s);
    const std::string msg = user_error([&] { load_idx(img, lab); });
    CHECK(msg.find("size mismatch") != std::string::npos);
    CHECK(msg.find(lab) != std::string::npos);
  }
  SUBCASE("images and labels counts disagree") {
    write_bytes(img, idx_images(3, 2, 3, kPixels));
    write_bytes(lab, idx_labels({1, 2}));
    const std::string msg = user_error([&] { load_idx(img, lab); });
    CHECK(msg.find("3 images") != std::string::npos);
    CHECK(msg.find("2 labels") != std::string::npos);
    CHECK(msg.find(img) != std::string::npos);
    CHECK(msg.find(lab) != std::string::npos);
  }
  SUBCASE("zero images") {
    write_bytes(img, idx_images(0, 28, 28, {}));
    write_bytes(lab, idx_labels({}));
    const std::string msg = user_error([&] { load_idx(img, lab); });
    CHECK(msg.find("empty data set") != std::string::npos);
    CHECK(msg.find(img) != std::string::npos);
  }
  SUBCASE("zero-pixel images") {
    write_bytes(img, idx_images(3, 0, 28, {}));
    CHECK(user_error([&] { load_idx(img, lab); }).find("0 pixels") != std::string::npos);
  }
  SUBCASE("images of more than 2^31 pixels, by their header alone") {
    // (validate read the shape as unknown and skipped its model checks: "ok")
    write_bytes(img, idx_images(0, 46341, 46341, {}));
    const std::string msg = user_error([&] { idx_image_shape(img); });
    CHECK_MESSAGE(msg.find("46341x46341 pixels, 2147488281 each") != std::string::npos, msg);
    CHECK(idx_image_shape((t / "none")).empty());
  }
}

TEST_CASE("idx: label 255 is a valid class index") {
  TempDir t;
  write_bytes((t / "img"), idx_images(3, 2, 3, kPixels));
  write_bytes((t / "lab"), idx_labels({255, 0, 1}));
  const Dataset d = load_idx((t / "img"), (t / "lab"));
  CHECK(d.y[0] == 255);
  CHECK(d.num_classes == 256);
}

// An IDX images file whose header promises 10 images of 28x28, followed by `size` bytes in all
// (zeros; beyond what is written the file is sparse).
void write_lying_images(const std::string& path, uint64_t size) {
  {
    std::ofstream f(path, std::ios::binary);
    const unsigned char head[16] = {0, 0, 8, 3, 0, 0, 0, 10, 0, 0, 0, 28, 0, 0, 0, 28};
    f.write(reinterpret_cast<const char*>(head), 16);
  }
  std::filesystem::resize_file(path, size);
}

TEST_CASE("idx: a header that lies about the size is refused before the file is read") {
  TempDir dir;
  // 1 MiB of images behind a header promising 10 images of 28x28: refused from the file size
  // and the header alone (the message of that check names the size with the header; reading
  // the whole file first would reach the later check's message instead). A 2 GB file was read
  // whole before (9 s, 2.1 GB RSS).
  const std::string img = dir / "big-images.idx";
  write_lying_images(img, 16 + (1 << 20));
  std::string msg;
  try {
    load_idx(img, img);
  } catch (const UserError& e) {
    msg = e.what();
  }
  INFO(msg);
  CHECK(msg.find("size mismatch: header says 10x28x28 (7856 bytes with the header) but the "
                 "file has 1048592 bytes") != std::string::npos);
  // Compressed: inflating stops as soon as it passes the promised size.
  const std::string gz = dir / "big-images.idx.gz";
  {
    std::ifstream in(img, std::ios::binary);
    std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    gzFile g = gzopen(gz.c_str(), "wb");
    gzwrite(g, raw.data(), static_cast<unsigned>(raw.size()));
    gzclose(g);
  }
  msg.clear();
  try {
    load_idx(gz, gz);
  } catch (const UserError& e) {
    msg = e.what();
  }
  INFO(msg);
  CHECK(msg.find("header says 10x28x28 (7856 bytes with the header) but the compressed data "
                 "holds more") != std::string::npos);
}

// Runs `read` in a child process; returns its exit status (0: refused with a message holding
// `want`; 3: refused otherwise, 4: another exception, 5: read) and its peak RSS in KiB, which
// only the parent can read.
std::pair<int, long> read_in_child(const std::function<void()>& read, const std::string& want) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    try {
      read();
    } catch (const UserError& e) {
      _exit(std::string(e.what()).find(want) != std::string::npos ? 0 : 3);
    } catch (...) {
      _exit(4);
    }
    _exit(5);
  }
  int status = 0;
  rusage ru{};
  REQUIRE(wait4(pid, &status, 0, &ru) == pid);
  REQUIRE(WIFEXITED(status));
  return {WEXITSTATUS(status), ru.ru_maxrss};
}

// Loads `file` as images and labels in a child process (read_in_child).
std::pair<int, long> load_in_child(const std::string& file, const std::string& want) {
  return read_in_child([&] { load_idx(file, file); }, want);
}

TEST_CASE("read_maybe_gzip: a trailer that lies about the size costs at most its cap") {
  // The gzip trailer's ISIZE sizes the output buffer before inflating; set to 4 GiB - 1 on a
  // 40-byte file it zero-filled 4 GB, which zlib then refuses ("incorrect length check"). The
  // hint is trusted up to 16 times the file plus 64 MiB. Read in a child process, whose peak RSS
  // the parent reads.
  TempDir dir;
  const std::string lying = dir / "lying.gz";
  std::string bytes = gzip("hello, a small file");
  for (size_t i = bytes.size() - 4; i < bytes.size(); ++i) bytes[i] = '\xff';
  write_bytes(lying, bytes);
  const auto [status, rss] = read_in_child([&] { read_maybe_gzip(lying); }, "");  // (any refusal)
  CHECK(status == 0);
  INFO("child peak RSS ", rss, " KiB");
  CHECK(rss < 256 * 1024);  // KiB: the 64 MiB cap and the test binary, not 4 GiB
}

TEST_CASE("idx: a 2 GB file whose header lies is refused without reading it") {
  // Issue 16's case: 2 GB behind a header promising 10 images (a sparse file: no disk used).
  // Loaded in a child process, whose peak RSS the parent reads: it stays far below the file
  // (before the size check it was 2.1 GB).
  TempDir dir;
  const std::string img = dir / "huge-images.idx";
  write_lying_images(img, uint64_t{2} << 30);
  const auto [status, rss] = load_in_child(img, "size mismatch");
  CHECK(status == 0);
  INFO("child peak RSS ", rss, " KiB");
  CHECK(rss < 256 * 1024);  // KiB: under 256 MiB against the file's 2 GiB
}

TEST_CASE("idx: a gzip whose first bytes are no IDX header is refused before it is inflated") {
  // 256 MiB of zeros compress to about 250 KB; before, the file was inflated whole (2 GB of
  // zeros: 1.98 GB RSS) and only then refused for its magic. Loaded in a child process, whose
  // peak RSS the parent reads.
  TempDir dir;
  const std::string zeros = dir / "zeros.gz";
  {
    gzFile g = gzopen(zeros.c_str(), "wb1");
    const std::string chunk(1 << 20, '\0');
    for (int i = 0; i < 256; ++i) gzwrite(g, chunk.data(), static_cast<unsigned>(chunk.size()));
    gzclose(g);
  }
  // A header whose dims multiply past 2^40 (16384^3): refused from the header alone too.
  const std::string huge = dir / "huge-dims.gz";
  {
    gzFile g = gzopen(huge.c_str(), "wb");
    const unsigned char head[16] = {0, 0, 8, 3, 0, 0, 0x40, 0, 0, 0, 0x40, 0, 0, 0, 0x40, 0};
    gzwrite(g, head, sizeof head);
    gzclose(g);
  }
  for (const auto& [file, want] :
       {std::pair{zeros, std::string("bad IDX magic 0x00000000")},
        std::pair{huge, std::string("header says 16384x16384x16384, more than 2^40 bytes")}}) {
    CAPTURE(file);
    const auto [status, rss] = load_in_child(file, want);
    CHECK(status == 0);
    INFO("child peak RSS ", rss, " KiB");
    CHECK(rss < 64 * 1024);  // KiB: far below the 256 MiB the zeros inflate to
  }
}

}  // namespace
}  // namespace dtrain
