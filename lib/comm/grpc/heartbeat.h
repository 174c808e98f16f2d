// Heartbeats of the gRPC transport. From the moment the peer table is known, a thread of its
// own sends a unary Health.Beat (with this rank's position for the desync report) to every
// peer each heartbeat_s / 3 (or as often as the most frequently beating peer, when it beats more
// often: hosts may set heartbeat_s differently, and each gives a peer at most twice its own),
// at most one in flight per peer, and -- once armed -- checks when
// each peer was last heard of. A peer silent for longer than heartbeat_s (or 3 of its own
// intervals, at most 2 x heartbeat_s: peer_silence_limit) is failed through the owner's hook
// as if its stream had ended: a frozen process (SIGSTOP) keeps its sockets open, and a rank that
// died before its streams opened has none, so nothing else would notice before a deadline.
// Beats never enter the mailboxes.
//
// A rank that aborts sends one last beat carrying why (announce_abort) and waits briefly for
// the acknowledgements before its connections close: a peer then hears "rank 0 aborted:
// connection to rank 1 lost" before rank 0's closed sockets, and names rank 1, not rank 0.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/grpc/common.h"
#include "comm/transport.h"
#include "dtrain.grpc.pb.h"

namespace dtrain::grpc_detail {

class Heartbeats {
 public:
  // What the heartbeats need of their transport. Called from the heartbeat thread.
  struct Hooks {
    std::function<bool(int)> peer_down;  // the peer is already known to be down
    std::function<void(int, const std::string&)> fail_peer;
    std::function<CommPosition()> own_position;
    std::function<bool()> aborted;  // the transport aborted: beat and judge no more
    // A peer's last beat said it aborted, and why (bounded and printable). Runs on a gRPC
    // server thread, before the beat is acknowledged.
    std::function<void(int, const std::string&)> peer_aborted;
  };
  Heartbeats(int rank, int world, double heartbeat_s, std::string token, Hooks hooks);
  ~Heartbeats() { stop(); }
  Heartbeats(const Heartbeats&) = delete;
  Heartbeats& operator=(const Heartbeats&) = delete;

  bool enabled() const { return heartbeat_s_ > 0 && world_ > 1; }
  // The Health service answering peers' beats; registered on this rank's server.
  grpc::Service* service() { return &service_; }
  // Starts beating to every peer over channels (element r: to rank r; null for self).
  void start(const std::vector<std::shared_ptr<grpc::Channel>>& channels);
  // Silence counts from now on (from the rendezvous). Peers are judged under a lock that
  // disarm() takes too, so once disarm() returns no hook runs any more.
  void arm();
  void disarm();
  // Sends `peers` one beat each saying this rank aborted and why, and waits up to `wait` for
  // them to be acknowledged (a dead peer's never is). Nothing before start() or after stop().
  // Thread-safe; meant to be called once, from the transport's abort.
  void announce_abort(const std::string& why, const std::vector<int>& peers, Clock::duration wait);
  // Stops beating and cancels beats in flight. Idempotent.
  void stop();
  // Every rank's latest position as heard from its beats; own is this rank's.
  std::vector<RankPosition> positions(const CommPosition& own) const;

 private:
  // One outgoing beat.
  struct BeatCall {
    grpc::ClientContext ctx;
    wire::Heartbeat req;
    wire::HeartbeatAck ack;
  };
  // Beats in flight, shared with their completion callbacks so that those never touch
  // *this. calls[r] is the beat to rank r still in flight, if any.
  // notices are the abort announcements, outside the one-per-peer slots.
  struct InFlight {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::shared_ptr<BeatCall>> calls;
    std::vector<std::shared_ptr<BeatCall>> notices;
    // failing[r]: why the last beat to rank r failed, when that says more than a timeout
    // (unresolvable name, refused connection); "" once one got through.
    std::vector<std::string> failing;
    int n = 0;            // calls and notices in flight
    int notices_n = 0;    // notices in flight
    bool closed = false;  // stop() ran: no new calls
  };
  // What this rank last heard from a peer's beats.
  // How often to beat now: heartbeat_s / 3, or the shortest interval a peer beats at (at least
  // 10 ms), if shorter.
  Clock::duration beat_interval() const;
  struct PeerHealth {
    bool beat = false;  // a beat arrived
    Clock::time_point heard;
    double interval_s = 0;  // the peer's beat interval, as it says
    CommPosition pos;       // `since` converted to this process's clock
  };
  class Service final : public wire::Health::CallbackService {
   public:
    explicit Service(Heartbeats* h) : h_(h) {}
    grpc::ServerUnaryReactor* Beat(grpc::CallbackServerContext* ctx, const wire::Heartbeat* req,
                                   wire::HeartbeatAck* /*ack*/) override {
      return h_->on_beat(ctx, req);
    }

   private:
    Heartbeats* const h_;
  };

  grpc::ServerUnaryReactor* on_beat(grpc::CallbackServerContext* ctx, const wire::Heartbeat* req);
  void loop();
  void send_beats();
  // This rank's beat (position and interval), as sent now.
  wire::Heartbeat make_beat() const;
  // Sends `beat` to rank r as `call` (kept alive by the caller until done runs), with the job
  // token and `deadline`; done runs once the call completes, perhaps inline, on any thread.
  void launch(int r, BeatCall& call, const wire::Heartbeat& beat, Clock::time_point deadline,
              std::function<void(const grpc::Status&)> done);
  // Fails every peer not heard from for too long, judged from `baseline` on (when checking
  // started, or when this rank last got the CPU back after a stall).
  void check_peers(Clock::time_point now, Clock::time_point baseline);

  const int rank_, world_;
  const double heartbeat_s_;
  const std::string token_;
  const Hooks hooks_;
  Service service_;
  std::vector<std::unique_ptr<wire::Health::Stub>> stubs_;  // null for self; set before started_
  std::atomic<bool> started_{false};
  std::shared_ptr<InFlight> beats_ = std::make_shared<InFlight>();
  mutable std::mutex health_mu_;
  std::vector<PeerHealth> health_;  // guarded by health_mu_
  std::mutex stop_mu_;              // guards stop_ and faster_peer_
  std::condition_variable stop_cv_;
  bool stop_ = false;
  // A peer said it beats more often than this rank's loop wakes: wake it now (its tick may be
  // far longer than that peer allows this rank's silence).
  bool faster_peer_ = false;
  // Guarded by check_mu_, which is held while peers are judged.
  std::mutex check_mu_;
  bool armed_ = false;
  Clock::time_point armed_at_;  // silence counts from then at the earliest
  std::thread thread_;
};

}  // namespace dtrain::grpc_detail
