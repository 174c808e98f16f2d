#include "comm/grpc/tcp_path.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "comm/grpc/tcp_wire.h"
#include "util/check.h"

namespace dtrain::grpc_detail {
namespace {

// How long an accepted connection may take to say who it is, and a sender to be answered.
constexpr auto kHelloTimeout = std::chrono::seconds(5);
// Connections read at once while their hellos arrive; a new one beyond drops the oldest.
constexpr size_t kMaxPendingHellos = 64;

std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  char host[64] = "?";
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0)
    getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, nullptr, 0,
                NI_NUMERICHOST);
  return host;
}

}  // namespace

// One message queued on a writer thread.
struct TcpJob {
  MsgHeader h;
  const char* data = nullptr;
  bool done = false;
  std::string error;  // set when done: the send failed
};

struct TcpPath::Out {
  int dst = 0;
  Fd fd;
  std::mutex write_mu;  // one message at a time on the socket
  std::mutex mu;        // guards the rest; cv signals queue changes and completed jobs
  std::condition_variable cv;
  std::deque<std::shared_ptr<TcpJob>> queue;
  std::string error;  // the connection failed: every send fails with it
  bool stop = false;
  std::thread writer;

  // Fails the connection with why (the first reason stays) and shuts the socket down so a
  // blocked write returns; returns the reason that stays.
  std::string fail(const std::string& why) {
    std::lock_guard<std::mutex> lk(mu);
    if (error.empty()) {
      error = why;
      ::shutdown(fd.get(), SHUT_RDWR);
    }
    cv.notify_all();
    return error;
  }
};

struct TcpPath::In {
  int src = -1;
  Fd fd;
  std::thread reader;
};

class TcpPath::Send final : public PendingSend {
 public:
  Send(std::shared_ptr<Out> o, std::shared_ptr<TcpJob> j) : o_(std::move(o)), j_(std::move(j)) {}
  ~Send() override {
    if (!waited_) wait_done();
  }
  void wait() override {
    DT_CHECK(!waited_);
    waited_ = true;
    wait_done();
    if (!j_->error.empty()) throw CommError(j_->error);
  }

 private:
  // The writer always finishes a job: its write completes or fails (fail/abort shut the
  // socket down).
  void wait_done() {
    std::unique_lock<std::mutex> lk(o_->mu);
    o_->cv.wait(lk, [&] { return j_->done; });
  }
  const std::shared_ptr<Out> o_;
  const std::shared_ptr<TcpJob> j_;
  bool waited_ = false;
};

std::unique_ptr<TcpPath> TcpPath::create(Env env, const std::string& bind_host) {
  try {
    int port = 0;
    Fd l = tcp_listen(bind_host, &port);
    return std::unique_ptr<TcpPath>(new TcpPath(std::move(env), std::move(l), port));
  } catch (const CommError& e) {
    spdlog::warn("rank {}: no TCP data path ({}); data goes over the gRPC streams", env.rank,
                 e.what());
    return nullptr;
  }
}

TcpPath::TcpPath(Env env, Fd listener, int port)
    : env_(std::move(env)), listener_(std::move(listener)), port_(port) {
  out_.resize(static_cast<size_t>(env_.world));
  if (pipe2(wake_, O_CLOEXEC) != 0) throw CommError("pipe2 failed");
  acceptor_ = std::thread([this] { accept_loop(); });
}

TcpPath::~TcpPath() {
  close();
}

// A connection whose hello is still arriving. The acceptor reads every pending hello as its
// bytes come (the socket is non-blocking), so a client that connects and says nothing holds
// one slot until its deadline, never the other ranks' connections.
struct TcpPath::PendingHello {
  Fd fd;
  std::string from;  // the client's address, for the log
  Clock::time_point deadline;
  std::string bytes;                  // received so far
  size_t need = kTcpHelloFixedBytes;  // the hello's size once its lengths are known
  bool sized = false;
  TcpHelloLengths n;  // once sized
  TcpHello h;

  // Reads what has arrived. Returns false while the hello is incomplete; true once it is
  // complete (why empty) or the connection cannot be a hello (why says so).
  bool read(std::string* why) {
    try {
      for (;;) {
        if (bytes.size() == need) {
          if (sized) return true;
          n = decode_tcp_hello_fixed(bytes, &h);
          need += n.token + n.session;
          sized = true;
          continue;
        }
        char b[1024];
        const ssize_t k = ::recv(fd.get(), b, std::min(sizeof b, need - bytes.size()), 0);
        if (k > 0) {
          bytes.append(b, static_cast<size_t>(k));
        } else if (k == 0) {
          *why = sized ? "closed during its hello" : "closed before its hello";
          return true;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
          return false;
        } else if (errno != EINTR) {
          *why = std::strerror(errno);
          return true;
        }
      }
    } catch (const WireError& e) {
      *why = e.what();
      return true;
    }
  }
  void finish_hello() {
    h.token = bytes.substr(kTcpHelloFixedBytes, n.token);
    h.session = bytes.substr(kTcpHelloFixedBytes + n.token, n.session);
  }
};

void TcpPath::accept_loop() {
  std::deque<PendingHello> pending;  // by arrival
  for (;;) {
    std::vector<pollfd> p = {{listener_.get(), POLLIN, 0}, {wake_[0], POLLIN, 0}};
    int timeout_ms = -1;
    const auto now = Clock::now();
    for (const PendingHello& ph : pending) {
      p.push_back({ph.fd.get(), POLLIN, 0});
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(ph.deadline - now).count();
      const int ms = static_cast<int>(std::max<decltype(left)>(left, 0));
      timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
    }
    if (poll(p.data(), p.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[1].revents || closing_.load()) return;
    // Hellos that progressed, or ran out of time.
    const auto t = Clock::now();
    for (size_t i = 0; i < pending.size();) {
      PendingHello& ph = pending[i];
      std::string why;
      bool done = p[2 + i].revents != 0 && ph.read(&why);
      if (!done && t >= ph.deadline) {
        why = fmt::format("no hello within {} s", kHelloTimeout.count());
        done = true;
      }
      if (!done) {
        ++i;
        continue;
      }
      if (why.empty()) {
        ph.finish_hello();
        why = refusal(ph.h);
      }
      if (!why.empty())
        spdlog::warn("rank {}: refused a data connection from {}: {}", env_.rank, ph.from, why);
      answer(std::move(ph.fd), why.empty() ? ph.h.src : -1);
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      p.erase(p.begin() + static_cast<std::ptrdiff_t>(2 + i));
    }
    if (!p[0].revents) continue;
    Fd fd(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd) continue;
    if (pending.size() >= kMaxPendingHellos) {  // the oldest silent client makes room
      spdlog::warn("rank {}: refused a data connection from {}: {} connections are saying hello",
                   env_.rank, pending.front().from, kMaxPendingHellos);
      pending.pop_front();
    }
    PendingHello ph;
    ph.from = peer_name(fd.get());
    ph.fd = std::move(fd);
    ph.deadline = t + kHelloTimeout;
    pending.push_back(std::move(ph));
  }
}

std::string TcpPath::refusal(const TcpHello& h) {
  if (!token_equal(env_.token, h.token)) return "wrong or missing job token";
  if (h.session != env_.session) return "another job (config hash differs)";
  if (h.world != env_.world || h.dst != env_.rank || h.src < 0 || h.src >= env_.world ||
      h.src == env_.rank)
    return fmt::format("it claims rank {} of {} sending to rank {}", h.src, h.world, h.dst);
  std::lock_guard<std::mutex> lk(in_mu_);
  for (const auto& in : in_)
    if (in->src == h.src) return fmt::format("rank {} is connected already", h.src);
  return "";
}

void TcpPath::answer(Fd fd, int src) {
  char answer[kTcpAnswerBytes];
  std::lock_guard<std::mutex> lk(in_mu_);
  if (src < 0 || closing_.load()) {
    encode_tcp_answer(answer, 1);
    (void)::send(fd.get(), answer, sizeof answer, MSG_NOSIGNAL);  // fits: nothing else was sent
    return;
  }
  // Counted as one of src's streams before src hears it was accepted, and so before src opens
  // its gRPC stream: the mailbox cannot fail in between.
  env_.mailbox(src).stream_opened();
  const int flags = fcntl(fd.get(), F_GETFL);
  fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);  // the reader blocks in recv
  auto in = std::make_unique<In>();
  in->src = src;
  in->fd = std::move(fd);
  encode_tcp_answer(answer, 0);
  (void)::send(in->fd.get(), answer, sizeof answer, MSG_NOSIGNAL);  // a failure ends the reader
  In* raw = in.get();
  in->reader = std::thread([this, raw] { read_loop(raw); });
  in_.push_back(std::move(in));
}

void TcpPath::read_loop(In* in) {
  const int src = in->src;
  Mailbox& box = env_.mailbox(src);
  // The chunk being read; float-typed so that reductions read it aligned.
  std::vector<float> buf(kTcpMaxChunkBytes / sizeof(float));
  Partials partial;
  std::string why = fmt::format("rank {} closed its connection", src);
  try {
    for (;;) {
      char hdr[kTcpChunkHeaderBytes];
      if (!read_exact(in->fd.get(), hdr, sizeof hdr)) break;
      WireFrame f;
      try {
        f = decode_tcp_chunk_header(hdr, src);
      } catch (const WireError& e) {
        why = env_.malformed(src, e.what());
        break;
      }
      if (std::string err = box.check_chunk(f, partial); !err.empty()) {
        why = env_.malformed(src, err);
        break;
      }
      // A chunk of a posted plain recv (an all-gather's, a broadcast's) is read straight into
      // the receiver's buffer: no staging copy. A recv that gives up meanwhile shuts the socket
      // down for reading, so that a stalled peer cannot keep it waiting.
      const int fd = in->fd.get();
      if (char* dst = box.pin_direct(partial, f, [fd] { ::shutdown(fd, SHUT_RD); })) {
        bool written = false;
        try {
          written = read_exact(fd, dst, f.len);
        } catch (...) {
          box.unpin_direct(partial, f, false);
          throw;
        }
        box.unpin_direct(partial, f, written);
        if (!written) {
          why =
              fmt::format("rank {} closed its connection in the middle of {}", src, describe(f.h));
          break;
        }
        continue;
      }
      if (!read_exact(in->fd.get(), buf.data(), f.len)) {
        why = fmt::format("rank {} closed its connection in the middle of {}", src, describe(f.h));
        break;
      }
      const Mailbox::ReduceFn reduce = [&](float* dst, Transport::Reduce op) {
        reduce_into(dst, buf.data(), f.len / sizeof(float), op);
      };
      const Mailbox::Delivery d = box.deliver(
          partial, f,
          [&](char* dst) {
            if (f.len > 0) std::memcpy(dst, buf.data(), f.len);  // dst is null for empty tensors
          },
          &reduce);
      if (d.kind == Mailbox::Delivery::kOverflow) {
        why = env_.malformed(src, d.why);
        break;
      }
      if (d.kind == Mailbox::Delivery::kAborted) break;
    }
  } catch (const CommError& e) {  // from a read: a reset
    why = fmt::format("connection to rank {} lost ({})", src, e.what());
  } catch (const std::exception& e) {
    // This rank cannot take a chunk in (bad_alloc for the size a message announced): its data
    // is lost while src's gRPC stream stays open, so the transport fails now, as a gRPC frame's
    // would, rather than a recv waiting out its timeout blaming src.
    why = env_.malformed(src, fmt::format("a chunk this rank could not take in ({})", e.what()));
  }
  box.stream_ended(why);
}

std::string TcpPath::connect(int dst, const std::string& host, int port, Clock::time_point deadline,
                             const std::function<std::string()>& stop) {
  DT_CHECK(dst >= 0 && dst < env_.world && dst != env_.rank);
  DT_CHECK(!out_[dst]);
  Fd fd;
  try {
    fd = tcp_connect(host, port, deadline, stop);
  } catch (const CommError& e) {
    if (std::string s = stop ? stop() : ""; !s.empty()) throw CommError(s);
    return e.what();
  }
  try {
    const std::string hello =
        encode_tcp_hello(TcpHello{env_.rank, dst, env_.world, env_.token, env_.session});
    write_all(fd.get(), hello.data(), hello.size(), nullptr, 0);
    for (;;) {
      if (wait_readable(fd.get(), std::min(deadline, Clock::now() + std::chrono::milliseconds(50))))
        break;
      if (std::string s = stop ? stop() : ""; !s.empty()) throw CommError(s);
      if (Clock::now() >= deadline) return "no answer to its hello";
    }
    char answer[kTcpAnswerBytes];
    if (!read_exact(fd.get(), answer, sizeof answer)) return "closed before answering its hello";
    if (const uint32_t st = decode_tcp_answer(answer); st != 0)
      return fmt::format("refused (status {}; its log says why)", st);
  } catch (const WireError& e) {
    return e.what();
  } catch (const CommError& e) {
    if (std::string s = stop ? stop() : ""; !s.empty()) throw CommError(s);
    return e.what();
  }
  auto o = std::make_shared<Out>();
  o->dst = dst;
  o->fd = std::move(fd);
  Out* raw = o.get();
  o->writer = std::thread([this, raw] { write_loop(raw); });
  std::lock_guard<std::mutex> lk(out_mu_);
  out_[dst] = std::move(o);
  return "";
}

void TcpPath::write_message(Out& o, const MsgHeader& h, const char* data) {
  std::lock_guard<std::mutex> wl(o.write_mu);
  {
    std::lock_guard<std::mutex> lk(o.mu);
    if (!o.error.empty()) throw CommError(o.error);
  }
  uint64_t off = 0;
  do {  // a message of 0 bytes is one empty chunk
    const uint64_t len = std::min(kTcpChunkBytes, h.bytes - off);
    char hdr[kTcpChunkHeaderBytes];
    encode_tcp_chunk_header(hdr, h, off, len);
    try {
      write_all(o.fd.get(), hdr, sizeof hdr, data + off, len);
    } catch (const CommError& e) {
      throw CommError(o.fail(fmt::format("connection to rank {} lost ({})", o.dst, e.what())));
    }
    off += len;
  } while (off < h.bytes);
}

void TcpPath::write_loop(Out* o) {
  for (;;) {
    std::shared_ptr<TcpJob> j;
    {
      std::unique_lock<std::mutex> lk(o->mu);
      o->cv.wait(lk, [&] { return o->stop || !o->queue.empty(); });
      if (o->queue.empty()) return;
      j = o->queue.front();
    }
    std::string err;
    try {
      write_message(*o, j->h, j->data);
    } catch (const CommError& e) {
      err = e.what();
    }
    std::lock_guard<std::mutex> lk(o->mu);
    o->queue.pop_front();
    j->error = err;
    j->done = true;
    o->cv.notify_all();
  }
}

void TcpPath::send(int dst, const MsgHeader& h, const void* data) {
  DT_CHECK(out_[dst]);
  write_message(*out_[dst], h, static_cast<const char*>(data));
}

std::unique_ptr<PendingSend> TcpPath::send_start(int dst, const MsgHeader& h, const void* data) {
  DT_CHECK(out_[dst]);
  const std::shared_ptr<Out>& o = out_[dst];
  auto j = std::make_shared<TcpJob>();
  j->h = h;
  j->data = static_cast<const char*>(data);
  {
    std::lock_guard<std::mutex> lk(o->mu);
    if (!o->error.empty()) throw CommError(o->error);
    o->queue.push_back(j);
  }
  o->cv.notify_all();
  return std::make_unique<Send>(o, std::move(j));
}

void TcpPath::fail(int peer, const std::string& why) {
  std::shared_ptr<Out> o;
  {
    std::lock_guard<std::mutex> lk(out_mu_);
    o = out_[peer];
  }
  if (o) o->fail(why);
}

void TcpPath::abort(const std::string& why) {
  std::vector<std::shared_ptr<Out>> outs;
  {
    std::lock_guard<std::mutex> lk(out_mu_);
    outs = out_;
  }
  for (auto& o : outs)
    if (o) o->fail(why);
  std::lock_guard<std::mutex> lk(in_mu_);
  for (auto& in : in_) ::shutdown(in->fd.get(), SHUT_RDWR);
}

void TcpPath::close() {
  std::lock_guard<std::mutex> cl(close_mu_);
  if (closed_) return;
  closed_ = true;
  closing_ = true;
  // Outgoing: the writers finish what is queued (every send has been waited for by now, or its
  // connection failed), then a FIN after the last byte.
  for (auto& o : out_) {
    if (!o) continue;
    {
      std::lock_guard<std::mutex> lk(o->mu);
      o->stop = true;
    }
    o->cv.notify_all();
    o->writer.join();
    ::shutdown(o->fd.get(), SHUT_WR);
  }
  (void)!::write(wake_[1], "x", 1);
  acceptor_.join();
  {
    std::lock_guard<std::mutex> lk(in_mu_);
    for (auto& in : in_) ::shutdown(in->fd.get(), SHUT_RDWR);
  }
  for (auto& in : in_) in->reader.join();
  ::close(wake_[0]);
  ::close(wake_[1]);
}

}  // namespace dtrain::grpc_detail
