// Float helpers that GCC vectorises under the project's strict floating point (no -ffast-math):
// a branch-free e^x (libm's expf keeps loops scalar) and lane-parallel row reductions. Shared by
// the activations (nn/activations.cc) and the attention softmax (nn/kernels/attention.cc).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace dtrain {

// Clamps |x| to c (c > 0) with integer operations: a float compare-and-select followed by a
// division is not if-converted under -ftrapping-math, which would keep the loops scalar. NaN
// passes through unchanged; +-inf becomes +-c.
inline float clamp_abs(float x, float c) {
  const int32_t bits = std::bit_cast<int32_t>(x);
  const int32_t mag = bits & 0x7fffffff;
  const int32_t cb = std::bit_cast<int32_t>(c);
  const int32_t m = (mag > cb && mag <= 0x7f800000) ? cb : mag;
  return std::bit_cast<float>(m | (bits & static_cast<int32_t>(0x80000000u)));
}

// e^x, relative error < 1e-7 for |x| <= 87; |x| is clamped to 87, so the result is always a
// finite normal float (1 + e^x never overflows). Cephes expf polynomial with Cody-Waite range
// reduction; round-to-nearest via the 1.5 * 2^23 trick.
inline float exp_approx(float x) {
  x = clamp_abs(x, 87.0f);
  const float t = x * 1.44269504088896341f + 12582912.0f;  // 1.5 * 2^23 + round(x / ln 2)
  const float n = t - 12582912.0f;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n from t's low mantissa bits (bits(t) = 0x4B400000 + n), not a float-to-int conversion:
  // that is undefined for NaN (and under UBSan stopped NaN from propagating); a NaN x leaves p
  // NaN, so the result is NaN whatever the scale's bits.
  return p * std::bit_cast<float>((std::bit_cast<uint32_t>(t) - 0x4B400000u + 127u) << 23);
}

// A float's bits as an int32 that orders like the float (negative floats' magnitude bits
// flipped); its own inverse. NaN with the sign bit clear orders above +inf.
inline int32_t ordered_bits(int32_t b) {
  return b ^ ((b >> 31) & 0x7fffffff);
}

// max_{j < n} x[j], n >= 1, exactly, as an integer maximum over ordered_bits: a float
// compare-and-select is not if-converted under -ftrapping-math, an integer one vectorises. A NaN
// (sign clear) wins, so it stays visible downstream.
inline float row_max(const float* x, int64_t n) {
  int32_t m = ordered_bits(std::bit_cast<int32_t>(x[0]));
  for (int64_t j = 1; j < n; ++j) m = std::max(m, ordered_bits(std::bit_cast<int32_t>(x[j])));
  return std::bit_cast<float>(ordered_bits(m));
}

// Compute-bound loops are also compiled for x86-64-v3 (AVX2 + FMA, 8 lanes) and picked at load
// time (GCC function multiversioning): the default build targets baseline x86-64 (SSE2, 4 lanes).
// DT_WIDE_CLONES adds an x86-64-v4 (AVX-512) clone, for pure elementwise maps only: GCC 12
// vectorises them 1.3x faster than v3 (GELU's backward), but the row reductions of kFastLanes
// accumulators (layer norm, softmax) 3x slower (measured on SkylakeX). The v3 and v4 clones may
// contract to FMA, so results can differ in the last bit between CPUs (as OpenBLAS kernels already
// do); a given machine always runs the same clone, so runs stay reproducible there.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DT_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#define DT_WIDE_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DT_SIMD_CLONES
#define DT_WIDE_CLONES
#endif

constexpr int kFastLanes = 8;

// sum_{j < n} x[j] * y[j] (y == nullptr: sum of x) with kFastLanes float accumulators:
// deterministic, and vectorised where one accumulator (strict summation order) stays scalar.
inline float row_dot(const float* x, const float* y, int64_t n) {
  float acc[kFastLanes] = {};
  int64_t j = 0;
  for (; j + kFastLanes <= n; j += kFastLanes) {
    for (int l = 0; l < kFastLanes; ++l) acc[l] += x[j + l] * (y != nullptr ? y[j + l] : 1.0f);
  }
  float s = 0.0f;
  for (; j < n; ++j) s += x[j] * (y != nullptr ? y[j] : 1.0f);
  for (int l = 0; l < kFastLanes; ++l) s += acc[l];
  return s;
}

}  // namespace dtrain
