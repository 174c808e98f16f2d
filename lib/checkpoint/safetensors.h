// safetensors files: 8-byte little-endian header length N, N bytes of JSON header
// {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
//  "__metadata__": {"key": "string value", ...}}, then the raw little-endian tensor bytes.
// Python's safetensors and numpy read what write_safetensors writes. Only F32 is written; F32
// is the only dtype read unless the caller asks for conversion (StReadOptions: files from
// elsewhere), otherwise anything else is refused with a message.
//
// Integrity: write_safetensors stores a CRC-32 (zlib's polynomial) of every tensor's bytes in
// __metadata__ key "crc32", a compact JSON object {"name": "8 lowercase hex digits", ...}; the
// readers never return that key in `metadata`. read_safetensors verifies every checksum when the
// key is present; files written before checksums existed lack it and read with checksummed false
// (the caller decides whether to warn).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "util/fs.h"

namespace dtrain {

struct StTensorRef {  // a tensor to write: name, shape, and a pointer to numel floats
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
};

struct StTensor {  // a tensor read back
  std::vector<int64_t> shape;
  std::vector<float> data;    // float32, converted from `dtype`; empty when not `loaded`
  std::string dtype = "F32";  // as the file stores it
  // False for a tensor StReadOptions left unread (not wanted, or of a dtype that does not convert):
  // its shape and dtype are known, its data is not.
  bool loaded = true;
};

struct StReadOptions {
  // Tensors stored as F16, BF16 or F64 are read converted to float32 (st_dtype.h: F16 and BF16
  // exactly, F64 rounded); tensors of the format's other dtypes (integers, booleans, 8-bit
  // floats) are listed unread. Off (dtrain's own files): any dtype but F32 is refused.
  bool convert = false;
  // When set, only the tensors it accepts are read and checksum-verified; the rest are listed
  // unread (a model's weights from a file that also holds optimizer state: no memory for it).
  // The header is validated whole either way.
  std::function<bool(const std::string& name)> wanted;
};

struct StFile {
  std::map<std::string, std::string> metadata;  // without the reserved "crc32" key
  std::map<std::string, StTensor> tensors;
  bool checksummed = false;  // the file carried "crc32" (and every tensor matched it)
  // The header carried its own CRC-32 (kStHeaderCrcKey) and matched it; files written between
  // tensor checksums (2026-12-01) and header checksums (2026-12-03) have only the former.
  bool header_checksummed = false;
};

// The largest header a safetensors reader accepts (dtrain's, and the reference implementation's,
// Python's): a writer refuses to write one it could not read back.
inline constexpr uint64_t kStMaxHeaderBytes = 100'000'000;

inline constexpr const char* kStCrcKey = "crc32";  // reserved __metadata__ key
// Reserved too: the CRC-32 of the header itself (metadata, shapes, offsets) in canonical form,
// verified by every read that finds it.
inline constexpr const char* kStHeaderCrcKey = "crc32_header";

// zlib's CRC-32 of `bytes` as 8 lowercase hex digits, the form of the checksums here (also
// manifest.json's, checkpoint/checkpoint.cc).
std::string crc32_hex(const std::string& bytes);

// Writes atomically (temp file, fsync, rename; see util/fs.h). Tensors are laid out in the order
// given, 8-byte aligned header (padded with spaces, as the reference implementation does).
// Throws std::runtime_error on I/O failure, leaving any old file intact. A "crc32" entry in
// `metadata` is ignored: the checksums of the tensors written replace it.
void write_safetensors(const std::string& path, const std::vector<StTensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       Links links = Links::kFollow);

// Reads and validates the whole file: header length within the file, JSON well-formed, offsets in
// range, contiguous and non-overlapping, byte counts equal to shape x the dtype's size. Throws
// UserError naming the file and what is wrong (truncated, corrupt header, bad dtype, ...). With
// checksums: a "crc32" value that is not an object of 8-hex-digit strings, one naming no tensor or
// missing a tensor is a corrupt header; a tensor whose bytes do not match is refused as
// "safetensors file 'PATH': tensor 'NAME' fails its CRC-32 check (stored X, computed Y): the file
// is corrupt" (tensors left unread are not verified). A file that does not begin as a safetensors
// file (too short, an impossible header length, a header that is not a JSON object) is refused as
// "'PATH' is not a safetensors file (...)".
StFile read_safetensors(const std::string& path, const StReadOptions& options = {});

// Only the header's __metadata__ (reads the 8-byte length and the header, no tensor data), with
// the same checks and messages as read_safetensors for those parts.
std::map<std::string, std::string> read_safetensors_metadata(const std::string& path);

// The header's checksum (kStHeaderCrcKey: it covers every tensor's checksum and the metadata, so
// it names the file's content), verified as read_safetensors_metadata verifies it; "" for a file
// written before header checksums. Reads the header only.
std::string read_safetensors_header_crc(const std::string& path);
// The shape the header gives tensor `name`, nullopt when it has no such tensor or the shape is
// not a list of integers (read_safetensors says what is wrong). Reads the header only.
std::optional<std::vector<int64_t>> read_safetensors_shape(const std::string& path,
                                                           const std::string& name);

}  // namespace dtrain
