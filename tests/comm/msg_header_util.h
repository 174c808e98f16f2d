// A MsgHeader in one expression, for the transport suites.
#pragma once

#include <cstdint>

#include "comm/transport.h"

namespace dtrain::testing {

inline MsgHeader header(uint64_t channel, uint64_t part, CommOp op, uint64_t bytes) {
  MsgHeader h;
  h.channel = channel;
  h.part = part;
  h.op = op;
  h.bytes = bytes;
  return h;
}

}  // namespace dtrain::testing
