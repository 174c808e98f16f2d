// The gRPC transport's class (internal to lib/comm/grpc_transport.cc and
// grpc/transport_setup.cc): the data path (send, recv, frames from gRPC threads) lives in
// grpc_transport.cc, connecting and shutting down (server, credentials, streams, waiting for
// peers) in grpc/transport_setup.cc. See grpc_transport.cc for the thread model.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "comm/grpc/common.h"
#include "comm/grpc/heartbeat.h"
#include "comm/grpc/peer_path.h"
#include "comm/grpc/shm_path.h"
#include "comm/grpc/streams.h"
#include "comm/grpc/tcp_path.h"
#include "comm/grpc_internal.h"
#include "comm/grpc_transport.h"
#include "comm/mailbox.h"
#include "comm/rendezvous/rendezvous.h"
#include "dtrain.grpc.pb.h"

namespace dtrain {
namespace grpc_detail {

class GrpcTransport final : public Transport, private InStreamSink {
 public:
  GrpcTransport(const GrpcOptions& o, const GrpcTuning& tune);
  ~GrpcTransport() override { shutdown(); }

  int rank() const override { return rank_; }
  int size() const override { return world_; }
  std::string backend() const override { return "grpc"; }
  const std::vector<std::string>& peers() const { return peers_; }
  std::vector<int> shm_peers() const { return shm_ ? shm_->peers() : std::vector<int>{}; }
  std::vector<int> tcp_peers() const {
    std::vector<int> v;
    for (int r = 0; r < world_; ++r)
      if (tcp_ && out_path_[r] == tcp_.get()) v.push_back(r);
    return v;
  }
  int tcp_port() const { return tcp_ ? tcp_->port() : 0; }
  GrpcRecvStats recv_stats() const {
    return GrpcRecvStats{counters_.direct.load(), counters_.redirected.load(),
                         counters_.mailbox.load(), counters_.chunks_read_direct.load()};
  }

  // Starts the server, joins, opens the streams; throws CommError.
  void connect();

  void send(int dst, const MsgHeader& h, const void* data) override;
  // Paths that overlap (gRPC streams: queued on dst's OutStream; TCP: on dst's writer thread)
  // return at once (PathSend); shared memory and self: the synchronous default.
  std::unique_ptr<PendingSend> send_start(int dst, const MsgHeader& h, const void* data) override;
  void recv(int src, const MsgHeader& h, void* data, Deadline deadline) override;
  void recv_reduce(int src, const MsgHeader& h, float* data, Reduce r, Deadline deadline) override;
  void send_recv(int dst, const MsgHeader& sh, const void* sdata, int src, const MsgHeader& rh,
                 void* rdata, const Reduce* red, Deadline deadline) override;
  void abort(const std::string& why) override;
  std::vector<RankPosition> positions() const override {
    return heartbeats_.positions(own_position());
  }

 private:
  class DataService final : public wire::Data::WithRawCallbackMethod_Stream<wire::Data::Service> {
   public:
    explicit DataService(GrpcTransport* t) : t_(t) {}
    grpc::ServerReadReactor<grpc::ByteBuffer>* Stream(grpc::CallbackServerContext* ctx,
                                                      grpc::ByteBuffer* response) override {
      return t_->open_in_stream(ctx, response);
    }

   private:
    GrpcTransport* const t_;
  };
  // A rank to itself: straight into its own mailbox.
  class SelfPath final : public PeerPath {
   public:
    explicit SelfPath(GrpcTransport* t) : t_(t) {}
    void send(int dst, const MsgHeader& h, const void* data) override {
      t_->mailbox(dst).deliver_whole(h, data);
    }
    void recv(int src, const MsgHeader& h, void* data, const Reduce* red,
              Deadline deadline) override {
      t_->mailbox(src).recv(h, data, red, deadline);
    }

   private:
    GrpcTransport* const t_;
  };
  // The gRPC streams: sends queue on the peer's OutStream, receives wait on its mailbox.
  class StreamPath final : public PeerPath {
   public:
    explicit StreamPath(GrpcTransport* t) : t_(t) {}
    void send(int dst, const MsgHeader& h, const void* data) override {
      t_->send_stream(dst, h, data);
    }
    bool overlaps() const override { return true; }
    std::unique_ptr<PendingSend> send_start(int dst, const MsgHeader& h, const void* data) override;
    void recv(int src, const MsgHeader& h, void* data, const Reduce* red,
              Deadline deadline) override {
      t_->mailbox(src).recv(h, data, red, deadline);
    }

   private:
    GrpcTransport* const t_;
  };

  // A send queued on a stream: waits on its ticket (StreamPath::send_start).
  class StreamSend;
  // A path's asynchronous send, with send()'s error report and accounting (send_start).
  class PathSend;

  Mailbox& mailbox(int src) { return *inboxes_[src]; }
  grpc::ChannelArguments channel_args() const;
  void set_credentials();
  void start_server();
  // Connects to every peer and opens this rank's streams; then waits for theirs. Both fail at
  // once when a peer is found down (setup_failure), else at `deadline`.
  void open_streams(Clock::time_point deadline);
  void wait_for_peers(Clock::time_point deadline);
  // Opens the TCP data connection to r when both sides have the path and r is not reached
  // through shared memory; on failure (logged) r's data stays on the gRPC stream.
  void connect_tcp(int r, Clock::time_point deadline);
  // "" or why connecting cannot succeed: this transport aborted, or a peer went down (one
  // found silent first: a rank that gave up because of it comes later).
  std::string setup_failure();
  // Dies here if a kill_in_connect fault names this rank and point (DTRAIN_FAULT).
  void fault_point(const char* at);
  void shutdown();
  void send_stream(int dst, const MsgHeader& h, const void* data) {
    wait_stream_send(dst, *start_stream_send(dst, h, data));
  }
  // Queues h on dst's stream (throws CommError if it is down); the ticket completes once gRPC
  // no longer references data.
  std::shared_ptr<SendTicket> start_stream_send(int dst, const MsgHeader& h, const void* data);
  // Waits for t; throws CommError if the send failed (once gRPC released data).
  void wait_stream_send(int dst, SendTicket& t);
  // Throws CommError if this transport aborted or h is above the message limit.
  void check_sendable(const MsgHeader& h);
  // After sending h to dst failed (in a catch block): throws the error to report.
  [[noreturn]] void rethrow_send_error(int dst, const MsgHeader& h);
  // Fails every pending and future recv from and send to `peer` with `why`, as if its stream
  // had ended (unless it already had).
  void fail_peer(int peer, const std::string& why);
  // A peer's abort notice (Heartbeats): fails receives from it with "rank P aborted: why", and
  // setup reports that reason (it names the rank that failed). gRPC server thread.
  void peer_aborted(int peer, const std::string& why);
  void finish_in_streams(const grpc::Status& s);
  // Logs and aborts the transport for a malformed `kind` ("frame" on a stream,
  // "shared-memory record") from src; returns the message.
  std::string malformed(int src, const std::string& what, const char* kind);
  void ring_shm_waiters() {
    if (shm_) shm_->ring_waiters();
  }

  // Server-side entry points (gRPC threads).
  grpc::ServerReadReactor<grpc::ByteBuffer>* open_in_stream(grpc::CallbackServerContext* ctx,
                                                            grpc::ByteBuffer* response);
  grpc::Status on_frame(InStream& s, const grpc::ByteBuffer& bb) override;
  void in_stream_ended(InStream& s, bool cancelled) override;
  void in_stream_done(InStream* s) override {
    std::lock_guard<std::mutex> lk(in_mu_);
    in_streams_.erase(s);
  }

  const GrpcOptions o_;
  const GrpcTuning tune_;
  const int rank_, world_;
  std::shared_ptr<grpc::ServerCredentials> server_creds_;
  std::shared_ptr<grpc::ChannelCredentials> channel_creds_;
  DataService data_service_;
  Heartbeats heartbeats_;
  std::unique_ptr<RendezvousHost> rendezvous_;  // rank 0 only
  std::unique_ptr<grpc::Server> server_;
  std::string listen_address_;
  std::vector<std::string> peers_;
  std::vector<int> tcp_ports_;  // per peer: its TCP data port, 0 = none
  BufferPool pool_;
  SeqWindow seq_window_;  // this rank's collective sequence numbers; its mailboxes check peers'
  RecvCounters counters_;
  DownLog down_log_;
  std::vector<std::unique_ptr<Mailbox>> inboxes_;
  std::vector<std::unique_ptr<OutStream>> out_;  // null for self
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::unique_ptr<ShmPath> shm_;  // null: shared memory off or unavailable
  std::unique_ptr<TcpPath> tcp_;  // null: TCP data path off (TLS, distributed.tcp) or unavailable
  SelfPath self_path_{this};
  StreamPath stream_path_{this};
  std::vector<PeerPath*> out_path_, in_path_;  // per peer: how data goes to / comes from it

  std::mutex in_mu_;  // guards in_streams_ and closing_; ordered before InStream::mu_ and mailboxes
  std::set<InStream*> in_streams_;
  bool closing_ = false;

  // What setup_failure has seen: peers failed for silence, in order, the first peer's abort
  // notice ("rank P aborted: ..."), and the first one whose connection closed, with when.
  std::mutex setup_mu_;
  std::vector<int> silent_;
  std::string peer_abort_;
  std::optional<int> closed_;
  Clock::time_point closed_at_;

  std::mutex abort_mu_;
  std::string abort_reason_;
  std::atomic<bool> aborted_{false};
};

}  // namespace grpc_detail
}  // namespace dtrain
