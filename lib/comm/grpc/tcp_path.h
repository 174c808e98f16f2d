// The gRPC transport's TCP data path: messages to peers that are not reached through shared
// memory move over plain TCP connections, one per ordered rank pair, instead of the gRPC
// streams, which stay up for failure detection (as with shared memory). Why: over loopback on 2
// cores the gRPC streams spent their cycles on HTTP/2 framing, slice copies and thread hand-offs
// and reached about gloo's bandwidth; a plain socket read into a small cache-resident buffer,
// delivered straight into the posted receive, is what gloo does without the extra costs.
//
// Negotiated at the rendezvous: every rank listens on a second port (its bind address, a port
// the kernel picks) and advertises it next to its gRPC address. A sender connects before it
// opens its gRPC stream and says who it is (grpc/tcp_wire.h: the hello carries the job token and
// the config hash, like the gRPC calls' metadata, in clear text as they are without TLS); the
// receiver answers once it counts the connection as one of the sender's streams
// (Mailbox::stream_opened). A sender that cannot connect or is refused keeps using its gRPC
// stream, after a warning: receivers need no decision, every path delivers into the mailbox.
// With TLS configured this path is off, so data stays encrypted.
//
// Threads: one acceptor, which reads up to 64 hellos at once as their bytes arrive (each within
// 5 s; a client that connects and says nothing delays no one); per incoming connection a reader
// that validates every chunk header (decode_tcp_chunk_header, Mailbox::check_chunk) before reading
// its payload into a buffer of its own and delivering it into src's mailbox -- so progress never
// depends on recv() being called, as the Transport contract requires; per outgoing connection a
// writer thread for send_start. send() writes on the caller's thread. One message at a time per
// connection.
//
// Failure: a connection that ends (peer closed, reset, shut down) ends one of the peer's
// streams (Mailbox::stream_ended), so its mailbox fails once the gRPC stream has ended too and
// no data that arrived before is lost; a malformed chunk aborts the transport (Env::malformed).
// fail(peer) and abort() shut sockets down, so blocked writes return at once with the reason.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/grpc/peer_path.h"
#include "comm/grpc/tcp_socket.h"
#include "comm/grpc/tcp_wire.h"
#include "comm/mailbox.h"

namespace dtrain::grpc_detail {

class TcpPath final : public PeerPath {
 public:
  // What the path needs of its transport.
  struct Env {
    int rank = 0, world = 0;
    std::string token, session;            // must match in every hello
    std::function<Mailbox&(int)> mailbox;  // what this rank receives from a peer
    // Reports a malformed chunk from src (logs, aborts the transport); returns the message.
    std::function<std::string(int, const std::string&)> malformed;
  };
  // Listens on bind_host; null (after a warning) if it cannot.
  static std::unique_ptr<TcpPath> create(Env env, const std::string& bind_host);
  ~TcpPath() override;  // close()

  int port() const { return port_; }
  // Opens the connection to dst's data port and waits for dst's answer, until `deadline`
  // (checking `stop`, "" or why to give up, meanwhile). Returns "" once dst accepted, else why
  // not (the caller keeps the gRPC stream for dst). Throws CommError only for what `stop` says.
  std::string connect(int dst, const std::string& host, int port, Clock::time_point deadline,
                      const std::function<std::string()>& stop);
  bool sends_to(int dst) const { return out_[dst] != nullptr; }

  void send(int dst, const MsgHeader& h, const void* data) override;
  // Queues the message on dst's writer thread.
  std::unique_ptr<PendingSend> send_start(int dst, const MsgHeader& h, const void* data) override;
  bool overlaps() const override { return true; }
  void recv(int src, const MsgHeader& h, void* data, const Transport::Reduce* red,
            Deadline deadline) override {
    env_.mailbox(src).recv(h, data, red, deadline);
  }

  // No more data goes to peer: queued and blocked sends to it fail with why.
  void fail(int peer, const std::string& why);
  // Everything fails with why; every connection is shut down (peers notice at once).
  void abort(const std::string& why);
  // Orderly end (idempotent): ends every outgoing connection after what was written (peers
  // read it to the end), stops reading, joins every thread.
  void close();

 private:
  struct Out;
  struct In;
  class Send;
  TcpPath(Env env, Fd listener, int port);
  struct PendingHello;
  // Accepts connections and reads their hellos, all at once (poll), each within 5 s.
  void accept_loop();
  // Why a complete hello is refused, or "".
  std::string refusal(const TcpHello& h);
  // Answers a connection: refused (src < 0), or accepted from src and given a reader.
  void answer(Fd fd, int src);
  void read_loop(In* in);
  void write_loop(Out* o);
  // Writes one message on o's connection; throws CommError (and fails o) on error.
  void write_message(Out& o, const MsgHeader& h, const char* data);

  const Env env_;
  Fd listener_;
  const int port_;
  int wake_[2] = {-1, -1};  // a pipe: wakes the acceptor to stop
  std::thread acceptor_;
  std::vector<std::shared_ptr<Out>> out_;  // null: dst is not reached over TCP
  // Guards out_'s entries while connect sets them: fail and abort run on the heartbeat and reader
  // threads meanwhile. (Sends, which read them unlocked, start after every connect.)
  std::mutex out_mu_;
  std::mutex in_mu_;                     // guards in_ and closing_
  std::vector<std::unique_ptr<In>> in_;  // accepted connections, by arrival
  std::atomic<bool> closing_{false};
  std::mutex close_mu_;
  bool closed_ = false;
};

}  // namespace dtrain::grpc_detail
