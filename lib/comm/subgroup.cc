#include "comm/subgroup.h"

#include <algorithm>
#include <memory>

#include "util/check.h"

namespace dtrain {

namespace {

constexpr int kGroupShift = kChannelGroupShift;  // transport.h

class SubgroupTransport final : public Transport {
 public:
  SubgroupTransport(Transport& parent, std::vector<int> members, uint32_t group_id)
      : parent_(parent), members_(std::move(members)), tag_(uint64_t{group_id + 1} << kGroupShift) {
    DT_CHECK_LT(group_id, 1u << 20);
    DT_CHECK(std::is_sorted(members_.begin(), members_.end()));
    auto it = std::find(members_.begin(), members_.end(), parent.rank());
    DT_CHECK_MSG(it != members_.end(), "rank " << parent.rank() << " is not in its group");
    rank_ = static_cast<int>(it - members_.begin());
  }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  std::string backend() const override { return parent_.backend(); }

  void send(int dst, const MsgHeader& h, const void* data) override {
    parent_.send(world(dst), tagged(h), data);
    bytes_sent_.fetch_add(h.bytes, std::memory_order_relaxed);
  }
  void recv(int src, const MsgHeader& h, void* data, Deadline deadline) override {
    parent_.recv(world(src), tagged(h), data, deadline);
    bytes_recv_.fetch_add(h.bytes, std::memory_order_relaxed);
  }
  void recv_reduce(int src, const MsgHeader& h, float* data, Reduce r, Deadline deadline) override {
    parent_.recv_reduce(world(src), tagged(h), data, r, deadline);
    bytes_recv_.fetch_add(h.bytes, std::memory_order_relaxed);
  }
  void send_recv(int dst, const MsgHeader& sh, const void* sdata, int src, const MsgHeader& rh,
                 void* rdata, const Reduce* red, Deadline deadline) override {
    parent_.send_recv(world(dst), tagged(sh), sdata, world(src), tagged(rh), rdata, red, deadline);
    bytes_sent_.fetch_add(sh.bytes, std::memory_order_relaxed);
    bytes_recv_.fetch_add(rh.bytes, std::memory_order_relaxed);
  }
  // Forwarded, so a group's pipelined ring keeps the parent's asynchronous sends (a gRPC
  // stream's) instead of the default's synchronous one.
  std::unique_ptr<PendingSend> send_start(int dst, const MsgHeader& h, const void* data) override {
    auto pending = parent_.send_start(world(dst), tagged(h), data);
    bytes_sent_.fetch_add(h.bytes, std::memory_order_relaxed);
    return pending;
  }
  void abort(const std::string& why) override { parent_.abort(why); }

 private:
  int world(int r) const {
    DT_CHECK_GE(r, 0);
    DT_CHECK_LT(r, size());
    return members_[static_cast<size_t>(r)];
  }
  MsgHeader tagged(MsgHeader h) const {
    DT_CHECK_LT(h.channel & ~kP2PBit, uint64_t{1} << kGroupShift);
    h.channel |= tag_;
    return h;
  }
  Transport& parent_;
  std::vector<int> members_;
  uint64_t tag_;
  int rank_ = 0;
};

}  // namespace

std::unique_ptr<Transport> make_subgroup_transport(Transport& parent, std::vector<int> members,
                                                   uint32_t group_id) {
  return std::make_unique<SubgroupTransport>(parent, std::move(members), group_id);
}

}  // namespace dtrain
