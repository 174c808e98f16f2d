// A process-wide guard for the gRPC tests: see CallbackQueueKeeper.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <future>
#include <memory>
#include <mutex>

#include "dtrain.grpc.pb.h"

namespace dtrain::grpc_test {

// gRPC 1.51's callback API runs, without a background poller (epoll1), on one process-wide
// completion queue that the channels and servers using it hold by reference count: when the last
// one goes, gRPC shuts that queue down and joins its threads, and a transport created meanwhile
// races the teardown (a double free in grpc_cq_internal_unref on one of gRPC's threads, seen once
// under ASan in CI; the race couchbase-cxx-client's tests work around the same way). A rank's
// process makes one transport; these tests make and drop many in turn, so one channel holds a
// reference for the test case's life and the teardown runs once, at its end. Its one call (to a
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
// The keeper of the running test case (null when none is held).
inline std::unique_ptr<CallbackQueueKeeper>& callback_queue_keeper(std::mutex*& mu) {
  static std::mutex m;
  static std::unique_ptr<CallbackQueueKeeper> k;
  mu = &m;
  return k;
}
// Call before a test's first transport (options() and the files' own option builders do);
// thread-safe (ranks call it from their threads).
inline void keep_callback_queue() {
  std::mutex* mu = nullptr;
  auto& k = callback_queue_keeper(mu);
  std::lock_guard<std::mutex> lk(*mu);
  if (!k) k = std::make_unique<CallbackQueueKeeper>();
}
// Drops the keeper once the test case's transports are gone (a doctest listener in
// test_grpc.cc calls it as each test case ends): the queue's threads end then, and OpenSSL's
// per-thread state of the TLS handshakes they ran with them (LeakSanitizer reported that state
// as leaked while the threads outlived the test, to the process's exit).
inline void release_callback_queue() {
  std::mutex* mu = nullptr;
  auto& k = callback_queue_keeper(mu);
  std::unique_ptr<CallbackQueueKeeper> gone;
  {
    std::lock_guard<std::mutex> lk(*mu);
    gone = std::move(k);
  }
}

}  // namespace dtrain::grpc_test
