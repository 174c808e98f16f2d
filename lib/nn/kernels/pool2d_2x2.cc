#include "nn/kernels/pool2d_2x2.h"

#include <algorithm>
#include <cmath>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "util/check.h"

namespace dtrain::kernels_detail {
namespace {

// The general loop starts at v = -inf and takes strictly larger elements. The first element a
// (not NaN) always replaces -inf or equals it, so v = a, k = its position is the same start;
// then b, c, d in row-major order, each taken only when strictly larger: the first maximum wins.
// Window q covers a = r0[2q], b = r0[2q + 1], c = r1[2q], d = r1[2q + 1]; positions in the
// plane are at, at + 1, at + w, at + w + 1 with at = base + 2q.

// Windows [q, ow) one by one (rows narrower than one vector, and the scalar build).
bool select_scalar(const float* r0, const float* r1, int32_t w, int32_t base, int64_t q, int64_t ow,
                   float* y, int32_t* argmax) {
  bool nan = false;
  for (; q < ow; ++q) {
    const float a = r0[2 * q], b = r0[2 * q + 1], c = r1[2 * q], d = r1[2 * q + 1];
    const int32_t at = base + static_cast<int32_t>(2 * q);
    float v = a;
    int32_t k = at;
    k = b > v ? at + 1 : k;
    v = b > v ? b : v;
    k = c > v ? at + w : k;
    v = c > v ? c : v;
    k = d > v ? at + w + 1 : k;
    v = d > v ? d : v;
    nan |= (a != a) | (b != b) | (c != c) | (d != d);
    y[q] = v;
    argmax[q] = k;
  }
  return nan;
}

#if defined(__SSE2__)
// m ? t : f, lane by lane (m all ones or all zeros).
inline __m128i pick(__m128i m, __m128i t, __m128i f) {
  return _mm_or_si128(_mm_and_si128(m, t), _mm_andnot_si128(m, f));
}
#endif

// One output row: returns whether a NaN was seen (the caller then redoes the row). Four windows
// per SSE2 step, branch-free (on real activations the comparisons are unpredictable); the last
// step overlaps the previous one when ow is not a multiple of 4 (it writes the same values).
// _mm_max_ps(t, v) is exactly t > v ? t : v.
bool select_row(const float* r0, const float* r1, int32_t w, int32_t base, int64_t ow, float* y,
                int32_t* argmax) {
#if defined(__SSE2__)
  if (ow < 4) return select_scalar(r0, r1, w, base, 0, ow, y, argmax);
  const __m128i one = _mm_set1_epi32(1), down = _mm_set1_epi32(w), down1 = _mm_set1_epi32(w + 1);
  const __m128i lane = _mm_setr_epi32(0, 2, 4, 6);
  __m128 nan = _mm_setzero_ps();
  for (int64_t q0 = 0; q0 < ow; q0 += 4) {
    const int64_t q = std::min(q0, ow - 4);
    const __m128 lo0 = _mm_loadu_ps(r0 + 2 * q), hi0 = _mm_loadu_ps(r0 + 2 * q + 4);
    const __m128 lo1 = _mm_loadu_ps(r1 + 2 * q), hi1 = _mm_loadu_ps(r1 + 2 * q + 4);
    const __m128 a = _mm_shuffle_ps(lo0, hi0, _MM_SHUFFLE(2, 0, 2, 0));
    const __m128 b = _mm_shuffle_ps(lo0, hi0, _MM_SHUFFLE(3, 1, 3, 1));
    const __m128 c = _mm_shuffle_ps(lo1, hi1, _MM_SHUFFLE(2, 0, 2, 0));
    const __m128 d = _mm_shuffle_ps(lo1, hi1, _MM_SHUFFLE(3, 1, 3, 1));
    __m128 v = a;
    __m128i k = _mm_setzero_si128();  // offset in the window
    __m128 m = _mm_cmpgt_ps(b, v);
    k = pick(_mm_castps_si128(m), one, k);
    v = _mm_max_ps(b, v);
    m = _mm_cmpgt_ps(c, v);
    k = pick(_mm_castps_si128(m), down, k);
    v = _mm_max_ps(c, v);
    m = _mm_cmpgt_ps(d, v);
    k = pick(_mm_castps_si128(m), down1, k);
    v = _mm_max_ps(d, v);
    nan = _mm_or_ps(nan, _mm_or_ps(_mm_cmpunord_ps(a, b), _mm_cmpunord_ps(c, d)));
    const __m128i at = _mm_add_epi32(_mm_set1_epi32(base + static_cast<int32_t>(2 * q)), lane);
    _mm_storeu_ps(y + q, v);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(argmax + q), _mm_add_epi32(at, k));
  }
  return _mm_movemask_ps(nan) != 0;
#else
  return select_scalar(r0, r1, w, base, 0, ow, y, argmax);
#endif
}

// PyTorch's rule for a row with a NaN: from -inf, take a strictly larger element or any NaN.
void select_row_with_nan(const float* r0, const float* r1, int32_t w, int32_t base, int64_t ow,
                         float* y, int32_t* argmax) {
  for (int64_t q = 0; q < ow; ++q) {
    const int32_t at = base + static_cast<int32_t>(2 * q);
    const float e[4] = {r0[2 * q], r0[2 * q + 1], r1[2 * q], r1[2 * q + 1]};
    const int32_t pos[4] = {at, at + 1, at + w, at + w + 1};
    float v = -INFINITY;
    int32_t k = at;
    for (int t = 0; t < 4; ++t) {
      if (e[t] > v || std::isnan(e[t])) {
        v = e[t];
        k = pos[t];
      }
    }
    y[q] = v;
    argmax[q] = k;
  }
}

// dx rows r0, r1 under one output row: each element gets 0.0f + dy (what the general kernel's
// zero-fill then add gives, -0 becoming +0) at its window's argmax, 0 elsewhere. Returns whether
// every argmax lay in its window. Windows [q, ow) one by one.
bool route_scalar(const float* dy, const int32_t* argmax, int32_t w, int32_t base, int64_t q,
                  int64_t ow, float* r0, float* r1) {
  bool ok = true;
  for (; q < ow; ++q) {
    const int32_t k = argmax[q] - (base + static_cast<int32_t>(2 * q));
    const float g = 0.0f + dy[q];
    r0[2 * q] = k == 0 ? g : 0.0f;
    r0[2 * q + 1] = k == 1 ? g : 0.0f;
    r1[2 * q] = k == w ? g : 0.0f;
    r1[2 * q + 1] = k == w + 1 ? g : 0.0f;
    ok &= (k == 0) | (k == 1) | (k == w) | (k == w + 1);
  }
  return ok;
}

// route_scalar four windows per SSE2 step, the last step overlapping as in select_row.
bool route_row(const float* dy, const int32_t* argmax, int32_t w, int32_t base, int64_t ow,
               float* r0, float* r1) {
#if defined(__SSE2__)
  if (ow < 4) return route_scalar(dy, argmax, w, base, 0, ow, r0, r1);
  const __m128i one = _mm_set1_epi32(1), down = _mm_set1_epi32(w), down1 = _mm_set1_epi32(w + 1);
  const __m128i lane = _mm_setr_epi32(0, 2, 4, 6);
  __m128i ok = _mm_set1_epi32(-1);
  for (int64_t q0 = 0; q0 < ow; q0 += 4) {
    const int64_t q = std::min(q0, ow - 4);
    const __m128i at = _mm_add_epi32(_mm_set1_epi32(base + static_cast<int32_t>(2 * q)), lane);
    const __m128i k =
        _mm_sub_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(argmax + q)), at);
    const __m128 g = _mm_add_ps(_mm_setzero_ps(), _mm_loadu_ps(dy + q));
    const __m128i ma = _mm_cmpeq_epi32(k, _mm_setzero_si128()), mb = _mm_cmpeq_epi32(k, one);
    const __m128i mc = _mm_cmpeq_epi32(k, down), md = _mm_cmpeq_epi32(k, down1);
    const __m128 a = _mm_and_ps(_mm_castsi128_ps(ma), g), b = _mm_and_ps(_mm_castsi128_ps(mb), g);
    const __m128 c = _mm_and_ps(_mm_castsi128_ps(mc), g), d = _mm_and_ps(_mm_castsi128_ps(md), g);
    _mm_storeu_ps(r0 + 2 * q, _mm_unpacklo_ps(a, b));
    _mm_storeu_ps(r0 + 2 * q + 4, _mm_unpackhi_ps(a, b));
    _mm_storeu_ps(r1 + 2 * q, _mm_unpacklo_ps(c, d));
    _mm_storeu_ps(r1 + 2 * q + 4, _mm_unpackhi_ps(c, d));
    ok = _mm_and_si128(ok, _mm_or_si128(_mm_or_si128(ma, mb), _mm_or_si128(mc, md)));
  }
  return _mm_movemask_epi8(ok) == 0xffff;
#else
  return route_scalar(dy, argmax, w, base, 0, ow, r0, r1);
#endif
}

}  // namespace

void max_pool2d_2x2_forward(const Pool2dGeometry& g, const float* x, float* y, int32_t* argmax) {
  DT_CHECK(is_max_pool_2x2(g));
  const int64_t oh = g.out_height(), ow = g.out_width(), w = g.width, hw = g.height * w;
  for (int64_t pl = 0; pl < g.batch * g.channels; ++pl) {
    for (int64_t p = 0; p < oh; ++p) {
      const float* r0 = x + pl * hw + 2 * p * w;
      const int32_t base = static_cast<int32_t>(2 * p * w);
      const int64_t out = (pl * oh + p) * ow;
      if (select_row(r0, r0 + w, static_cast<int32_t>(w), base, ow, y + out, argmax + out))
        select_row_with_nan(r0, r0 + w, static_cast<int32_t>(w), base, ow, y + out, argmax + out);
    }
  }
}

void max_pool2d_2x2_backward(const Pool2dGeometry& g, const float* dy, const int32_t* argmax,
                             float* dx) {
  DT_CHECK(is_max_pool_2x2(g));
  const int64_t oh = g.out_height(), ow = g.out_width(), w = g.width, h = g.height, hw = h * w;
  for (int64_t pl = 0; pl < g.batch * g.channels; ++pl) {
    float* plane = dx + pl * hw;
    for (int64_t p = 0; p < oh; ++p) {
      float* r0 = plane + 2 * p * w;
      const int64_t out = (pl * oh + p) * ow;
      const bool ok = route_row(dy + out, argmax + out, static_cast<int32_t>(w),
                                static_cast<int32_t>(2 * p * w), ow, r0, r0 + w);
      DT_CHECK_MSG(ok, "max_pool2d backward: an argmax outside its window");
      if (w > 2 * ow) r0[w - 1] = r0[2 * w - 1] = 0.0f;  // odd width: the last column
    }
    for (int64_t t = 2 * oh * w; t < hw; ++t) plane[t] = 0.0f;  // odd height: the last row
  }
}

}  // namespace dtrain::kernels_detail
