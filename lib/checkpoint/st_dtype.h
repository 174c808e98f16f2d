// The element types a safetensors header names ("dtype"), and the conversion of its floating-point
// ones to float32. dtrain writes F32 only; files from elsewhere (PyTorch models saved in half
// precision, bfloat16 or float64) are read through these when a caller asks for conversion.
#pragma once

#include <cstddef>
#include <string_view>

namespace dtrain {

// Bytes per element of a dtype the safetensors format defines (BOOL, U8, I8, F8_E5M2, F8_E4M3,
// I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64); 0 for any other name.
int st_dtype_bytes(std::string_view dtype);

// True for the dtypes st_to_f32 converts: F32, F16, BF16 and F64.
bool st_dtype_converts(std::string_view dtype);

// Converts n little-endian elements of `dtype` at `src` (n * st_dtype_bytes(dtype) bytes, any
// alignment) to float32 at `dst`. F16 and BF16 widen exactly (subnormals, infinities and NaNs
// kept); F64 rounds to the nearest float32, to +-infinity beyond float32's range (a finite value
// that became infinite: the caller's non-finite check names it). Requires st_dtype_converts.
void st_to_f32(std::string_view dtype, const void* src, size_t n, float* dst);

}  // namespace dtrain
