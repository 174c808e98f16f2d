// The gRPC transport's same-host data path: messages to ranks on this machine go through
// shared-memory rings (comm/shm_ring.h) instead of the gRPC streams, which stay up for failure
// detection, refusals and peers on other hosts. Negotiated at the rendezvous: each rank
// advertises its segment's random name; a peer that can open it and finds the matching nonce is
// on this host and attaches before it opens its stream, so once every peer's stream is seen the
// set of shared-memory senders is fixed (fix_senders).
//
// Nothing polls in the background: a receiver drains the sender's ring itself (RecvPump) and
// sleeps on its segment's bell, which senders, other draining threads and failures ring.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/grpc/peer_path.h"
#include "comm/mailbox.h"
#include "comm/shm_ring.h"

namespace dtrain::grpc_detail {

class ShmPath final : public PeerPath {
 public:
  // What the path needs of its transport.
  struct Env {
    int rank = 0, world = 0;
    std::function<Mailbox&(int)> mailbox;  // what this rank receives from a peer
    // Reports a malformed record from src (logs, aborts the transport); returns the message.
    std::function<std::string(int, const std::string&)> malformed;
  };
  // This rank's inbound segment; null (after a warning) if shared memory is unavailable.
  static std::unique_ptr<ShmPath> create(Env env);

  const std::string& name() const { return in_->name(); }
  // Maps the segments of the peers that advertised one (names[r], "" = none), before this
  // rank's streams open: a peer that sees our stream sees the attachment.
  void attach(const std::vector<std::string>& names);
  // Every peer attached before opening the stream this rank saw, or never will: fixes which
  // ranks write to us here, and removes the segment's name.
  void fix_senders();
  bool sends_to(int dst) const { return out_[dst] != nullptr; }
  bool receives_from(int src) const { return src_[src] != 0; }
  std::vector<int> peers() const;  // the ranks this rank sends to through shared memory
  // Wakes every receiver sleeping on this rank's segment (a peer failed, an abort).
  void ring_waiters() { in_->ring_owner(); }

  void send(int dst, const MsgHeader& h, const void* data) override;
  void recv(int src, const MsgHeader& h, void* data, const Transport::Reduce* red,
            Deadline deadline) override;
  void flush(int src) override;

 private:
  class Pump;
  explicit ShmPath(Env env);
  // Delivers every record waiting in src's ring, unless another thread is already at it.
  // Throws CommError (after aborting) on a corrupt ring.
  void drain(int src);

  const Env env_;
  std::unique_ptr<ShmSegment> in_;                    // our inbound rings
  std::vector<std::unique_ptr<ShmSegment>> out_;      // peers' segments; null: use the stream
  std::vector<char> src_;                             // src writes to us (fixed once connected)
  std::vector<std::unique_ptr<std::mutex>> send_mu_;  // one writer per outgoing ring
  // One drainer per incoming ring; it guards the ring's unfinished messages too.
  std::vector<std::unique_ptr<std::mutex>> read_mu_;
  std::vector<Partials> partial_;
};

}  // namespace dtrain::grpc_detail
