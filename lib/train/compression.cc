#include "train/compression.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "tensor/blas.h"
#include "util/check.h"

namespace dtrain {

namespace {

constexpr int64_t kInt8Block = 256;  // values per int8 scale

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

size_t round4(size_t b) {
  return (b + 3) / 4 * 4;
}

}  // namespace

int64_t topk_count(const CompressionConfig& cfg, int64_t n) {
  return std::min<int64_t>(n, static_cast<int64_t>(std::ceil(cfg.ratio * static_cast<double>(n))));
}

size_t compressed_message_bytes(const CompressionConfig& cfg, int64_t n) {
  DT_CHECK_GE(n, 0);
  if (cfg.type == CompressionType::kFp16 || cfg.type == CompressionType::kBf16)
    return round4(static_cast<size_t>(n) * 2);
  if (cfg.type == CompressionType::kInt8) {
    const int64_t blocks = (n + kInt8Block - 1) / kInt8Block;
    return static_cast<size_t>(blocks) * 4 + round4(static_cast<size_t>(n));
  }
  DT_CHECK_MSG(cfg.type == CompressionType::kTopk,
               "unknown compression type " << to_string(cfg.type));
  return static_cast<size_t>(topk_count(cfg, n)) * 8;  // (index and value)
}

GradCompressor::GradCompressor(const CompressionConfig& cfg, int64_t n)
    : cfg_(cfg), n_(n), msg_bytes_(compressed_message_bytes(cfg, n)) {
  if (cfg.type == CompressionType::kTopk) k_ = topk_count(cfg, n);
  if (cfg.error_feedback) residual_.assign(static_cast<size_t>(n), 0.0f);
  work_.resize(static_cast<size_t>(n));
  mine_decoded_.resize(static_cast<size_t>(n));
}

void GradCompressor::encode(const float* v, uint8_t* msg) const {
  std::memset(msg, 0, msg_bytes_);
  if (cfg_.type == CompressionType::kFp16) {
    for (int64_t i = 0; i < n_; ++i) {
      const _Float16 h = static_cast<_Float16>(v[i]);
      std::memcpy(msg + 2 * i, &h, 2);
    }
  } else if (cfg_.type == CompressionType::kBf16) {
    for (int64_t i = 0; i < n_; ++i) {
      const uint16_t h = to_bf16(v[i]);
      std::memcpy(msg + 2 * i, &h, 2);
    }
  } else if (cfg_.type == CompressionType::kInt8) {
    // Layout: all block scales (float), then the int8 values.
    const int64_t blocks = (n_ + kInt8Block - 1) / kInt8Block;
    float* scales = reinterpret_cast<float*>(msg);
    int8_t* q = reinterpret_cast<int8_t*>(msg + blocks * 4);
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t lo = b * kInt8Block, hi = std::min(n_, lo + kInt8Block);
      float amax = 0.0f;
      bool finite = true;
      for (int64_t i = lo; i < hi; ++i) {
        finite = finite && std::isfinite(v[i]);
        amax = std::max(amax, std::abs(v[i]));
      }
      // A block holding a NaN or an infinity decodes to NaN (scale NaN, values 0), so the
      // reduced gradient is not finite and train.nonfinite sees it; a quantised zero block would
      // hide it (and casting NaN to int8 is undefined).
      const float scale = !finite    ? std::numeric_limits<float>::quiet_NaN()
                          : amax > 0 ? amax / 127.0f
                                     : 0.0f;
      scales[b] = scale;
      const float inv = finite && scale > 0 ? 1.0f / scale : 0.0f;
      for (int64_t i = lo; i < hi; ++i)
        q[i] = finite ? static_cast<int8_t>(std::clamp(std::nearbyint(v[i] * inv), -127.0f, 127.0f))
                      : int8_t{0};
    }
  } else {  // topk: the k entries of largest magnitude as (uint32 index, float value)
    order_.resize(static_cast<size_t>(n_));
    for (int64_t i = 0; i < n_; ++i) order_[static_cast<size_t>(i)] = i;
    // Ties broken by index so every run selects the same entries. A NaN counts as the largest
    // magnitude: it is sent (the reduced gradient is then not finite and train.nonfinite sees
    // it) rather than kept in the residual, and the order stays a strict weak one.
    const auto mag = [&](int64_t i) {
      const float a = std::abs(v[i]);
      return std::isnan(a) ? std::numeric_limits<float>::infinity() : a;
    };
    std::nth_element(order_.begin(), order_.begin() + k_, order_.end(), [&](int64_t a, int64_t b) {
      const float fa = mag(a), fb = mag(b);
      return fa != fb ? fa > fb : a < b;
    });
    std::sort(order_.begin(), order_.begin() + k_);
    for (int64_t j = 0; j < k_; ++j) {
      const uint32_t idx = static_cast<uint32_t>(order_[static_cast<size_t>(j)]);
      std::memcpy(msg + 8 * j, &idx, 4);
      std::memcpy(msg + 8 * j + 4, &v[idx], 4);
    }
  }
}

void GradCompressor::decode_add(const uint8_t* msg, float* out) const {
  if (cfg_.type == CompressionType::kFp16) {
    for (int64_t i = 0; i < n_; ++i) {
      _Float16 h;
      std::memcpy(&h, msg + 2 * i, 2);
      out[i] += static_cast<float>(h);
    }
  } else if (cfg_.type == CompressionType::kBf16) {
    for (int64_t i = 0; i < n_; ++i) {
      uint16_t h;
      std::memcpy(&h, msg + 2 * i, 2);
      out[i] += from_bf16(h);
    }
  } else if (cfg_.type == CompressionType::kInt8) {
    const int64_t blocks = (n_ + kInt8Block - 1) / kInt8Block;
    const float* scales = reinterpret_cast<const float*>(msg);
    const int8_t* q = reinterpret_cast<const int8_t*>(msg + blocks * 4);
    for (int64_t i = 0; i < n_; ++i) out[i] += scales[i / kInt8Block] * static_cast<float>(q[i]);
  } else {
    for (int64_t j = 0; j < k_; ++j) {
      uint32_t idx;
      float val;
      std::memcpy(&idx, msg + 8 * j, 4);
      std::memcpy(&val, msg + 8 * j + 4, 4);
      // A peer's message is checked like any input: an index out of range is a protocol error.
      if (static_cast<int64_t>(idx) >= n_)
        throw CommError("topk message holds index " + std::to_string(idx) + " for " +
                        std::to_string(n_) + " gradients");
      out[idx] += val;
    }
  }
}

void GradCompressor::allreduce_sum(Communicator& comm, float* grad) {
  const int w = comm.size();
  // What this rank wants to send: its gradient plus what earlier steps dropped.
  for (int64_t i = 0; i < n_; ++i)
    work_[static_cast<size_t>(i)] =
        grad[i] + (residual_.empty() ? 0.0f : residual_[static_cast<size_t>(i)]);
  const size_t words = msg_bytes_ / 4;
  gathered_.resize(words * static_cast<size_t>(w));
  uint8_t* mine =
      reinterpret_cast<uint8_t*>(gathered_.data() + words * static_cast<size_t>(comm.rank()));
  encode(work_.data(), mine);
  if (!residual_.empty()) {
    // residual = what was wanted - what the message carries.
    std::fill(mine_decoded_.begin(), mine_decoded_.end(), 0.0f);
    decode_add(mine, mine_decoded_.data());
    for (int64_t i = 0; i < n_; ++i)
      residual_[static_cast<size_t>(i)] =
          work_[static_cast<size_t>(i)] - mine_decoded_[static_cast<size_t>(i)];
  }
  if (w > 1) {
    std::vector<float> my_words(
        gathered_.begin() + static_cast<std::ptrdiff_t>(words * comm.rank()),
        gathered_.begin() + static_cast<std::ptrdiff_t>(words * (comm.rank() + 1)));
    comm.allgather(my_words.data(), gathered_.data(), std::vector<size_t>(w, words));
  }
  std::fill(grad, grad + n_, 0.0f);
  for (int r = 0; r < w; ++r)
    decode_add(reinterpret_cast<const uint8_t*>(gathered_.data() + words * static_cast<size_t>(r)),
               grad);
}

}  // namespace dtrain

namespace dtrain {

std::string GradCompressor::describe(int world) const {
  // Each rank's message goes to the W - 1 others (an all-gather); DDP's ring all-reduce sends
  // 2 (W - 1) / W of the gradient per rank: the saving shrinks as W grows (fp16: 2x at 2 ranks,
  // 1.33x at 3, none at 4, and more than DDP beyond).
  const std::string head =
      fmt::format("{}: a message of {} bytes per rank per exchange for a gradient of {}",
                  to_string(cfg_.type), msg_bytes_, n_ * 4);
  const std::string ef = fmt::format(" (error feedback {})", cfg_.error_feedback ? "on" : "off");
  if (world < 2) return head + ef;
  const double w = world;
  const double sent = (w - 1) * static_cast<double>(msg_bytes_);
  const double ddp = 2 * (w - 1) / w * static_cast<double>(n_) * 4;
  const double ratio = sent > 0 ? ddp / sent : 1.0;
  return head + fmt::format(
                    "; at {} ranks each sends {:.0f} bytes where DDP's all-reduce sends "
                    "{:.0f}: {:.2f}x {}{}",
                    world, sent, ddp, ratio >= 1 ? ratio : 1 / ratio, ratio >= 1 ? "fewer" : "more",
                    ef);
}

GradReducer::State GradCompressor::export_state() const {
  return {.residual = residual_, .q = {}, .rng = {}};
}

void GradCompressor::import_state(const State& s) {
  DT_CHECK_MSG(s.q.empty() && s.rng.empty(), to_string(cfg_.type)
                                                 << " has no PowerSGD state to import");
  if (s.residual.empty()) return;
  DT_CHECK_EQ(s.residual.size(), residual_.size());
  residual_ = s.residual;
}

std::unique_ptr<GradReducer> make_grad_reducer(const CompressionConfig& cfg,
                                               const std::vector<ParamEntry>& params, int64_t n,
                                               uint64_t seed) {
  if (cfg.type == CompressionType::kPowersgd)
    return std::make_unique<PowerSgd>(cfg, params, n, seed);
  return std::make_unique<GradCompressor>(cfg, n);
}

namespace {

// Relative norm below which a row of P^T, once the earlier rows are projected out, counts as
// zero (rank-deficient M or Q): it is then replaced rather than divided by ~0. float32 rounding
// leaves ~1e-7 relative, so anything under 1e-5 is noise, not a direction of M.
constexpr double kRankTol = 1e-5;

double dot(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Removes from row its components along the (orthonormal) rows [0, j) of pt, twice: one pass of
// Gram-Schmidt in float leaves O(eps |row| / |result|) of them ("twice is enough").
void project_out(float* row, const float* pt, int64_t j, int64_t len) {
  for (int pass = 0; pass < 2; ++pass)
    for (int64_t k = 0; k < j; ++k) {
      const float* e = pt + k * len;
      const float d = static_cast<float>(dot(row, e, len));
      for (int64_t i = 0; i < len; ++i) row[i] -= d * e[i];
    }
}

// out (rows x cols) = P Q^T = sum over k of row k of pt (P^T, r x rows) times row k of qt (Q^T,
// r x cols): r rank-1 updates, row by row (a row stays in L1; no aliasing, so it vectorises).
void outer_product_sum(const float* __restrict pt, const float* __restrict qt,
                       float* __restrict out, int64_t rows, int64_t cols, int64_t r) {
  for (int64_t i = 0; i < rows; ++i) {
    float* __restrict row = out + i * cols;
    const float p0 = pt[i];
    for (int64_t j = 0; j < cols; ++j) row[j] = p0 * qt[j];
    for (int64_t k = 1; k < r; ++k) {
      const float pk = pt[k * rows + i];
      const float* __restrict q = qt + k * cols;
      for (int64_t j = 0; j < cols; ++j) row[j] += pk * q[j];
    }
  }
}

}  // namespace

PowerSgd::PowerSgd(const CompressionConfig& cfg, const std::vector<ParamEntry>& params, int64_t n,
                   uint64_t seed)
    : cfg_(cfg), n_(n), r_(cfg.rank), rng_(seed, 0x9057e75d) {
  DT_CHECK_GE(r_, 1);
  // Ranges of the flat buffer in table order; a matrix is compressed when its factors are
  // smaller than it, everything else (and any gap in the table) is sent as it is.
  std::vector<std::pair<int64_t, int64_t>> dense;
  int64_t pos = 0, p_len = 0, q_len = 0, res_len = 0;
  auto add_dense = [&](int64_t b, int64_t e) {
    if (e <= b) return;
    if (!dense.empty() && dense.back().second == b)
      dense.back().second = e;
    else
      dense.emplace_back(b, e);
  };
  std::vector<ParamEntry> sorted = params;
  std::sort(sorted.begin(), sorted.end(),
            [](const ParamEntry& a, const ParamEntry& b) { return a.offset < b.offset; });
  for (const ParamEntry& pe : sorted) {
    DT_CHECK_GE(pe.offset, pos);
    DT_CHECK_LE(pe.offset + pe.numel, n);
    add_dense(pos, pe.offset);
    pos = pe.offset + pe.numel;
    // A tensor of 2 or more dimensions is the matrix [shape[0], the rest] (a conv2d weight
    // [O, I, kh, kw] is O x I*kh*kw), as PyTorch's powerSGD_hook views it.
    // (rank < numel / (n + m): r_ * (n + m) would overflow for a rank near 2^62.)
    const int64_t rows = pe.shape.empty() ? 0 : pe.shape[0];
    const int64_t cols = rows > 0 ? pe.numel / rows : 0;
    if (pe.shape.size() >= 2 && rows > 0 && cols > 0 &&
        r_ < pe.numel / (rows + cols) + (pe.numel % (rows + cols) != 0)) {
      Matrix m{.offset = pe.offset,
               .rows = rows,
               .cols = cols,
               .p_offset = p_len,
               .q_offset = q_len,
               .res_offset = res_len};
      DT_CHECK_EQ(m.rows * m.cols, pe.numel);
      p_len += r_ * m.rows;
      q_len += r_ * m.cols;
      res_len += pe.numel;
      mats_.push_back(m);
    } else {
      add_dense(pe.offset, pos);
    }
  }
  add_dense(pos, n);
  dense_ = std::move(dense);
  for (const auto& [b, e] : dense_) dense_total_ += e - b;
  p_.assign(static_cast<size_t>(p_len + dense_total_), 0.0f);
  // Q starts as N(0, 1) from the run seed: every rank draws the same Q.
  Rng q_rng(seed, 0x51ed);
  q_.resize(static_cast<size_t>(q_len));
  for (float& v : q_) v = q_rng.normal();
  if (cfg.error_feedback) residual_.assign(static_cast<size_t>(res_len), 0.0f);
}

std::string PowerSgd::describe(int /*world*/) const {
  const int64_t sent = p_floats() + q_floats();
  return fmt::format(
      "powersgd rank {}: all-reduces {} floats ({} bytes) per step instead of {} ({} bytes), "
      "{:.1f}x fewer: {} matrices as factors, {} floats exact (error feedback {})",
      r_, sent, sent * 4, n_, n_ * 4,
      sent > 0 ? static_cast<double>(n_) / static_cast<double>(sent) : 1.0, mats_.size(),
      dense_total_, cfg_.error_feedback ? "on" : "off");
}

GradReducer::State PowerSgd::export_state() const {
  return {.residual = residual_, .q = q_, .rng = rng_.to_string()};
}

void PowerSgd::import_state(const State& s) {
  if (!s.residual.empty()) {
    DT_CHECK_EQ(s.residual.size(), residual_.size());
    residual_ = s.residual;
  }
  if (!s.q.empty()) {
    DT_CHECK_EQ(s.q.size(), q_.size());
    q_ = s.q;
  }
  if (!s.rng.empty()) rng_.from_string(s.rng);
}

double PowerSgd::residual_sq() const {
  double s = 0;
  for (float v : residual_) s += static_cast<double>(v) * v;
  return s;
}

void PowerSgd::orthonormalise_rows(float* pt, int64_t rows, int64_t len) {
  // rows < len: a matrix is compressed only when r (n + m) < n m, hence r < min(n, m).
  DT_CHECK_LT(rows, len);
  for (int64_t j = 0; j < rows; ++j) {
    float* row = pt + j * len;
    const double before = std::sqrt(dot(row, row, len));
    if (!std::isfinite(before)) continue;  // a non-finite gradient stays visible to the trainer
    project_out(row, pt, j, len);
    double after = std::sqrt(dot(row, row, len));
    // Rank-deficient (a zero gradient, a matrix of rank < r): any unit direction orthogonal to
    // the earlier rows keeps P orthonormal, and P P^T M stays a projection of M. Drawing it from
    // rng_ keeps the ranks in step: P^T is the same on every rank, so they all draw here.
    if (!(after > kRankTol * before)) {
      for (int tries = 0;; ++tries) {
        DT_CHECK_MSG(tries < 8, "PowerSGD found no direction orthogonal to " << j << " rows");
        for (int64_t i = 0; i < len; ++i) row[i] = rng_.normal();
        const double fresh = std::sqrt(dot(row, row, len));
        project_out(row, pt, j, len);
        after = std::sqrt(dot(row, row, len));
        if (after > 0.1 * fresh) break;  // j < len: a random vector almost surely passes
      }
    }
    const float inv = static_cast<float>(1.0 / after);
    for (int64_t i = 0; i < len; ++i) row[i] *= inv;
  }
}

void PowerSgd::allreduce_sum(Communicator& comm, float* grad) {
  const bool multi = comm.size() > 1;
  const int64_t r = r_;
  // P^T = Q^T M^T for every matrix, M with this rank's residual added.
  for (const Matrix& m : mats_) {
    float* M = grad + m.offset;
    if (!residual_.empty()) {
      const float* res = residual_.data() + m.res_offset;
      for (int64_t i = 0; i < m.rows * m.cols; ++i) M[i] += res[i];
    }
    gemm(false, true, r, m.rows, m.cols, 1.0f, q_.data() + m.q_offset, m.cols, M, m.cols, 0.0f,
         p_.data() + m.p_offset, m.rows);
  }
  // The dense ranges ride in the same all-reduce as the P's.
  float* dense = p_.data() + (p_floats() - dense_total_);
  for (const auto& [b, e] : dense_) dense = std::copy(grad + b, grad + e, dense);
  if (multi) comm.allreduce(p_.data(), p_.size(), ReduceOp::kSum);
  dense = p_.data() + (p_floats() - dense_total_);
  for (const auto& [b, e] : dense_) {
    std::copy(dense, dense + (e - b), grad + b);
    dense += e - b;
  }
  // Q^T = P^T M with orthonormal P (identical on every rank); residual = M - P (M^T P)^T.
  for (const Matrix& m : mats_) {
    float* pt = p_.data() + m.p_offset;
    float* qt = q_.data() + m.q_offset;
    const float* M = grad + m.offset;
    orthonormalise_rows(pt, r, m.rows);
    gemm(false, false, r, m.cols, m.rows, 1.0f, pt, m.rows, M, m.cols, 0.0f, qt, m.cols);
    if (!residual_.empty()) {
      float* res = residual_.data() + m.res_offset;
      std::copy(M, M + m.rows * m.cols, res);
      gemm(true, false, m.rows, m.cols, r, -1.0f, pt, m.rows, qt, m.cols, 1.0f, res, m.cols);
    }
  }
  if (multi) comm.allreduce(q_.data(), q_.size(), ReduceOp::kSum);
  // The result, P Q^T with the summed Q; q_ keeps the sum as the next step's start. A plain
  // loop, not gemm: every rank must compute bitwise the same values from the same P and Q, and
  // OpenBLAS picks kernels (summation order, FMA) by CPU and thread count, which may differ
  // between hosts. Orthonormalisation is plain code for the same reason.
  for (const Matrix& m : mats_)
    outer_product_sum(p_.data() + m.p_offset, q_.data() + m.q_offset, grad + m.offset, m.rows,
                      m.cols, r);
}

}  // namespace dtrain
