// Plain blocking TCP sockets for the gRPC transport's TCP data path (grpc/tcp_path.h): listen,
// connect with a deadline, exact reads and whole writes. Errors are CommError with the address
// and errno's words; a peer that closed reads as a short read (false), never SIGPIPE.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "comm/grpc/common.h"

namespace dtrain::grpc_detail {

// An owned socket descriptor (-1 = none). Moves; closes on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() {
    const int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset();

 private:
  int fd_ = -1;
};

// Listens on host (an address or a name; "0.0.0.0" / "::" = every interface) at a port the
// kernel picks; returns the socket and sets *port. Throws CommError.
Fd tcp_listen(const std::string& host, int* port);

// Connects to host:port by `deadline`, retrying refused attempts (the peer may not listen
// yet), and checking `stop` ("" or why to give up) every few milliseconds. Sets TCP_NODELAY.
// Throws CommError.
Fd tcp_connect(const std::string& host, int port, Clock::time_point deadline,
               const std::function<std::string()>& stop);

// Waits until fd is readable or `deadline`; false on timeout.
bool wait_readable(int fd, Clock::time_point deadline);

// Reads exactly n bytes. False if the peer closed first (or the socket was shut down);
// throws CommError on another error (a reset: "connection reset by peer").
bool read_exact(int fd, void* buf, size_t n);
// Writes every byte of the two pieces (a header and a payload; either may be empty). Throws
// CommError on error (a closed or reset peer, a socket shut down by fail/abort).
void write_all(int fd, const void* a, size_t an, const void* b, size_t bn);

}  // namespace dtrain::grpc_detail
