#include "comm/rendezvous/store_service.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "comm/grpc/common.h"
#include "comm/grpc_internal.h"

namespace dtrain::grpc_detail {
namespace {
// How often waits past their deadline are expired.
constexpr auto kExpireEvery = std::chrono::milliseconds(50);
// A wait longer than this is cut to it (a forged timeout must not hold a call forever).
constexpr uint64_t kMaxWaitMs = uint64_t{24} * 3600 * 1000;

StoreDeadline after_ms(uint64_t ms) {
  return Clock::now() + std::chrono::milliseconds(std::min(ms, kMaxWaitMs));
}
}  // namespace

StoreService::StoreService(MemoryStore* store, std::string token, std::string who)
    : store_(store), token_(std::move(token)), who_(std::move(who)) {
  expirer_ = std::thread([this] {
    std::unique_lock<std::mutex> lk(mu_);
    while (!cv_.wait_for(lk, kExpireEvery, [&] { return stop_; })) {
      lk.unlock();
      store_->expire();
      lk.lock();
    }
  });
}

StoreService::~StoreService() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  expirer_.join();
}

bool StoreService::refused(grpc::CallbackServerContext* ctx, grpc::ServerUnaryReactor* r) {
  if (authorized(ctx, token_, who_, "a rendezvous call")) return false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++refused_calls_;
    last_refused_peer_ = ctx->peer();
  }
  r->Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong or missing job token"));
  return true;
}

std::string StoreService::refused_summary() {
  std::lock_guard<std::mutex> lk(mu_);
  if (refused_calls_ == 0) return "";
  return fmt::format("{} call(s) with a wrong or missing job token were refused, the last from {}",
                     refused_calls_, last_refused_peer_);
}

std::string StoreService::refused_hint(const std::string& peers) {
  const std::string r = refused_summary();
  return r.empty() ? "" : "; " + r + " (is every " + peers + " given the same DTRAIN_JOB_TOKEN?)";
}

grpc::ServerUnaryReactor* StoreService::now(grpc::CallbackServerContext* ctx,
                                            const std::function<void()>& op) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  if (refused(ctx, r)) return r;
  try {
    op();
    r->Finish(grpc::Status::OK);
  } catch (const CommError& e) {  // the store shut down, or a key is no counter
    r->Finish(grpc::Status(grpc::StatusCode::ABORTED, e.what()));
  }
  return r;
}

grpc::ServerUnaryReactor* StoreService::Set(grpc::CallbackServerContext* ctx,
                                            const wire::StoreRequest* req,
                                            wire::StoreReply* /*reply*/) {
  return now(ctx, [&] { store_->set(req->key(), req->value()); });
}

grpc::ServerUnaryReactor* StoreService::Add(grpc::CallbackServerContext* ctx,
                                            const wire::StoreRequest* req,
                                            wire::StoreReply* reply) {
  return now(ctx, [&] { reply->set_count(store_->add(req->key(), req->delta())); });
}

grpc::ServerUnaryReactor* StoreService::Get(grpc::CallbackServerContext* ctx,
                                            const wire::StoreRequest* req,
                                            wire::StoreReply* reply) {
  return wait_for(ctx, req, {req->key()}, reply, true);
}

grpc::ServerUnaryReactor* StoreService::Wait(grpc::CallbackServerContext* ctx,
                                             const wire::StoreRequest* req,
                                             wire::StoreReply* reply) {
  return wait_for(ctx, req, {req->keys().begin(), req->keys().end()}, reply, false);
}

grpc::ServerUnaryReactor* StoreService::wait_for(grpc::CallbackServerContext* ctx,
                                                 const wire::StoreRequest* req,
                                                 std::vector<std::string> keys,
                                                 wire::StoreReply* reply, bool want_value) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  if (refused(ctx, r)) return r;
  // The reactor and reply stay valid until Finish; done runs exactly once.
  store_->when_set(
      std::move(keys), after_ms(req->timeout_ms()),
      [r, reply, want_value](const std::string& error, const std::vector<std::string>& values) {
        if (error == "timeout") {
          r->Finish(
              grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "timed out waiting for the store"));
        } else if (!error.empty()) {
          r->Finish(grpc::Status(grpc::StatusCode::ABORTED, error));
        } else {
          if (want_value && !values.empty()) reply->set_value(values.front());
          r->Finish(grpc::Status::OK);
        }
      });
  return r;
}

GrpcStore::GrpcStore(std::shared_ptr<grpc::Channel> channel, std::string token,
                     StoreDeadline op_deadline, ErrorFn error)
    : stub_(wire::Store::NewStub(channel)),
      token_(std::move(token)),
      op_deadline_(op_deadline),
      error_(std::move(error)) {}

wire::StoreReply GrpcStore::call(const char* method, wire::StoreRequest req, StoreDeadline deadline,
                                 bool idempotent) {
  auto backoff = std::chrono::milliseconds(100);
  for (;;) {
    const auto now = Clock::now();
    // The server answers a wait itself, a moment before the call's own deadline.
    req.set_timeout_ms(static_cast<uint64_t>(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count())));
    grpc::ClientContext ctx;
    ctx.AddMetadata(kGrpcTokenKey, token_);
    ctx.set_wait_for_ready(true);  // the host may not be up yet: gRPC reconnects with backoff
    ctx.set_deadline(wall(deadline + std::chrono::milliseconds(500)));
    wire::StoreReply reply;
    grpc::Status s;
    if (method[0] == 'S')
      s = stub_->Set(&ctx, req, &reply);
    else if (method[0] == 'G')
      s = stub_->Get(&ctx, req, &reply);
    else if (method[0] == 'W')
      s = stub_->Wait(&ctx, req, &reply);
    else
      s = stub_->Add(&ctx, req, &reply);
    if (s.ok()) return reply;
    const bool lost = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                      s.error_code() == grpc::StatusCode::CANCELLED;
    if (lost && idempotent && Clock::now() + backoff < deadline) {
      std::this_thread::sleep_for(backoff);  // connection lost mid-call: the host restarting?
      backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
      continue;
    }
    throw error_(s);
  }
}

void GrpcStore::set(const std::string& key, const std::string& value) {
  wire::StoreRequest req;
  req.set_key(key);
  req.set_value(value);
  call("Set", std::move(req), op_deadline_, true);
}

std::string GrpcStore::get(const std::string& key, StoreDeadline deadline) {
  wire::StoreRequest req;
  req.set_key(key);
  return call("Get", std::move(req), deadline, true).value();
}

void GrpcStore::wait(const std::vector<std::string>& keys, StoreDeadline deadline) {
  wire::StoreRequest req;
  for (const auto& k : keys) req.add_keys(k);
  call("Wait", std::move(req), deadline, true);
}

int64_t GrpcStore::add(const std::string& key, int64_t delta) {
  wire::StoreRequest req;
  req.set_key(key);
  req.set_delta(delta);
  return call("Add", std::move(req), op_deadline_, false).count();  // not repeated: not idempotent
}

}  // namespace dtrain::grpc_detail
