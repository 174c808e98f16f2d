// The gRPC transport's TCP data path (lib/comm/grpc/tcp_path.h) against peers that are not
// dtrain: ranks that disagree on using it, forged and malformed connections, and a chunk
// written by hand in the documented layout (grpc/tcp_wire.h). The well-behaved paths (every
// collective, killed and frozen peers, mismatches, timeouts) run in test_grpc.cc and
// test_collectives.cc over TCP like over the other paths.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "callback_queue.h"
#include "comm/grpc/tcp_wire.h"
#include "comm/grpc_internal.h"
#include "comm/grpc_transport.h"
#include "msg_header_util.h"
#include "test_util.h"
#include "util/duration.h"

using namespace dtrain;
using namespace dtrain::grpc_detail;

namespace {

using dtrain::testing::contains;
using dtrain::testing::free_port;
using dtrain::testing::header;
using TClock = std::chrono::steady_clock;

constexpr char kToken[] = "tcp-test-token";
constexpr char kHash[] = "tcp0cafe";

GrpcOptions options(int rank, int world, int port) {
  dtrain::grpc_test::keep_callback_queue();
  GrpcOptions o;
  o.shm = false;
  o.tcp = true;
  o.rank = rank;
  o.world_size = world;
  o.master_port = port;
  o.token = kToken;
  o.config_hash = kHash;
  o.rendezvous_timeout_s = 20;
  o.connect_timeout_s = 20;
  return o;
}

std::vector<std::unique_ptr<Transport>> connect_transports(
    int world, const std::function<void(int, GrpcOptions&)>& tweak = nullptr) {
  const int port = free_port();
  std::vector<std::unique_ptr<Transport>> t(static_cast<size_t>(world));
  std::vector<std::string> err(static_cast<size_t>(world));
  std::vector<std::thread> th;
  for (int r = 0; r < world; ++r)
    th.emplace_back([&, r] {
      GrpcOptions o = options(r, world, port);
      if (tweak) tweak(r, o);
      try {
        t[static_cast<size_t>(r)] = connect_grpc(o);
      } catch (const std::exception& e) {
        err[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& x : th) x.join();
  for (int r = 0; r < world; ++r)
    REQUIRE_MESSAGE(err[static_cast<size_t>(r)].empty(), "rank ", r, ": ", err[r]);
  return t;
}

// A plain client of a rank's TCP data port, as a forged or broken peer would be.
class RawConn {
 public:
  explicit RawConn(int port) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  }
  ~RawConn() { ::close(fd_); }
  void write(const std::string& b) {
    REQUIRE(::send(fd_, b.data(), b.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(b.size()));
  }
  // Everything the server sends until it closes the connection (or 10 s pass: then "timeout").
  std::string read_to_end() {
    std::string got;
    const auto until = TClock::now() + std::chrono::seconds(10);
    for (;;) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) == 1) {
        char b[256];
        const ssize_t k = ::recv(fd_, b, sizeof b, 0);
        if (k <= 0) return got;
        got.append(b, static_cast<size_t>(k));
      }
      if (TClock::now() > until) return got + "timeout";
    }
  }
  // The server's answer to a hello (8 bytes), or "" if it closed first.
  std::string read_answer() {
    std::string got;
    char b[kTcpAnswerBytes];
    while (got.size() < kTcpAnswerBytes) {
      const ssize_t k = ::recv(fd_, b, kTcpAnswerBytes - got.size(), 0);
      if (k <= 0) break;
      got.append(b, static_cast<size_t>(k));
    }
    return got;
  }

 private:
  int fd_;
};

std::string hello(int src, int dst, int world, const std::string& token = kToken,
                  const std::string& session = kHash) {
  return encode_tcp_hello(TcpHello{src, dst, world, token, session});
}

std::string chunk(const MsgHeader& h, uint64_t offset, const std::string& payload) {
  std::string b(kTcpChunkHeaderBytes, '\0');
  encode_tcp_chunk_header(b.data(), h, offset, payload.size());
  return b + payload;
}

// 3 MiB + 7 from every rank to every other one, all sends before the receives.
void exchange(std::vector<std::unique_ptr<Transport>>& t) {
  const int world = static_cast<int>(t.size());
  constexpr size_t kBytes = (size_t{3} << 20) + 7;
  std::vector<std::string> errors(t.size());
  std::vector<std::thread> th;
  for (int r = 0; r < world; ++r)
    th.emplace_back([&, r] {
      try {
        for (int dst = 0; dst < world; ++dst) {
          if (dst == r) continue;
          std::vector<uint8_t> data(kBytes, static_cast<uint8_t>(r * 16 + dst));
          t[static_cast<size_t>(r)]->send(dst, header(1, r, CommOp::kAllGather, kBytes),
                                          data.data());
        }
        for (int src = 0; src < world; ++src) {
          if (src == r) continue;
          std::vector<uint8_t> got(kBytes);
          t[static_cast<size_t>(r)]->recv(src, header(1, src, CommOp::kAllGather, kBytes),
                                          got.data(), deadline_in(30));
          for (uint8_t b : got)
            if (b != static_cast<uint8_t>(src * 16 + r))
              throw std::runtime_error("wrong byte from rank " + std::to_string(src));
        }
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& x : th) x.join();
  for (int r = 0; r < world; ++r)
    CHECK_MESSAGE(errors[static_cast<size_t>(r)].empty(), "rank ", r, ": ", errors[r]);
}

}  // namespace

TEST_CASE("tcp: ranks that disagree on the TCP path use the streams between them") {
  // Rank 1 has it off: only ranks 0 and 2 exchange over TCP.
  auto t = connect_transports(3, [](int r, GrpcOptions& o) { o.tcp = r != 1; });
  CHECK(grpc_tcp_peers(*t[0]) == std::vector<int>{2});
  CHECK(grpc_tcp_peers(*t[1]).empty());
  CHECK(grpc_tcp_peers(*t[2]) == std::vector<int>{0});
  exchange(t);
}

TEST_CASE("tcp: TLS turns the TCP path off (data stays on the encrypted streams)") {
  // Without certificates at hand the check is on the option's other side: tcp = false behaves
  // as a TLS job does (no data port advertised, nothing connects).
  auto t = connect_transports(2, [](int, GrpcOptions& o) { o.tcp = false; });
  CHECK(grpc_tcp_port(*t[0]) == 0);
  CHECK(grpc_tcp_peers(*t[0]).empty());
  exchange(t);
}

TEST_CASE("tcp: forged data connections are refused and the job goes on") {
  auto t = connect_transports(2);
  const int port = grpc_tcp_port(*t[0]);
  REQUIRE(port > 0);
  const auto refused = [&](const std::string& bytes, const char* what) {
    INFO(what);
    RawConn c(port);
    c.write(bytes);
    const std::string got = c.read_to_end();
    // Closed, after a refusal answer or without one -- never accepted, never left open.
    CHECK(got.find("timeout") == std::string::npos);
    if (got.size() >= kTcpAnswerBytes)
      CHECK(decode_tcp_answer(std::span<const char>(got.data(), kTcpAnswerBytes)) != 0);
  };
  refused("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + std::string(64, 'x'), "an HTTP request");
  refused(hello(1, 0, 2, "wrong-token"), "a wrong token");
  refused(hello(1, 0, 2, ""), "no token");
  refused(hello(1, 0, 2, kToken, "another-job"), "another job's config hash");
  refused(hello(1, 0, 2), "a rank that is connected already");
  refused(hello(5, 0, 2), "a rank out of range");
  refused(hello(1, 1, 2), "the wrong destination");
  refused(hello(1, 0, 3), "another world size");
  refused(hello(0, 0, 2), "the receiver itself");
  std::string huge = hello(1, 0, 2);
  huge[20] = '\xff';  // token length 255 + ...: within limits but never sent
  huge[23] = '\x7f';  // ... now 2 GiB: above the limit
  refused(huge, "a token length above the limit");
  exchange(t);
}

TEST_CASE("tcp: a chunk written by hand in the documented layout is delivered") {
  // Rank 2 keeps the streams, so this test may speak for it on rank 0's TCP port.
  auto t = connect_transports(3, [](int r, GrpcOptions& o) { o.tcp = r != 2; });
  RawConn c(grpc_tcp_port(*t[0]));
  c.write(hello(2, 0, 3));
  const std::string a = c.read_answer();
  REQUIRE(a.size() == kTcpAnswerBytes);
  CHECK(decode_tcp_answer(a) == 0);
  const MsgHeader h = header(kP2PBit | 7, 0, CommOp::kSendRecv, 10);
  c.write(chunk(h, 0, "hello") + chunk(h, 5, "world"));
  std::vector<char> got(10);
  t[0]->recv(2, h, got.data(), deadline_in(10));
  CHECK(std::string(got.data(), 10) == "helloworld");
  exchange(t);
}

TEST_CASE("tcp: a malformed chunk from an authenticated peer fails the receiver, naming it") {
  struct Case {
    const char* what;
    std::function<std::string()> bytes;
    const char* says;
  };
  const MsgHeader ok = header(3, 0, CommOp::kAllReduce, 16);
  const std::vector<Case> cases = {
      {"bad magic", [] { return std::string(kTcpChunkHeaderBytes, 'Z'); }, "bad magic"},
      {"an unknown op", [] { return chunk(header(3, 0, static_cast<CommOp>(77), 4), 0, "abcd"); },
       "unknown op 77"},
      {"a chunk above the limit",
       [] {
         std::string b(kTcpChunkHeaderBytes, '\0');
         encode_tcp_chunk_header(b.data(), header(3, 0, CommOp::kAllReduce, 8 << 20), 0, 4 << 20);
         return b;
       },
       "at most"},
      {"a chunk past the message's end", [&] { return chunk(ok, 12, "12345678"); }, "exceeds"},
      {"a message that starts in the middle", [&] { return chunk(ok, 8, "1234"); },
       "start never arrived"},
  };
  for (const Case& k : cases) {
    INFO(k.what);
    auto t = connect_transports(3, [](int r, GrpcOptions& o) { o.tcp = r != 2; });
    RawConn c(grpc_tcp_port(*t[0]));
    c.write(hello(2, 0, 3));
    REQUIRE(c.read_answer().size() == kTcpAnswerBytes);
    c.write(k.bytes());
    std::vector<float> buf(4);
    std::string err;
    try {
      t[0]->recv(2, ok, buf.data(), deadline_in(10));
    } catch (const CommError& e) {
      err = e.what();
    }
    CHECK_MESSAGE(contains(err, "malformed chunk on the TCP connection from rank 2"), err);
    CHECK_MESSAGE(contains(err, k.says), err);
    // The connection is closed on the forger.
    CHECK(c.read_to_end().find("timeout") == std::string::npos);
  }
}

TEST_CASE("tcp: clients that connect and say nothing hold up no one") {
  // Rank 2 keeps the streams, so this test may speak for it on rank 0's TCP port.
  auto t = connect_transports(3, [](int r, GrpcOptions& o) { o.tcp = r != 2; });
  const int port = grpc_tcp_port(*t[0]);
  // 70 silent clients: more than the 64 hellos the acceptor reads at once, so the oldest 6 are
  // dropped to make room; none of them delays a hello that arrives after them.
  std::vector<std::unique_ptr<RawConn>> silent;
  for (int i = 0; i < 70; ++i) silent.push_back(std::make_unique<RawConn>(port));
  const auto start = TClock::now();
  RawConn c(port);
  c.write(hello(2, 0, 3));
  const std::string a = c.read_answer();
  const double waited = std::chrono::duration<double>(TClock::now() - start).count();
  REQUIRE(a.size() == kTcpAnswerBytes);
  CHECK(decode_tcp_answer(a) == 0);
  CHECK_MESSAGE(waited < 3.0, "answered after ", waited, " s");  // one client's 5 s would fail
  // The oldest were closed to make room, the newest stay until their 5 s run out.
  CHECK(silent.front()->read_to_end().find("timeout") == std::string::npos);
  const auto before_close = TClock::now();
  CHECK(silent.back()->read_to_end().find("timeout") == std::string::npos);
  CHECK(std::chrono::duration<double>(TClock::now() - before_close).count() > 0.5);
  const MsgHeader h = header(kP2PBit | 9, 0, CommOp::kSendRecv, 4);
  c.write(chunk(h, 0, "abcd"));
  std::vector<char> got(4);
  t[0]->recv(2, h, got.data(), deadline_in(10));
  CHECK(std::string(got.data(), 4) == "abcd");
  exchange(t);
}
