#include "comm/transport.h"

#include <algorithm>
#include <sstream>

#include "util/check.h"

namespace dtrain {

const char* comm_op_name(CommOp op) {
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

std::string describe(const MsgHeader& h) {
  std::ostringstream os;
  if (h.channel & kP2PBit)
    os << comm_op_name(h.op) << " tag " << (h.channel & ~kP2PBit) << " message " << h.part;
  else
    // Collective part ids are (phase << 56) | (step << 32) | segment (collectives.cc).
    os << comm_op_name(h.op) << " seq " << h.channel << " (phase " << (h.part >> 56) << ", step "
       << ((h.part >> 32) & 0xffffff) << ", segment " << (h.part & 0xffffffff) << ")";
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

}  // namespace dtrain
