#include "train/compression.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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

GradCompressor::GradCompressor(const CompressionConfig& cfg, int64_t n) : cfg_(cfg), n_(n) {
  DT_CHECK_GE(n, 0);
  if (cfg.type == "fp16" || cfg.type == "bf16") {
    msg_bytes_ = round4(static_cast<size_t>(n) * 2);
  } else if (cfg.type == "int8") {
    const int64_t blocks = (n + kInt8Block - 1) / kInt8Block;
    msg_bytes_ = static_cast<size_t>(blocks) * 4 + round4(static_cast<size_t>(n));
  } else if (cfg.type == "topk") {
    k_ = std::min<int64_t>(n, static_cast<int64_t>(std::ceil(cfg.ratio * static_cast<double>(n))));
    msg_bytes_ = static_cast<size_t>(k_) * 8;
  } else {
    DT_CHECK_MSG(false, "unknown compression type " << cfg.type);
  }
  if (cfg.error_feedback) residual_.assign(static_cast<size_t>(n), 0.0f);
  work_.resize(static_cast<size_t>(n));
  mine_decoded_.resize(static_cast<size_t>(n));
}

void GradCompressor::encode(const float* v, uint8_t* msg) const {
  std::memset(msg, 0, msg_bytes_);
  if (cfg_.type == "fp16") {
    for (int64_t i = 0; i < n_; ++i) {
      const _Float16 h = static_cast<_Float16>(v[i]);
      std::memcpy(msg + 2 * i, &h, 2);
    }
  } else if (cfg_.type == "bf16") {
    for (int64_t i = 0; i < n_; ++i) {
      const uint16_t h = to_bf16(v[i]);
      std::memcpy(msg + 2 * i, &h, 2);
    }
  } else if (cfg_.type == "int8") {
    // Layout: all block scales (float), then the int8 values.
    const int64_t blocks = (n_ + kInt8Block - 1) / kInt8Block;
    float* scales = reinterpret_cast<float*>(msg);
    int8_t* q = reinterpret_cast<int8_t*>(msg + blocks * 4);
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t lo = b * kInt8Block, hi = std::min(n_, lo + kInt8Block);
      float amax = 0.0f;
      for (int64_t i = lo; i < hi; ++i) amax = std::max(amax, std::abs(v[i]));
      const float scale = amax > 0 && std::isfinite(amax) ? amax / 127.0f : 0.0f;
      scales[b] = scale;
      const float inv = scale > 0 ? 1.0f / scale : 0.0f;
      for (int64_t i = lo; i < hi; ++i)
        q[i] = static_cast<int8_t>(std::clamp(std::nearbyint(v[i] * inv), -127.0f, 127.0f));
    }
  } else {  // topk: the k entries of largest magnitude as (uint32 index, float value)
    order_.resize(static_cast<size_t>(n_));
    for (int64_t i = 0; i < n_; ++i) order_[static_cast<size_t>(i)] = i;
    // Ties broken by index so every run selects the same entries.
    std::nth_element(order_.begin(), order_.begin() + k_, order_.end(), [&](int64_t a, int64_t b) {
      const float fa = std::abs(v[a]), fb = std::abs(v[b]);
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
  if (cfg_.type == "fp16") {
    for (int64_t i = 0; i < n_; ++i) {
      _Float16 h;
      std::memcpy(&h, msg + 2 * i, 2);
      out[i] += static_cast<float>(h);
    }
  } else if (cfg_.type == "bf16") {
    for (int64_t i = 0; i < n_; ++i) {
      uint16_t h;
      std::memcpy(&h, msg + 2 * i, 2);
      out[i] += from_bf16(h);
    }
  } else if (cfg_.type == "int8") {
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
