// A training step's recorded GEMMs replayed with nothing around them (`dtrain bench gemm` and
// `dtrain bench step`): the bound on what the step's GEMMs can cost.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tensor/blas.h"

namespace dtrain {

// The recorded calls on memory of their own. Every maximal run of overlapping operands becomes one
// region of an arena, at the same offset modulo 64 bytes as it was (the same cache-line
// alignment), so calls that shared memory in the step share it here (a layer's output read by the
// next GEMM, the heads' slices of one q/k/v buffer) and the replay touches as much memory as the
// step's GEMMs did. Not thread-safe; owns its arena.
class GemmReplay {
 public:
  explicit GemmReplay(const std::vector<GemmCall>& calls);

  size_t bytes() const { return arena_.size() * sizeof(float); }
  const std::vector<GemmCall>& calls() const { return recorded_; }
  // Restores the arena's starting values (small normal floats), so repeated accumulating
  // (beta = 1) calls cannot grow them: call before each timed replay.
  void reset();
  // All calls in order; with `seconds` (one entry per call), adds each call's time to it.
  void run(std::vector<double>* seconds = nullptr) const;
  // reset() then run(), timed: seconds for the whole replay.
  double timed_step();

 private:
  struct Span {
    uintptr_t lo = 0, hi = 0;
  };
  struct Region {
    Span span;
    size_t offset = 0;  // bytes from base_
  };
  struct Call {
    GemmCall g;
    float* a;
    float* b;
    float* c;
  };
  static Span operand(uintptr_t p, int64_t rows, int64_t cols, int64_t ld);
  static std::vector<Span> spans_of(const GemmCall& c);
  // Where operand span s lives in the arena (an empty one, K = 0: anywhere, it is not read).
  float* at_(const Span& s) const;

  std::vector<GemmCall> recorded_;
  std::vector<Region> regions_;
  std::vector<float> arena_, start_;
  char* base_ = nullptr;
  std::vector<Call> calls_;
};

}  // namespace dtrain
