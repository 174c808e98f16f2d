#include "comm/mailbox.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "util/check.h"

namespace dtrain {

namespace {
using Clock = std::chrono::steady_clock;

// Three significant digits: a deadline computed a moment before the call reads "0.5", not
// "0.499993".
std::string seconds_str(double s) {
  return fmt::format("{:.3g}", s);
}
}  // namespace

std::string mismatch_msg(int src, int self, const MsgHeader& got, const MsgHeader& want) {
  return fmt::format("mismatched calls: rank {} sent {}, rank {} expected {}", src, describe(got),
                     self, describe(want));
}

// ---- BufferPool ------------------------------------------------------------------------------

void BufferPool::Free::operator()(char* p) const {
  std::free(p);
}

BufferPool::Buf BufferPool::get(uint64_t n) {
  if (n >= kMinPooled) {
    std::lock_guard<std::mutex> lk(mu_);
    // The smallest free buffer that fits, unless it is more than twice too big.
    const auto it = free_.lower_bound(n);
    if (it != free_.end() && it->first <= 2 * n) {
      Buf b{std::move(it->second), it->first};
      free_.erase(it);
      held_ -= b.cap;
      return b;
    }
  }
  Buf b;
  if (n >= kHugeMin) {
    b.cap = (n + kHuge - 1) / kHuge * kHuge;
    b.p.reset(static_cast<char*>(std::aligned_alloc(kHuge, b.cap)));
    if (b.p) madvise(b.p.get(), b.cap, MADV_HUGEPAGE);  // a hint: failure is harmless
  } else {
    b.cap = n;
    b.p.reset(static_cast<char*>(std::malloc(std::max<uint64_t>(n, 1))));
  }
  if (!b.p) throw std::bad_alloc();
  return b;
}

void BufferPool::put(Buf b) {
  if (b.cap < kMinPooled) return;
  std::lock_guard<std::mutex> lk(mu_);
  while (held_ + b.cap > kMaxHeld && !free_.empty()) {  // drop the smallest first
    held_ -= free_.begin()->first;
    free_.erase(free_.begin());
  }
  if (held_ + b.cap > kMaxHeld) return;
  held_ += b.cap;
  free_.emplace(b.cap, std::move(b.p));
}

// ---- DownLog -----------------------------------------------------------------------------------

void DownLog::note(int peer) {
  std::lock_guard<std::mutex> lk(mu_);
  for (const Entry& e : down_)
    if (e.peer == peer) return;
  down_.push_back(Entry{peer, Clock::now()});
}

void DownLog::excuse(int peer) {
  std::lock_guard<std::mutex> lk(mu_);
  excused_.insert(peer);
}

const DownLog::Entry* DownLog::first_locked(int except) const {
  for (const Entry& e : down_)
    if (e.peer != except && !excused_.count(e.peer)) return &e;
  return nullptr;
}

int DownLog::first() const {
  std::lock_guard<std::mutex> lk(mu_);
  const Entry* e = first_locked(-1);
  return e ? e->peer : -1;
}

std::string DownLog::note_for(int peer) const {
  std::lock_guard<std::mutex> lk(mu_);
  if (excused_.count(peer)) return "";  // it said why
  const Entry* e = first_locked(peer);
  if (!e) return "";
  // Only a peer that went down before this one (or this one is not noted yet) came first.
  for (const Entry& x : down_) {
    if (&x == e) break;
    if (x.peer == peer) return "";
  }
  return fmt::format(
      "; rank {} went down first, {} earlier: rank {} probably failed because of it", e->peer,
      seconds_str(std::chrono::duration<double>(Clock::now() - e->at).count()), peer);
}

// ---- Mailbox -----------------------------------------------------------------------------------

Mailbox::Mailbox(int self, int src, BufferPool* pool, RecvCounters* counters, DownLog* down,
                 MailboxLimits limits)
    : self_(self), src_(src), pool_(pool), counters_(counters), down_log_(down), limits_(limits) {}

std::string Mailbox::check_chunk(const WireFrame& f, const Partials& partial) const {
  if (f.src != src_)
    return fmt::format("it claims to come from rank {} on rank {}'s stream", f.src, src_);
  const auto it = partial.find(MsgKey{f.h.channel, f.h.part});
  if (it == partial.end()) {
    if (f.offset != 0)
      return fmt::format("chunk at offset {} of {} whose start never arrived", f.offset,
                         describe(f.h));
    return "";
  }
  const Partial& p = it->second;
  if (f.h.op != p.h.op || f.h.bytes != p.h.bytes)
    return fmt::format("a chunk of {} says {}", describe(p.h), describe(f.h));
  if (f.offset != p.received)
    return fmt::format("chunk at offset {} of {}, expected offset {}", f.offset, describe(p.h),
                       p.received);
  return "";
}

std::shared_ptr<InMsg> Mailbox::new_msg_locked(const MsgHeader& h) {
  auto m = std::make_shared<InMsg>();
  m->h = h;
  m->buf = pool_->get(h.bytes);
  msgs_[MsgKey{h.channel, h.part}].push_back(m);
  ++buffered_;
  buffered_bytes_ += h.bytes;
  return m;
}

std::shared_ptr<Posted> Mailbox::claim_post_locked(const MsgKey& key, const MsgHeader& h,
                                                   bool can_reduce) {
  const auto q = msgs_.find(key);
  if (q != msgs_.end() && !q->second.empty()) return nullptr;  // earlier messages go first
  const auto post = posted_.find(key);
  if (post == posted_.end()) return nullptr;
  Posted& p = *post->second;
  if (p.taken || p.h.op != h.op || p.h.bytes != h.bytes || (p.reduce && !can_reduce))
    return nullptr;
  p.taken = true;
  if (counters_) ++counters_->direct;
  return post->second;
}

std::string Mailbox::over_limits_locked(const MsgHeader& h) const {
  if (buffered_ >= limits_.max_messages)
    return fmt::format(
        "{} would be message {} buffered ahead of this rank's receives, over the limit of {} "
        "(sequence numbers far ahead of this rank's: a forged or broken peer)",
        describe(h), limits_.max_messages + 1, limits_.max_messages);
  if (buffered_ > 0 && h.bytes > limits_.max_bytes - std::min(limits_.max_bytes, buffered_bytes_))
    return fmt::format(
        "{} would make {} bytes buffered ahead of this rank's receives, over the limit of {} (a "
        "forged or broken peer)",
        describe(h), buffered_bytes_ + h.bytes, limits_.max_bytes);
  if (limits_.window) {
    if (std::string why = limits_.window->check(h.channel); !why.empty())
      return fmt::format("{}: {}", describe(h), why);
  }
  return "";
}

Mailbox::Delivery Mailbox::deliver(Partials& partial, const WireFrame& f,
                                   const std::function<void(char*)>& copy, const ReduceFn* reduce) {
  const MsgKey key{f.h.channel, f.h.part};
  auto it = partial.find(key);
  if (it == partial.end()) {  // a new message: deliver directly if its recv is posted
    Partial p;
    p.h = f.h;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!aborted_.empty()) return Delivery{Delivery::kAborted, aborted_};
      p.post = claim_post_locked(key, f.h, reduce != nullptr);
      if (!p.post) {
        if (std::string why = over_limits_locked(f.h); !why.empty())
          return Delivery{Delivery::kOverflow, std::move(why)};
        p.msg = new_msg_locked(f.h);
        cv_.notify_all();  // a waiting recv may have to report a mismatch now
      }
    }
    it = partial.emplace(key, std::move(p)).first;
  }
  Partial& p = it->second;
  const bool complete = p.received + f.len == p.h.bytes;
  if (p.post && p.post->reduce &&
      (f.offset % sizeof(float) || (!complete && f.len % sizeof(float))))
    return Delivery{Delivery::kOverflow,
                    fmt::format("chunk at offset {} of {} bytes of {} is not float-aligned",
                                f.offset, f.len, describe(f.h))};
  {
    // Copies happen under the lock: recv may redirect the message into its own buffer or
    // abandon that buffer (timeout) at any moment, and must see whole chunks.
    std::lock_guard<std::mutex> lk(mu_);
    if (p.post) {
      if (!p.post->abandoned) {
        if (p.post->reduce)
          (*reduce)(reinterpret_cast<float*>(p.post->dest + f.offset), p.post->op);
        else
          copy(p.post->dest + f.offset);
      }
    } else if (p.msg->redirect) {
      if (!p.msg->redirect->abandoned) copy(p.msg->redirect->dest + f.offset);
    } else {
      copy(p.msg->buf.p.get() + f.offset);
      p.msg->complete = complete;
    }
    account_locked(key, p, f.len);
  }
  p.received += f.len;
  if (complete) partial.erase(it);
  return Delivery{};
}

void Mailbox::account_locked(const MsgKey& key, Partial& p, uint64_t len) {
  const bool complete = p.received + len == p.h.bytes;
  if (p.post && complete) {
    p.post->done = true;
    const auto post = posted_.find(key);
    if (post != posted_.end() && post->second == p.post) posted_.erase(post);
  } else if (p.msg && p.msg->redirect && complete) {
    p.msg->redirect->done = true;
    if (const auto q = msgs_.find(key); q != msgs_.end()) {
      const auto m = std::find(q->second.begin(), q->second.end(), p.msg);
      if (m != q->second.end()) {
        q->second.erase(m);
        --buffered_;
        buffered_bytes_ -= p.h.bytes;
      }
      if (q->second.empty()) msgs_.erase(q);
    }
  }
  if (p.msg) p.msg->received = p.received + len;
  if (complete) cv_.notify_all();
}

char* Mailbox::pin_direct(Partials& partial, const WireFrame& f, std::function<void()> interrupt) {
  const MsgKey key{f.h.channel, f.h.part};
  std::lock_guard<std::mutex> lk(mu_);
  if (!aborted_.empty()) return nullptr;  // deliver() says so
  auto it = partial.find(key);
  std::shared_ptr<Posted> target;
  if (it == partial.end()) {  // a new message: only straight into a posted plain recv
    Partial np;
    np.h = f.h;
    np.post = claim_post_locked(key, f.h, false);
    if (!np.post) return nullptr;
    it = partial.emplace(key, std::move(np)).first;
  }
  const Partial& p = it->second;
  if (p.post && !p.post->reduce)
    target = p.post;
  else if (p.msg && p.msg->redirect)
    target = p.msg->redirect;
  // An empty message (dest may be null) has nothing to read: deliver() takes it.
  if (!target || target->abandoned || f.len == 0) return nullptr;
  ++target->writers;
  target->interrupt = std::move(interrupt);
  if (counters_) ++counters_->chunks_read_direct;
  return target->dest + f.offset;
}

void Mailbox::unpin_direct(Partials& partial, const WireFrame& f, bool written) {
  const MsgKey key{f.h.channel, f.h.part};
  const auto it = partial.find(key);
  DT_CHECK(it != partial.end());
  Partial& p = it->second;
  {
    std::lock_guard<std::mutex> lk(mu_);
    Posted& target = p.post ? *p.post : *p.msg->redirect;
    DT_CHECK_GT(target.writers, 0);
    --target.writers;
    if (written) account_locked(key, p, f.len);
    cv_.notify_all();  // an abandoning recv may be waiting for the writer to leave
  }
  if (!written) return;
  p.received += f.len;
  if (p.received == p.h.bytes) partial.erase(it);
}

void Mailbox::deliver_whole(const MsgHeader& h, const void* data) {
  const MsgKey key{h.channel, h.part};
  std::lock_guard<std::mutex> lk(mu_);
  if (const std::shared_ptr<Posted> post = claim_post_locked(key, h, true)) {
    Posted& p = *post;
    if (p.reduce)
      reduce_into(reinterpret_cast<float*>(p.dest), static_cast<const float*>(data),
                  h.bytes / sizeof(float), p.op);
    else if (h.bytes)
      std::memcpy(p.dest, data, h.bytes);
    p.done = true;
    posted_.erase(key);
  } else {
    std::shared_ptr<InMsg> m = new_msg_locked(h);
    if (h.bytes) std::memcpy(m->buf.p.get(), data, h.bytes);
    m->received = h.bytes;
    m->complete = true;
  }
  cv_.notify_all();
}

namespace {

// Of the conflicting messages waiting on a channel, the one to name: the sender's first. Parts
// are kept in part-id order, in which a broadcast's hello (segment kBroadcastHello, which the
// sender sends before its data) comes last: when a root's hello and its first data segment are
// both there, the hello names the call as the sender made it ("(root 0)"), not a segment of it.
const MsgHeader* first_sent(const MsgHeader* found, const MsgHeader& got) {
  const bool hello =
      part_phase(got.part) == kBroadcastPhase && part_segment(got.part) == kBroadcastHello;
  return found == nullptr || hello ? &got : found;
}

}  // namespace

std::string Mailbox::mismatch_locked(const MsgHeader& h) const {
  // Any message from src on the same channel with another op means the ranks called different
  // collectives at this sequence number; the same key with another size, or a broadcast part
  // naming another root, is a mismatch too.
  const MsgHeader* found = nullptr;
  for (auto it = msgs_.lower_bound(MsgKey{h.channel, 0});
       it != msgs_.end() && it->first.channel == h.channel; ++it) {
    if (it->second.empty()) continue;
    const MsgHeader& got = it->second.front()->h;
    if (got.op != h.op || (it->first.part == h.part && got.bytes != h.bytes) ||
        parts_conflict(got, h))
      found = first_sent(found, got);
  }
  return found != nullptr ? mismatch_msg(src_, self_, *found, h) : "";
}

std::string Mailbox::mismatch_on_channel(const MsgHeader& h) {
  std::lock_guard<std::mutex> lk(mu_);
  const MsgHeader* found = nullptr;
  for (auto it = msgs_.lower_bound(MsgKey{h.channel, 0});
       it != msgs_.end() && it->first.channel == h.channel; ++it)
    if (!it->second.empty() &&
        (it->second.front()->h.op != h.op || parts_conflict(it->second.front()->h, h)))
      found = first_sent(found, it->second.front()->h);
  return found != nullptr ? mismatch_msg(src_, self_, *found, h) : "";
}

void Mailbox::redirect_locked(InMsg& front, std::shared_ptr<Posted>& post, const MsgHeader& h,
                              void* data) {
  const MsgKey key{h.channel, h.part};
  if (post) {
    const auto it = posted_.find(key);
    if (it != posted_.end() && it->second == post) posted_.erase(it);
  } else {
    post = std::make_shared<Posted>();
    post->h = h;
    post->dest = static_cast<char*>(data);
  }
  post->taken = true;
  front.redirect = post;
  if (counters_) ++counters_->redirected;
  if (front.received) std::memcpy(data, front.buf.p.get(), front.received);
  pool_->put(std::move(front.buf));
}

void Mailbox::recv(const MsgHeader& h, void* data, const Transport::Reduce* red, Deadline deadline,
                   RecvPump* pump) {
  const auto start = Clock::now();
  const MsgKey key{h.channel, h.part};
  if (limits_.window) limits_.window->note(h.channel);
  std::shared_ptr<Posted> post;
  std::unique_lock<std::mutex> lk(mu_, std::defer_lock);
  // On every exit but success: make sure no producer writes into data after we return.
  auto unpost_locked = [&] {
    if (!post) return;
    post->abandoned = true;
    const auto it = posted_.find(key);
    if (it != posted_.end() && it->second == post) posted_.erase(it);
    // A producer reading a chunk straight into data (pin_direct) may be blocked on a peer that
    // stalled: interrupt it (its connection ends) and wait until it has left data.
    if (post->writers > 0) {
      if (post->interrupt) post->interrupt();
      cv_.wait(lk, [&] { return post->writers == 0; });
    }
  };
  bool pumped_after_failure = false;
  for (;;) {
    if (pump) {
      try {
        pump->pump();
      } catch (...) {
        lk.lock();
        unpost_locked();
        throw;
      }
    }
    lk.lock();
    if (post && post->done) break;  // delivered straight into data
    std::string error;
    std::shared_ptr<InMsg> ready;
    if (!post || !post->taken) {
      error = mismatch_locked(h);
      const auto q = msgs_.find(key);
      if (!error.empty()) {
      } else if (q != msgs_.end() && !q->second.empty()) {
        InMsg& front = *q->second.front();
        if (front.complete) {
          ready = std::move(q->second.front());
          q->second.pop_front();
          --buffered_;
          buffered_bytes_ -= ready->h.bytes;
          if (q->second.empty()) msgs_.erase(q);
        } else if (!front.redirect && !red) {
          // Partly received: copy what is there and have the producer write the rest into
          // data (otherwise the whole message would be copied twice).
          redirect_locked(front, post, h, data);
          lk.unlock();
          continue;
        }
        // else: still arriving (a reduce waits for all of it), or redirected by a recv that
        // gave up: it disappears once its last chunk arrives.
      } else if (!post) {
        post = std::make_shared<Posted>();
        post->h = h;
        post->dest = static_cast<char*>(data);
        if (red) {
          post->reduce = true;
          post->op = *red;
        }
        DT_CHECK_MSG(posted_.emplace(key, post).second,
                     "two concurrent recvs of " << describe(h) << " from rank " << src_);
      }
    }
    if (!ready && error.empty()) {
      if (!aborted_.empty()) {
        error = aborted_;
      } else if (!failed_.empty()) {
        // A pumped source may still hold the peer's last messages: look once more.
        if (!pump || pumped_after_failure)
          error = failed_ + " (this rank was waiting for " + describe(h) + ")" +
                  (down_log_ ? down_log_->note_for(src_) : "");
        pumped_after_failure = true;
        if (error.empty()) {
          lk.unlock();
          continue;
        }
      } else if (deadline.passed(Clock::now())) {
        // The time waited, without the time this process was stopped (deadline.h).
        const auto paused = deadline.paused_since_set();
        const double s = std::chrono::duration<double>(deadline.at - start).count();
        error = fmt::format(
            "recv timed out after {} s waiting for {} from rank {} "
            "(distributed.timeout_s){}",
            seconds_str(std::max(s, 0.0)), describe(h), src_,
            paused > Clock::duration::zero()
                ? fmt::format(", not counting {} s this process was stopped",
                              seconds_str(std::chrono::duration<double>(paused).count()))
                : "");
      }
    }
    if (ready) {
      unpost_locked();
      lk.unlock();
      if (red)
        reduce_into(static_cast<float*>(data), reinterpret_cast<const float*>(ready->buf.p.get()),
                    h.bytes / sizeof(float), *red);
      else if (h.bytes)
        std::memcpy(data, ready->buf.p.get(), h.bytes);
      pool_->put(std::move(ready->buf));
      if (counters_) ++counters_->mailbox;
      return;
    }
    if (!error.empty()) {
      unpost_locked();
      throw CommError(error);
    }
    if (pump) {
      lk.unlock();
      pump->wait(deadline);
    } else {
      cv_.wait_until(lk, deadline.when());
      lk.unlock();
    }
  }
}

bool Mailbox::fail(const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!failed_.empty() || !aborted_.empty()) return false;
    failed_ = why;
    down_ = true;
    if (down_log_) down_log_->note(src_);
  }
  cv_.notify_all();
  return true;
}

void Mailbox::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    aborted_ = why;
    down_ = true;
  }
  cv_.notify_all();
}

std::string Mailbox::aborted_reason() const {
  std::lock_guard<std::mutex> lk(mu_);
  return aborted_;
}

std::string Mailbox::failed_reason() const {
  std::lock_guard<std::mutex> lk(mu_);
  return failed_;
}

void Mailbox::stream_opened() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++live_streams_;
    connected_ = true;
  }
  cv_.notify_all();
}

void Mailbox::stream_ended(const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (--live_streams_ > 0 || !failed_.empty()) return;
    failed_ = why;
    down_ = true;
    if (down_log_) down_log_->note(src_);
  }
  cv_.notify_all();
}

std::string Mailbox::wait_connected(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_until(lk, deadline, [&] { return connected_ || !failed_.empty() || !aborted_.empty(); });
  if (!aborted_.empty()) return aborted_;
  if (!failed_.empty()) return failed_;
  return connected_ ? "" : "timeout";
}

}  // namespace dtrain
