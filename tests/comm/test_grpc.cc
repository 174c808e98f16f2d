// The gRPC transport: rendezvous and all-pairs data exchange over many world sizes and
// message sizes, concurrency, mutual TLS, collectives, and a throughput benchmark (skipped).
// Ranks are threads of this process, each with its own transport, server and streams; ports are
// always chosen free. Most tests run three times: data on the gRPC streams only, on the TCP data
// path (GrpcOptions::tcp), then on the same-host shared-memory path (GrpcOptions::shm), which
// must all behave the same. Failures and refusals: test_grpc_faults.cc.
#include <doctest/doctest.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/grpc_internal.h"
#include "comm/grpc_transport.h"
#include "dtrain.grpc.pb.h"
#include "grpc_test_util.h"
#include "msg_header_util.h"
#include "quiet_listener.h"
#include "test_util.h"
#include "util/check.h"

using namespace dtrain;
using namespace dtrain::grpc_test;  // (with Clock, contains, free_port and header)

namespace {

// Releases the gRPC callback queue's keeper (callback_queue.h) as each test case of this binary
// ends, when its transports are gone.
struct ReleaseCallbackQueue : dtrain::testing::QuietListener {
  using QuietListener::QuietListener;
  void test_case_end(const doctest::CurrentTestCaseStats&) override {
    dtrain::grpc_test::release_callback_queue();
  }
};
REGISTER_LISTENER("release_callback_queue", 1, ReleaseCallbackQueue);

}  // namespace

EVERY_PATH_TEST_CASE("grpc: rendezvous and all-pairs exchange for world sizes 1 to 4",
                     test_rendezvous_and_all_pairs_exchange) {
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    Job job = connect_job(world);
    require_ok(job);
    for (int r = 0; r < world; ++r) {
      CHECK(job.t[r]->rank() == r);
      CHECK(job.t[r]->size() == world);
      CHECK(job.t[r]->backend() == "grpc");
      CHECK(grpc_peer_addresses(*job.t[r]).size() == static_cast<size_t>(world));
      // All ranks are on this host: with shm on, every peer is reached through shared memory.
      CHECK(grpc_shm_peers(*job.t[r]).size() ==
            (g_path == Path::kShm ? static_cast<size_t>(world - 1) : 0u));
      CHECK(grpc_tcp_peers(*job.t[r]).size() ==
            (g_path == Path::kTcp ? static_cast<size_t>(world - 1) : 0u));
    }
    // Every rank sends every size to every rank (itself included), all sends before any recv.
    const auto errors = run_ranks(world, [&](int r) {
      Transport& t = *job.t[r];
      for (int dst = 0; dst < world; ++dst)
        for (size_t k = 0; k < kSizes.size(); ++k) {
          const auto data = make_payload(r, dst, kSizes[k]);
          t.send(dst, header(k, r, CommOp::kAllGather, data.size()), data.data());
        }
      for (int src = 0; src < world; ++src)
        for (size_t k = 0; k < kSizes.size(); ++k) {
          std::vector<uint8_t> got(kSizes[k]);
          t.recv(src, header(k, src, CommOp::kAllGather, got.size()), got.data(), in(30));
          if (std::string e = verify(src, r, got); !e.empty()) throw std::runtime_error(e);
        }
    });
    for (int r = 0; r < world; ++r) CHECK_MESSAGE(errors[r].empty(), "rank ", r, ": ", errors[r]);
    uint64_t per_peer = 0;
    for (size_t s : kSizes) per_peer += s;
    for (int r = 0; r < world; ++r) {
      CHECK(job.t[r]->bytes_sent() == per_peer * world);
      CHECK(job.t[r]->bytes_recv() == per_peer * world);
    }
  }
}

TEST_CASE("grpc: ranks that disagree on shared memory use the streams between them") {
  constexpr int kWorld = 3;
  const int port = free_port();
  // Rank 1 has it off: only ranks 0 and 2 exchange through shared memory.
  Job job = connect_job(kWorld, [&](int r) {
    GrpcOptions o = options(r, kWorld, port);
    o.shm = r != 1;
    return o;
  });
  require_ok(job);
  CHECK(grpc_shm_peers(*job.t[0]) == std::vector<int>{2});
  CHECK(grpc_shm_peers(*job.t[1]).empty());
  CHECK(grpc_shm_peers(*job.t[2]) == std::vector<int>{0});
  constexpr size_t kBytes = (size_t{3} << 20) + 7;
  const auto errors = run_ranks(kWorld, [&](int r) {
    Transport& t = *job.t[r];
    for (int dst = 0; dst < kWorld; ++dst) {
      if (dst == r) continue;
      const auto data = make_payload(r, dst, kBytes);
      t.send(dst, header(1, r, CommOp::kAllGather, data.size()), data.data());
    }
    for (int src = 0; src < kWorld; ++src) {
      if (src == r) continue;
      std::vector<uint8_t> got(kBytes);
      t.recv(src, header(1, src, CommOp::kAllGather, got.size()), got.data(), in(30));
      if (std::string e = verify(src, r, got); !e.empty()) throw std::runtime_error(e);
    }
  });
  for (int r = 0; r < kWorld; ++r) CHECK_MESSAGE(errors[r].empty(), "rank ", r, ": ", errors[r]);
}

EVERY_PATH_TEST_CASE("grpc: concurrent sends to all peers then recvs do not deadlock",
                     test_concurrent_sends_to_all_peers) {
  constexpr int kWorld = 3;
  constexpr size_t kBig = size_t{12} << 20;  // above the HTTP/2 windows: needs draining
  Job job = connect_job(kWorld);
  require_ok(job);
  const auto errors = run_ranks(kWorld, [&](int r) {
    Transport& t = *job.t[r];
    std::vector<std::thread> senders;
    std::vector<std::string> send_errors(kWorld);
    for (int dst = 0; dst < kWorld; ++dst) {
      if (dst == r) continue;
      // Two threads per peer: a big message and small p2p ones interleave on one stream.
      senders.emplace_back([&, dst] {
        try {
          const auto big = make_payload(r, dst, kBig);
          t.send(dst, header(1, 0, CommOp::kAllReduce, big.size()), big.data());
        } catch (const std::exception& e) {
          send_errors[dst] = e.what();
        }
      });
      senders.emplace_back([&, dst] {
        try {
          for (uint64_t i = 0; i < 5; ++i) {
            const auto small = make_payload(r, dst, 100 + i);
            t.send(dst, header(kP2PBit | 7, i, CommOp::kSendRecv, small.size()), small.data());
          }
        } catch (const std::exception& e) {
          send_errors[dst] = e.what();
        }
      });
    }
    for (auto& s : senders) s.join();
    for (const auto& e : send_errors)
      if (!e.empty()) throw std::runtime_error(e);
    for (int src = 0; src < kWorld; ++src) {
      if (src == r) continue;
      for (uint64_t i = 0; i < 5; ++i) {
        std::vector<uint8_t> small(100 + i);
        t.recv(src, header(kP2PBit | 7, i, CommOp::kSendRecv, small.size()), small.data(), in(30));
        if (std::string e = verify(src, r, small); !e.empty()) throw std::runtime_error(e);
      }
      std::vector<uint8_t> raw(kBig);
      t.recv(src, header(1, 0, CommOp::kAllReduce, kBig), raw.data(), in(30));
      if (std::string e = verify(src, r, raw); !e.empty()) throw std::runtime_error(e);
    }
  });
  for (int r = 0; r < kWorld; ++r) CHECK_MESSAGE(errors[r].empty(), "rank ", r, ": ", errors[r]);
}

EVERY_PATH_TEST_CASE("grpc: recv posted before the message arrives and recv_reduce",
                     test_recv_posted_before_the_message) {
  Job job = connect_job(2);
  require_ok(job);
  constexpr size_t kN = (size_t{3} << 20) + 5;  // floats, several chunks
  std::vector<float> a(kN), b(kN, 2.0f), c(kN, 1.0f);
  for (size_t i = 0; i < kN; ++i) a[i] = static_cast<float>(i % 1000);
  const auto errors = run_ranks(2, [&](int r) {
    if (r == 0) {
      // Posted first (direct delivery), then a reduce from a posted and a mailbox message.
      std::vector<float> got(kN);
      job.t[0]->recv(1, header(3, 0, CommOp::kBroadcast, kN * 4), got.data(), in(30));
      if (got != a) throw std::runtime_error("posted recv: wrong data");
      job.t[0]->recv_reduce(1, header(4, 0, CommOp::kAllReduce, kN * 4), c.data(),
                            Transport::Reduce::kSum, in(30));
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let part 1 arrive
      job.t[0]->recv_reduce(1, header(4, 1, CommOp::kAllReduce, kN * 4), c.data(),
                            Transport::Reduce::kMax, in(30));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      job.t[1]->send(0, header(3, 0, CommOp::kBroadcast, kN * 4), a.data());
      job.t[1]->send(0, header(4, 0, CommOp::kAllReduce, kN * 4), b.data());
      job.t[1]->send(0, header(4, 1, CommOp::kAllReduce, kN * 4), a.data());
    }
  });
  REQUIRE_MESSAGE(errors[0].empty(), errors[0]);
  REQUIRE_MESSAGE(errors[1].empty(), errors[1]);
  for (size_t i = 0; i < kN; i += 997) CHECK(c[i] == std::max(3.0f, a[i]));
}

EVERY_PATH_TEST_CASE("grpc: a recv posted while its message is arriving gets every byte",
                     test_a_recv_posted_while_its) {
  Job job = connect_job(2);
  require_ok(job);
  constexpr size_t kBytes = size_t{24} << 20;
  const auto data = make_payload(1, 0, kBytes);
  // Posting the recv at various moments covers all three delivery paths: before the first
  // chunk (direct), mid-message (redirected) and after the last one (mailbox).
  const int delays_ms[] = {0, 1, 3, 6, 10, 20, 40, 300};
  for (int i = 0; i < 8; ++i) {
    CAPTURE(delays_ms[i]);
    std::vector<uint8_t> got(kBytes);
    Worker sender(
        [&] { job.t[1]->send(0, header(40 + i, 0, CommOp::kAllGather, kBytes), data.data()); });
    std::this_thread::sleep_for(std::chrono::milliseconds(delays_ms[i]));
    job.t[0]->recv(1, header(40 + i, 0, CommOp::kAllGather, kBytes), got.data(), in(30));
    sender.join();
    REQUIRE_MESSAGE(sender.error.empty(), sender.error);
    CHECK(verify(1, 0, got) == "");
  }
  const GrpcRecvStats st = grpc_recv_stats(*job.t[0]);
  MESSAGE("direct ", st.direct, ", redirected ", st.redirected, ", mailbox ", st.mailbox);
  CHECK(st.direct + st.redirected + st.mailbox == 8);  // which path each took depends on timing
}

EVERY_PATH_TEST_CASE("grpc: mutual TLS", test_mutual_tls) {
  testing::TempDir dir;
  const std::string d = dir.path();
  const std::string cmd =
      "cd " + d +
      " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
      " -keyout ca.key -out ca.pem -days 2 -subj /CN=dtrain-test-ca"
      " && openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
      " -keyout node.key -out node.csr -subj /CN=localhost"
      " && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\nextendedKeyUsage=serverAuth,"
      "clientAuth\\n' > ext.cnf"
      " && openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial"
      " -out node.pem -days 2 -extfile ext.cnf";
  const testing::CmdResult r = testing::run_cmd(cmd);
  if (r.exit_code != 0) {
    MESSAGE("skipped: cannot make test certificates with openssl: ", r.output);
    return;
  }
  const int port = free_port();
  Job job = connect_job(2, [&](int rank) {
    GrpcOptions o = options(rank, 2, port);
    o.tls_cert = d + "/node.pem";
    o.tls_key = d + "/node.key";
    o.tls_ca = d + "/ca.pem";
    return o;
  });
  require_ok(job);
  const auto data = make_payload(0, 1, 3 << 20);
  job.t[0]->send(1, header(1, 0, CommOp::kBroadcast, data.size()), data.data());
  std::vector<uint8_t> got(data.size());
  job.t[1]->recv(0, header(1, 0, CommOp::kBroadcast, got.size()), got.data(), in(20));
  CHECK(verify(0, 1, got) == "");
}

EVERY_PATH_TEST_CASE("grpc: collectives run over the gRPC transport",
                     test_collectives_run_over_the_grpc) {
  constexpr int kWorld = 3;
  Job job = connect_job(kWorld);
  require_ok(job);
  constexpr size_t kN = 300007;
  const auto errors = run_ranks(kWorld, [&](int r) {
    CommOptions co;
    co.timeout_s = 30;
    co.segment_bytes = 256 << 10;
    Communicator comm(std::move(job.t[r]), co);
    std::vector<float> v(kN);
    for (size_t i = 0; i < kN; ++i) v[i] = static_cast<float>((i + r) % 17);
    comm.allreduce(v.data(), v.size());
    for (size_t i = 0; i < kN; ++i) {
      float want = 0;
      for (int q = 0; q < kWorld; ++q) want += static_cast<float>((i + q) % 17);
      if (v[i] != want) throw std::runtime_error("allreduce mismatch at " + std::to_string(i));
    }
    comm.barrier();
  });
  for (int r = 0; r < kWorld; ++r) CHECK_MESSAGE(errors[r].empty(), "rank ", r, ": ", errors[r]);
}

// One-way throughput and CPU cost of 64 MiB messages between two processes (forked before gRPC
// starts, so run it alone): test_comm -tc="grpc: throughput" --no-skip
// The default sweep runs chunk sizes 256 KiB / 1 MiB / 4 MiB, lending or copying, three times in
// rotation (run-to-run noise on a shared 2-core machine is large) and prints the medians.
// DTRAIN_GRPC_BENCH="chunk_kib,copy,lookahead_kib,frame_kib,read_chunk_kib;..." replaces it
// (0 = gRPC's default for the last three).
TEST_CASE("grpc: throughput" * doctest::skip()) {
  std::vector<GrpcTuning> configs;
  if (const char* env = std::getenv("DTRAIN_GRPC_BENCH")) {
    std::string spec = env;
    for (size_t pos = 0; pos < spec.size();) {
      size_t end = spec.find(';', pos);
      if (end == std::string::npos) end = spec.size();
      GrpcTuning t;
      int chunk = 0, copy = 0, look = 0, frame = 0, read = 0;
      if (std::sscanf(spec.substr(pos, end - pos).c_str(), "%d,%d,%d,%d,%d", &chunk, &copy, &look,
                      &frame, &read) == 5) {
        t.chunk_bytes = size_t(chunk) << 10;
        t.copy_send = copy != 0;
        t.lookahead_bytes = look << 10;
        t.max_frame_size = frame << 10;
        t.tcp_read_chunk = read << 10;
        configs.push_back(t);
      }
      pos = end + 1;
    }
  } else {
    for (int round = 0; round < 3; ++round)
      for (size_t chunk : {size_t{256} << 10, size_t{1} << 20, size_t{4} << 20})
        for (bool copy : {false, true}) {
          GrpcTuning t;
          t.chunk_bytes = chunk;
          t.copy_send = copy;
          configs.push_back(t);
        }
  }
  constexpr size_t kBytes = size_t{64} << 20;
  constexpr int kReps = 16;
  auto cpu_s = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  };
  auto faults = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_minflt + u.ru_majflt);
  };
  std::vector<int> ports;
  for (size_t i = 0; i < configs.size(); ++i) ports.push_back(free_port());
  int pipefd[2];
  REQUIRE(pipe(pipefd) == 0);
  const pid_t pid = fork();  // before any gRPC object exists in this process
  REQUIRE(pid >= 0);
  const int me = pid == 0 ? 1 : 0;
  std::printf("%-9s %6s %6s %6s %6s %8s %13s %13s %11s\n", "send", "chunk", "look", "frame", "read",
              "GB/s", "send CPU s/GB", "recv CPU s/GB", "recv flt/MB");
  auto label = [](const GrpcTuning& c) {
    char b[96];
    std::snprintf(b, sizeof(b), "%-9s %5zuK %5dK %5dK %5dK", c.copy_send ? "copy" : "zero-copy",
                  c.chunk_bytes >> 10, c.lookahead_bytes >> 10, c.max_frame_size >> 10,
                  c.tcp_read_chunk >> 10);
    return std::string(b);
  };
  std::map<std::string, std::vector<std::array<double, 3>>> runs;
  for (size_t ci = 0; ci < configs.size(); ++ci) {
    const GrpcTuning& c = configs[ci];
    double result[3] = {0, 0, 0};
    {
      auto t = connect_grpc(options(me, 2, ports[ci]), c);
      std::vector<char> buf(kBytes, 1);
      char ack = 0;
      const MsgHeader handshake = header(1, 0, CommOp::kBarrier, 1);
      // Warm up (first touch of the buffers, heaps, TCP and HTTP/2 windows), then measure.
      for (int i = 0; i < 3; ++i) {
        const MsgHeader h = header(1000 + i, 0, CommOp::kBroadcast, kBytes);
        if (me == 0)
          t->send(1, h, buf.data());
        else
          t->recv(0, h, buf.data(), in(60));
      }
      if (me == 0) {
        t->recv(1, handshake, &ack, in(60));
      } else {
        t->send(0, handshake, &ack);
      }
      const double c0 = cpu_s(), f0 = faults();
      const auto w0 = Clock::now();
      for (int i = 0; i < kReps; ++i) {
        const MsgHeader h = header(2 + i, 0, CommOp::kBroadcast, kBytes);
        if (me == 0)
          t->send(1, h, buf.data());
        else
          t->recv(0, h, buf.data(), in(60));
      }
      const MsgHeader hend = header(100, 0, CommOp::kBarrier, 1);
      if (me == 0)
        t->recv(1, hend, &ack, in(60));
      else
        t->send(0, hend, &ack);
      result[0] = std::chrono::duration<double>(Clock::now() - w0).count();
      result[1] = cpu_s() - c0;
      result[2] = faults() - f0;
      // Keep the peer's streams open until the other side is done too.
      const MsgHeader hbye = header(101, 0, CommOp::kBarrier, 1);
      if (me == 0) {
        t->send(1, hbye, &ack);
      } else {
        t->recv(0, hbye, &ack, in(60));
      }
    }
    if (me == 1) {
      REQUIRE(write(pipefd[1], result, sizeof(result)) == sizeof(result));
      continue;
    }
    double peer[3];
    REQUIRE(read(pipefd[0], peer, sizeof(peer)) == sizeof(peer));
    const double gb = 1e-9 * kBytes * kReps;
    std::printf("%s %8.2f %13.3f %13.3f %11.1f\n", label(c).c_str(), gb / result[0], result[1] / gb,
                peer[1] / gb, peer[2] / (gb * 1e3));
    std::fflush(stdout);
    runs[label(c)].push_back({gb / result[0], result[1] / gb, peer[1] / gb});
  }
  if (me == 1) _exit(0);
  std::printf("\nmedians over %zu runs each:\n", runs.begin()->second.size());
  for (auto& [name, v] : runs) {
    std::array<double, 3> med{};
    for (int k = 0; k < 3; ++k) {
      std::vector<double> x;
      for (const auto& r : v) x.push_back(r[k]);
      std::sort(x.begin(), x.end());
      med[k] = x[x.size() / 2];
    }
    std::printf("%s %8.2f %13.3f %13.3f\n", name.c_str(), med[0], med[1], med[2]);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  close(pipefd[0]);
  close(pipefd[1]);
}
