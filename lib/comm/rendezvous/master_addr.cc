#include "comm/rendezvous/master_addr.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "comm/grpc/common.h"

namespace dtrain {

namespace {

// Whether this host can bind `a` (port 0): an address of one of its interfaces.
bool is_local(const addrinfo& a) {
  const int fd = ::socket(a.ai_family, SOCK_DGRAM, 0);
  if (fd < 0) return false;
  sockaddr_storage s{};
  std::memcpy(&s, a.ai_addr, a.ai_addrlen);
  if (a.ai_family == AF_INET) reinterpret_cast<sockaddr_in*>(&s)->sin_port = 0;
  if (a.ai_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&s)->sin6_port = 0;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&s), a.ai_addrlen) == 0;
  ::close(fd);
  return ok;
}

std::string numeric(const addrinfo& a) {
  char host[NI_MAXHOST] = {};
  if (::getnameinfo(a.ai_addr, a.ai_addrlen, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0)
    return "?";
  return host;
}

using AddrList = std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)>;

// The stream addresses of host:port (numeric port), or null when the name does not resolve.
AddrList resolve_stream(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0)
    return AddrList(nullptr, ::freeaddrinfo);
  return AddrList(res, ::freeaddrinfo);
}

}  // namespace

std::string master_addr_problem(const std::string& master_addr, bool serving) {
  const std::string host = grpc_detail::strip_brackets(master_addr);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0) return "MASTER_ADDR '" + host + "' does not resolve (" + ::gai_strerror(rc) + ")";
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> hold(res, ::freeaddrinfo);
  if (!serving) return "";
  for (const addrinfo* a = res; a != nullptr; a = a->ai_next)
    if (is_local(*a)) return "";
  return "MASTER_ADDR '" + host + "' (" + numeric(*res) +
         ") is not an address of this host, where rank 0 serves the rendezvous: give rank 0's "
         "host (unless that address forwards here, as a Kubernetes service does)";
}

std::string listen_problem(const std::string& host, int port) {
  const std::string h = grpc_detail::strip_brackets(host);
  const AddrList hold = resolve_stream(h, port);
  if (!hold) return "";
  const addrinfo* res = hold.get();
  // gRPC listens on every address the name gives: the one that fails is the news. Taken or
  // forbidden beats "not an address here" (a name may give an address family this host lacks).
  int worst = 0;
  for (const addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const int one = 1, zero = 0;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // (as gRPC binds)
    if (a->ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    const bool ok = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1) == 0;
    const int err = errno;
    ::close(fd);
    if (ok) continue;
    if (worst == 0 || worst == EADDRNOTAVAIL) worst = err;
  }
  const std::string p = std::to_string(port);
  switch (worst) {
    case 0:
      return "";
    case EADDRINUSE:
      return "port " + p +
             " is taken on this host by another process: another job, a second process given "
             "RANK=0, or a rank of an earlier run still running; choose another MASTER_PORT "
             "(dtrain launch picks a free one unless --master-port is given)";
    case EADDRNOTAVAIL:
      return h + " is not an address of this host";
    case EACCES:
      return "port " + p + " is not open to this process" +
             (port < 1024 ? std::string(" (below 1024: it needs privileges)") : std::string()) +
             "; choose another MASTER_PORT";
    default:
      return std::string("bind: ") + std::strerror(worst);
  }
}

std::string rendezvous_port_problem(const std::string& host, int port) {
  const std::string h = grpc_detail::strip_brackets(host);
  const AddrList hold = resolve_stream(h, port);
  if (!hold) return "";
  const addrinfo* res = hold.get();
  const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return "";
  int err = ::connect(fd, res->ai_addr, res->ai_addrlen) == 0 ? 0 : errno;
  if (err == EINPROGRESS) {
    pollfd pf{fd, POLLOUT, 0};
    if (::poll(&pf, 1, 2000) == 1) {
      socklen_t len = sizeof err;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    } else {
      err = ETIMEDOUT;
    }
  }
  ::close(fd);
  const std::string at = h + ":" + std::to_string(port);
  if (err == 0)
    return "something listens at " + at +
           " but never answered as a dtrain rendezvous: another program on that port, or rank 0 "
           "with other TLS settings (distributed.tls)";
  if (err == ECONNREFUSED)
    return "nothing listens at " + at +
           ": rank 0 is not running there (not started yet, failed, or given another "
           "MASTER_PORT)";
  if (err == ETIMEDOUT)
    return "a connection to " + at +
           " gets no answer within 2 s: a firewall dropping it, a host that is down, or a "
           "program there that takes no more connections";
  return "";
}

}  // namespace dtrain
