#include "comm/transport.h"

#include <algorithm>
#include <sstream>

#include "util/check.h"

namespace dtrain {

namespace {
const char* base_op_name(CommOp op) {
  switch (op) {
    case CommOp::kAllReduce:
      return "allreduce";
    case CommOp::kReduceScatter:
      return "reduce_scatter";
    case CommOp::kAllGather:
      return "allgather";
    case CommOp::kBroadcast:
      return "broadcast";
    case CommOp::kBarrier:
      return "barrier";
    case CommOp::kSendRecv:
      return "send/recv";
    case CommOp::kAllGatherV:
      return "allgatherv";
  }
  return "unknown-op";
}
}  // namespace

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "float32";
    case DType::kI64:
      return "int64";
    case DType::kBytes:
      return "bytes";
  }
  return "unknown-dtype";
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return sizeof(float);
    case DType::kI64:
      return sizeof(int64_t);
    case DType::kBytes:
      return 1;
  }
  DT_CHECK_MSG(false, "unknown dtype " << static_cast<uint32_t>(t));
  return 1;
}

bool valid_op(uint32_t raw) {
  const uint32_t op = raw & 0xffu, t = raw >> 8;
  return op >= static_cast<uint32_t>(CommOp::kAllReduce) &&
         op <= static_cast<uint32_t>(CommOp::kAllGatherV) && t <= static_cast<uint32_t>(kLastDType);
}

std::string comm_op_name(CommOp op) {
  const DType t = op_dtype(op);
  if (t == DType::kF32) return base_op_name(base_op(op));
  return std::string(dtype_name(t)) + " " + base_op_name(base_op(op));
}

const char* count_unit(CommOp op) {
  switch (op_dtype(op)) {
    case DType::kF32:
      return "floats";
    case DType::kI64:
      return "int64s";
    case DType::kBytes:
      return "bytes";
  }
  return "elements";
}

bool parts_conflict(const MsgHeader& got, const MsgHeader& want) {
  return !(want.channel & kP2PBit) && got.channel == want.channel && got.op == want.op &&
         base_op(want.op) == CommOp::kBroadcast && part_phase(got.part) == kBroadcastPhase &&
         part_phase(want.part) == kBroadcastPhase && part_step(got.part) != part_step(want.part);
}

std::string describe(const MsgHeader& h) {
  std::ostringstream os;
  if (h.channel & kP2PBit)
    os << comm_op_name(h.op) << " tag " << (h.channel & ~kP2PBit) << " message " << h.part;
  else
    // Collective part ids are (phase << 56) | (step << 32) | segment (collectives.cc).
    // (a subgroup's channel carries its tag above the sequence number: named apart)
    os << comm_op_name(h.op) << " seq " << (h.channel & ((uint64_t{1} << kChannelGroupShift) - 1))
       << ((h.channel >> kChannelGroupShift) != 0
               ? " of group " + std::to_string((h.channel >> kChannelGroupShift) - 1)
               : std::string())
       << (part_phase(h.part) == kBroadcastPhase && base_op(h.op) == CommOp::kBroadcast
               ? " (root " + std::to_string(part_step(h.part))
               : " (phase " + std::to_string(part_phase(h.part)) + ", step " +
                     std::to_string(part_step(h.part)))
       << (part_segment(h.part) == kBroadcastHello
               ? std::string(")")
               : ", segment " + std::to_string(part_segment(h.part)) + ")");
  os << " (" << h.bytes << " bytes)";
  return os.str();
}

void reduce_into(float* dst, const float* src, size_t n, Transport::Reduce r) {
  switch (r) {
    case Transport::Reduce::kSum:
      for (size_t i = 0; i < n; ++i) dst[i] += src[i];
      break;
    case Transport::Reduce::kProd:
      for (size_t i = 0; i < n; ++i) dst[i] *= src[i];
      break;
    case Transport::Reduce::kMin:
      for (size_t i = 0; i < n; ++i) dst[i] = std::min(dst[i], src[i]);
      break;
    case Transport::Reduce::kMax:
      for (size_t i = 0; i < n; ++i) dst[i] = std::max(dst[i], src[i]);
      break;
  }
}

void Transport::recv_reduce(int src, const MsgHeader& h, float* data, Reduce r, Deadline deadline) {
  DT_CHECK_EQ(h.bytes % sizeof(float), 0u);
  // One scratch buffer per thread: recv_reduce may run concurrently on several threads.
  thread_local std::vector<float> scratch;
  const size_t n = h.bytes / sizeof(float);
  if (scratch.size() < n) scratch.resize(n);
  recv(src, h, scratch.data(), deadline);
  reduce_into(data, scratch.data(), n, r);
}

namespace {

// A send that completed before its handle was made.
class DoneSend final : public PendingSend {
 public:
  void wait() override {}
};

}  // namespace

std::unique_ptr<PendingSend> Transport::send_start(int dst, const MsgHeader& h, const void* data) {
  send(dst, h, data);
  return std::make_unique<DoneSend>();
}

void Transport::send_recv(int dst, const MsgHeader& sh, const void* sdata, int src,
                          const MsgHeader& rh, void* rdata, const Reduce* red, Deadline deadline) {
  send(dst, sh, sdata);
  if (red)
    recv_reduce(src, rh, static_cast<float*>(rdata), *red, deadline);
  else
    recv(src, rh, rdata, deadline);
}

}  // namespace dtrain
