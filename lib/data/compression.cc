#include "data/compression.h"

#include <zlib.h>

#include <cstdint>
#include <cstdio>

#include "util/check.h"

namespace dtrain {
namespace {

// "xz -d it" and the like: how to decompress a file of `format` (unread_compression's names).
std::string decompress_how(const std::string& format) {
  return format == "zip" ? "unzip it" : format == "7z" ? "extract it (7z x)" : format + " -d it";
}

}  // namespace

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

bool is_tar_header(std::string_view h) {
  // "ustar\0" then version "00" (POSIX), or "ustar  \0" (GNU); a text could hold "ustar" at
  // byte 257, so the header's checksum must add up too: the octal number at 148..155 is the sum
  // of the block's 512 bytes with that field counted as spaces (unsigned, or signed by old tars).
  if (h.size() < 512 || h.substr(257, 5) != "ustar") return false;
  size_t i = 148;
  while (i < 156 && h[i] == ' ') ++i;
  int64_t stored = 0;
  int digits = 0;
  for (; i < 156 && h[i] >= '0' && h[i] <= '7'; ++i, ++digits) stored = stored * 8 + (h[i] - '0');
  if (digits == 0 || (i < 156 && h[i] != ' ' && h[i] != '\0')) return false;
  int64_t sum_unsigned = 0, sum_signed = 0;
  for (size_t j = 0; j < 512; ++j) {
    const char c = j >= 148 && j < 156 ? ' ' : h[j];
    sum_unsigned += static_cast<unsigned char>(c);
    sum_signed += static_cast<signed char>(c);
  }
  return stored == sum_unsigned || stored == sum_signed;
}

void refuse_unread_compression(const std::string& path, std::string_view head) {
  if (is_tar_header(head))
    throw UserError("'" + path + "' is a tar archive, not a data file: extract it (tar xf '" +
                    path + "') and give dtrain the files it holds");
  const std::string_view format = unread_compression(head);
  if (format.empty()) return;
  const std::string f(format);
  throw UserError("'" + path + "' is " + f + "-compressed, and dtrain reads gzip or uncompressed " +
                  "files only: " + decompress_how(f) + ", or recompress it with gzip");
}

void refuse_unread_inside_gzip(const std::string& path, std::string_view inflated) {
  using namespace std::string_view_literals;
  if (inflated.starts_with("\x1f\x8b\x08"sv))
    throw UserError("'" + path +
                    "' is gzip-compressed twice (its gzip data inflates to gzip-compressed data), "
                    "and dtrain decompresses once: gunzip it twice, or remove one layer (gunzip "
                    "-c '" +
                    path + "' > OUT, a gzip file dtrain reads)");
  if (is_tar_header(inflated))
    throw UserError("'" + path +
                    "' is a gzip-compressed tar archive (.tar.gz), not a data file: extract it "
                    "(tar xzf '" +
                    path + "') and give dtrain the files it holds");
  const std::string_view format = unread_compression(inflated);
  if (format.empty()) return;
  const std::string f(format);
  throw UserError("'" + path + "' holds " + f +
                  "-compressed data inside its gzip compression, and dtrain reads gzip or "
                  "uncompressed files only: gunzip it, then " +
                  decompress_how(f) + ", or recompress the data with gzip alone");
}

void refuse_unread_compression(const std::string& path) {
  std::FILE* in = std::fopen(path.c_str(), "rb");
  if (in == nullptr) return;
  char head[kFormatMagicBytes] = {};
  const size_t got = std::fread(head, 1, sizeof head, in);
  std::fclose(in);
  refuse_unread_compression(path, std::string_view(head, got));
  if (!is_gzip(std::string_view(head, got))) return;
  // A gzip file: what its contents start with (zlib reads them across members; a corrupt or
  // truncated file gives what it has, or nothing).
  gzFile g = gzopen(path.c_str(), "rb");
  if (g == nullptr) return;
  const int n = gzread(g, head, static_cast<unsigned>(sizeof head));
  gzclose(g);
  if (n > 0) refuse_unread_inside_gzip(path, std::string_view(head, static_cast<size_t>(n)));
}

}  // namespace dtrain
