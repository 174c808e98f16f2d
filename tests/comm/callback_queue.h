// A process-wide guard for the gRPC tests: see CallbackQueueKeeper.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <future>
#include <memory>

#include "dtrain.grpc.pb.h"

namespace dtrain::grpc_test {

// gRPC 1.51's callback API runs, without a background poller (epoll1), on one process-wide
// completion queue that the channels and servers using it hold by reference count: when the last
// one goes, gRPC shuts that queue down and joins its threads, and a transport created meanwhile
// races the teardown (a double free in grpc_cq_internal_unref on one of gRPC's threads, seen once
// under ASan in CI; the race couchbase-cxx-client's tests work around the same way). A rank's
// process makes one transport; these tests make and drop many in turn, so one channel holds a
// reference for the test binary's life and the teardown runs once, at exit. Its one call (to a
// port nothing listens on) takes the reference; it has ended before the constructor returns.
class CallbackQueueKeeper {
 public:
  CallbackQueueKeeper()
      : channel_(grpc::CreateChannel("127.0.0.1:9", grpc::InsecureChannelCredentials())),
        stub_(wire::Health::NewStub(channel_)) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(50));
    std::promise<void> done;
    stub_->async()->Beat(&ctx_, &req_, &ack_, [&done](const grpc::Status&) { done.set_value(); });
    done.get_future().wait();
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<wire::Health::Stub> stub_;
  grpc::ClientContext ctx_;
  wire::Heartbeat req_;
  wire::HeartbeatAck ack_;
};
// Call before a test's first transport (options() and the files' own option builders do).
inline void keep_callback_queue() {
  static const CallbackQueueKeeper keeper;  // (thread-safe once; destroyed at exit)
}

}  // namespace dtrain::grpc_test
