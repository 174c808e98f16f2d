#pragma once
// Compression and archive formats dtrain recognises in data files. dtrain reads gzip (and
// uncompressed files); a file in another compression format, a gzip file whose contents are
// compressed again, or a tar archive would be read as its compressed or archived bytes -- as
// text tokens, silently, or as a CSV or IDX file with a misleading parse error -- so it is
// refused by name instead.
#include <string>
#include <string_view>

namespace dtrain {

// The bytes a file's first bytes must include for unread_compression to recognise every format.
inline constexpr size_t kCompressionMagicBytes = 10;
// The bytes refuse_unread_compression looks at (a tar header's 512: its "ustar" magic is at
// offset 257, its checksum covers the whole block).
inline constexpr size_t kFormatMagicBytes = 512;

// Whether `head` (a file's or a buffer's first bytes) starts with gzip's magic number, 1f 8b.
inline bool is_gzip(std::string_view head) {
  return head.size() >= 2 && static_cast<unsigned char>(head[0]) == 0x1f &&
         static_cast<unsigned char>(head[1]) == 0x8b;
}

// "xz", "bzip2", "zstd", "zip", "7z" or "lz4" when `head` (a file's first bytes, at least
// kCompressionMagicBytes of them when the file has that many) starts with that format's magic
// number, else "" (gzip and plain files included).
std::string_view unread_compression(std::string_view head);

// Whether `head` (a file's first bytes) starts with a tar header: the "ustar" magic at offset 257
// (POSIX and GNU tar) and a header checksum that adds up. False when head is shorter than 512.
bool is_tar_header(std::string_view head);

// Throws UserError naming `path`, its format and the remedy when unread_compression(head) names
// one, or when it is a tar archive. `head`: the file's first bytes (kFormatMagicBytes of them
// when the file has that many; fewer recognise the compression formats but not tar).
void refuse_unread_compression(const std::string& path, std::string_view head);

// The same for a gzip file's contents, `inflated` their first bytes (kFormatMagicBytes when they
// have that many): gzip-compressed again, compressed in another format, or a tar archive
// (.tar.gz). The message says the format is inside the gzip compression.
void refuse_unread_inside_gzip(const std::string& path, std::string_view inflated);

// Both for a file by its path: reads its first bytes and, when it is gzip, its contents' first
// bytes (a file that cannot be opened, read or inflated passes: its reader names that).
void refuse_unread_compression(const std::string& path);

}  // namespace dtrain
