// Shared by the gRPC transport tests (test_grpc.cc, test_grpc_faults.cc): ranks as threads
// of this process with their own transports, the data path each test runs on, payload patterns
// and a raw client of a rank's Data service. Test-only; everything is inline so that both files
// can include it.
#pragma once

#include <doctest/doctest.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "callback_queue.h"
#include "comm/communicator.h"
#include "comm/grpc_internal.h"
#include "comm/grpc_transport.h"
#include "dtrain.grpc.pb.h"
#include "msg_header_util.h"
#include "test_util.h"
#include "util/check.h"

namespace dtrain::grpc_test {

using Clock = std::chrono::steady_clock;

using dtrain::testing::contains;
using dtrain::testing::free_port;
using dtrain::testing::header;

// The data path of the running test (see EVERY_PATH_TEST_CASE); options() follows it.
enum class Path { kStreams = 0, kTcp = 1, kShm = 2 };
inline Path g_path = Path::kStreams;
inline const char* path_name(Path p) {
  return p == Path::kShm ? "shared memory" : p == Path::kTcp ? "TCP" : "gRPC streams";
}

inline void run_every_path(void (*body)()) {
  keep_callback_queue();
  for (const Path p : {Path::kStreams, Path::kTcp, Path::kShm}) {
    g_path = p;
    struct Reset {
      ~Reset() { g_path = Path::kStreams; }
    } reset;
    const std::string name = path_name(p);  // (INFO keeps a reference: a named string)
    INFO("data path: ", name);
    body();
  }
}

// A test case whose body runs over the gRPC streams, over TCP, then over shared memory.
#define EVERY_PATH_TEST_CASE(name, fn)       \
  static void fn();                          \
  TEST_CASE(name) {                          \
    ::dtrain::grpc_test::run_every_path(fn); \
  }                                          \
  static void fn()

// The path a helper process was told to use (DTRAIN_GRPC_HELPER_PATH), and the variable.
inline Path helper_path() {
  const char* v = std::getenv("DTRAIN_GRPC_HELPER_PATH");
  return v ? static_cast<Path>(std::atoi(v)) : Path::kStreams;
}
inline std::string helper_path_env() {
  return "DTRAIN_GRPC_HELPER_PATH=" + std::to_string(static_cast<int>(g_path));
}

inline GrpcOptions options(int rank, int world, int port) {
  keep_callback_queue();
  GrpcOptions o;
  o.shm = g_path == Path::kShm;
  o.tcp = g_path == Path::kTcp;
  o.rank = rank;
  o.world_size = world;
  o.master_port = port;
  o.token = "s3cret-token";
  o.config_hash = "cafe01";
  o.rendezvous_timeout_s = 20;
  o.connect_timeout_s = 20;
  return o;
}

inline Deadline in(double s) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// Connects `world` ranks concurrently. errors[r] is "" or rank r's connect_grpc failure.
struct Job {
  std::vector<std::unique_ptr<Transport>> t;
  std::vector<std::string> errors;
  bool ok() const {
    for (const auto& e : errors)
      if (!e.empty()) return false;
    return true;
  }
};
inline Job connect_job(int world, const std::function<GrpcOptions(int)>& opts,
                       const std::vector<int>& ranks = {}) {
  Job job;
  job.t.resize(world);
  job.errors.resize(world);
  std::vector<int> which = ranks;
  if (which.empty())
    for (int r = 0; r < world; ++r) which.push_back(r);
  std::vector<std::thread> threads;
  for (int r : which) {
    threads.emplace_back([&, r] {
      try {
        job.t[r] = connect_grpc(opts(r));
      } catch (const std::exception& e) {
        job.errors[r] = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  return job;
}
inline Job connect_job(int world) {
  const int port = free_port();
  return connect_job(world, [&](int r) { return options(r, world, port); });
}

inline void require_ok(const Job& job) {
  for (size_t r = 0; r < job.errors.size(); ++r)
    REQUIRE_MESSAGE(job.errors[r].empty(), "rank ", r, ": ", job.errors[r]);
}

// A thread that records its exception's message instead of terminating, and is joined when it
// goes out of scope (so a failing assertion in the test body cannot leave it running).
class Worker {
 public:
  explicit Worker(std::function<void()> fn)
      : t_([this, fn = std::move(fn)] {
          try {
            fn();
          } catch (const std::exception& e) {
            error = e.what();
          }
        }) {}
  ~Worker() { join(); }
  void join() {
    if (t_.joinable()) t_.join();
  }
  std::string error;  // "" if fn returned normally; read after join()

 private:
  std::thread t_;
};

// Runs fn(rank) on one thread per rank; returns each rank's error ("" if none).
inline std::vector<std::string> run_ranks(int world, const std::function<void(int)>& fn) {
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  return errors;
}

inline uint8_t pattern(int src, int dst, size_t size, size_t i) {
  return static_cast<uint8_t>(src * 31 + dst * 17 + size * 13 + i * 7 + (i >> 11));
}
inline std::vector<uint8_t> make_payload(int src, int dst, size_t size) {
  std::vector<uint8_t> v(size);
  for (size_t i = 0; i < size; ++i) v[i] = pattern(src, dst, size, i);
  return v;
}
// "" if data is what src sent to dst, else where it differs.
inline std::string verify(int src, int dst, const std::vector<uint8_t>& data) {
  for (size_t i = 0; i < data.size(); ++i)
    if (data[i] != pattern(src, dst, data.size(), i))
      return "byte " + std::to_string(i) + " of " + std::to_string(data.size()) + " from rank " +
             std::to_string(src) + " differs";
  return "";
}

// Sends to a peer that went away: the failure reaches the sender asynchronously, so allow a
// few attempts. Returns the error ("" if every send succeeded).
inline std::string send_fails_soon(Transport& t, int dst) {
  std::vector<uint8_t> b(100);
  for (int i = 0; i < 50; ++i) {
    try {
      t.send(dst, header(kP2PBit | 99, i, CommOp::kSendRecv, b.size()), b.data());
    } catch (const CommError& e) {
      return e.what();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return "";
}

inline const std::vector<size_t> kSizes = {0, 1, 1001, (size_t{5} << 20) + 3};

// A raw client of a rank's Data service, as a hostile or buggy peer would be.
struct RawStream {
  grpc::ClientContext ctx;
  wire::StreamAck ack;
  std::unique_ptr<wire::Data::Stub> stub;
  std::unique_ptr<grpc::ClientWriter<wire::Frame>> w;
  RawStream(const std::string& address, const std::string& token, int claimed_rank) {
    stub = wire::Data::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    if (!token.empty()) ctx.AddMetadata(kGrpcTokenKey, token);
    ctx.AddMetadata(kGrpcRankKey, std::to_string(claimed_rank));
    w = stub->Stream(&ctx, &ack);
  }
  grpc::Status finish() {
    w->WritesDone();
    return w->Finish();
  }
};

inline wire::Frame frame(int src, uint64_t channel, uint64_t total, uint64_t offset,
                         size_t payload) {
  wire::Frame f;
  f.set_src_rank(src);
  f.set_channel(channel);
  f.set_part(0);
  f.set_op(static_cast<uint32_t>(CommOp::kAllReduce));
  f.set_total_bytes(total);
  f.set_offset(offset);
  f.set_payload(std::string(payload, 'x'));
  return f;
}

}  // namespace dtrain::grpc_test
