#include "gemm_replay.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "util/check.h"
#include "util/rng.h"

namespace dtrain {

// The bytes [lo, hi) an operand spans: `rows` rows of `cols` floats at a stride of `ld` floats.
GemmReplay::Span GemmReplay::operand(uintptr_t p, int64_t rows, int64_t cols, int64_t ld) {
  DT_CHECK_EQ(p % sizeof(float), 0u);
  if (rows == 0 || cols == 0) return {p, p};
  return {p, p + static_cast<uintptr_t>((rows - 1) * ld + cols) * sizeof(float)};
}

std::vector<GemmReplay::Span> GemmReplay::spans_of(const GemmCall& c) {
  return {operand(c.a, c.trans_a ? c.k : c.m, c.trans_a ? c.m : c.k, c.lda),
          operand(c.b, c.trans_b ? c.n : c.k, c.trans_b ? c.k : c.n, c.ldb),
          operand(c.c, c.m, c.n, c.ldc)};
}

GemmReplay::GemmReplay(const std::vector<GemmCall>& calls) {
  std::vector<Span> all;
  for (const GemmCall& c : calls)
    for (const Span& s : spans_of(c))
      if (s.hi > s.lo) all.push_back(s);
  std::sort(all.begin(), all.end(), [](const Span& x, const Span& y) { return x.lo < y.lo; });
  for (const Span& s : all) {
    if (!regions_.empty() && s.lo < regions_.back().span.hi)
      regions_.back().span.hi = std::max(regions_.back().span.hi, s.hi);
    else
      regions_.push_back({s, 0});
  }
  size_t at = 0;
  for (Region& r : regions_) {
    at = (at + 63) / 64 * 64 + r.span.lo % 64;
    r.offset = at;
    at += r.span.hi - r.span.lo;
  }
  arena_.resize(at / sizeof(float) + 16);
  base_ = reinterpret_cast<char*>(arena_.data());
  base_ += (64 - reinterpret_cast<uintptr_t>(base_) % 64) % 64;
  // Small normal values: finite, no subnormals, and reset before each timed step, so values
  // cannot grow over the repetitions of accumulating (beta = 1) calls.
  Rng rng(1);
  for (float& v : arena_) v = 0.05f * rng.normal();
  start_ = arena_;
  recorded_ = calls;
  for (const GemmCall& c : calls) {
    const std::vector<Span> sp = spans_of(c);
    calls_.push_back({c, at_(sp[0]), at_(sp[1]), at_(sp[2])});
  }
}

void GemmReplay::reset() {
  std::memcpy(arena_.data(), start_.data(), bytes());
}

void GemmReplay::run(std::vector<double>* seconds) const {
  for (size_t i = 0; i < calls_.size(); ++i) {
    const Call& x = calls_[i];
    const GemmCall& c = x.g;
    const auto t0 = std::chrono::steady_clock::now();
    gemm(c.trans_a, c.trans_b, c.m, c.n, c.k, c.alpha, x.a, c.lda, x.b, c.ldb, c.beta, x.c, c.ldc);
    if (seconds != nullptr)
      (*seconds)[i] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
}

double GemmReplay::timed_step() {
  reset();
  const auto t0 = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

float* GemmReplay::at_(const Span& s) const {
  if (s.hi == s.lo) return reinterpret_cast<float*>(base_);
  auto it = std::upper_bound(regions_.begin(), regions_.end(), s.lo,
                             [](uintptr_t v, const Region& r) { return v < r.span.lo; });
  DT_CHECK(it != regions_.begin());
  --it;
  DT_CHECK(s.hi <= it->span.hi);
  return reinterpret_cast<float*>(base_ + it->offset + (s.lo - it->span.lo));
}

}  // namespace dtrain
