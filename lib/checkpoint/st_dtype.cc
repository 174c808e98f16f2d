// safetensors dtypes (st_dtype.h).
#include "checkpoint/st_dtype.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "util/check.h"

namespace dtrain {

static_assert(std::endian::native == std::endian::little, "safetensors data is little endian");

namespace {

// IEEE 754 binary16 to binary32, exactly.
float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant x 2^-24, exact in float32
    const float f = static_cast<float>(mant) * 0x1p-24f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(f) | sign);
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf, NaN
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

// binary64 to binary32, rounded to nearest. A finite double at or beyond the rounding boundary
// above FLT_MAX becomes infinity explicitly: the cast itself would be undefined behaviour there.
float double_to_float(double d) {
  constexpr double kBoundary = 0x1.ffffffp127;  // FLT_MAX + half an ulp: rounds to infinity
  if (std::isnan(d)) return std::numeric_limits<float>::quiet_NaN();
  if (d >= kBoundary) return std::numeric_limits<float>::infinity();
  if (d <= -kBoundary) return -std::numeric_limits<float>::infinity();
  return static_cast<float>(d);
}

}  // namespace

int st_dtype_bytes(std::string_view dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "BOOL" || dtype == "U8" || dtype == "I8" || dtype == "F8_E5M2" || dtype == "F8_E4M3")
    return 1;
  return 0;
}

bool st_dtype_converts(std::string_view dtype) {
  return dtype == "F32" || dtype == "F16" || dtype == "BF16" || dtype == "F64";
}

void st_to_f32(std::string_view dtype, const void* src, size_t n, float* dst) {
  DT_CHECK(st_dtype_converts(dtype));
  const auto* p = static_cast<const unsigned char*>(src);
  if (dtype == "F32") {
    std::memcpy(dst, p, n * 4);
  } else if (dtype == "F64") {
    for (size_t i = 0; i < n; ++i) {
      double d;
      std::memcpy(&d, p + 8 * i, 8);
      dst[i] = double_to_float(d);
    }
  } else {
    const bool bf16 = dtype == "BF16";
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      // bfloat16 is float32's upper half.
      dst[i] = bf16 ? std::bit_cast<float>(static_cast<uint32_t>(h) << 16) : half_to_float(h);
    }
  }
}

}  // namespace dtrain
