#include "comm/grpc/tcp_socket.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>

#include "comm/transport.h"

namespace dtrain::grpc_detail {
namespace {

// poll()'s timeout for `left` (an int of milliseconds: a far deadline is capped at INT_MAX, about
// 24 days, and the callers poll again; a past one is 0).
int poll_ms(std::chrono::milliseconds left) {
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, std::numeric_limits<int>::max()));
}

std::string err_str(int e) {
  return std::strerror(e);
}

struct AddrInfoFree {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};
using AddrInfo = std::unique_ptr<addrinfo, AddrInfoFree>;

AddrInfo resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string h = strip_brackets(host);
  const std::string p = std::to_string(port);
  if (const int rc = getaddrinfo(h.empty() ? nullptr : h.c_str(), p.c_str(), &hints, &res))
    throw CommError(fmt::format("cannot resolve '{}': {}", host, gai_strerror(rc)));
  return AddrInfo(res);
}

void set_nodelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// One non-blocking connect attempt, polled until `until`: 0, or the errno it failed with.
int try_connect(const addrinfo* a, Fd* out, Clock::time_point until) {
  Fd fd(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
  if (!fd) return errno;
  if (connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) return errno;
    pollfd p{fd.get(), POLLOUT, 0};
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    if (poll(&p, 1, poll_ms(ms)) <= 0) return ETIMEDOUT;
    int e = 0;
    socklen_t len = sizeof e;
    getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &e, &len);
    if (e != 0) return e;
  }
  const int flags = fcntl(fd.get(), F_GETFL);
  fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  set_nodelay(fd.get());
  *out = std::move(fd);
  return 0;
}

}  // namespace

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = o.release();
  }
  return *this;
}

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Fd tcp_listen(const std::string& host, int* port) {
  const AddrInfo ai = resolve(host, 0, true);
  int last = 0;
  for (const addrinfo* a = ai.get(); a; a = a->ai_next) {
    Fd fd(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd) {
      last = errno;
      continue;
    }
    // The system's largest backlog: every peer connects at about the same moment (a 64-entry
    // queue would drop SYNs of a large job, costing the dropped ones 1-3 s of retransmits).
    if (bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || listen(fd.get(), SOMAXCONN) != 0) {
      last = errno;
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len);
    *port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                     : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    return fd;
  }
  throw CommError(fmt::format("cannot listen on {}: {}", host, err_str(last)));
}

Fd tcp_connect(const std::string& host, int port, Clock::time_point deadline,
               const std::function<std::string()>& stop) {
  const AddrInfo ai = resolve(host, port, false);
  constexpr auto kSlice = std::chrono::milliseconds(50);
  int last = ETIMEDOUT;
  for (;;) {
    for (const addrinfo* a = ai.get(); a; a = a->ai_next) {
      Fd fd;
      last = try_connect(a, &fd, std::min(deadline, Clock::now() + kSlice * 20));
      if (last == 0) return fd;
    }
    if (std::string why = stop ? stop() : ""; !why.empty()) throw CommError(why);
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(kSlice);
  }
  throw CommError(fmt::format("cannot connect to {}: {}", host_port(host, port), err_str(last)));
}

bool wait_readable(int fd, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    const int rc = poll(&p, 1, poll_ms(ms));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return true;  // let the read report it
  }
}

bool read_exact(int fd, void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, MSG_WAITALL);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k == 0) return false;
    if (errno == EINTR) continue;
    throw CommError(err_str(errno));
  }
  return true;
}

void write_all(int fd, const void* a, size_t an, const void* b, size_t bn) {
  iovec v[2] = {{const_cast<void*>(a), an}, {const_cast<void*>(b), bn}};
  iovec* iov = v;
  int cnt = 2;
  while (cnt > 0) {
    if (iov->iov_len == 0) {
      ++iov;
      --cnt;
      continue;
    }
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = static_cast<size_t>(cnt);
    const ssize_t k = ::sendmsg(fd, &m, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
      throw CommError(err_str(errno));
    }
    auto left = static_cast<size_t>(k);
    while (cnt > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --cnt;
    }
    if (cnt > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
}

}  // namespace dtrain::grpc_detail
