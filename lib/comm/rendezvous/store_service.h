// The Store over gRPC (proto/dtrain.proto, service Store): StoreService serves a MemoryStore on
// rank 0's server; GrpcStore is every rank's client. Waiting calls (Get, Wait) are answered
// asynchronously, so they never hold one of gRPC's threads.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/rendezvous/store.h"
#include "dtrain.grpc.pb.h"

namespace dtrain::grpc_detail {

class StoreService final : public wire::Store::CallbackService {
 public:
  // Serves `store` to clients with `token` (refusals are logged as "<who>: refused ..."). Runs a
  // thread that expires waits past their deadline.
  StoreService(MemoryStore* store, std::string token, std::string who);
  // A rank number is no name: 0 would convert to a null std::string.
  StoreService(MemoryStore* store, std::string token, int rank) = delete;
  ~StoreService() override;

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* ctx, const wire::StoreRequest* req,
                                wire::StoreReply* reply) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const wire::StoreRequest* req,
                                wire::StoreReply* reply) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* ctx, const wire::StoreRequest* req,
                                 wire::StoreReply* reply) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* ctx, const wire::StoreRequest* req,
                                wire::StoreReply* reply) override;

  // The calls refused so far for a wrong or missing job token, "" when none: "3 call(s) with a
  // wrong or missing job token were refused, the last from ipv4:10.0.0.2:51234". A host whose
  // peers never arrive names this as the likely cause (thread-safe).
  std::string refused_summary();
  // "; <refused_summary()> (is every <peers> given the same DTRAIN_JOB_TOKEN?)", to end a
  // timeout's error with, or "" when nothing was refused (thread-safe).
  std::string refused_hint(const std::string& peers);

 private:
  // Answers once `keys` are set (the value of the first into reply, for Get).
  grpc::ServerUnaryReactor* wait_for(grpc::CallbackServerContext* ctx,
                                     const wire::StoreRequest* req, std::vector<std::string> keys,
                                     wire::StoreReply* reply, bool want_value);
  // Answers at once: OK once op ran, ABORTED with what it threw.
  grpc::ServerUnaryReactor* now(grpc::CallbackServerContext* ctx, const std::function<void()>& op);
  bool refused(grpc::CallbackServerContext* ctx, grpc::ServerUnaryReactor* r);

  MemoryStore* const store_;
  const std::string token_;
  const std::string who_;  // names the host in refusal warnings
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread expirer_;
  int64_t refused_calls_ = 0;      // under mu_
  std::string last_refused_peer_;  // under mu_
};

// A Store reached over a channel. Every call carries the token and waits for the channel (the
// store's host may come up later). A failed call throws what `error` makes of its status.
class GrpcStore final : public Store {
 public:
  using ErrorFn = std::function<CommError(const grpc::Status&)>;
  // Calls that do not wait for keys (set, add) give up at `op_deadline`.
  GrpcStore(std::shared_ptr<grpc::Channel> channel, std::string token, StoreDeadline op_deadline,
            ErrorFn error);
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, StoreDeadline deadline) override;
  void wait(const std::vector<std::string>& keys, StoreDeadline deadline) override;
  int64_t add(const std::string& key, int64_t delta) override;

 private:
  // Runs one call until `deadline`, retrying while the connection is unavailable when
  // `idempotent`; throws error_(status) otherwise.
  wire::StoreReply call(const char* method, wire::StoreRequest req, StoreDeadline deadline,
                        bool idempotent);

  std::unique_ptr<wire::Store::Stub> stub_;
  const std::string token_;
  const StoreDeadline op_deadline_;
  const ErrorFn error_;
};

}  // namespace dtrain::grpc_detail
