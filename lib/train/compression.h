// Gradient compression for data-parallel training (distributed.compression). Every compressor
// replaces the flat gradient by the sum over ranks of what each rank's compressed gradient
// decodes to, bitwise the same on every rank; with error feedback, what compression dropped this
// step is added to the next step's gradient (so over many steps nothing is lost). At world size
// 1 the reducer still runs (encode, decode, error feedback; nothing is sent), so one process
// shows what compression costs in accuracy. The state a reducer carries between steps
// (export_state) goes into checkpoints: train/compression_state.h.
//
// GradCompressor (fp16, bf16, int8, topk): each rank encodes its gradient (plus the residual)
// into a compact byte message; the messages of all ranks are all-gathered (as opaque bytes: the
// collective copies bits, never adds them) and every rank decodes and sums them in rank order.
// Bytes on the wire per rank for n gradient floats and W ranks: (W-1) x message, where message
// = 2n (fp16, bf16), n + 4 ceil(n/256) (int8 with one float scale per 256 values) or 8k (topk:
// k = ceil(ratio n) index/value pairs). Against the ring all-reduce's 8n (W-1)/W bytes that is,
// for W = 2, a half, about a quarter, and 2 ratio (1/50 at ratio 0.01); the all-gather grows with
// W, so the saving shrinks for larger groups (a compressed reduce-scatter is future work).
//
// PowerSgd (Vogels et al. 2019, PyTorch's powerSGD_hook): each weight of 2 or more dimensions,
// the matrix M (n x m) of its first dimension by the rest (a conv2d weight [O, I, kh, kw] is
// O x I*kh*kw, the hook's view), is sent as
// rank-r factors P (n x r) and Q (m x r). The factors are linear in M, so they are all-reduced
// (ring, sums): P = M Q_prev summed over ranks and orthonormalised, Q = M^T P summed, result
// P Q^T. Tensors where that does not pay (1-D biases, r (n + m) >= n m) are all-reduced exact.
// Bytes on the wire per rank: 8 (W-1)/W x (r (sum n + sum m) + d) with d the uncompressed floats,
// against 8 (W-1)/W x (sum n m + d) for DDP; unlike the all-gather types the ratio does not
// depend on W. (784-512-512-10 MLP, r = 4: 12,402 floats instead of 669,706, 54x fewer.)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "nn/model.h"
#include "util/rng.h"

namespace dtrain {

// What the trainer calls after backward instead of the bucketed all-reduce.
class GradReducer {
 public:
  virtual ~GradReducer() = default;
  // Replaces grad[0, n) by the sum over ranks of every rank's decoded compressed gradient (the
  // trainer scales gradients by the global sample count, so the sum is the global mean loss's
  // gradient). Collective: every rank calls it with the same n, in the same order.
  virtual void allreduce_sum(Communicator& comm, float* grad) = 0;
  // One line for the log: what one step sends among `world` ranks, against DDP's all-reduce.
  virtual std::string describe(int world) const = 0;

  // What a reducer carries from one step to the next, for checkpoints (a resumed run continues
  // bitwise where the saved one stopped only with it). residual: this rank's error-feedback
  // residual (per rank; empty without error feedback). q: PowerSGD's warm start, every Q^T
  // (global: bitwise the same on every rank). rng: PowerSGD's replacement-direction RNG state
  // (global; "" for the others).
  struct State {
    std::vector<float> residual, q;
    std::string rng;
  };
  // The current state; export_state() of a fresh reducer gives the sizes import_state() takes.
  virtual State export_state() const = 0;
  // Replaces the parts of the state that `s` holds: an empty residual or q (or rng "") keeps
  // this reducer's own; a non-empty one must have exactly export_state()'s size (DT_CHECK).
  virtual void import_state(const State& s) = 0;
};

// cfg.type powersgd gives a PowerSgd over the model's parameters of 2 or more dimensions, any
// other a GradCompressor;
// seed (the run seed) draws PowerSGD's initial Q, identical on every rank.
std::unique_ptr<GradReducer> make_grad_reducer(const CompressionConfig& cfg,
                                               const std::vector<ParamEntry>& params, int64_t n,
                                               uint64_t seed);

// topk's kept values of n, and the bytes of one encoded message of n values (a multiple of 4)
// for fp16, bf16, int8 and topk: what GradCompressor sends, and the memory check counts.
int64_t topk_count(const CompressionConfig& cfg, int64_t n);
size_t compressed_message_bytes(const CompressionConfig& cfg, int64_t n);

class GradCompressor : public GradReducer {
 public:
  GradCompressor(const CompressionConfig& cfg, int64_t n);

  void allreduce_sum(Communicator& comm, float* grad) override;
  std::string describe(int world) const override;
  State export_state() const override;
  void import_state(const State& s) override;

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

class PowerSgd : public GradReducer {
 public:
  // params: the model's parameter table over a flat gradient of n floats; cfg.rank >= 1.
  PowerSgd(const CompressionConfig& cfg, const std::vector<ParamEntry>& params, int64_t n,
           uint64_t seed);

  // residual (error feedback) of each compressed M is this rank's M minus this rank's share of
  // the approximation, P (M^T P)^T, so the residuals of all ranks add up to exactly what the
  // step did not deliver (as PyTorch's M - mean approximation does, without mixing the other
  // ranks' gradients into this rank's residual).
  void allreduce_sum(Communicator& comm, float* grad) override;
  std::string describe(int world) const override;
  State export_state() const override;
  void import_state(const State& s) override;

  struct Matrix {
    int64_t offset = 0, rows = 0, cols = 0;  // M = grad[offset, offset + rows * cols), row-major
    int64_t p_offset = 0, q_offset = 0;      // its P^T (r x rows) and Q^T (r x cols) in p_, q_
    int64_t res_offset = 0;                  // its residual (rows x cols) in residual_
  };
  const std::vector<Matrix>& matrices() const { return mats_; }         // the compressed ones
  int64_t p_floats() const { return static_cast<int64_t>(p_.size()); }  // P's + dense floats
  int64_t q_floats() const { return static_cast<int64_t>(q_.size()); }
  int64_t dense_floats() const { return dense_total_; }
  // Sum of squares of the error-feedback residual (0 without error feedback).
  double residual_sq() const;

 private:
  void orthonormalise_rows(float* pt, int64_t rows, int64_t len);

  CompressionConfig cfg_;
  int64_t n_ = 0, r_ = 0, dense_total_ = 0;
  std::vector<Matrix> mats_;
  std::vector<std::pair<int64_t, int64_t>> dense_;  // [begin, end) ranges sent uncompressed
  // p_: every matrix's P^T, then the dense ranges (one all-reduce); q_: every Q^T (another).
  // q_ persists: the next step starts its power iteration from it (warm start).
  std::vector<float> p_, q_, residual_;
  Rng rng_;  // replacement directions for rank-deficient P; same draws on every rank
};

}  // namespace dtrain
