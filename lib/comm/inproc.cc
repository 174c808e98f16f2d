#include "comm/inproc.h"

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "util/check.h"

namespace dtrain {

namespace {

struct Key {
  int src;
  uint64_t channel;
  uint64_t part;
  bool operator<(const Key& o) const {
    return std::tie(src, channel, part) < std::tie(o.src, o.channel, o.part);
  }
};

struct Message {
  CommOp op;
  size_t bytes = 0;
  std::vector<char> payload;  // size >= bytes (pooled buffer)
};

struct Mailbox {
  std::mutex mu;
  std::condition_variable cv;
  std::map<Key, Message> messages;
};

// Shared by all ranks of one group.
struct Hub {
  explicit Hub(int world)
      : boxes(static_cast<size_t>(world)), positions(static_cast<size_t>(world)) {}
  std::vector<Mailbox> boxes;
  std::mutex fail_mu;
  std::atomic<bool> failed{false};
  std::string reason;
  // Recycled payload buffers: fresh large allocations fault in new pages on every message, which
  // costs more than the copy itself.
  std::mutex pool_mu;
  std::vector<std::vector<char>> pool;
  // Every rank's position for the desync report: ranks are threads, so no heartbeats are
  // needed (they cannot freeze separately) and every rank reads the others' directly.
  std::mutex pos_mu;
  std::vector<RankPosition> positions;

  std::vector<char> get_buffer(size_t bytes) {
    {
      std::lock_guard<std::mutex> lk(pool_mu);
      for (size_t i = 0; i < pool.size(); ++i) {
        if (pool[i].size() >= bytes) {
          std::vector<char> b = std::move(pool[i]);
          pool[i] = std::move(pool.back());
          pool.pop_back();
          return b;
        }
      }
    }
    return std::vector<char>(bytes);
  }
  void put_buffer(std::vector<char>&& b) {
    if (b.empty()) return;
    std::lock_guard<std::mutex> lk(pool_mu);
    if (pool.size() < 64) pool.push_back(std::move(b));
  }

  void fail(const std::string& why) {
    {
      std::lock_guard<std::mutex> lk(fail_mu);
      if (failed.load()) return;
      reason = why;
      failed.store(true);
    }
    for (auto& b : boxes) {
      std::lock_guard<std::mutex> lk(b.mu);
      b.cv.notify_all();
    }
  }
  std::string why() {
    std::lock_guard<std::mutex> lk(fail_mu);
    return reason;
  }
};

class InprocTransport final : public Transport {
 public:
  InprocTransport(std::shared_ptr<Hub> hub, int rank, int world)
      : hub_(std::move(hub)), rank_(rank), world_(world) {}

  int rank() const override { return rank_; }
  int size() const override { return world_; }
  std::string backend() const override { return "inproc"; }

  void send(int dst, const MsgHeader& h, const void* data) override {
    DT_CHECK(dst >= 0 && dst < world_);
    if (hub_->failed.load()) throw CommError(hub_->why());
    Message m{h.op, h.bytes, hub_->get_buffer(h.bytes)};
    if (h.bytes) std::memcpy(m.payload.data(), data, h.bytes);
    Mailbox& box = hub_->boxes[static_cast<size_t>(dst)];
    {
      std::lock_guard<std::mutex> lk(box.mu);
      const bool fresh = box.messages.emplace(Key{rank_, h.channel, h.part}, std::move(m)).second;
      DT_CHECK_MSG(fresh,
                   "rank " << rank_ << " sent " << describe(h) << " to rank " << dst << " twice");
    }
    box.cv.notify_all();
    bytes_sent_ += h.bytes;
  }

  void recv(int src, const MsgHeader& h, void* data, Deadline deadline) override {
    Message m = take(src, h, deadline);
    if (h.bytes) std::memcpy(data, m.payload.data(), h.bytes);
    hub_->put_buffer(std::move(m.payload));
  }

  void recv_reduce(int src, const MsgHeader& h, float* data, Reduce r, Deadline deadline) override {
    Message m = take(src, h, deadline);
    reduce_into(data, reinterpret_cast<const float*>(m.payload.data()), h.bytes / sizeof(float), r);
    hub_->put_buffer(std::move(m.payload));
  }

  void abort(const std::string& why) override { hub_->fail(why); }

  void publish_position(const CommPosition& p) override {
    Transport::publish_position(p);
    std::lock_guard<std::mutex> lk(hub_->pos_mu);
    RankPosition& mine = hub_->positions[static_cast<size_t>(rank_)];
    mine.known = true;
    mine.pos = p;
  }
  std::vector<RankPosition> positions() const override {
    std::vector<RankPosition> out;
    {
      std::lock_guard<std::mutex> lk(hub_->pos_mu);
      out = hub_->positions;
    }
    const auto now = std::chrono::steady_clock::now();
    for (RankPosition& p : out) p.heard = now;  // shared memory: always current
    out[static_cast<size_t>(rank_)].known = true;
    return out;
  }

 private:
  Message take(int src, const MsgHeader& h, Deadline deadline) {
    DT_CHECK(src >= 0 && src < world_);
    Mailbox& box = hub_->boxes[static_cast<size_t>(rank_)];
    std::unique_lock<std::mutex> lk(box.mu);
    const Key key{src, h.channel, h.part};
    for (;;) {
      if (hub_->failed.load()) throw CommError(hub_->why());
      auto it = box.messages.find(key);
      if (it != box.messages.end()) {
        Message m = std::move(it->second);
        box.messages.erase(it);
        lk.unlock();
        if (m.op != h.op || m.bytes != h.bytes) {
          MsgHeader got = h;
          got.op = m.op;
          got.bytes = m.bytes;
          throw CommError("mismatched calls: rank " + std::to_string(src) + " sent " +
                          describe(got) + ", rank " + std::to_string(rank_) + " expected " +
                          describe(h));
        }
        bytes_recv_ += h.bytes;
        return m;
      }
      // A message of the same collective (same sender and channel) with another op means the
      // ranks called different collectives at this sequence number: fail now, not at the deadline.
      auto same = box.messages.lower_bound(Key{src, h.channel, 0});
      if (same != box.messages.end() && same->first.src == src &&
          same->first.channel == h.channel && same->second.op != h.op) {
        MsgHeader got = h;
        got.op = same->second.op;
        got.part = same->first.part;
        got.bytes = same->second.bytes;
        throw CommError("mismatched calls: rank " + std::to_string(src) + " sent " + describe(got) +
                        ", rank " + std::to_string(rank_) + " expected " + describe(h));
      }
      if (box.cv.wait_until(lk, deadline) == std::cv_status::timeout &&
          box.messages.find(key) == box.messages.end() && !hub_->failed.load()) {
        throw CommError("timed out waiting for " + describe(h) + " from rank " +
                        std::to_string(src));
      }
    }
  }

  std::shared_ptr<Hub> hub_;
  int rank_, world_;
};

}  // namespace

std::vector<std::unique_ptr<Transport>> make_inproc_group(int world) {
  DT_CHECK_GE(world, 1);
  auto hub = std::make_shared<Hub>(world);
  std::vector<std::unique_ptr<Transport>> out;
  for (int r = 0; r < world; ++r) out.push_back(std::make_unique<InprocTransport>(hub, r, world));
  return out;
}

}  // namespace dtrain
