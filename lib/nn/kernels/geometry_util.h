// Helpers shared by the convolution and pooling kernels (not part of the nn API).
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>

namespace dtrain::kernels_detail {

// "HxW", as geometry messages print sizes.
inline std::string dims(int64_t h, int64_t w) {
  return std::to_string(h) + "x" + std::to_string(w);
}

// The largest per-sample buffer (elements) the kernels accept: GEMM sizes are 32-bit in OpenBLAS.
inline constexpr double kMaxElements = static_cast<double>(std::numeric_limits<int32_t>::max());

inline bool fits_int32(std::initializer_list<int64_t> values) {
  for (int64_t v : values) {
    if (v > std::numeric_limits<int32_t>::max()) return false;
  }
  return true;
}

// The sizes convolution and pooling share.
struct WindowSizes {
  int64_t batch, channels, height, width, kernel_h, kernel_w, stride_h, stride_w;
};

// The checks both geometries start with; "" when they pass. `channels_name` is what the message
// calls the channel count ("input channels", "channels").
inline std::string window_error(const WindowSizes& s, const char* channels_name) {
  if (s.batch < 0) return "batch must be >= 0 (got " + std::to_string(s.batch) + ")";
  if (s.channels < 1)
    return std::string(channels_name) + " must be >= 1 (got " + std::to_string(s.channels) + ")";
  if (s.height < 1 || s.width < 1)
    return "input height and width must be >= 1 (got " + dims(s.height, s.width) + ")";
  if (s.kernel_h < 1 || s.kernel_w < 1)
    return "kernel must be >= 1 (got " + dims(s.kernel_h, s.kernel_w) + ")";
  if (s.stride_h < 1 || s.stride_w < 1)
    return "stride must be >= 1 (got " + dims(s.stride_h, s.stride_w) + ")";
  return "";
}

// Output positions q in [0, count) whose input index q * stride + off lies in [0, limit), as a
// half-open range [q0, q1) (empty when q0 == q1). stride >= 1.
inline std::pair<int64_t, int64_t> valid_span(int64_t count, int64_t stride, int64_t off,
                                              int64_t limit) {
  const int64_t q0 = off >= 0 ? 0 : (-off + stride - 1) / stride;
  const int64_t last = limit - 1 - off;  // q * stride <= last
  const int64_t q1 = last < 0 ? 0 : std::min(count, last / stride + 1);
  return {std::min(q0, q1), q1};
}

}  // namespace dtrain::kernels_detail
