#include <doctest/doctest.h>

#include <cmath>
#include <thread>

#include "comm/inproc.h"
#include "train/compression.h"
#include "util/rng.h"

using namespace dtrain;

namespace {

std::vector<float> random_vec(int64_t n, uint64_t seed, float scale = 1.0f) {
  Rng r(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = r.normal() * scale;
  return v;
}

CompressionConfig cfg(const std::string& type, double ratio = 0.01, bool ef = true) {
  CompressionConfig c;
  c.type = type;
  c.ratio = ratio;
  c.error_feedback = ef;
  return c;
}

std::vector<float> round_trip(const GradCompressor& g, const std::vector<float>& v) {
  std::vector<uint8_t> msg(g.message_bytes());
  g.encode(v.data(), msg.data());
  std::vector<float> out(v.size(), 0.0f);
  g.decode_add(msg.data(), out.data());
  return out;
}

}  // namespace

TEST_CASE("compression: message sizes are half, about a quarter, and 8 bytes per kept entry") {
  const int64_t n = 1000;
  CHECK(GradCompressor(cfg("fp16"), n).message_bytes() == 2000);
  CHECK(GradCompressor(cfg("bf16"), n).message_bytes() == 2000);
  CHECK(GradCompressor(cfg("int8"), n).message_bytes() == 4 * 4 + 1000);
  CHECK(GradCompressor(cfg("topk", 0.01), n).message_bytes() == 10 * 8);
  CHECK(GradCompressor(cfg("fp16"), 3).message_bytes() == 8);  // padded to whole floats
}

TEST_CASE("compression: encode/decode errors stay within each format's precision") {
  const int64_t n = 4099;  // not a multiple of the int8 block
  const auto v = random_vec(n, 1, 3.0f);
  const auto f16 = round_trip(GradCompressor(cfg("fp16"), n), v);
  const auto b16 = round_trip(GradCompressor(cfg("bf16"), n), v);
  const auto i8 = round_trip(GradCompressor(cfg("int8"), n), v);
  for (int64_t i = 0; i < n; ++i) {
    const float x = v[static_cast<size_t>(i)];
    REQUIRE(std::abs(f16[static_cast<size_t>(i)] - x) <= 1e-3f * std::abs(x) + 1e-7f);
    REQUIRE(std::abs(b16[static_cast<size_t>(i)] - x) <= 4e-3f * std::abs(x) + 1e-30f);
    // int8: half a quantisation step of its 256-value block.
    float amax = 0;
    const int64_t lo = i / 256 * 256;
    for (int64_t j = lo; j < std::min(n, lo + 256); ++j)
      amax = std::max(amax, std::abs(v[static_cast<size_t>(j)]));
    REQUIRE(std::abs(i8[static_cast<size_t>(i)] - x) <= amax / 127.0f * 0.5001f);
  }
  // top-k keeps exactly the k entries of largest magnitude, unchanged, and zeroes the rest.
  const auto tk = round_trip(GradCompressor(cfg("topk", 0.05), n), v);
  std::vector<float> mags;
  for (float x : v) mags.push_back(std::abs(x));
  std::sort(mags.begin(), mags.end(), std::greater<>());
  const int64_t k = static_cast<int64_t>(std::ceil(0.05 * n));
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float y = tk[static_cast<size_t>(i)];
    if (y != 0.0f) {
      ++kept;
      CHECK(y == v[static_cast<size_t>(i)]);
      CHECK(std::abs(y) >= mags[static_cast<size_t>(k - 1)]);
    }
  }
  CHECK(kept == k);
}

TEST_CASE("compression: error feedback carries what was dropped into later steps") {
  // One rank, the same gradient every step: without feedback top-k never sends most entries
  // and int8 repeats the same rounding error; with feedback the residual stays bounded, so
  // what was sent over T steps approaches what was given.
  auto group = make_inproc_group(1);
  Communicator comm(std::move(group[0]));
  const int64_t n = 500;
  for (const char* type : {"topk", "int8"}) {
    GradCompressor g(cfg(type, 0.02), n);
    GradCompressor plain(cfg(type, 0.02, false), n);
    std::vector<double> given(n, 0.0), sent(n, 0.0), sent_plain(n, 0.0);
    const auto g0 = random_vec(n, 100);
    for (int t = 0; t < 200; ++t) {
      auto v = g0;
      auto u = v;
      for (int64_t i = 0; i < n; ++i) given[static_cast<size_t>(i)] += v[static_cast<size_t>(i)];
      g.allreduce_sum(comm, v.data());
      plain.allreduce_sum(comm, u.data());
      for (int64_t i = 0; i < n; ++i) {
        sent[static_cast<size_t>(i)] += v[static_cast<size_t>(i)];
        sent_plain[static_cast<size_t>(i)] += u[static_cast<size_t>(i)];
      }
    }
    double err = 0, err_plain = 0;
    for (int64_t i = 0; i < n; ++i) {
      err += std::abs(given[static_cast<size_t>(i)] - sent[static_cast<size_t>(i)]);
      err_plain += std::abs(given[static_cast<size_t>(i)] - sent_plain[static_cast<size_t>(i)]);
    }
    INFO(std::string(type), ": error with feedback ", err, ", without ", err_plain);
    CHECK(err < 0.5 * err_plain);
  }
}

TEST_CASE("compression: every rank gets the same sum of all ranks' compressed gradients") {
  for (const char* type : {"fp16", "bf16", "int8", "topk"}) {
    const int world = 3;
    const int64_t n = 777;
    auto group = make_inproc_group(world);
    std::vector<std::vector<float>> results(world);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r)
      threads.emplace_back([&, r] {
        Communicator comm(std::move(group[static_cast<size_t>(r)]));
        GradCompressor g(cfg(type, 0.1), n);
        auto v = random_vec(n, 7 + static_cast<uint64_t>(r));
        g.allreduce_sum(comm, v.data());
        results[static_cast<size_t>(r)] = v;
      });
    for (auto& t : threads) t.join();
    // Reference: decode(encode(v_r)) summed in rank order.
    GradCompressor ref(cfg(type, 0.1), n);
    std::vector<float> sum(n, 0.0f);
    for (int r = 0; r < world; ++r) {
      const auto v = random_vec(n, 7 + static_cast<uint64_t>(r));
      std::vector<uint8_t> msg(ref.message_bytes());
      ref.encode(v.data(), msg.data());
      ref.decode_add(msg.data(), sum.data());
    }
    INFO(std::string(type));
    for (int r = 0; r < world; ++r) CHECK(results[static_cast<size_t>(r)] == sum);
  }
}
