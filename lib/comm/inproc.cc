#include "comm/inproc.h"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "comm/mailbox.h"
#include "util/check.h"

namespace dtrain {

namespace {

// Shared by all ranks of one group.
struct Hub {
  explicit Hub(int world)
      : world(world), rows(static_cast<size_t>(world)), positions(static_cast<size_t>(world)) {}

  // The mailboxes of one receiving rank, one per sender, made on first use: a job of 1024
  // in-process ranks must not allocate a million of them up front.
  struct Row {
    std::mutex mu;
    std::vector<std::unique_ptr<Mailbox>> from;
  };

  const int world;
  std::vector<Row> rows;
  std::mutex fail_mu;
  std::atomic<bool> failed{false};
  std::string reason;
  BufferPool pool;
  // Every rank's position for the desync report: ranks are threads, so no heartbeats are
  // needed (they cannot freeze separately) and every rank reads the others' directly.
  std::mutex pos_mu;
  std::vector<RankPosition> positions;

  // What `dst` receives from `src`.
  Mailbox& box(int dst, int src) {
    Row& row = rows[static_cast<size_t>(dst)];
    std::lock_guard<std::mutex> lk(row.mu);
    if (row.from.empty()) row.from.resize(static_cast<size_t>(world));
    auto& b = row.from[static_cast<size_t>(src)];
    if (!b) {
      // Senders are threads of this process: nothing to bound against.
      b = std::make_unique<Mailbox>(dst, src, &pool, nullptr, nullptr, MailboxLimits{});
      if (failed.load()) b->abort(why());
    }
    return *b;
  }

  void fail(const std::string& why) {
    {
      std::lock_guard<std::mutex> lk(fail_mu);
      if (failed.load()) return;
      reason = why;
      failed.store(true);
    }
    for (Row& row : rows) {
      std::lock_guard<std::mutex> lk(row.mu);
      for (auto& b : row.from)
        if (b) b->abort(why);
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
    hub_->box(dst, rank_).deliver_whole(h, data);
    bytes_sent_ += h.bytes;
  }

  void recv(int src, const MsgHeader& h, void* data, Deadline deadline) override {
    DT_CHECK(src >= 0 && src < world_);
    hub_->box(rank_, src).recv(h, data, nullptr, deadline);
    bytes_recv_ += h.bytes;
  }

  void recv_reduce(int src, const MsgHeader& h, float* data, Reduce r, Deadline deadline) override {
    DT_CHECK(src >= 0 && src < world_);
    DT_CHECK_EQ(h.bytes % sizeof(float), 0u);
    hub_->box(rank_, src).recv(h, data, &r, deadline);
    bytes_recv_ += h.bytes;
  }

  void abort(const std::string& why) override { hub_->fail(why); }

  void publish_position(const CommPosition& p) override {
    Transport::publish_position(p);
    std::lock_guard<std::mutex> lk(hub_->pos_mu);
    RankPosition& mine = hub_->positions[static_cast<size_t>(rank_)];
    mine.known = true;
    mine.pos = own_position();  // (with its activity)
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
