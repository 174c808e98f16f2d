#include "comm/grpc/shm_path.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "comm/grpc/common.h"

namespace dtrain::grpc_detail {
namespace {

// Each sender's ring in the receiver's segment, and the payload per record. 512 KiB records let
// the receiver start reducing while the sender still copies a 1 MiB segment; a 4 MiB ring holds
// a few collectives' segments in flight.
constexpr uint64_t kShmRingBytes = uint64_t{4} << 20;
constexpr uint64_t kShmChunkBytes = uint64_t{512} << 10;
// Before sleeping on a futex, a waiter polls this many rounds of ~64 pause instructions (a few
// microseconds each): a message that is about to arrive costs no system call. Kept short: the
// spinning thread takes a core from a compute thread.
constexpr int kShmSpinRounds = 16;
// A sleeping shared-memory waiter rechecks deadlines and failures at least this often.
constexpr auto kShmMaxSleep = std::chrono::milliseconds(50);

void cpu_relax() {
  for (int i = 0; i < 64; ++i) __builtin_ia32_pause();
}

}  // namespace

// A receiver drains src's ring itself, spins a little, then sleeps on this rank's bell.
class ShmPath::Pump final : public RecvPump {
 public:
  Pump(ShmPath& p, int src) : p_(p), src_(src) {}
  void pump() override {
    bell_ = p_.in_->bell();  // before looking: a later event changes it
    p_.drain(src_);
  }
  void wait(Deadline deadline) override {
    if (spins_++ < kShmSpinRounds) {
      cpu_relax();
      return;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::microseconds>(deadline.when() - Clock::now());
    p_.in_->wait_bell(bell_, std::clamp<std::chrono::microseconds>(
                                 left, std::chrono::microseconds(1), kShmMaxSleep));
  }

 private:
  ShmPath& p_;
  const int src_;
  uint32_t bell_ = 0;
  int spins_ = 0;
};

std::unique_ptr<ShmPath> ShmPath::create(Env env) {
  const int rank = env.rank;
  std::unique_ptr<ShmPath> p(new ShmPath(std::move(env)));
  try {
    p->in_ = ShmSegment::create(rank, p->env_.world, kShmRingBytes);
  } catch (const CommError& e) {
    spdlog::warn("rank {}: no shared-memory path, using gRPC streams only: {}", rank, e.what());
    return nullptr;
  }
  return p;
}

ShmPath::ShmPath(Env env) : env_(std::move(env)) {
  const int world = env_.world;
  out_.resize(world);
  src_.assign(world, 0);
  partial_.resize(world);
  for (int r = 0; r < world; ++r) {
    send_mu_.push_back(std::make_unique<std::mutex>());
    read_mu_.push_back(std::make_unique<std::mutex>());
  }
}

void ShmPath::attach(const std::vector<std::string>& names) {
  for (int r = 0; r < env_.world; ++r) {
    if (r == env_.rank || names[r].empty()) continue;
    std::string why;
    out_[r] = ShmSegment::open(names[r], r, env_.world, &why);
    if (out_[r] && !out_[r]->reserve_ring(env_.rank, &why)) {
      // (this host's /dev/shm is full: said, since the job runs slower for it)
      spdlog::warn("rank {}: no shared memory to rank {}, using its gRPC stream: {}", env_.rank, r,
                   why);
      out_[r].reset();
      continue;
    }
    if (out_[r])
      out_[r]->attach(env_.rank);
    else  // another host (the usual case) or no access: the stream carries the data
      spdlog::debug("rank {}: no shared memory to rank {}: {}", env_.rank, r, why);
  }
}

void ShmPath::fix_senders() {
  std::string srcs;
  for (int r = 0; r < env_.world; ++r) {
    src_[r] = r != env_.rank && in_->attached(r);
    if (src_[r]) srcs += fmt::format("{}{}", srcs.empty() ? "" : ", ", r);
  }
  in_->unlink();
  spdlog::debug("rank {}: shared memory from rank(s) [{}], to rank(s) [{}]", env_.rank, srcs,
                fmt::join(peers(), ", "));
}

std::vector<int> ShmPath::peers() const {
  std::vector<int> out;
  for (int r = 0; r < env_.world; ++r)
    if (out_[r]) out.push_back(r);
  return out;
}

void ShmPath::send(int dst, const MsgHeader& h, const void* data) {
  ShmSegment& seg = *out_[dst];
  Mailbox& peer = env_.mailbox(dst);
  const int self = env_.rank;
  // A dead or closed peer is known from its stream to us: fail like a stream send would.
  auto check_peer = [&] {
    if (!peer.down()) return;
    if (std::string a = peer.aborted_reason(); !a.empty()) throw CommError(a);
    throw CommError(
        fmt::format("cannot send {} to rank {}: {}", describe(h), dst, peer.failed_reason()));
  };
  check_peer();
  std::lock_guard<std::mutex> lk(*send_mu_[dst]);
  const uint64_t chunk = std::min<uint64_t>(kShmChunkBytes, seg.max_payload());
  uint64_t off = 0;
  do {
    ShmRecord rec;
    rec.op = static_cast<uint32_t>(h.op);
    rec.channel = h.channel;
    rec.part = h.part;
    rec.total = h.bytes;
    rec.offset = off;
    rec.len = std::min<uint64_t>(chunk, h.bytes - off);
    for (int spins = 0;;) {
      const uint32_t seen = seg.space_bell(self);
      if (seg.try_write(self, rec, static_cast<const char*>(data) + off)) break;
      // The ring is full until dst drains it. Meanwhile keep our own rings moving, so that
      // ranks that all send before they receive cannot wait on each other.
      check_peer();
      for (int s = 0; s < env_.world; ++s)
        if (src_[s]) drain(s);
      if (spins++ < kShmSpinRounds)
        cpu_relax();
      else
        seg.wait_space(self, seen, std::chrono::milliseconds(1));
    }
    seg.ring_owner();
    off += rec.len;
  } while (off < h.bytes);
}

void ShmPath::drain(int src) {
  std::unique_lock<std::mutex> rl(*read_mu_[src], std::try_to_lock);
  if (!rl.owns_lock()) return;  // another thread drains; it rings the bell when done
  Mailbox& box = env_.mailbox(src);
  bool any = false;
  for (;;) {
    ShmRecord rec;
    const char* payload = nullptr;
    std::string err;
    if (!in_->peek(src, &rec, &payload, &err)) {
      if (err.empty()) break;
      throw CommError(env_.malformed(src, err));
    }
    WireFrame f;
    f.src = src;
    f.op_raw = rec.op;
    f.h = MsgHeader{rec.channel, rec.part, static_cast<CommOp>(rec.op), rec.total};
    f.offset = rec.offset;
    f.len = rec.len;
    try {
      check_frame_fields(f);
    } catch (const WireError& e) {
      throw CommError(env_.malformed(src, e.what()));
    }
    if (std::string e = box.check_chunk(f, partial_[src]); !e.empty())
      throw CommError(env_.malformed(src, e));
    const Mailbox::ReduceFn reduce = [&](float* dst, Transport::Reduce op) {
      reduce_into(dst, reinterpret_cast<const float*>(payload), f.len / sizeof(float), op);
    };
    const Mailbox::Delivery d = box.deliver(
        partial_[src], f,
        [&](char* dst) {
          if (f.len) std::memcpy(dst, payload, f.len);
        },
        &reduce);
    if (d.kind == Mailbox::Delivery::kOverflow) throw CommError(env_.malformed(src, d.why));
    in_->pop(src, rec);
    any = true;
    if (d.kind == Mailbox::Delivery::kAborted) break;  // recv reports it
  }
  rl.unlock();
  if (any) ring_waiters();  // what we delivered may be what another thread waits for
}

void ShmPath::recv(int src, const MsgHeader& h, void* data, const Transport::Reduce* red,
                   Deadline deadline) {
  Pump pump(*this, src);
  env_.mailbox(src).recv(h, data, red, deadline, &pump);
}

void ShmPath::flush(int src) {
  if (!src_[src]) return;
  try {
    drain(src);  // its last messages may still be in the ring
  } catch (const CommError&) {
  }
}

}  // namespace dtrain::grpc_detail
