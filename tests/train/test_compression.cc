#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
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
  c.type = parse_enum<CompressionType>(type).value();
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

// ---- PowerSGD ----

namespace {

CompressionConfig psgd_cfg(int64_t rank, bool ef = true) {
  CompressionConfig c;
  c.type = CompressionType::kPowersgd;
  c.rank = rank;
  c.error_feedback = ef;
  return c;
}

// A parameter table in the model's layout: tensors back to back in the given order.
std::vector<ParamEntry> table(const std::vector<Shape>& shapes) {
  std::vector<ParamEntry> t;
  int64_t off = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ParamEntry e;
    e.name = "p";  // (not "p" + to_string: GCC 12 warns -Wrestrict on that, falsely)
    e.name += std::to_string(i);
    e.shape = shapes[i];
    e.offset = off;
    e.numel = shape_numel(shapes[i]);
    off += e.numel;
    t.push_back(e);
  }
  return t;
}

int64_t total(const std::vector<ParamEntry>& t) {
  return t.empty() ? 0 : t.back().offset + t.back().numel;
}

// Runs `world` ranks as threads: each builds a PowerSgd over `params` and, for every step s,
// calls allreduce_sum on grad(rank, s). Returns results[rank][step]; bytes[rank] its bytes sent.
struct PsgdRun {
  std::vector<std::vector<std::vector<float>>> results;
  std::vector<uint64_t> bytes;
  std::vector<double> residual_sq;  // per rank, after the last step
};
PsgdRun run_psgd(int world, const CompressionConfig& c, const std::vector<ParamEntry>& params,
                 int steps, const std::function<std::vector<float>(int, int)>& grad) {
  auto group = make_inproc_group(world);
  PsgdRun out;
  out.results.assign(static_cast<size_t>(world), {});
  out.bytes.assign(static_cast<size_t>(world), 0);
  out.residual_sq.assign(static_cast<size_t>(world), 0.0);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      Communicator comm(std::move(group[static_cast<size_t>(r)]));
      PowerSgd p(c, params, total(params), 42);
      for (int s = 0; s < steps; ++s) {
        auto g = grad(r, s);
        p.allreduce_sum(comm, g.data());
        out.results[static_cast<size_t>(r)].push_back(std::move(g));
      }
      out.bytes[static_cast<size_t>(r)] = comm.bytes_sent();
      out.residual_sq[static_cast<size_t>(r)] = p.residual_sq();
    });
  for (auto& t : threads) t.join();
  return out;
}

// a (n x k) times b^T (m x k): a rank <= k matrix, row-major.
std::vector<float> low_rank(int64_t n, int64_t m, int64_t k, uint64_t seed) {
  const auto a = random_vec(n * k, seed), b = random_vec(m * k, seed + 1000);
  std::vector<float> c(static_cast<size_t>(n * m), 0.0f);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l)
        s += static_cast<double>(a[static_cast<size_t>(i * k + l)]) *
             b[static_cast<size_t>(j * k + l)];
      c[static_cast<size_t>(i * m + j)] = static_cast<float>(s);
    }
  return c;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

}  // namespace

TEST_CASE("powersgd: which tensors are compressed, and the floats each step all-reduces") {
  // 40x30 and 5x30 pay at rank 4 (4 (n + m) < n m); 8x8 does not (4 x 16 = 64), nor 3x3, nor
  // any 1-D tensor.
  const auto t = table({{40, 30}, {40}, {5, 30}, {8, 8}, {3, 3}, {7}});
  PowerSgd p(psgd_cfg(4), t, total(t), 1);
  REQUIRE(p.matrices().size() == 2);
  CHECK(p.matrices()[0].offset == 0);
  CHECK(p.matrices()[1].offset == 1240);
  CHECK(p.dense_floats() == 40 + 64 + 9 + 7);
  CHECK(p.p_floats() == 4 * (40 + 5) + p.dense_floats());
  CHECK(p.q_floats() == 4 * (30 + 30));
  // rank >= min(n, m) never compresses.
  PowerSgd q(psgd_cfg(5), table({{6, 5}, {5, 100}}), 530, 1);
  CHECK(q.matrices().empty());
  CHECK(q.dense_floats() == 530);
  // A conv2d weight [O, I, kh, kw] is the matrix O x I*kh*kw, as PyTorch's powerSGD_hook views
  // it (cnn-ref's [64, 32, 3, 3] is 64 x 288; it was sent whole): so is any tensor of 3 or more
  // dimensions. Its bias stays exact; [4, 1, 3, 3] = 4 x 9 does not pay at rank 4.
  const auto c = table({{64, 32, 3, 3}, {64}, {4, 1, 3, 3}, {6, 5, 10}});
  PowerSgd conv(psgd_cfg(4), c, total(c), 1);
  REQUIRE(conv.matrices().size() == 2);
  CHECK(conv.matrices()[0].rows == 64);
  CHECK(conv.matrices()[0].cols == 288);
  CHECK(conv.matrices()[1].offset == 64 * 288 + 64 + 36);
  CHECK(conv.matrices()[1].rows == 6);
  CHECK(conv.matrices()[1].cols == 50);
  CHECK(conv.dense_floats() == 64 + 36);
  CHECK(conv.q_floats() == 4 * (288 + 50));
}

TEST_CASE("powersgd: every rank gets bitwise the same result, step after step") {
  const auto t = table({{40, 30}, {40}, {5, 30}, {3, 3}});
  const int world = 3;
  const auto run = run_psgd(world, psgd_cfg(4), t, 4, [&](int r, int s) {
    return random_vec(total(t), 100 + static_cast<uint64_t>(r * 10 + s));
  });
  for (int s = 0; s < 4; ++s)
    for (int r = 1; r < world; ++r) {
      INFO("step ", s, " rank ", r);
      CHECK(run.results[static_cast<size_t>(r)][static_cast<size_t>(s)] ==
            run.results[0][static_cast<size_t>(s)]);
    }
  // Random full-rank gradients are compressed: the result is not their sum.
  std::vector<float> sum(static_cast<size_t>(total(t)), 0.0f);
  for (int r = 0; r < world; ++r) {
    const auto v = random_vec(total(t), 100 + static_cast<uint64_t>(r * 10));
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += v[i];
  }
  CHECK(run.results[0][0] != sum);
}

TEST_CASE("powersgd: a gradient of rank <= r comes out as the exact all-reduced sum") {
  // Matrix 60x50 (r = 4). Case 1: each of 2 ranks holds a rank-2 matrix in its own column space,
  // the sum has rank 4 = r. Case 2: both in one rank-2 space (P is rank-deficient: two of its
  // columns are replaced by fresh orthogonal directions). Exact from the first step, and with
  // warm-started Q at every step. With error feedback only the first step: later ones also
  // carry the residual, float rounding of the earlier steps (~1e-5 relative) that error
  // feedback rightly sends on.
  // (the same as a conv2d weight [60, 2, 5, 5]: the matrix 60 x 50)
  for (const Shape& shape : {Shape{60, 50}, Shape{60, 2, 5, 5}})
    for (const bool ef : {false, true})
      for (const bool shared : {false, true}) {
        auto grad = [&](int r, int s) {
          auto v = low_rank(60, 50, 2, shared ? 5 + static_cast<uint64_t>(s) : 10 + r * 3 + s * 7);
          if (shared)  // the same column space, scaled differently on each rank
            for (float& x : v) x *= static_cast<float>(r + 1);
          const auto b = random_vec(60, 900 + static_cast<uint64_t>(r));
          v.insert(v.end(), b.begin(), b.end());
          return v;
        };
        const int steps = ef ? 1 : 3;
        const auto run = run_psgd(2, psgd_cfg(4, ef), table({shape, {60}}), steps, grad);
        for (int s = 0; s < steps; ++s) {
          std::vector<float> sum = grad(0, s);
          const auto g1 = grad(1, s);
          for (size_t i = 0; i < sum.size(); ++i) sum[i] += g1[i];
          const auto& got = run.results[0][static_cast<size_t>(s)];
          double err = 0;
          for (size_t i = 0; i < sum.size(); ++i)
            err = std::max(err, static_cast<double>(std::abs(got[i] - sum[i])));
          INFO("shape ", shape.size(), "-D, error feedback ", ef, ", shared column space ", shared,
               ", step ", s, ": max error ", err, " of max ", max_abs(sum));
          CHECK(err <= 1e-5 * max_abs(sum));
          // The bias is all-reduced, not approximated: exact (a + b is the same in any order).
          for (size_t i = 3000; i < sum.size(); ++i) REQUIRE(got[i] == sum[i]);
        }
      }
}

TEST_CASE("powersgd: error feedback delivers the sum of the true gradients over the steps") {
  // Two ranks, each with its own fixed full-rank gradient every step. Without feedback the
  // rank-2 approximation misses the same part every step, so the shortfall grows linearly; with
  // feedback it is the residual, which stays bounded, so the sums converge.
  const auto t = table({{30, 20}});
  const int steps = 200;
  auto grad = [](int r, int) { return random_vec(600, 300 + static_cast<uint64_t>(r)); };
  std::vector<double> given(600, 0.0);
  for (int r = 0; r < 2; ++r) {
    const auto g = grad(r, 0);
    for (size_t i = 0; i < 600; ++i) given[i] += steps * static_cast<double>(g[i]);
  }
  auto shortfall = [&](const PsgdRun& run, int upto) {
    std::vector<double> sent(600, 0.0);
    for (int s = 0; s < upto; ++s)
      for (size_t i = 0; i < 600; ++i) sent[i] += run.results[0][static_cast<size_t>(s)][i];
    double e = 0;
    for (size_t i = 0; i < 600; ++i) e += std::pow(given[i] * upto / steps - sent[i], 2);
    return std::sqrt(e);
  };
  const auto ef = run_psgd(2, psgd_cfg(2), t, steps, grad);
  const auto plain = run_psgd(2, psgd_cfg(2, false), t, steps, grad);
  const double e_half = shortfall(ef, steps / 2), e_full = shortfall(ef, steps);
  const double p_full = shortfall(plain, steps);
  double norm = 0;
  for (double x : given) norm += std::pow(x / steps, 2);
  norm = std::sqrt(norm);  // one step's summed gradient
  INFO("shortfall with feedback ", e_half, " -> ", e_full, ", without ", p_full,
       "; one step's gradient ", norm);
  CHECK(e_full < 0.1 * p_full);
  CHECK(e_full < 1.5 * e_half + 1e-3 * norm);  // bounded: does not grow with the steps
  CHECK(e_full < 10 * norm);
  // The shortfall is exactly what the ranks hold as residuals (sum of the two).
  CHECK(ef.residual_sq[0] > 0);
  CHECK(plain.residual_sq[0] == 0);
}

TEST_CASE("powersgd: a zero gradient gives zeros, not NaN, and compression resumes after it") {
  const auto t = table({{20, 16}, {20}});
  const auto rank1 = low_rank(20, 16, 1, 77);
  auto grad = [&](int, int s) {
    std::vector<float> v(static_cast<size_t>(total(t)), 0.0f);
    if (s >= 2) std::copy(rank1.begin(), rank1.end(), v.begin());
    return v;
  };
  const auto run = run_psgd(2, psgd_cfg(4, false), t, 5, grad);
  for (int s = 0; s < 2; ++s)
    for (float x : run.results[0][static_cast<size_t>(s)]) REQUIRE(x == 0.0f);
  // Q is zero after zero steps: the first nonzero step projects on fresh random directions (an
  // approximation, finite); from the next one the warm-started Q finds the matrix exactly.
  for (int s = 2; s < 5; ++s)
    for (float x : run.results[0][static_cast<size_t>(s)]) REQUIRE(std::isfinite(x));
  for (int s = 3; s < 5; ++s) {
    double err = 0;
    for (size_t i = 0; i < rank1.size(); ++i)
      err = std::max(err, static_cast<double>(
                              std::abs(run.results[0][static_cast<size_t>(s)][i] - 2 * rank1[i])));
    INFO("step ", s, " max error ", err);
    CHECK(err <= 1e-5 * 2 * max_abs(rank1));
  }
}

TEST_CASE("powersgd: rank >= min(n, m) falls back to the exact all-reduce") {
  const auto t = table({{6, 5}, {6}});
  auto grad = [&](int r, int s) {
    return random_vec(total(t), 500 + static_cast<uint64_t>(r * 10 + s));
  };
  const auto run = run_psgd(2, psgd_cfg(5), t, 2, grad);
  for (int s = 0; s < 2; ++s) {
    auto sum = grad(0, s);
    const auto g1 = grad(1, s);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += g1[i];
    CHECK(run.results[0][static_cast<size_t>(s)] == sum);
    CHECK(run.results[1][static_cast<size_t>(s)] == sum);
  }
}

TEST_CASE("powersgd: bytes sent are those of the factors, not of the gradient") {
  const auto t = table({{64, 48}, {64}, {10, 64}, {10}});
  PowerSgd p(psgd_cfg(4), t, total(t), 1);
  const int steps = 3;
  const auto run = run_psgd(2, psgd_cfg(4), t, steps, [&](int r, int s) {
    return random_vec(total(t), 40 + static_cast<uint64_t>(r * 10 + s));
  });
  // A 2-rank ring all-reduce of k floats sends k floats in total from the two ranks, twice
  // (reduce-scatter, all-gather): 4 k bytes each on average.
  const uint64_t factors = static_cast<uint64_t>(p.p_floats() + p.q_floats());
  CHECK(run.bytes[0] + run.bytes[1] == 2 * steps * 4 * factors);
  CHECK(factors * 4 < static_cast<uint64_t>(total(t)));
}
