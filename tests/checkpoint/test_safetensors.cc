// safetensors: round trip, exact byte layout, atomic replace, and the reader's validation of
// hostile input (crafted bad headers plus byte flips and truncations of a valid file).
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "checkpoint/st_dtype.h"
#include "test_util.h"
#include "util/check.h"
#include "util/fs.h"

namespace dtrain {
namespace {

using testing::TempDir;

namespace fs = std::filesystem;

// Plain (non-atomic, no fsync) write: the fuzz test writes thousands of files.
void put(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

std::string floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// A file from a header text and data bytes; `len` overrides the header length field.
std::string craft(const std::string& header, const std::string& data,
                  std::optional<uint64_t> len = std::nullopt) {
  return le64(len.value_or(header.size())) + header + data;
}

// Runs read_safetensors and returns the UserError message ("" when it did not throw one).
// Any other exception type fails the calling test.
std::string read_error(const std::string& path) {
  try {
    read_safetensors(path);
  } catch (const UserError& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("not a UserError: " << e.what());
  }
  return "";
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_CASE("round trip: names, shapes, bits and metadata") {
  TempDir tmp;
  const std::string path = (tmp / "model.safetensors");
  const float nan_payload = std::bit_cast<float>(0x7fc12345u);
  const std::vector<float> w = {
      1.0f,       -0.0f, 3.5f, 1e-42f /* denormal */, std::numeric_limits<float>::infinity(),
      nan_payload};
  const std::vector<float> s = {42.0f};
  const std::vector<float> b = {0.1f, 0.2f, 0.3f};
  const std::map<std::string, std::string> meta = {
      {"step", "42"}, {"config", "{\"lr\": 0.1}"}, {"unicode", "h\xc3\xa9llo"}, {"empty", ""}};
  write_safetensors(path,
                    {{"layers.0.weight", {2, 3}, w.data()},
                     {"scalar", {}, s.data()},
                     {"empty", {0, 3}, nullptr},
                     {"layers.0.bias", {3}, b.data()}},
                    meta);
  const StFile f = read_safetensors(path);
  CHECK(f.metadata == meta);
  REQUIRE(f.tensors.size() == 4);
  CHECK(f.tensors.at("layers.0.weight").shape == std::vector<int64_t>{2, 3});
  CHECK(same_bits(f.tensors.at("layers.0.weight").data, w));
  CHECK(f.tensors.at("scalar").shape.empty());
  CHECK(same_bits(f.tensors.at("scalar").data, s));
  CHECK(f.tensors.at("empty").shape == std::vector<int64_t>{0, 3});
  CHECK(f.tensors.at("empty").data.empty());
  CHECK(same_bits(f.tensors.at("layers.0.bias").data, b));

  // No tensors, no metadata: still a valid file, whose checksum table is empty.
  write_safetensors(path, {}, {});
  const StFile e = read_safetensors(path);
  CHECK(e.tensors.empty());
  CHECK(e.metadata.empty());
  CHECK(read_file(path) ==
        le64(64) + R"({"__metadata__":{"crc32":"{}","crc32_header":"078051c7"}})" + "       ");
}

TEST_CASE("exact byte layout of a tiny file") {
  TempDir tmp;
  const std::string path = (tmp / "tiny.safetensors");
  const std::vector<float> w = {1.5f, -2.0f}, s = {0.25f};
  write_safetensors(path, {{"w", {2}, w.data()}, {"s", {}, s.data()}}, {{"k", "v"}});
  // Tensors in the order given, offsets relative to the data section, zlib CRC-32s of each
  // tensor's bytes after the metadata, then the header's own CRC-32: of its canonical form
  // (keys sorted, compact, without crc32_header), which Python reproduces as
  // zlib.crc32(json.dumps(h, sort_keys=True, separators=(',', ':')).encode()). 208 JSON bytes,
  // a multiple of 8: no padding.
  const std::string json =
      R"({"__metadata__":{"k":"v","crc32":"{\"w\":\"ccdf2c3a\",\"s\":\"dba65afc\"}",)"
      R"("crc32_header":"aa3b0b8b"},)"
      R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("s":{"dtype":"F32","shape":[],"data_offsets":[8,12]}})";
  REQUIRE(json.size() == 208);
  const std::string want =
      std::string("\xd0\0\0\0\0\0\0\0", 8) + json + floats({1.5f, -2.0f, 0.25f});
  const std::string got = read_file(path);
  CHECK(got.size() == 8 + 208 + 12);
  CHECK(got == want);
  // Checksums in upper-case hex (another tool's spelling; it was "the file is corrupt"): the
  // header's (which covers the tensors' as written) ...
  std::string upper = want;
  upper.replace(upper.find("aa3b0b8b"), 8, "AA3B0B8B");
  put(path, upper);
  CHECK(read_safetensors(path).tensors.at("w").data == w);
  // ... and the tensors', in a header without its own checksum.
  put(path, craft(R"({"__metadata__":{"crc32":"{\"w\":\"CCDF2C3A\"}"},)"
                  R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                  floats(w)));
  CHECK(read_safetensors(path).tensors.at("w").data == w);
}

TEST_CASE("the header carries its own CRC-32: an edited step or shape is refused") {
  TempDir tmp;
  const std::string path = (tmp / "h.safetensors");
  const std::vector<float> w = {1.5f, -2.0f};
  write_safetensors(path, {{"w", {2}, w.data()}}, {{"step", "4"}});
  CHECK(read_safetensors(path).metadata.at("step") == "4");
  CHECK_FALSE(read_safetensors(path).metadata.contains("crc32_header"));  // reserved, not data
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {R"("step":"4")", R"("step":"5")"}, {R"("shape":[2])", R"("shape":[1])"}}) {
    std::string bytes = read_file(path);
    const size_t at = bytes.find(from);
    REQUIRE(at != std::string::npos);
    bytes.replace(at, from.size(), to);
    const std::string bad = (tmp / "bad.safetensors");
    std::ofstream(bad, std::ios::binary | std::ios::trunc) << bytes;
    CHECK_THROWS_WITH_AS(read_safetensors(bad),
                         doctest::Contains("corrupt header: it fails its CRC-32 check"), UserError);
    CHECK_THROWS_AS(read_safetensors_metadata(bad), UserError);
  }
}

TEST_CASE("a file of 50,000 tensors round-trips, in the order given") {
  // (a header of that many tensors was built in time quadratic in their number: 60,000 took
  // 31 s to save, while loading took well under one)
  TempDir tmp;
  const std::string path = (tmp / "many.safetensors");
  constexpr int kN = 50'000;
  std::vector<float> values(kN);
  std::vector<StTensorRef> refs;
  for (int i = 0; i < kN; ++i) {
    values[static_cast<size_t>(i)] = static_cast<float>(i) * 0.5f;
    refs.push_back({"t" + std::to_string(kN - i), {1}, &values[static_cast<size_t>(i)]});
  }
  write_safetensors(path, refs, {{"step", "1"}});
  const StFile f = read_safetensors(path);
  REQUIRE(f.tensors.size() == static_cast<size_t>(kN));
  CHECK(f.checksummed);
  CHECK(f.header_checksummed);
  for (int i = 0; i < kN; i += 997)
    CHECK(f.tensors.at("t" + std::to_string(kN - i)).data == std::vector<float>{i * 0.5f});
  // In the order given: t50000 first (offset 0), t1 last.
  const std::string bytes = read_file(path);
  const size_t first = bytes.find(R"("t50000":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})");
  const size_t second = bytes.find(R"("t49999":{"dtype":"F32","shape":[1],"data_offsets":[4,8]})");
  const size_t last =
      bytes.find(R"("t1":{"dtype":"F32","shape":[1],"data_offsets":[199996,200000]})");
  CHECK(first != std::string::npos);
  CHECK(second != std::string::npos);
  CHECK(last != std::string::npos);
  CHECK(first < second);
  CHECK(second < last);
  CHECK_THROWS_AS(write_safetensors(path, {refs[0], refs[1], refs[0]}, {}), InternalError);
}

TEST_CASE("writer rejects inconsistent input as internal errors") {
  TempDir tmp;
  const std::string path = (tmp / "x.safetensors");
  const float v[2] = {1, 2};
  CHECK_THROWS_AS(write_safetensors(path, {{"a", {2}, v}, {"a", {2}, v}}, {}), InternalError);
  CHECK_THROWS_AS(write_safetensors(path, {{"a", {-1}, v}}, {}), InternalError);
  CHECK_THROWS_AS(write_safetensors(path, {{"a", {2}, nullptr}}, {}), InternalError);
  CHECK_THROWS_AS(write_safetensors(path, {{"__metadata__", {2}, v}}, {}), InternalError);
  CHECK_FALSE(fs::exists(path));
}

// A real I/O failure in the middle of streaming the tensor bytes: RLIMIT_FSIZE makes write(2)
// fail with EFBIG (SIGXFSZ ignored) once the temp file reaches 4 KiB.
TEST_CASE("a failed write leaves the old file intact") {
  TempDir tmp;
  const std::string path = (tmp / "ckpt.safetensors");
  const std::vector<float> old_data = {1, 2, 3};
  write_safetensors(path, {{"old", {3}, old_data.data()}}, {{"v", "1"}});
  const std::string before = read_file(path);

  const std::vector<float> big(100000, 7.0f);
  rlimit saved;
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
  rlimit small = saved;
  small.rlim_cur = 4096;
  void (*old_handler)(int) = ::signal(SIGXFSZ, SIG_IGN);
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  bool threw = false;
  try {
    write_safetensors(path, {{"big", {100000}, big.data()}}, {{"v", "2"}});
  } catch (const std::runtime_error&) {
    threw = true;
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::signal(SIGXFSZ, old_handler);
  CHECK(threw);
  CHECK(read_file(path) == before);
  CHECK(read_safetensors(path).metadata.at("v") == "1");
  int files = 0;  // the temp file was removed
  for (const auto& entry : fs::directory_iterator(fs::path(tmp.path()))) {
    (void)entry;
    ++files;
  }
  CHECK(files == 1);
}

struct BadCase {
  const char* what;
  std::string bytes;
  const char* expect;  // substring of the message
};

TEST_CASE("corrupt, truncated and unsupported files are UserErrors naming the file") {
  TempDir tmp;
  const std::string path = (tmp / "bad.safetensors");
  const std::string f8 = floats({1, 2});  // 8 data bytes
  auto one = [](const std::string& entry) { return R"({"a":)" + entry + "}"; };
  const std::vector<BadCase> cases = {
      {"empty file", "", "truncated"},
      {"short file", "abcde", "truncated"},
      {"header longer than file", craft("{}", "", 200), "truncated"},
      {"absurd header length", craft("{}", "", 1ULL << 62), "header length"},
      {"not json", craft("hello!!!", ""), "corrupt header"},
      {"json garbage after", craft("{} x", ""), "corrupt header"},
      {"invalid utf-8", craft("{\"\xff\":1}", ""), "corrupt header"},
      {"not an object", craft("[1,2]", ""), "not a JSON object"},
      {"too deep", craft(one(std::string(100, '[') + std::string(100, ']')), ""), "deep"},
      {"entry not object", craft(one("5"), ""), "tensor 'a'"},
      {"missing shape", craft(one(R"({"dtype":"F32","data_offsets":[0,8]})"), f8), "lacks"},
      {"bad dtype", craft(one(R"({"dtype":"F16","shape":[4],"data_offsets":[0,8]})"), f8),
       "tensor 'a' has dtype F16"},
      {"dtype not string", craft(one(R"({"dtype":3,"shape":[2],"data_offsets":[0,8]})"), f8),
       "dtype"},
      {"negative dim", craft(one(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"), f8),
       "shape"},
      {"float dim", craft(one(R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})"), f8),
       "shape"},
      {"shape not list", craft(one(R"({"dtype":"F32","shape":2,"data_offsets":[0,8]})"), f8),
       "shape"},
      {"overflowing shape",
       craft(one(R"({"dtype":"F32","shape":[4294967296,4294967296,4294967296],)"
                 R"("data_offsets":[0,8]})"),
             f8),
       "shape"},
      {"one offset", craft(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0]})"), f8),
       "data_offsets"},
      {"reversed offsets", craft(one(R"({"dtype":"F32","shape":[2],"data_offsets":[8,0]})"), f8),
       "data_offsets"},
      {"string offsets", craft(one(R"({"dtype":"F32","shape":[2],"data_offsets":["0","8"]})"), f8),
       "data_offsets"},
      {"span != 4*numel", craft(one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})"), f8),
       "needs 12"},
      {"overlap",
       craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
             floats({1, 2, 3})),
       "overlap"},
      {"gap",
       craft(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
             floats({1, 2, 3})),
       "gap"},
      {"not starting at 0", craft(one(R"({"dtype":"F32","shape":[1],"data_offsets":[4,8]})"), f8),
       "gap"},
      {"data truncated", craft(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})"), "1234"),
       "truncated"},
      {"huge tensor, tiny file",
       craft(one(R"({"dtype":"F32","shape":[1000000000000],"data_offsets":[0,4000000000000]})"),
             f8),
       "truncated"},
      {"trailing bytes", craft(one(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})"), f8),
       "trailing"},
      // (a tensor named twice, the two entries together covering the data: the reader took the
      // second entry's bytes in silence)
      {"tensor named twice",
       craft(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
             R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
             f8),
       "names the key 'a' twice"},
      {"metadata key twice", craft(R"({"__metadata__":{"k":"1","k":"2"}})", ""), "'k' twice"},
      // (3 bytes per value, ~80 bytes per parsed value: a 99 MB header took 3.1 GB; the limit
      // is 2M values plus one per 5 bytes)
      {"six million empty objects",
       craft(R"({"__metadata__":null,"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":[)" +
                 [] {
                   std::string t;
                   for (int i = 0; i < 6'000'000; ++i) t += "{},";
                   return t;
                 }() +
                 "{}]}}",
             floats({1})),
       "its JSON holds more than"},
      {"metadata value not string", craft(R"({"__metadata__":{"k":1}})", ""), "metadata"},
      {"metadata not object", craft(R"({"__metadata__":["k"]})", ""), "__metadata__"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    put(path, c.bytes);
    const std::string msg = read_error(path);
    CAPTURE(msg);
    CHECK(msg.find(path) != std::string::npos);
    CHECK(msg.find(c.expect) != std::string::npos);
  }

  // A valid file, truncated by one float.
  const std::vector<float> v = {1, 2, 3, 4};
  write_safetensors(path, {{"v", {4}, v.data()}}, {});
  std::string bytes = read_file(path);
  put(path, bytes.substr(0, bytes.size() - 4));
  CHECK(read_error(path).find("truncated") != std::string::npos);

  // Not a file at all.
  CHECK(read_error((tmp / "missing.safetensors")).find("missing.safetensors") != std::string::npos);
  CHECK(read_error(tmp.path()).find(tmp.path()) != std::string::npos);

  // Accepted variations the reference also accepts: null metadata, extra keys, other key order.
  put(path, craft(R"({"__metadata__":null,"a":{"data_offsets":[0,4],"shape":[1],)"
                  R"("dtype":"F32","extra":true}})",
                  floats({9})));
  const StFile ok = read_safetensors(path);
  CHECK(ok.tensors.at("a").data == std::vector<float>{9});
}

// Every single-byte corruption and every truncation of a valid file: reading either succeeds
// with self-consistent tensors or throws UserError, never anything else (and never crashes).
TEST_CASE("fuzz: byte flips and truncations never escape as anything but UserError") {
  TempDir tmp;
  const std::string good = (tmp / "good.safetensors");
  const std::string path = (tmp / "fuzz.safetensors");
  const std::vector<float> w = {1, 2, 3, 4, 5, 6}, s = {7};
  write_safetensors(good, {{"w", {2, 3}, w.data()}, {"z", {0}, nullptr}, {"s", {}, s.data()}},
                    {{"note", "x"}});
  const std::string bytes = read_file(good);
  REQUIRE(read_error(good).empty());

  int ok = 0, rejected = 0;
  auto try_bytes = [&](const std::string& b, size_t pos, int variant) {
    put(path, b);
    try {
      const StFile f = read_safetensors(path);
      for (const auto& [name, t] : f.tensors) {
        int64_t numel = 1;
        for (int64_t d : t.shape) numel *= d;
        CHECK(static_cast<int64_t>(t.data.size()) == numel);
      }
      ++ok;
    } catch (const UserError& e) {
      if (std::string(e.what()).find(path) == std::string::npos) {
        FAIL("message lacks the path at " << pos << "/" << variant << ": " << e.what());
      }
      ++rejected;
    } catch (const std::exception& e) {
      FAIL("byte " << pos << " variant " << variant << ": " << e.what());
    }
  };
  const unsigned char xors[] = {0x01, 0x02, 0x10, 0x20, 0x80, 0xff};
  const char sets[] = {'"', '{', '}', '[', ']', ',', ':', '9', '-', '\0', ' ', '\\'};
  for (size_t pos = 0; pos < bytes.size(); ++pos) {
    int variant = 0;
    for (unsigned char x : xors) {
      std::string b = bytes;
      b[pos] = static_cast<char>(static_cast<unsigned char>(b[pos]) ^ x);
      try_bytes(b, pos, variant++);
    }
    for (char c : sets) {
      std::string b = bytes;
      b[pos] = c;
      try_bytes(b, pos, variant++);
    }
  }
  for (size_t len = 0; len < bytes.size(); ++len) {
    put(path, bytes.substr(0, len));
    CHECK(!read_error(path).empty());  // every truncation is detected
  }
  put(path, bytes + "X");
  CHECK(read_error(path).find("trailing") != std::string::npos);
  CHECK(ok > 0);  // flips inside tensor data are valid files
  CHECK(rejected > 0);
}

template <typename T>
std::string raw_bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

TEST_CASE("st_to_f32: F16 and BF16 widen exactly, F64 rounds, beyond float32's range is infinite") {
  // Every one of the 65,536 halves against the compiler's own _Float16 conversion.
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    float got = 0;
    st_to_f32("F16", &h, 1, &got);
    const float want = static_cast<float>(std::bit_cast<_Float16>(h));
    if (std::isnan(want)) {
      REQUIRE_MESSAGE(std::isnan(got), bits);
      CHECK(std::signbit(got) == std::signbit(want));
    } else {
      REQUIRE_MESSAGE(std::bit_cast<uint32_t>(got) == std::bit_cast<uint32_t>(want), bits);
    }
  }
  const std::vector<uint16_t> bf16 = {0x3f80, 0xc000, 0x0001, 0x7f80, 0xff80, 0x8000};
  std::vector<float> got(bf16.size());
  st_to_f32("BF16", bf16.data(), bf16.size(), got.data());
  CHECK(
      same_bits(got, {1.0f, -2.0f, std::bit_cast<float>(0x00010000u), INFINITY, -INFINITY, -0.0f}));
  constexpr float kMax = std::numeric_limits<float>::max();
  const std::vector<double> f64 = {0.1,
                                   -1e-300,
                                   static_cast<double>(kMax),
                                   0x1.fffffefffffffp127,  // just below the boundary: FLT_MAX
                                   0x1.ffffffp127,         // the boundary: infinity
                                   -1e300,
                                   std::numeric_limits<double>::quiet_NaN()};
  got.resize(f64.size());
  st_to_f32("F64", f64.data(), f64.size(), got.data());
  CHECK(got[0] == 0.1f);
  CHECK(std::bit_cast<uint32_t>(got[1]) == 0x80000000u);  // -0: below float32's subnormals
  CHECK(got[2] == kMax);
  CHECK(got[3] == kMax);
  CHECK(got[4] == INFINITY);
  CHECK(got[5] == -INFINITY);
  CHECK(std::isnan(got[6]));
  CHECK(st_dtype_bytes("BF16") == 2);
  CHECK(st_dtype_bytes("I64") == 8);
  CHECK(st_dtype_bytes("F8_E4M3") == 1);
  CHECK(st_dtype_bytes("F128") == 0);
  CHECK_FALSE(st_dtype_converts("I32"));
}

TEST_CASE("read_safetensors with convert: other float dtypes as float32, the rest listed unread") {
  TempDir tmp;
  const std::string path = tmp / "mixed.safetensors";
  const std::vector<uint16_t> h = {0x3c00, 0xc200};  // F16 1, -3
  const std::vector<uint16_t> b = {0x4040};          // BF16 3
  const std::vector<double> d = {0.25, -8.0, 1e-3};
  const std::vector<int64_t> step = {7};
  const std::vector<float> f = {5.0f};
  put(path, craft(R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},)"
                  R"("b":{"dtype":"BF16","shape":[1,1],"data_offsets":[4,6]},)"
                  R"("d":{"dtype":"F64","shape":[3],"data_offsets":[6,30]},)"
                  R"("step":{"dtype":"I64","shape":[],"data_offsets":[30,38]},)"
                  R"("f":{"dtype":"F32","shape":[1],"data_offsets":[38,42]}})",
                  raw_bytes(h) + raw_bytes(b) + raw_bytes(d) + raw_bytes(step) + raw_bytes(f)));
  // dtrain's own reading refuses the first dtype that is not F32 (keys in sorted order).
  CHECK(read_error(path).find("tensor 'b' has dtype BF16; only F32 is supported") !=
        std::string::npos);
  StReadOptions options;
  options.convert = true;
  StFile file = read_safetensors(path, options);
  REQUIRE(file.tensors.size() == 5);
  CHECK(same_bits(file.tensors.at("h").data, {1.0f, -3.0f}));
  CHECK(same_bits(file.tensors.at("b").data, {3.0f}));
  CHECK(file.tensors.at("b").shape == std::vector<int64_t>{1, 1});
  CHECK(same_bits(file.tensors.at("d").data, {0.25f, -8.0f, 1e-3f}));
  CHECK(same_bits(file.tensors.at("f").data, {5.0f}));
  const StTensor& s = file.tensors.at("step");
  CHECK_FALSE(s.loaded);
  CHECK(s.dtype == "I64");
  CHECK(s.data.empty());
  CHECK(file.tensors.at("h").dtype == "F16");
  // `wanted` leaves the others unread.
  options.wanted = [](const std::string& name) { return name == "d"; };
  file = read_safetensors(path, options);
  CHECK(file.tensors.at("d").loaded);
  CHECK_FALSE(file.tensors.at("h").loaded);
  CHECK(file.tensors.at("h").data.empty());
  // Sizes follow the dtype: an F64 tensor of 3 needs 24 bytes; a dtype the format lacks is named.
  put(path,
      craft(R"({"d":{"dtype":"F64","shape":[3],"data_offsets":[0,12]}})", std::string(12, 0)));
  try {
    read_safetensors(path, options);
    FAIL("no error");
  } catch (const UserError& e) {
    CHECK(std::string(e.what()).find("needs 24") != std::string::npos);
  }
  put(path, craft(R"({"q":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})", std::string(1, 0)));
  try {
    read_safetensors(path, options);
    FAIL("no error");
  } catch (const UserError& e) {
    CHECK(std::string(e.what()).find(
              "tensor 'q' has dtype F4, which the safetensors format does not define") !=
          std::string::npos);
  }
}

}  // namespace
}  // namespace dtrain
