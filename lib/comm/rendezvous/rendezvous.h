// The rendezvous: every rank (rank 0 included) joins rank 0 with (rank, world size, listen
// address, shared-memory segment name, job token, config hash) and receives the peer table once
// all ranks have joined. Rank 0 hosts the service (RendezvousHost) at MASTER_ADDR:MASTER_PORT;
// join_rendezvous is every rank's side. A disagreement (protocol version, world size, config
// hash, duplicate or out-of-range rank) or a timeout fails the rendezvous for every rank with
// the same message.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/grpc/common.h"
#include "comm/grpc_transport.h"
#include "dtrain.grpc.pb.h"

namespace dtrain::grpc_detail {

class Coordinator;

// Rank 0's rendezvous service: a Coordinator behind the token check.
class RendezvousHost {
 public:
  // Fails the rendezvous, naming the ranks that never joined, at `deadline`.
  RendezvousHost(const GrpcOptions& o, Clock::time_point deadline);
  ~RendezvousHost();
  grpc::Service* service() { return &service_; }
  // Fails pending and later joins with `why` (unless the rendezvous completed) and stops.
  void shutdown(const std::string& why);

 private:
  class Service final : public wire::Rendezvous::CallbackService {
   public:
    explicit Service(RendezvousHost* h) : h_(h) {}
    grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const wire::JoinRequest* req,
                                   wire::JoinReply* reply) override;

   private:
    RendezvousHost* const h_;
  };
  const std::string token_;
  const int rank_;
  std::unique_ptr<Coordinator> coordinator_;
  Service service_;
};

// One entry of the peer table.
struct PeerEntry {
  std::string address;   // "host:port" of the rank's Data service
  std::string shm_name;  // its shared-memory segment, "" = none
};

// Joins the rendezvous at o.master_addr:o.master_port (waiting for rank 0 to come up) and
// returns the peer table, in rank order. Throws CommError with what rank 0 or the network said.
std::vector<PeerEntry> join_rendezvous(const GrpcOptions& o, const std::string& listen_address,
                                       const std::string& shm_name,
                                       const std::shared_ptr<grpc::ChannelCredentials>& creds,
                                       const grpc::ChannelArguments& args);

}  // namespace dtrain::grpc_detail
