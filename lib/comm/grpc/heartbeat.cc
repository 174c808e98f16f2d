#include "comm/grpc/heartbeat.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "comm/grpc_internal.h"
#include "util/strings.h"

namespace dtrain::grpc_detail {

namespace {

// The most of a position's activity a beat carries (Position.activity).
constexpr size_t kMaxActivityBytes = 200;

// A peer's abort reason as it may be printed: at most kMaxAbortNoticeBytes, control characters
// shown as '?', and if that is not valid UTF-8, bytes outside ASCII too (it ends up in logs and
// summary.json).
std::string printable_notice(const std::string& s) {
  std::string out = s.substr(0, kMaxAbortNoticeBytes);
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  if (!valid_utf8(out))
    for (char& c : out)
      if (static_cast<unsigned char>(c) >= 0x80) c = '?';
  return out;
}

}  // namespace

Heartbeats::Heartbeats(int rank, int world, double heartbeat_s, std::string token, Hooks hooks)
    : rank_(rank),
      world_(world),
      heartbeat_s_(heartbeat_s),
      token_(std::move(token)),
      hooks_(std::move(hooks)),
      service_(this),
      health_(static_cast<size_t>(world)) {
  beats_->calls.resize(static_cast<size_t>(world));
  beats_->failing.resize(static_cast<size_t>(world));
}

void Heartbeats::start(const std::vector<std::shared_ptr<grpc::Channel>>& channels) {
  if (!enabled() || thread_.joinable()) return;
  stubs_.resize(static_cast<size_t>(world_));
  for (int r = 0; r < world_; ++r)
    if (r != rank_) stubs_[r] = wire::Health::NewStub(channels[r]);
  started_ = true;
  thread_ = std::thread([this] { loop(); });
}

void Heartbeats::arm() {
  std::lock_guard<std::mutex> lk(check_mu_);
  armed_ = true;
  armed_at_ = Clock::now();
}

void Heartbeats::disarm() {
  std::lock_guard<std::mutex> lk(check_mu_);
  armed_ = false;
}

void Heartbeats::stop() {
  {
    std::lock_guard<std::mutex> lk(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::vector<std::shared_ptr<BeatCall>> calls;
  {
    std::lock_guard<std::mutex> lk(beats_->mu);
    beats_->closed = true;
    calls = beats_->calls;
    calls.insert(calls.end(), beats_->notices.begin(), beats_->notices.end());
  }
  for (auto& c : calls)  // unlocked: a cancelled call's callback may run inline
    if (c) c->ctx.TryCancel();
  calls.clear();
  // Cancelled calls complete promptly; their callbacks only touch beats_, so not waiting for
  // a stuck one would be safe too.
  std::unique_lock<std::mutex> lk(beats_->mu);
  if (!beats_->cv.wait_for(lk, std::chrono::seconds(5), [&] { return beats_->n == 0; }))
    spdlog::warn("rank {}: {} heartbeat call(s) still in flight at shutdown", rank_, beats_->n);
}

Clock::duration Heartbeats::beat_interval() const {
  // No faster than every 10 ms, whatever a peer claims (a forged claim must not make this rank
  // flood the others).
  constexpr double kFastest = 0.01;
  double iv = heartbeat_s_ / 3;
  std::lock_guard<std::mutex> lk(health_mu_);
  for (const PeerHealth& h : health_)
    if (h.beat && h.interval_s > 0 && h.interval_s < iv) iv = std::max(kFastest, h.interval_s);
  return secs_dur(iv);
}

void Heartbeats::loop() {
  // The CPU-starvation test below is about this thread's own schedule: heartbeat_s / 3.
  const Clock::duration own_interval = secs_dur(heartbeat_s_ / 3);
  Clock::time_point last_beat = Clock::now(), next_beat = last_beat;
  // Checking starts once armed; it restarts from scratch when this thread got no CPU for much
  // longer than it asked (this process was stopped, or starved): the silence was ours, and
  // peers' beats may still be queued in our sockets.
  std::optional<Clock::time_point> baseline;
  Clock::time_point last = Clock::now();
  std::unique_lock<std::mutex> lk(stop_mu_);
  while (!stop_) {
    lk.unlock();
    const auto now = Clock::now();
    // Beats go out as often as the most demanding peer beats (heartbeat_s is per host): a peer
    // gives this rank at most 2 x its own heartbeat_s of silence (peer_silence_limit), which
    // beating every heartbeat_s / 3 of this rank's exceeds once the two differ by more than 6x.
    const Clock::duration interval = beat_interval();
    next_beat = std::min(next_beat, last_beat + interval);
    // Peers are judged 4 times per beat interval, so a silence is noticed at most heartbeat_s /
    // 12 after it exceeds heartbeat_s (judging once per interval made that up to heartbeat_s / 3).
    const Clock::duration tick = interval / 4;
    if (!hooks_.aborted()) {
      if (now >= next_beat) {
        send_beats();
        last_beat = now;
        next_beat = now + interval;
      }
      std::lock_guard<std::mutex> ck(check_mu_);
      if (armed_) {
        if (!baseline) {
          baseline = armed_at_;
        } else if (now - last > 2 * own_interval + std::chrono::seconds(1)) {
          spdlog::warn(
              "rank {}: the heartbeat thread got no CPU for {:.1f} s (process stopped or "
              "starved); judging peers' heartbeats afresh",
              rank_, std::chrono::duration<double>(now - last).count());
          baseline = now;
        }
        check_peers(now, *baseline);
      }
    }
    last = now;
    lk.lock();
    stop_cv_.wait_for(lk, tick, [&] { return stop_ || faster_peer_; });
    faster_peer_ = false;
  }
}

wire::Heartbeat Heartbeats::make_beat() const {
  const auto now = Clock::now();
  const CommPosition pos = hooks_.own_position();
  wire::Heartbeat beat;
  beat.set_src_rank(rank_);
  beat.set_interval_s(heartbeat_s_ / 3);
  wire::Position* p = beat.mutable_position();
  p->set_completed(pos.completed);
  p->set_active(pos.active);
  p->set_op(static_cast<uint32_t>(pos.op));
  p->set_seq(pos.seq);
  p->set_count(pos.count);
  p->set_since_ms(static_cast<uint64_t>(std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::milliseconds>(now - pos.since).count())));
  p->set_activity(pos.activity.substr(0, kMaxActivityBytes));
  return beat;
}

void Heartbeats::launch(int r, BeatCall& call, const wire::Heartbeat& beat,
                        Clock::time_point deadline, std::function<void(const grpc::Status&)> done) {
  call.req = beat;
  call.ctx.AddMetadata(kGrpcTokenKey, token_);
  call.ctx.set_deadline(wall(deadline));
  // The callback may run inline: nothing is locked here.
  stubs_[r]->async()->Beat(&call.ctx, &call.req, &call.ack,
                           [done = std::move(done)](const grpc::Status& st) { done(st); });
}

void Heartbeats::send_beats() {
  const auto now = Clock::now();
  const wire::Heartbeat beat = make_beat();
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    auto call = std::make_shared<BeatCall>();
    {
      std::lock_guard<std::mutex> lk(beats_->mu);
      if (beats_->closed || beats_->calls[r]) continue;  // the last one is still on its way
      beats_->calls[r] = call;
      ++beats_->n;
    }
    // A beat older than heartbeat_s is worthless to the peer.
    launch(r, *call, beat, now + secs_dur(heartbeat_s_),
           [state = beats_, r](const grpc::Status& st) {
             std::shared_ptr<BeatCall> done;
             std::lock_guard<std::mutex> lk(state->mu);
             done = std::move(state->calls[r]);
             // Why beats to the peer fail, when not for its silence (a timeout) or this rank's
             // stop: a name that does not resolve here, an address nothing answers at. Kept until a
             // beat gets through (timeouts may alternate with it).
             if (st.ok())
               state->failing[r].clear();
             else if (st.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED &&
                      st.error_code() != grpc::StatusCode::CANCELLED)
               state->failing[r] = st.error_message().substr(0, 300);
             --state->n;
             state->cv.notify_all();
           });
  }
}

void Heartbeats::announce_abort(const std::string& why, const std::vector<int>& peers,
                                Clock::duration wait) {
  if (!enabled() || !started_) return;
  const auto now = Clock::now();
  wire::Heartbeat beat = make_beat();
  beat.set_aborted(why.empty() ? "aborted" : why.substr(0, kMaxAbortNoticeBytes));
  for (const int r : peers) {
    if (r == rank_ || r < 0 || r >= world_) continue;
    auto call = std::make_shared<BeatCall>();
    {
      std::lock_guard<std::mutex> lk(beats_->mu);
      if (beats_->closed) return;
      beats_->notices.push_back(call);
      ++beats_->n;
      ++beats_->notices_n;
    }
    launch(r, *call, beat, now + wait, [state = beats_](const grpc::Status&) {
      std::lock_guard<std::mutex> lk(state->mu);
      --state->n;
      --state->notices_n;
      state->cv.notify_all();
    });
  }
  // The notices' calls stay referenced by beats_->notices (stop() cancels any left).
  std::unique_lock<std::mutex> lk(beats_->mu);
  beats_->cv.wait_until(lk, now + wait, [&] { return beats_->notices_n == 0; });
}

void Heartbeats::check_peers(Clock::time_point now, Clock::time_point baseline) {
  for (int r = 0; r < world_; ++r) {
    if (r == rank_ || hooks_.peer_down(r)) continue;
    Clock::time_point heard;
    double limit = heartbeat_s_;
    {
      std::lock_guard<std::mutex> lk(health_mu_);
      const PeerHealth& h = health_[r];
      heard = h.beat ? std::max(h.heard, baseline) : baseline;
      limit = peer_silence_limit(heartbeat_s_, h.interval_s);
    }
    const double silent = std::chrono::duration<double>(now - heard).count();
    if (silent <= limit) continue;
    std::string failing;
    {
      std::lock_guard<std::mutex> lk(beats_->mu);
      failing = beats_->failing[static_cast<size_t>(r)];
    }
    // (a peer this rank cannot reach -- its advertised name does not resolve here, say -- cannot
    // reach this rank's beats either: each side sees only silence, unless told why)
    if (failing.find("DNS resolution failed") != std::string::npos)
      failing += fmt::format(
          " (the host name rank {} advertised does not resolve here: give every rank "
          "distributed.bind, an address the others reach, such as a pod's IP)",
          r);
    hooks_.fail_peer(r, fmt::format("no heartbeat from rank {} for {} s: frozen or unreachable "
                                    "(distributed.heartbeat_s {}){}",
                                    r, seconds_str(silent), seconds_str(heartbeat_s_),
                                    failing.empty() ? "" : "; beats sent to it fail: " + failing));
  }
}

grpc::ServerUnaryReactor* Heartbeats::on_beat(grpc::CallbackServerContext* ctx,
                                              const wire::Heartbeat* req) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (!authorized(ctx, token_, fmt::format("rank {}", rank_), "a heartbeat")) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong or missing job token"));
    return reactor;
  }
  const int src = req->src_rank();
  if (src < 0 || src >= world_ || src == rank_) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 fmt::format("heartbeat from invalid rank {}", src)));
    return reactor;
  }
  const auto now = Clock::now();
  const wire::Position& p = req->position();
  bool faster = false;
  {
    std::lock_guard<std::mutex> lk(health_mu_);
    PeerHealth& h = health_[src];
    // First heard at an interval shorter than this rank's (beat_interval follows it), or at a
    // shorter one than before.
    const double iv = req->interval_s();
    faster = iv > 0 && iv < heartbeat_s_ / 3 && (!h.beat || iv < h.interval_s);
    h.beat = true;
    h.heard = now;
    // As the peer says; check_peers bounds what it does (peer_silence_limit).
    h.interval_s = iv;
    h.pos.completed = p.completed();
    h.pos.active = p.active();
    h.pos.op = static_cast<CommOp>(p.op());
    h.pos.seq = p.seq();
    h.pos.count = p.count();
    // Capped (a day) so that a bogus value cannot overflow the clock arithmetic.
    h.pos.since = now - std::chrono::milliseconds(std::min<uint64_t>(p.since_ms(), 86400000));
    h.pos.activity = printable_notice(p.activity().substr(0, kMaxActivityBytes));
  }
  if (faster) {
    {
      std::lock_guard<std::mutex> lk(stop_mu_);
      faster_peer_ = true;
    }
    stop_cv_.notify_all();
  }
  // Before the acknowledgement: the aborting peer waits for it before closing its connections.
  if (!req->aborted().empty() && hooks_.peer_aborted)
    hooks_.peer_aborted(src, printable_notice(req->aborted()));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

std::vector<RankPosition> Heartbeats::positions(const CommPosition& own) const {
  std::vector<RankPosition> out(static_cast<size_t>(world_));
  const auto now = Clock::now();
  {
    std::lock_guard<std::mutex> lk(health_mu_);
    for (int r = 0; r < world_; ++r) {
      out[r].known = health_[r].beat;
      out[r].pos = health_[r].pos;
      out[r].heard = health_[r].heard;
    }
  }
  out[rank_] = RankPosition{true, own, now};
  return out;
}

}  // namespace dtrain::grpc_detail
