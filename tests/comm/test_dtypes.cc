// int64 and byte collectives against a serial reference: all-reduce (sum, min, max), broadcast,
// all-gather with equal and unequal counts, sync and async, for world sizes 1-5 and many sizes
// on the in-process backend and a subset over gRPC (streams and shared memory). Values include
// ones that do not survive a float round trip. Ranks that disagree on the element type of the
// same byte count fail at once with both sides named.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm_test_util.h"

using namespace dtrain;
using dtrain::testing::require_ok;
using dtrain::testing::run_ranks;

namespace {

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kTwo53p1 = (int64_t{1} << 53) + 1;  // the first integer a double cannot hold

// Rank r's element i for min/max: special values (the extremes, 2^53 + 1 and neighbours, -1)
// mixed with large odd numbers, different on every rank.
int64_t minmax_value(int r, size_t i) {
  const int64_t k = static_cast<int64_t>(i);
  switch ((i + static_cast<size_t>(r)) % 6) {
    case 0:
      return kMin + r;
    case 1:
      return kMax - r;
    case 2:
      return kTwo53p1 + 2 * r;
    case 3:
      return -1 - r;
    case 4:
      return (k * 0x9E3779B97F4A7C15LL) ^ (int64_t{r} << 40);
    default:
      return -kTwo53p1 * (r + 1) + k;
  }
}

// Rank r's element i for sums: never overflows for up to 8 ranks, and no partial sum fits a
// double when it is not a small integer. Element 3 mod 7 is kMin on rank 0 and small elsewhere.
int64_t sum_value(int r, size_t i) {
  const int64_t k = static_cast<int64_t>(i);
  switch (i % 7) {
    case 0:
      return kTwo53p1 + r;
    case 1:
      return -1;
    case 2:
      return (kMax / 16) - k - r;
    case 3:
      return r == 0 ? kMin : r;
    case 4:
      return -(kTwo53p1 * 3) + 7 * r;
    default:
      return k * 1000003 - r;
  }
}

uint8_t byte_value(int r, size_t i) {
  return static_cast<uint8_t>((i * 131 + static_cast<size_t>(r) * 29 + (i >> 8)) & 0xff);
}

std::string at(const std::string& what, size_t n, size_t i) {
  return what + " n=" + std::to_string(n) + " element " + std::to_string(i);
}

// int64 all-reduce of n elements with every op, sync and async, against the serial reference.
void check_allreduce(Communicator& c, size_t n) {
  const int w = c.size();
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
    auto v = [&](int r, size_t i) {
      return op == ReduceOp::kSum ? sum_value(r, i) : minmax_value(r, i);
    };
    std::vector<int64_t> d(n);
    for (size_t i = 0; i < n; ++i) d[i] = v(c.rank(), i);
    if (op == ReduceOp::kMax)
      c.allreduce_async(d.data(), n, op)->wait();
    else
      c.allreduce(d.data(), n, op);
    for (size_t i = 0; i < n; ++i) {
      int64_t want = v(0, i);
      for (int r = 1; r < w; ++r) {
        if (op == ReduceOp::kSum) want += v(r, i);
        if (op == ReduceOp::kMin) want = std::min(want, v(r, i));
        if (op == ReduceOp::kMax) want = std::max(want, v(r, i));
      }
      if (d[i] != want)
        throw std::runtime_error(at(std::string("allreduce ") + reduce_op_name(op), n, i) +
                                 ": got " + std::to_string(d[i]) + ", want " +
                                 std::to_string(want));
    }
  }
}

// Broadcast of n elements of T from every root.
template <typename T, typename Value>
void check_broadcast(Communicator& c, size_t n, Value value, const std::string& what) {
  for (int root = 0; root < c.size(); ++root) {
    std::vector<T> d(n, static_cast<T>(0x5a));
    if (c.rank() == root)
      for (size_t i = 0; i < n; ++i) d[i] = value(root, i);
    c.broadcast(d.data(), n, root);
    for (size_t i = 0; i < n; ++i)
      if (d[i] != value(root, i)) throw std::runtime_error(at(what, n, i));
  }
}

// All-gather of T with `counts` (equal or not), out of place and in place async.
template <typename T, typename Value>
void check_allgather(Communicator& c, const std::vector<size_t>& counts, Value value,
                     const std::string& what) {
  const int w = c.size(), me = c.rank();
  size_t total = 0, mine_at = 0;
  for (int r = 0; r < w; ++r) {
    if (r == me) mine_at = total;
    total += counts[static_cast<size_t>(r)];
  }
  const size_t mine = counts[static_cast<size_t>(me)];
  auto expect = [&](const std::vector<T>& got, const std::string& form) {
    size_t i = 0;
    for (int r = 0; r < w; ++r)
      for (size_t k = 0; k < counts[static_cast<size_t>(r)]; ++k, ++i)
        if (got[i] != value(r, k)) throw std::runtime_error(at(what + " " + form, total, i));
  };
  std::vector<T> in(mine), out(total, T{0});
  for (size_t k = 0; k < mine; ++k) in[k] = value(me, k);
  c.allgather(in.data(), out.data(), counts);
  expect(out, "allgather");

  std::vector<T> inplace(total, T{0});
  std::copy(in.begin(), in.end(), inplace.begin() + static_cast<std::ptrdiff_t>(mine_at));
  c.allgather_inplace_async(inplace.data(), counts)->wait();
  expect(inplace, "allgather_inplace_async");
}

// Counts of one rank's block, equal on every rank or different (rank 1's empty, when w > 1).
std::vector<size_t> counts_for(int w, size_t n, bool equal) {
  std::vector<size_t> counts(static_cast<size_t>(w), n);
  if (!equal)
    for (int r = 0; r < w; ++r) counts[static_cast<size_t>(r)] = r == 1 ? 0 : n + 3 * r;
  return counts;
}

// Element counts: int64s (the largest is 1 MiB + 24 bytes) and bytes.
const std::vector<size_t> kI64Sizes = {0, 1, 7, 1000, (size_t{1} << 17) + 3};
const std::vector<size_t> kByteSizes = {0, 1, 7, 1000, (size_t{1} << 20) + 3};

void check_all(Communicator& c, const std::vector<size_t>& i64_sizes,
               const std::vector<size_t>& byte_sizes) {
  for (size_t n : i64_sizes) {
    check_allreduce(c, n);
    check_broadcast<int64_t>(c, n, minmax_value, "int64 broadcast");
    for (bool equal : {true, false})
      check_allgather<int64_t>(c, counts_for(c.size(), n, equal), minmax_value, "int64");
  }
  for (size_t n : byte_sizes) {
    check_broadcast<uint8_t>(c, n, byte_value, "byte broadcast");
    for (bool equal : {true, false})
      check_allgather<uint8_t>(c, counts_for(c.size(), n, equal), byte_value, "byte");
  }
}

}  // namespace

TEST_CASE("int64 and byte collectives match the serial reference, world sizes 1-5 (inproc)") {
  for (int w = 1; w <= 5; ++w) {
    INFO("world ", w);
    require_ok(run_ranks(w, [&](Communicator& c) { check_all(c, kI64Sizes, kByteSizes); }));
  }
}

TEST_CASE("int64 and byte collectives with small segments (many messages per block)") {
  CommOptions opts;
  opts.segment_bytes = 100;  // 12 int64s, 100 bytes: boundaries fall inside elements' runs
  require_ok(run_ranks(
      3,
      [&](Communicator& c) {
        check_all(c, {0, 1, 7, 1000}, {0, 1, 7, 1000, 4099});
      },
      opts));
  opts.segment_bytes = 4;  // below one int64: one element per message
  require_ok(run_ranks(
      2,
      [&](Communicator& c) {
        check_all(c, {1, 7, 33}, {1, 7, 33});
      },
      opts));
}

TEST_CASE("int64 and byte collectives over gRPC streams, TCP and shared memory") {
  for (const std::string backend : {"grpc", "tcp", "shm"}) {
    INFO("backend ", backend);
    require_ok(run_ranks(
        3,
        [&](Communicator& c) {
          check_all(c, {0, 7, 1000, (size_t{1} << 17) + 3}, {1, 1000, (size_t{1} << 20) + 3});
        },
        {}, backend));
  }
}

TEST_CASE("async int64 all-reduces interleave with float collectives in call order") {
  require_ok(run_ranks(4, [&](Communicator& c) {
    const int w = c.size();
    std::vector<int64_t> counts = {c.rank() + 1, kTwo53p1, -(c.rank() + 1)};
    std::vector<float> f(1000, 1.0f);
    std::vector<int64_t> step = {int64_t{1} << 60 | c.rank()};
    auto a = c.allreduce_async(counts.data(), counts.size(), ReduceOp::kSum);
    auto b = c.allreduce_async(f.data(), f.size(), ReduceOp::kSum);
    auto d = c.allreduce_async(step.data(), 1, ReduceOp::kMax);
    d->wait();
    a->wait();
    b->wait();
    const int64_t tri = int64_t{w} * (w + 1) / 2;
    CHECK(counts == std::vector<int64_t>{tri, kTwo53p1 * w, -tri});
    CHECK(step[0] == (int64_t{1} << 60 | (w - 1)));
    for (float x : f) REQUIRE(x == static_cast<float>(w));
  }));
}

TEST_CASE("an int64 sum that overflows fails on every rank, naming the element") {
  const auto errors = run_ranks(3, [&](Communicator& c) {
    std::vector<int64_t> d = {1, c.rank() == 2 ? kMax : 1};
    c.allreduce(d.data(), d.size());
  });
  for (size_t r = 0; r < errors.size(); ++r) {
    INFO("rank ", r, ": ", errors[r]);
    CHECK(errors[r].find("overflows at element 1") != std::string::npos);
    CHECK(errors[r].find("int64 allreduce seq 0 (2 int64s)") != std::string::npos);
  }
}

TEST_CASE("ranks that disagree on the element type of the same bytes fail at once, both named") {
  CommOptions opts;
  opts.timeout_s = 30;  // a mismatch must not wait for the deadline
  // Each pair sends the same channel, parts and byte counts; only the element type differs.
  struct Case {
    const char* name;
    std::function<void(Communicator&)> a, b;  // rank 0, rank 1
    const char* a_says;
    const char* b_says;
  };
  const std::vector<Case> cases = {
      {"float vs int64 allgather",
       [](Communicator& c) {
         std::vector<float> in(2, 1.0f), out(4);
         c.allgather(in.data(), out.data(), {2, 2});
       },
       [](Communicator& c) {
         std::vector<int64_t> in(1, kTwo53p1), out(2);
         c.allgather(in.data(), out.data(), {1, 1});
       },
       "allgather seq 0", "int64 allgather seq 0"},
      {"int64 vs byte allgather",
       [](Communicator& c) {
         std::vector<int64_t> in(1, -1), out(2);
         c.allgather(in.data(), out.data(), {1, 1});
       },
       [](Communicator& c) {
         std::vector<uint8_t> in(8, 0xff), out(16);
         c.allgather(in.data(), out.data(), {8, 8});
       },
       "int64 allgather seq 0", "bytes allgather seq 0"},
  };
  for (const std::string backend : {"inproc", "grpc", "tcp", "shm"}) {
    for (const Case& k : cases) {
      INFO("backend ", backend, ", ", k.name);
      const auto t0 = std::chrono::steady_clock::now();
      const auto errors = run_ranks(
          2,
          [&](Communicator& c) {
            if (c.rank() == 0)
              k.a(c);
            else
              k.b(c);
          },
          opts, backend);
      const double el =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      CHECK(el < 20.0);
      const std::string all = errors[0] + " | " + errors[1];
      INFO(all);
      CHECK(all.find("mismatched calls") != std::string::npos);
      // Both sides, each with its element type, in one message (whichever rank saw it).
      auto has = [&](const std::string& x) { return all.find(x) != std::string::npos; };
      const std::string a = k.a_says, b = k.b_says;
      CHECK(((has("rank 0 sent " + a) && has("rank 1 expected " + b)) ||
             (has("rank 1 sent " + b) && has("rank 0 expected " + a))));
    }
  }
}

TEST_CASE("float and int64 broadcasts of the same bytes do not mix") {
  CommOptions opts;
  opts.timeout_s = 30;
  const auto errors = run_ranks(
      3,
      [&](Communicator& c) {
        if (c.rank() == 0) {
          std::vector<float> d(2, 1.0f);
          c.broadcast(d.data(), 2, 0);
          // (the root fails too, or its next call does)
          std::vector<float> x(1, 1.0f);
          c.allreduce(x.data(), 1);
        } else {
          std::vector<int64_t> d(1, 0);
          c.broadcast(d.data(), 1, 0);
        }
      },
      opts);
  const std::string all = errors[0] + " | " + errors[1] + " | " + errors[2];
  INFO(all);
  // Whichever side sees it first (rank 0 hears from rank 2 as rank 1 hears from rank 0), both
  // element types are named.
  auto has = [&](const std::string& x) { return all.find(x) != std::string::npos; };
  CHECK(((has("mismatched calls: rank 0 sent broadcast seq 0") &&
          has("expected int64 broadcast seq 0")) ||
         (has("mismatched calls: rank 2 sent int64 broadcast seq 0") &&
          has("rank 0 expected broadcast seq 0"))));
}

TEST_CASE("a stuck int64 collective names its element type in the error and desync report") {
  for (const std::string backend : {"inproc", "grpc"}) {
    INFO("backend ", backend);
    CommOptions opts;
    opts.timeout_s = 1.0;
    std::string report;
    const auto errors = run_ranks(
        3,
        [&](Communicator& c) {
          if (c.rank() == 1) {
            // Rank 1 skips the collective but stays alive (and beating) while the others give up.
            std::this_thread::sleep_for(std::chrono::milliseconds(2500));
            return;
          }
          std::vector<int64_t> d(5, 1);
          try {
            c.allreduce(d.data(), d.size());
          } catch (const CommError&) {
            if (c.rank() == 0) report = c.desync_report();
            throw;
          }
        },
        opts, backend, /*heartbeat_s=*/1.0);
    INFO(errors[0], "\n", report);
    CHECK(errors[0].find("int64 allreduce seq 0 (5 int64s) failed after") != std::string::npos);
    // Rank 2's row: over gRPC its position (with the element type) came in its heartbeats.
    size_t rows = 0;
    for (size_t at = report.find("int64 allreduce seq 0 (5 int64s)"); at != std::string::npos;
         at = report.find("int64 allreduce seq 0 (5 int64s)", at + 1))
      ++rows;
    CHECK(rows == 2);  // ranks 0 and 2; rank 1 is in no collective
    CHECK(report.find("(no collective)") != std::string::npos);
  }
}
