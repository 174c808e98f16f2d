// pick_free_port (launch/launcher.h): a rendezvous port for a job on this machine.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <fstream>
#include <random>
#include <utility>
#include <vector>

#include "launch/launcher.h"
#include "launch/process.h"

namespace dtrain {

using launch_detail::Fd;
using launch_detail::sys_error;

namespace {

// Binds a fresh loopback TCP socket to `port` (0: the kernel picks) and returns the port it got,
// or -1 if that port is taken.
int try_bind_loopback(int port) {
  Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.open()) throw sys_error("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (port != 0 && (errno == EADDRINUSE || errno == EACCES)) return -1;
    throw sys_error("bind 127.0.0.1:" + std::to_string(port));
  }
  socklen_t len = sizeof addr;
  if (::getsockname(s.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    throw sys_error("getsockname");
  return ntohs(addr.sin_port);
}

// The kernel's ephemeral range (net.ipv4.ip_local_port_range), Linux's default if unreadable.
std::pair<int, int> ephemeral_range() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 32768, hi = 60999;
  if (!(in >> lo >> hi) || lo < 1 || hi > 65535 || lo > hi) return {32768, 60999};
  return {lo, hi};
}

}  // namespace

int pick_free_port() {
  // Outside the ephemeral range: the kernel hands ports in that range to every bind(0) and
  // every outgoing connection, so in the moment between this pick and rank 0's bind another
  // process (a parallel test's gRPC server, seen in CI) could take one from there. A random free
  // port below the range (or above it) can only be taken by a program that names it.
  const auto [lo, hi] = ephemeral_range();
  std::vector<std::pair<int, int>> spans;
  if (lo > 10000) spans.push_back({10000, lo - 1});
  if (hi < 65535) spans.push_back({hi + 1, 65535});
  int64_t total = 0;
  for (const auto& [a, b] : spans) total += b - a + 1;
  if (total > 0) {
    std::random_device rd;
    std::uniform_int_distribution<int64_t> pick(0, total - 1);
    for (int tries = 0; tries < 64; ++tries) {
      int64_t k = pick(rd);
      for (const auto& [a, b] : spans) {
        if (k <= b - a) {
          if (const int port = try_bind_loopback(a + static_cast<int>(k)); port > 0) return port;
          break;
        }
        k -= b - a + 1;
      }
    }
  }
  return try_bind_loopback(0);  // everything outside the range taken (or no room): the kernel's
}

}  // namespace dtrain
