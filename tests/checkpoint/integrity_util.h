// Damage done to safetensors files on disk for the integrity tests: a flipped bit in one tensor's
// bytes (what a bad disk or a torn copy does), a value rewritten with valid checksums (what a
// diverged run would save), and the checksums removed (what files from before checksums look
// like).
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "test_util.h"

namespace dtrain::testing {

// The header length and the parsed header of a safetensors file.
inline nlohmann::json st_header(const std::string& path, uint64_t* header_len) {
  const std::string bytes = read_text(path);
  REQUIRE(bytes.size() >= 8);
  std::memcpy(header_len, bytes.data(), 8);
  return nlohmann::json::parse(bytes.substr(8, *header_len));
}

// Flips bit `bit` of byte `byte` of tensor `name`'s data in the file at `path`, in place.
inline void flip_tensor_bit(const std::string& path, const std::string& name, int64_t byte = 0,
                            int bit = 3) {
  uint64_t header_len = 0;
  const nlohmann::json h = st_header(path, &header_len);
  REQUIRE_MESSAGE(h.contains(name), path, " has no tensor ", name);
  const int64_t begin = h.at(name).at("data_offsets").at(0).get<int64_t>();
  const int64_t end = h.at(name).at("data_offsets").at(1).get<int64_t>();
  REQUIRE(begin + byte < end);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  const auto pos =
      static_cast<std::streamoff>(8 + header_len + static_cast<uint64_t>(begin + byte));
  f.seekg(pos);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ (1 << bit));
  f.seekp(pos);
  f.write(&c, 1);
  REQUIRE(f.good());
}

// Rewrites the file with element `index` of tensor `name` set to `value`; the checksums are
// those of the new bytes, so only a value check can refuse it.
inline void set_tensor_value(const std::string& path, const std::string& name, int64_t index,
                             float value) {
  StFile f = read_safetensors(path);
  REQUIRE(f.tensors.count(name) == 1);
  f.tensors.at(name).data.at(static_cast<size_t>(index)) = value;
  std::vector<StTensorRef> refs;
  for (const auto& [n, t] : f.tensors) refs.push_back({n, t.shape, t.data.data()});
  write_safetensors(path, refs, f.metadata);
}

// Rewrites the file with __metadata__ key `key` set to `value` (erased when value is null),
// checksums recomputed: only a check of that key can refuse it.
inline void set_metadata(const std::string& path, const std::string& key, const char* value) {
  StFile f = read_safetensors(path);
  if (value == nullptr)
    f.metadata.erase(key);
  else
    f.metadata[key] = value;
  std::vector<StTensorRef> refs;
  for (const auto& [n, t] : f.tensors) refs.push_back({n, t.shape, t.data.data()});
  write_safetensors(path, refs, f.metadata);
}

// Rewrites the file without its "crc32" and "crc32_header" metadata, tensor bytes unchanged: a
// file as dtrain wrote it before checksums. header_only: without "crc32_header" alone, a file
// as dtrain wrote it between tensor and header checksums.
inline void strip_checksums(const std::string& path, bool header_only = false) {
  uint64_t header_len = 0;
  nlohmann::json h = st_header(path, &header_len);
  REQUIRE(h.at("__metadata__").contains(kStCrcKey));
  if (!header_only) h.at("__metadata__").erase(kStCrcKey);
  h.at("__metadata__").erase(kStHeaderCrcKey);
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t len = text.size();
  const std::string data = read_text(path).substr(8 + header_len);
  std::string out(8, '\0');
  std::memcpy(out.data(), &len, 8);
  out += text;
  out += data;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << out;
}

}  // namespace dtrain::testing
