// The rendezvous store (comm/rendezvous/store.h): in memory, with prefixes, and over gRPC as rank
// 0 serves it (comm/rendezvous/store_service.h).
#include <doctest/doctest.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "comm/rendezvous/master_addr.h"
#include "comm/rendezvous/store.h"
#include "comm/rendezvous/store_service.h"
#include "test_util.h"

using namespace dtrain;
using dtrain::grpc_detail::GrpcStore;
using dtrain::grpc_detail::StoreService;

namespace {
using Clock = std::chrono::steady_clock;
StoreDeadline in_ms(int ms) {
  return Clock::now() + std::chrono::milliseconds(ms);
}
}  // namespace

TEST_CASE("store: set, get, wait and add in memory, and a prefix per group") {
  MemoryStore m;
  m.set("a", "1");
  CHECK(m.get("a", in_ms(10)) == "1");
  CHECK(m.add("n", 2) == 2);
  CHECK(m.add("n", 3) == 5);
  CHECK(m.add("n", 0) == 5);
  CHECK(m.add("a", 1) == 2);  // "1" reads as a counter
  m.set("s", "text");
  CHECK_THROWS_WITH_AS(m.add("s", 1), doctest::Contains("does not hold a counter"), CommError);
  // get and wait block until the key is set, by another thread.
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    m.set("late", "x");
    m.set("later", "y");
  });
  CHECK(m.get("late", in_ms(10000)) == "x");
  m.wait({"late", "later"}, in_ms(10000));
  setter.join();
  const auto t0 = Clock::now();
  CHECK_THROWS_WITH_AS(m.get("never", in_ms(100)), doctest::Contains("timed out"), CommError);
  CHECK(Clock::now() - t0 >= std::chrono::milliseconds(100));

  PrefixStore g1("g1", m), g2("g2", m);
  g1.set("k", "one");
  g2.set("k", "two");
  CHECK(g1.get("k", in_ms(10)) == "one");
  CHECK(g2.get("k", in_ms(10)) == "two");
  CHECK(m.get("g1/k", in_ms(10)) == "one");
  CHECK(g1.add("c", 1) == 1);
  CHECK(g2.add("c", 1) == 1);
  g1.wait({"k", "c"}, in_ms(10));
}

TEST_CASE("store: asynchronous waits end once, by the keys, the deadline or shutdown") {
  std::vector<std::string> seen;
  std::atomic<int> calls{0};
  MemoryStore m([&](const std::string& k, const std::string&) { seen.push_back(k); });
  std::string got_error = "unset";
  std::vector<std::string> got;
  m.when_set({"a", "b"}, in_ms(10000),
             [&](const std::string& e, const std::vector<std::string>& v) {
               ++calls;
               got_error = e;
               got = v;
             });
  m.set("a", "1");
  CHECK(calls == 0);
  m.set("b", "2");
  CHECK(calls == 1);
  CHECK(got_error == "");
  CHECK(got == std::vector<std::string>{"1", "2"});
  CHECK(seen == std::vector<std::string>{"a", "b"});
  // A counter's key, created or changed by add, is set as well: it completes the waits on it
  // (it completed none) and is watched like any set.
  std::vector<std::string> counted;
  m.when_set({"n"}, in_ms(10000),
             [&](const std::string&, const std::vector<std::string>& v) { counted = v; });
  CHECK(m.add("n", 5) == 5);
  CHECK(counted == std::vector<std::string>{"5"});
  CHECK(seen == std::vector<std::string>{"a", "b", "n"});

  std::string late_error;
  m.when_set({"z"}, in_ms(0),
             [&](const std::string& e, const std::vector<std::string>&) { late_error = e; });
  m.expire();
  CHECK(late_error == "timeout");

  std::string closed_error;
  m.when_set({"z"}, in_ms(10000),
             [&](const std::string& e, const std::vector<std::string>&) { closed_error = e; });
  std::thread waiter(
      [&] { CHECK_THROWS_WITH_AS(m.get("z", in_ms(10000)), "rank 0 shut down", CommError); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  m.shutdown("rank 0 shut down");
  waiter.join();
  CHECK(closed_error == "rank 0 shut down");
  CHECK_THROWS_WITH_AS(m.set("q", "1"), "rank 0 shut down", CommError);
}

TEST_CASE("store: over gRPC, clients wait for keys others set, a wrong token is refused") {
  MemoryStore m;
  StoreService service(&m, "tok", "rank 0");
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  REQUIRE(port > 0);
  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  auto error = [](const grpc::Status& s) {
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) return CommError("deadline");
    if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) return CommError("unauthenticated");
    return CommError(s.error_message());
  };
  GrpcStore a(channel, "tok", in_ms(10000), error), c(channel, "tok", in_ms(10000), error);
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    c.set("job/x", "payload");
  });
  CHECK(a.get("job/x", in_ms(10000)) == "payload");
  setter.join();
  a.wait({"job/x"}, in_ms(1000));
  CHECK(a.add("joins", 1) == 1);
  CHECK(c.add("joins", 1) == 2);
  CHECK(m.get("job/x", in_ms(10)) == "payload");
  // A wait the server gives up on is a deadline error; a shut-down store answers with its reason.
  CHECK_THROWS_WITH_AS(a.get("none", in_ms(200)), "deadline", CommError);
  GrpcStore wrong(channel, "nope", in_ms(5000), error);
  CHECK_THROWS_WITH_AS(wrong.set("k", "v"), "unauthenticated", CommError);
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    m.shutdown("rank 0 shut down");
  });
  CHECK_THROWS_WITH_AS(a.get("never", in_ms(10000)), doctest::Contains("rank 0 shut down"),
                       CommError);
  closer.join();
  server->Shutdown();
}

TEST_CASE("master_addr_problem: a rendezvous timeout's hint about MASTER_ADDR") {
  // Numeric addresses only (no DNS in CI). 192.0.2.0/24 is TEST-NET-1: never this host's.
  CHECK(dtrain::master_addr_problem("127.0.0.1", true).empty());
  CHECK(dtrain::master_addr_problem("192.0.2.99", false).empty());  // only rank 0 serves
  CHECK(dtrain::master_addr_problem("192.0.2.99", true) ==
        "MASTER_ADDR '192.0.2.99' (192.0.2.99) is not an address of this host, where rank 0 "
        "serves the rendezvous: give rank 0's host (unless that address forwards here, as a "
        "Kubernetes service does)");
}

TEST_CASE("listen_problem: why rank 0 cannot listen on its rendezvous port") {
  // A port held by another listener on 127.0.0.1.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(fd, 1) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const int port = ntohs(a.sin_port);
  // Taken: on its address, on the wildcard, and under a name that may give ::1 first (a host
  // without IPv6 said "localhost is not an address of this host").
  for (const char* host : {"127.0.0.1", "0.0.0.0", "localhost"}) {
    CAPTURE(host);
    CHECK(dtrain::testing::contains(
        dtrain::listen_problem(host, port),
        "port " + std::to_string(port) + " is taken on this host by another process"));
  }
  ::close(fd);
  CHECK(dtrain::listen_problem("127.0.0.1", port).empty());  // free again
  CHECK(dtrain::listen_problem("192.0.2.99", port) == "192.0.2.99 is not an address of this host");
}
