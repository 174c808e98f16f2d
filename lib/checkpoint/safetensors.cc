// safetensors writer and validating reader. The reader treats the file as untrusted input: every
// field is checked (types, ranges, overflow, layout) before any tensor buffer is allocated, and
// every problem is a UserError naming the file, never a crash or an out-of-range read.
#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <stdexcept>

#include <zlib.h>
#include <nlohmann/json.hpp>

#include "checkpoint/st_dtype.h"
#include "util/check.h"
#include "util/fs.h"
#include "util/json_limits.h"
#include "util/strings.h"

namespace dtrain {

// Tensor bytes are written and read as the host's floats.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes little endian");
static_assert(sizeof(float) == 4);

namespace {

constexpr uint64_t kMaxHeaderBytes = kStMaxHeaderBytes;
// A tensor's entry is ~9 values (its key, dtype, shape and offsets) in 60 or more bytes; text of
// "{}," spends 3 bytes a value and grows ~30-fold as a tree (util/json_limits.h). Two million
// values plus one per 5 bytes passes every header dtrain writes (a model of 46,000 layers wrote
// 2.07M values), and stops the header of empty objects that took 3.1 GB.
int64_t max_header_values(size_t header_bytes) {
  return 2'000'000 + static_cast<int64_t>(header_bytes / 5);
}
constexpr int kMaxJsonDepth = 16;  // a valid header nests 3 deep

int64_t checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    DT_CHECK_GE(d, 0);
    DT_CHECK(!__builtin_mul_overflow(n, d, &n));
  }
  return n;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw UserError("safetensors file '" + path + "': " + what);
}

// A non-negative JSON integer (nlohmann stores those as number_unsigned) that fits in int64.
bool as_index(const nlohmann::json& j, int64_t* out) {
  if (!j.is_number_unsigned()) return false;
  const uint64_t u = j.get<uint64_t>();
  if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
  *out = static_cast<int64_t>(u);
  return true;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Reads exactly len bytes at offset, or throws UserError (a short read means the file shrank
// since it was measured: treated as truncation).
void pread_all(int fd, void* dst, size_t len, int64_t offset, const std::string& path) {
  char* p = static_cast<char*>(dst);
  while (len > 0) {
    const ssize_t n = ::pread(fd, p, len, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path, std::string("read error: ") + std::strerror(errno));
    }
    if (n == 0) fail(path, "truncated (file shrank while reading)");
    p += n;
    len -= static_cast<size_t>(n);
    offset += n;
  }
}

// zlib's CRC-32 of n bytes (crc32_z takes a size_t length, so tensors over 4 GiB work).
uint32_t crc_of(const void* data, size_t n) {
  if (n == 0) return 0;  // the CRC-32 of no bytes
  return static_cast<uint32_t>(
      crc32_z(crc32_z(0L, Z_NULL, 0), static_cast<const Bytef*>(data), static_cast<z_size_t>(n)));
}

// CRC-32 of a header in canonical form: keys sorted (nlohmann::json's order), compact, without
// the kStHeaderCrcKey entry itself. Writer and reader both derive it from the parsed header, so
// it does not depend on the key order or spacing of the text.
uint32_t header_crc(nlohmann::json header) {
  if (auto m = header.find("__metadata__"); m != header.end() && m->is_object())
    m->erase(kStHeaderCrcKey);
  const std::string text = header.dump();
  return crc_of(text.data(), text.size());
}

std::string crc_hex(uint32_t crc) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

// Appends key: value to an ordered_json object whose keys the caller knows are new, in O(1):
// ordered_map's operator[] searches the keys before it inserts, so a header of 60,000 tensors
// took 31 s to build (99,900: 85 s).
void append_new_key(nlohmann::ordered_json& object, const std::string& key,
                    nlohmann::ordered_json value) {
  using Items = nlohmann::ordered_json::object_t::Container;
  static_cast<Items&>(object.get_ref<nlohmann::ordered_json::object_t&>())
      .emplace_back(key, std::move(value));
}

struct Entry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t begin = 0, end = 0;
};

// One tensor's header entry, validated: its dtype (F32, or with options.convert any the format
// defines), shape and byte range (its size agrees with the shape; the layout is checked later).
Entry parse_entry(const std::string& key, const nlohmann::json& value, const std::string& path,
                  const StReadOptions& options) {
  const std::string what = "tensor '" + shown_text(key, 200) + "'";
  if (!value.is_object()) fail(path, "corrupt header: " + what + " is not an object");
  const auto dtype = value.find("dtype");
  const auto shape = value.find("shape");
  const auto offsets = value.find("data_offsets");
  if (dtype == value.end() || shape == value.end() || offsets == value.end()) {
    fail(path, "corrupt header: " + what + " lacks dtype, shape or data_offsets");
  }
  if (!dtype->is_string()) fail(path, "corrupt header: " + what + " dtype is not a string");
  Entry e;
  e.name = key;
  e.dtype = dtype->get<std::string>();
  const int bytes = st_dtype_bytes(e.dtype);
  if (options.convert ? bytes == 0 : e.dtype != "F32") {
    fail(path, what + " has dtype " + shown_text(e.dtype) +
                   (options.convert ? ", which the safetensors format does not define"
                                    : "; only F32 is supported"));
  }
  if (!shape->is_array()) fail(path, "corrupt header: " + what + " shape is not a list");
  e.numel = 1;
  bool zero = false, overflow = false;
  for (const auto& d : *shape) {
    int64_t dim = 0;
    if (!as_index(d, &dim)) {
      fail(path, "corrupt header: " + what + " shape has a non-integer or negative entry");
    }
    e.shape.push_back(dim);
    zero = zero || dim == 0;
    overflow = overflow || __builtin_mul_overflow(e.numel, dim, &e.numel);
  }
  if (zero) {
    e.numel = 0;
  } else if (overflow || e.numel > std::numeric_limits<int64_t>::max() / 8) {
    // Only an overflow guard: a shape too large for the file is reported by the layout check
    // as "truncated", the likelier cause.
    fail(path, "corrupt header: " + what + " shape is impossibly large");
  }
  if (!offsets->is_array() || offsets->size() != 2 || !as_index((*offsets)[0], &e.begin) ||
      !as_index((*offsets)[1], &e.end) || e.begin > e.end) {
    fail(path, "corrupt header: " + what + " data_offsets is not [begin, end]");
  }
  if (e.end - e.begin != e.numel * bytes) {
    fail(path, "corrupt header: " + what + " data_offsets span " + std::to_string(e.end - e.begin) +
                   " bytes but its shape needs " + std::to_string(e.numel * bytes));
  }
  return e;
}

}  // namespace

std::string crc32_hex(const std::string& bytes) {
  return crc_hex(crc_of(bytes.data(), bytes.size()));
}

void write_safetensors(const std::string& path, const std::vector<StTensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata, Links links) {
  // Header first (it holds every offset), in the order given; the tensor bytes are then streamed
  // from the callers' buffers without an intermediate copy.
  // The checksums cost one extra pass over the bytes: zlib's crc32 runs at ~2 GB/s here, 0.1 s
  // per 200 MB tensor (README "Checkpoint integrity").
  std::set<std::string> seen;
  for (const auto& t : tensors) {
    DT_CHECK_MSG(t.name != "__metadata__", "reserved tensor name");
    DT_CHECK_MSG(seen.insert(t.name).second, "duplicate tensor name '" << t.name << "'");
  }
  nlohmann::ordered_json crcs = nlohmann::ordered_json::object();
  for (const auto& t : tensors) {
    const int64_t numel = checked_numel(t.shape);
    append_new_key(crcs, t.name, crc_hex(crc_of(t.data, static_cast<size_t>(numel) * 4)));
  }
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata)
      if (k != kStCrcKey) meta[k] = v;
    try {
      meta[kStCrcKey] = crcs.dump();
    } catch (const nlohmann::json::exception& e) {  // invalid UTF-8 in a tensor name
      throw UserError("cannot write safetensors file '" + path + "': " + e.what());
    }
    header["__metadata__"] = std::move(meta);
  }
  int64_t offset = 0;
  for (const auto& t : tensors) {
    const int64_t numel = checked_numel(t.shape);
    DT_CHECK_MSG(numel == 0 || t.data != nullptr, "tensor '" << t.name << "' has no data");
    const int64_t bytes = numel * 4;
    DT_CHECK_EQ(bytes / 4, numel);
    append_new_key(
        header, t.name,
        {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}});
    offset += bytes;
  }
  std::string text;
  try {
    // The header's own checksum (metadata such as step and batch, shapes, offsets), over its
    // canonical form: see header_crc.
    header["__metadata__"][kStHeaderCrcKey] = crc_hex(header_crc(nlohmann::json(header)));
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // invalid UTF-8 in a name or metadata value
    throw UserError("cannot write safetensors file '" + path + "': " + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_len = text.size();
  // (a file of a larger header would be refused by every reader: dtrain's own, Python's)
  if (header_len > kMaxHeaderBytes)
    throw UserError("cannot write safetensors file '" + path +
                    "': its header (names, shapes and metadata) would take " +
                    std::to_string(header_len) + " bytes, over the " +
                    std::to_string(kMaxHeaderBytes) + " that safetensors readers accept");

  write_file_atomic_with(
      path,
      [&](int fd) {
        unsigned char len_bytes[8];
        std::memcpy(len_bytes, &header_len, 8);
        write_all(fd, len_bytes, 8, path);
        write_all(fd, text.data(), text.size(), path);
        for (const auto& t : tensors) {
          const size_t bytes = static_cast<size_t>(checked_numel(t.shape)) * sizeof(float);
          if (bytes > 0) write_all(fd, t.data, bytes, path);
        }
      },
      links);
}

namespace {

[[noreturn]] void not_safetensors(const std::string& path, const std::string& why) {
  throw UserError("'" + path + "' is not a safetensors file (" + why + ")");
}

// Files written since the header checksum existed carry it; older ones load without it.
void verify_header_crc(const nlohmann::json& header, const std::string& path) {
  const auto m = header.find("__metadata__");
  if (m == header.end() || !m->is_object()) return;
  const auto c = m->find(kStHeaderCrcKey);
  if (c == m->end()) return;
  const std::string stored = c->is_string() ? c->get<std::string>() : c->dump();
  const std::string computed = crc_hex(header_crc(header));
  // (hex digits in either case: another tool may write them upper-case)
  if (ascii_lower(stored) != computed)
    fail(path, "corrupt header: it fails its CRC-32 check (stored " + stored + ", computed " +
                   computed + "): the file is corrupt");
}

// Steps 1 and 2 of reading: the header length field and the header JSON object. A file failing
// here does not begin as a safetensors file does (a YAML file's first 8 bytes read as a length
// of ~10^18), so the message says that first, then the detail. Sets *header_len.
nlohmann::json read_header(int fd, const std::string& path, uint64_t file_size,
                           uint64_t* header_len_out) {
  if (file_size < 8) {
    not_safetensors(path, "truncated: " + std::to_string(file_size) +
                              " bytes, shorter than the 8-byte header length field");
  }
  uint64_t header_len = 0;
  {
    unsigned char b[8];
    pread_all(fd, b, 8, 0, path);
    std::memcpy(&header_len, b, 8);
  }
  if (header_len > kMaxHeaderBytes) {
    not_safetensors(path, "corrupt header length " + std::to_string(header_len) +
                              " in its first 8 bytes, over the limit of " +
                              std::to_string(kMaxHeaderBytes));
  }
  if (header_len > file_size - 8) {
    not_safetensors(path, "truncated: header length " + std::to_string(header_len) + " but only " +
                              std::to_string(file_size - 8) + " bytes follow");
  }
  std::string text(header_len, '\0');
  pread_all(fd, text.data(), text.size(), 8, path);
  if (json_depth(text) > kMaxJsonDepth) fail(path, "corrupt header: JSON nested too deeply");
  nlohmann::json header;
  try {
    header = parse_limited_json(text, max_header_values(text.size()));
  } catch (const nlohmann::json::exception& e) {
    not_safetensors(path, "corrupt header: " + shown_text(json_error_text(e.what()), 300));
  } catch (const JsonLimitError& e) {
    fail(path, std::string("corrupt header: its JSON ") + e.what());
  }
  if (!header.is_object()) not_safetensors(path, "corrupt header: not a JSON object");
  verify_header_crc(header, path);
  *header_len_out = header_len;
  return header;
}

void read_metadata(const nlohmann::json& value, const std::string& path,
                   std::map<std::string, std::string>& out) {
  if (value.is_null()) return;
  if (!value.is_object()) fail(path, "corrupt header: __metadata__ is not an object");
  for (const auto& [mk, mv] : value.items()) {
    if (!mv.is_string())
      fail(path, "corrupt header: metadata value '" + shown_text(mk, 200) + "' is not a string");
    if (mk != kStHeaderCrcKey) out[mk] = mv.get<std::string>();  // verified by read_header
  }
}

// The checksums of a "crc32" metadata value, by tensor name; fail()s when it is malformed.
std::map<std::string, uint32_t> parse_crcs(const std::string& value, const std::string& path) {
  const std::string bad = "corrupt header: metadata 'crc32' ";
  if (json_depth(value) > kMaxJsonDepth) fail(path, bad + "is nested too deeply");
  nlohmann::json j;
  try {
    j = parse_limited_json(value, max_header_values(value.size()));
  } catch (const nlohmann::json::exception&) {
    fail(path, bad + "is not JSON");
  } catch (const JsonLimitError& e) {
    fail(path, bad + e.what());
  }
  if (!j.is_object()) fail(path, bad + "is not an object");
  std::map<std::string, uint32_t> out;
  for (const auto& [name, v] : j.items()) {
    const std::string hex = v.is_string() ? v.get<std::string>() : "";
    if (hex.size() != 8 || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
      fail(path, bad + "entry '" + shown_text(name, 200) + "' is not 8 hex digits");
    out[name] = static_cast<uint32_t>(std::stoul(hex, nullptr, 16));
  }
  return out;
}

// The open file and its size; UserError when it cannot be opened or is not a regular file.
Fd open_regular(const std::string& path, uint64_t* size) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below); it changes
  // nothing for a regular file's reads.
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) {
    throw UserError("cannot open safetensors file '" + path + "': " + std::strerror(errno));
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) fail(path, std::string("stat failed: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

}  // namespace

std::map<std::string, std::string> read_safetensors_metadata(const std::string& path) {
  uint64_t file_size = 0, header_len = 0;
  const Fd fd = open_regular(path, &file_size);
  const nlohmann::json header = read_header(fd.get(), path, file_size, &header_len);
  std::map<std::string, std::string> out;
  if (const auto it = header.find("__metadata__"); it != header.end())
    read_metadata(*it, path, out);
  out.erase(kStCrcKey);
  return out;
}

std::string read_safetensors_header_crc(const std::string& path) {
  uint64_t file_size = 0, header_len = 0;
  const Fd fd = open_regular(path, &file_size);
  const nlohmann::json header = read_header(fd.get(), path, file_size, &header_len);
  const auto m = header.find("__metadata__");
  if (m == header.end() || !m->is_object()) return "";
  const auto c = m->find(kStHeaderCrcKey);
  return c != m->end() && c->is_string() ? c->get<std::string>() : "";
}

std::optional<std::vector<int64_t>> read_safetensors_shape(const std::string& path,
                                                           const std::string& name) {
  uint64_t file_size = 0, header_len = 0;
  const Fd fd = open_regular(path, &file_size);
  const nlohmann::json header = read_header(fd.get(), path, file_size, &header_len);
  const auto t = header.find(name);
  if (name == "__metadata__" || t == header.end() || !t->is_object()) return std::nullopt;
  const auto shape = t->find("shape");
  if (shape == t->end() || !shape->is_array()) return std::nullopt;
  std::vector<int64_t> out;
  for (const nlohmann::json& d : *shape) {
    if (!d.is_number_integer()) return std::nullopt;
    out.push_back(d.get<int64_t>());
  }
  return out;
}

StFile read_safetensors(const std::string& path, const StReadOptions& options) {
  uint64_t file_size = 0, header_len = 0;
  const Fd fd = open_regular(path, &file_size);
  const nlohmann::json header = read_header(fd.get(), path, file_size, &header_len);
  const int64_t data_start = 8 + static_cast<int64_t>(header_len);
  const int64_t data_size = static_cast<int64_t>(file_size) - data_start;

  // 3. Entries: types, ranges, sizes.
  StFile out;
  std::vector<Entry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      read_metadata(value, path, out.metadata);
      continue;
    }
    entries.push_back(parse_entry(key, value, path, options));
  }
  std::map<std::string, uint32_t> crcs;
  if (const auto it = out.metadata.find(kStCrcKey); it != out.metadata.end()) {
    crcs = parse_crcs(it->second, path);
    out.metadata.erase(it);
    out.checksummed = true;
    const auto meta = header.find("__metadata__");  // read_header verified the CRC it found
    out.header_checksummed = meta != header.end() && meta->contains(kStHeaderCrcKey);
    for (const auto& e : entries)
      if (!crcs.count(e.name))
        fail(path, "corrupt header: no CRC-32 for tensor '" + shown_text(e.name, 200) + "'");
    if (crcs.size() != entries.size()) {
      for (const auto& [name, c] : crcs)
        if (!header.contains(name) || name == "__metadata__")
          fail(path,
               "corrupt header: a CRC-32 for tensor '" + name + "', which is not in the file");
    }
  }

  // 4. Layout: the tensors tile [0, end) without gaps or overlap, and end is the data size.
  std::vector<const Entry*> order;
  for (const auto& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  int64_t pos = 0;
  for (const Entry* e : order) {
    if (e->begin != pos) {
      fail(path, "corrupt header: tensor '" + shown_text(e->name, 200) + "' data_offsets [" +
                     std::to_string(e->begin) + ", " + std::to_string(e->end) + "] " +
                     (e->begin < pos ? "overlap another tensor" : "leave a gap before it"));
    }
    pos = e->end;
  }
  if (pos > data_size) {
    fail(path, "truncated: tensors need " + std::to_string(pos) + " data bytes, file has " +
                   std::to_string(data_size));
  }
  if (pos < data_size) {
    fail(path,
         "corrupt: " + std::to_string(data_size - pos) + " trailing bytes after the last tensor");
  }

  // 5. Data: everything above is validated; the allocation is at most the data section's size
  // (twice that for F16 and BF16 converted to float32), plus one converted tensor's bytes.
  std::vector<unsigned char> raw;
  for (const auto& e : entries) {
    StTensor t;
    t.shape = e.shape;
    t.dtype = e.dtype;
    t.loaded = st_dtype_converts(e.dtype) && (!options.wanted || options.wanted(e.name));
    if (!t.loaded) {
      out.tensors.emplace(e.name, std::move(t));
      continue;
    }
    t.data.resize(static_cast<size_t>(e.numel));
    const size_t bytes = static_cast<size_t>(e.end - e.begin);
    const bool f32 = e.dtype == "F32";
    if (!f32) raw.resize(bytes);
    void* dst = f32 ? static_cast<void*>(t.data.data()) : raw.data();
    if (bytes > 0) pread_all(fd.get(), dst, bytes, data_start + e.begin, path);
    if (out.checksummed) {
      const uint32_t stored = crcs.at(e.name);
      const uint32_t computed = crc_of(dst, bytes);
      if (stored != computed)
        fail(path, "tensor '" + shown_text(e.name, 200) + "' fails its CRC-32 check (stored " +
                       crc_hex(stored) + ", computed " + crc_hex(computed) +
                       "): the file is corrupt");
    }
    if (!f32) st_to_f32(e.dtype, raw.data(), t.data.size(), t.data.data());
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

}  // namespace dtrain
