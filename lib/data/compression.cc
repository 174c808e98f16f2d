#include "data/compression.h"

#include <cstdio>

#include "util/check.h"

namespace dtrain {

std::string_view unread_compression(std::string_view h) {
  using namespace std::string_view_literals;
  if (h.starts_with("\xFD"
                    "7zXZ\0"sv))
    return "xz";
  // "BZh" and a block size 1-9, then a block's or the end's magic: no text starts so.
  if (h.size() >= 10 && h.starts_with("BZh") && h[3] >= '1' && h[3] <= '9' &&
      (h.substr(4, 6) == "1AY&SY"sv || h.substr(4, 6) == "\x17\x72\x45\x38\x50\x90"sv))
    return "bzip2";
  if (h.starts_with("\x28\xB5\x2F\xFD"sv)) return "zstd";
  // A skippable frame (magic 0x184D2A50-5F, little-endian) may open a zstd file (pzstd, zstd
  // --patch-from dictionaries): its 0x18 byte is no text's.
  if (h.size() >= 4 && (static_cast<unsigned char>(h[0]) & 0xF0) == 0x50 &&
      h.substr(1, 3) == "\x2A\x4D\x18"sv)
    return "zstd";
  if (h.starts_with("PK\x03\x04"sv) || h.starts_with("PK\x05\x06"sv)) return "zip";
  if (h.starts_with("7z\xBC\xAF\x27\x1C"sv)) return "7z";
  if (h.starts_with("\x04\x22\x4D\x18"sv)) return "lz4";
  if (h.starts_with("\x02\x21\x4C\x18"sv)) return "lz4";  // the legacy frame (lz4 -l)
  return "";
}

void refuse_unread_compression(const std::string& path, std::string_view head) {
  const std::string_view format = unread_compression(head);
  if (format.empty()) return;
  const std::string f(format);
  const std::string how = f == "zip" ? "unzip it" : f == "7z" ? "extract it (7z x)" : f + " -d it";
  throw UserError("'" + path + "' is " + f + "-compressed, and dtrain reads gzip or uncompressed " +
                  "files only: " + how + ", or recompress it with gzip");
}

void refuse_unread_compression(const std::string& path) {
  std::FILE* in = std::fopen(path.c_str(), "rb");
  if (in == nullptr) return;
  char head[kCompressionMagicBytes] = {};
  const size_t got = std::fread(head, 1, sizeof head, in);
  std::fclose(in);
  refuse_unread_compression(path, std::string_view(head, got));
}

}  // namespace dtrain
