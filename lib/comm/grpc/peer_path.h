// How the gRPC transport moves data to and from one peer. The transport picks one path per
// peer when it connects -- itself, the gRPC streams, shared memory (grpc/shm_path.h) or a plain
// TCP connection (grpc/tcp_path.h) -- and send()/recv() go through it; the streams stay up for
// failure detection whichever path carries the data. Every path delivers into the same mailboxes
// (comm/mailbox.h).
#pragma once

#include <memory>

#include "comm/transport.h"

namespace dtrain::grpc_detail {

class PeerPath {
 public:
  virtual ~PeerPath() = default;
  // As Transport::send; dst is the peer.
  virtual void send(int dst, const MsgHeader& h, const void* data) = 0;
  // Whether send_start overlaps sends with the caller's work; paths that do not are sent
  // synchronously (Transport::send_start's default).
  virtual bool overlaps() const { return false; }
  // As Transport::send_start, for paths that overlap. Errors are CommError, from here or from
  // the handle's wait(); the transport adds send()'s report and accounting.
  virtual std::unique_ptr<PendingSend> send_start(int /*dst*/, const MsgHeader& /*h*/,
                                                  const void* /*data*/) {
    return nullptr;
  }
  // As Transport::recv, or recv_reduce when red is set.
  virtual void recv(int src, const MsgHeader& h, void* data, const Transport::Reduce* red,
                    Deadline deadline) = 0;
  // Moves what src already sent into its mailbox (before a mismatch check). Never throws.
  virtual void flush(int /*src*/) {}
};

}  // namespace dtrain::grpc_detail
