#pragma once
// Compression formats dtrain recognises in data files. dtrain reads gzip (and uncompressed
// files); a file in another compression format would be read as its compressed bytes -- as text
// tokens, silently, or as a CSV or IDX file with a misleading parse error -- so it is refused
// by name instead.
#include <string>
#include <string_view>

namespace dtrain {

// The bytes a file's first bytes must include for unread_compression to recognise every format.
inline constexpr size_t kCompressionMagicBytes = 10;

// "xz", "bzip2", "zstd", "zip", "7z" or "lz4" when `head` (a file's first bytes, at least
// kCompressionMagicBytes of them when the file has that many) starts with that format's magic
// number, else "" (gzip and plain files included).
std::string_view unread_compression(std::string_view head);

// Throws UserError naming `path`, its format and the remedy when unread_compression(head) names
// one. `head`: the file's first bytes.
void refuse_unread_compression(const std::string& path, std::string_view head);

// The same for a file by its path: reads its first bytes (a file that cannot be opened or read
// passes: its reader names that).
void refuse_unread_compression(const std::string& path);

}  // namespace dtrain
