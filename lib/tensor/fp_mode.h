// Subnormal floats in layer arithmetic.
//
// A float below 2^-126 in magnitude (subnormal) costs a microcode assist of ~100 cycles per
// operation on Intel cores when it is an input or a result of SSE/AVX arithmetic, and the GEMM
// kernels are no exception. Training produces them as soon as the model is confident: the
// softmax gradient of a class with a logit ~90 below the row's maximum is subnormal, and products
// of small gradients with weights make more in the backward GEMMs. On mlp-ref (synthetic data,
// loss ~1e-6 after 200 steps) 4% of the logit gradients are subnormal and 14% below 1e-30;
// the backward GEMMs that read them ran several times slower than on random data.
//
// FlushSubnormals sets flush-to-zero (results) and denormals-are-zero (inputs) in this thread's
// MXCSR for its lifetime and then restores the previous mode, so only the code in its scope
// computes that way. Model::forward and Model::backward hold one around every layer call
// (TensorFlow runs its CPU kernels the same way). The effect on values is bounded by 2^-126
// absolute per operation: a subnormal becomes a zero of the same sign.
//
// OpenBLAS's worker threads (runtime.threads > 1) keep their own MXCSR (OpenBLAS 0.3.21 does
// not pass the caller's on), so with several BLAS threads only the caller's share of a GEMM
// flushes; results stay deterministic for a given thread count.
#pragma once

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace dtrain {

class FlushSubnormals {
 public:
#if defined(__SSE__)
  static constexpr unsigned kFtz = 0x8000;  // MXCSR bit 15: flush-to-zero
  static constexpr unsigned kDaz = 0x0040;  // MXCSR bit 6: denormals-are-zero
  FlushSubnormals() : saved_(_mm_getcsr()) {
    if ((saved_ & (kFtz | kDaz)) != (kFtz | kDaz)) _mm_setcsr(saved_ | kFtz | kDaz);
  }
  ~FlushSubnormals() {
    if ((saved_ & (kFtz | kDaz)) != (kFtz | kDaz)) _mm_setcsr(saved_);
  }

 private:
  unsigned saved_;
#else
  FlushSubnormals() = default;
#endif

 public:
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;
};

}  // namespace dtrain
