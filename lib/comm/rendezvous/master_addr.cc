#include "comm/rendezvous/master_addr.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

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

}  // namespace dtrain
