// Gradient compression for data-parallel training (distributed.compression). Each rank encodes
// its gradient (plus the error-feedback residual) into a compact byte message; the messages of
// all ranks are all-gathered (as opaque bytes: the collective copies bits, never adds them) and
// every rank decodes and sums them in rank order, so all ranks obtain bitwise the same result.
// With error feedback, what compression dropped this step is added to the next step's gradient.
//
// Bytes on the wire per rank for n gradient floats and W ranks: (W-1) x message, where message
// = 2n (fp16, bf16), n + 4 ceil(n/256) (int8 with one float scale per 256 values) or 8k (topk:
// k = ceil(ratio n) index/value pairs). Against the ring all-reduce's 8n (W-1)/W bytes that is,
// for W = 2, a half, about a quarter, and 2 ratio (1/50 at ratio 0.01); the all-gather grows with
// W, so the saving shrinks for larger groups (a compressed reduce-scatter is future work).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"

namespace dtrain {

class GradCompressor {
 public:
  GradCompressor(const CompressionConfig& cfg, int64_t n);

  // Replaces grad[0, n) by the sum over ranks of every rank's decoded compressed gradient.
  // Collective: every rank calls it with the same n, in the same order.
  void allreduce_sum(Communicator& comm, float* grad);

  // Encoded message size in bytes (a multiple of 4).
  size_t message_bytes() const { return msg_bytes_; }

  // Exposed for tests: encode v[0, n) into msg (message_bytes()), and add the decoding of msg
  // into out[0, n).
  void encode(const float* v, uint8_t* msg) const;
  void decode_add(const uint8_t* msg, float* out) const;

 private:
  CompressionConfig cfg_;
  int64_t n_ = 0, k_ = 0;
  size_t msg_bytes_ = 0;
  std::vector<float> residual_, work_, mine_decoded_;
  std::vector<float> gathered_;  // W messages as floats (bit patterns)
  mutable std::vector<int64_t> order_;
};

}  // namespace dtrain
