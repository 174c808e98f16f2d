// Whole-file reads with in-memory gunzip (zlib), and the IDX (MNIST / Fashion-MNIST) loader.
// Only unsigned-byte IDX files are supported: 3-D images (magic 0x00000803, N x rows x cols) and
// 1-D labels (magic 0x00000801, N). Header sizes are checked against the real byte count before
// anything is allocated.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "data/compression.h"
#include "data/dataset.h"
#include "util/check.h"
#include "util/fs.h"

namespace dtrain {

namespace fs = std::filesystem;
namespace {

// The bytes this process may allocate for a file's contents (available memory, or ulimit -v),
// SIZE_MAX when unknown.
size_t allocation_budget() {
  const int64_t avail = available_memory_bytes();
  return avail < 0 ? SIZE_MAX : static_cast<size_t>(avail);
}

// Asks Linux to back [p, p + bytes) with transparent huge pages before it is first touched. On
// VMs the first touch of every 4 KiB page is costly: the 180 MiB Fashion-MNIST feature matrix took
// ~0.5 s in page faults alone, ~20 ms with 2 MiB pages. Best effort; a no-op where unsupported.
void advise_huge_pages(const void* p, size_t bytes) {
#ifdef MADV_HUGEPAGE
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const auto begin = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const auto end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

// Resizes an empty buffer to `n` elements, advising huge pages before the zero-fill touches it.
template <typename Buffer>
void resize_fresh(Buffer& buf, size_t n) {
  buf.reserve(n);
  advise_huge_pages(buf.data(), n * sizeof(buf[0]));
  buf.resize(n);
}

// Reads `fd` to its end, named `path` in messages. Sized by fstat (util::read_file streams
// through an ostringstream, which is several times slower on the 26 MB Fashion-MNIST file).
// `too_long`: what to throw once more than `max_bytes` have come from a stream (a file's size is
// checked before reading).
std::string read_whole_fd(int fd, const std::string& path, size_t max_bytes = SIZE_MAX,
                          const std::function<UserError()>& too_long = {}) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw UserError("cannot read '" + path + "': " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw UserError("cannot read '" + path + "': it is a directory");
  std::string out;
  resize_fresh(out, S_ISREG(st.st_mode) ? static_cast<size_t>(st.st_size) : 0);
  auto read_some = [&](char* dst, size_t cap) -> size_t {
    for (;;) {
      const ssize_t n = ::read(fd, dst, cap);
      if (n >= 0) return static_cast<size_t>(n);
      if (errno != EINTR) throw UserError("error reading '" + path + "': " + std::strerror(errno));
    }
  };
  size_t len = 0;
  for (;;) {
    if (len < out.size()) {
      const size_t n = read_some(out.data() + len, out.size() - len);
      if (n == 0) break;
      len += n;
    } else {  // at the expected size (or not a regular file): probe for more without growing
      char chunk[65536];
      const size_t n = read_some(chunk, sizeof chunk);
      if (n == 0) break;
      out.append(chunk, n);
      len += n;
      if (len > max_bytes) throw too_long();
    }
  }
  out.resize(len);
  return out;
}

std::string read_whole_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw UserError("cannot read '" + path + "': " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  return read_whole_fd(fd, path);
}

// Inflates every gzip member of `in` (gzip allows concatenated members; zero padding after the
// last member is tolerated like gzip(1) does). Anything else is a UserError naming `path`.
// max_out: as soon as the output exceeds it (an IDX header's size, what can be allocated), it
// stops with UserError(over_limit()); the output buffer never grows past max_out + 1 bytes.
// count: when given, the output is only counted there (a 1-MiB buffer, overwritten) and ""
// returned: the same checks and messages, without holding the contents.
// expect: the size the caller's format says the output has (an IDX header's), 0 when unknown;
// when the gzip trailer agrees with it, the buffer is sized to it at once (growing it by copies
// held the old and the new buffer at once: 4 GB for a 2.4 GB file).
std::string gunzip(const std::string& in, const std::string& path, size_t max_out,
                   const std::function<std::string()>& over_limit, int64_t* count = nullptr,
                   size_t expect = 0) {
  const size_t cap = count != nullptr      ? size_t{1} << 20
                     : max_out == SIZE_MAX ? SIZE_MAX
                                           : max_out + 1;  // the output buffer's
  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) throw std::bad_alloc();
  struct Guard {
    z_stream* z;
    ~Guard() { inflateEnd(z); }
  } guard{&zs};

  // The trailer's ISIZE (uncompressed size mod 2^32) is only a capacity hint, trusted up to 16
  // times the file plus 64 MiB (text and IDX images inflate 2-5x): beyond that the buffer grows
  // by doubling as the data really comes, so a lying trailer costs no more than that (it once
  // zero-filled deflate's maximum ratio, ~1032x: 1 GB for a 1 MiB file).
  // Past 1 GiB the buffer grows by half rather than doubling: a file of 4 GiB or more (whose
  // trailer holds its length mod 4 GiB, and a multi-member file's only its last member's)
  // overshot by up to 2x, and its copy held 3x the text.
  std::string out;
  {
    size_t hint = 0;
    if (in.size() >= 18) {
      const auto* t = reinterpret_cast<const unsigned char*>(in.data() + in.size() - 4);
      hint = static_cast<size_t>(t[0]) | static_cast<size_t>(t[1]) << 8 |
             static_cast<size_t>(t[2]) << 16 | static_cast<size_t>(t[3]) << 24;
    }
    // (agreeing, the two are still bounded by deflate's largest ratio, 1032:1: a file cannot
    // hold more, whatever header and trailer both claim)
    const bool agreed = expect > 0 && hint == (expect & 0xffffffffu);
    const size_t trusted = agreed ? in.size() * 1032 + 4096 : in.size() * 16 + (size_t{64} << 20);
    hint = std::min({agreed ? expect : hint, trusted, cap});
    resize_fresh(out, std::max<size_t>(hint, 4096));
  }

  size_t in_pos = 0;   // bytes of `in` handed to zlib so far
  size_t out_len = 0;  // bytes of `out` produced so far
  const auto grown = [&] {
    const size_t size = out.size();
    const size_t next = size >= (size_t{1} << 30) ? size + size / 2 : size * 2;
    return std::max(out_len + 1, std::min(next, cap));
  };
  auto feed = [&] {
    const size_t n = std::min<size_t>(in.size() - in_pos, UINT_MAX);
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data() + in_pos));
    zs.avail_in = static_cast<uInt>(n);
    in_pos += n;
  };
  feed();
  for (;;) {
    if (zs.avail_in == 0 && in_pos < in.size()) feed();
    // One byte over max_out is enough to know the limit is broken.
    if (out_len == out.size()) {
      // Into a fresh string of exactly that size: std::string's own growth at least doubles its
      // capacity, whatever size is asked.
      std::string bigger;
      resize_fresh(bigger, grown());
      std::memcpy(bigger.data(), out.data(), out_len);
      out.swap(bigger);
    }
    const size_t room = std::min<size_t>(out.size() - out_len, UINT_MAX);
    zs.next_out = reinterpret_cast<Bytef*>(out.data() + out_len);
    zs.avail_out = static_cast<uInt>(room);
    const int ret = inflate(&zs, Z_NO_FLUSH);
    out_len += room - zs.avail_out;
    if (count != nullptr) {  // (counted, and the buffer written over)
      *count += static_cast<int64_t>(out_len);
      out_len = 0;
      if (static_cast<uint64_t>(*count) > max_out) throw UserError(over_limit());
    }
    if (out_len > max_out) throw UserError(over_limit());
    if (ret == Z_STREAM_END) {
      const size_t consumed = in_pos - zs.avail_in;
      if (consumed == in.size()) break;
      if (is_gzip(std::string_view(in).substr(consumed))) {
        inflateReset(&zs);
        continue;
      }
      if (std::all_of(in.begin() + static_cast<std::ptrdiff_t>(consumed), in.end(),
                      [](char c) { return c == 0; })) {
        break;
      }
      throw UserError("corrupt gzip file '" + path +
                      "': trailing garbage after the compressed data");
    }
    if (ret == Z_OK) continue;
    if (ret == Z_BUF_ERROR) {
      if (zs.avail_in == 0 && in_pos == in.size()) {
        throw UserError("truncated gzip file '" + path + "': unexpected end of compressed data");
      }
      continue;  // no room in the output: grown at the top of the loop
    }
    if (ret == Z_MEM_ERROR) throw std::bad_alloc();
    throw UserError("corrupt gzip file '" + path +
                    "': " + (zs.msg != nullptr ? zs.msg : "invalid compressed data"));
  }
  out.resize(out_len);
  return out;
}

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;

uint32_t read_be32(const std::string& s, size_t pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data() + pos);
  return static_cast<uint32_t>(p[0]) << 24 | static_cast<uint32_t>(p[1]) << 16 |
         static_cast<uint32_t>(p[2]) << 8 | static_cast<uint32_t>(p[3]);
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

struct IdxFile {
  std::string bytes;           // whole (decompressed) file
  std::vector<uint64_t> dims;  // from the header
  size_t data_offset = 0;      // first payload byte
};

// The total size an IDX file's header promises (header + product of dims), read from its first
// bytes only (gzip or not); SIZE_MAX when they cannot tell (too short, another magic, a product
// past 2^40): read_idx's checks of the whole file then name the problem.
struct Promise {
  size_t total = SIZE_MAX;
  std::string shape;           // "100x2x3"
  bool gzip = false;           // the file is gzip-compressed (zlib's gzdirect, known after a read)
  int got = 0;                 // header bytes read (the whole header: 4 + 4 dims); -1: not opened
  uint32_t magic = 0;          // the first 4 bytes, when got >= 4
  bool huge = false;           // the dims multiply past 2^40
  std::vector<uint64_t> dims;  // the header's dims, when it is whole and of the right kind
};
Promise idx_promised_size(const std::string& path, uint32_t magic) {
  const size_t ndims = magic & 0xff, head_len = 4 + 4 * ndims;
  gzFile g = gzopen(path.c_str(), "rb");  // reads a file without the gzip magic as it is
  if (g == nullptr) {                     // (the reader names what cannot be opened)
    Promise none;
    none.got = -1;
    return none;
  }
  std::string head(head_len, '\0');
  const int got = gzread(g, head.data(), static_cast<unsigned>(head_len));
  Promise p;
  p.gzip = gzdirect(g) == 0;
  p.got = got;
  gzclose(g);
  if (got >= 4) p.magic = read_be32(head, 0);
  if (got != static_cast<int>(head_len) || p.magic != magic) return p;  // total unknown
  uint64_t product = 1;
  for (size_t i = 0; i < ndims; ++i) {
    const uint64_t d = read_be32(head, 4 + 4 * i);
    p.dims.push_back(d);
    if (i > 0) p.shape.push_back('x');
    p.shape.append(std::to_string(d));
    product *= d;
    if (product > (uint64_t{1} << 40)) p.huge = true;  // (each d < 2^32: no overflow first)
  }
  if (p.huge) return p;  // total unknown
  p.total = static_cast<size_t>(head_len + product);
  return p;
}

UserError bad_magic(const std::string& path, uint32_t got, uint32_t magic, const char* what) {
  // A valid IDX header of another type or rank (0x00 0x00, type, dims) is named as such, not
  // as a corrupt file: dtrain reads unsigned bytes (0x08) of 3 dims (images) or 1 (labels).
  static const std::pair<uint32_t, const char*> kTypes[] = {
      {0x08, "unsigned byte"}, {0x09, "signed byte"}, {0x0B, "short"},
      {0x0C, "int"},           {0x0D, "float"},       {0x0E, "double"}};
  const uint32_t dims = got & 0xff, type = (got >> 8) & 0xff;
  const bool ours = type == 0x08 && (dims == 1 || dims == 3);  // (labels and images swapped)
  if ((got >> 16) == 0 && dims >= 1 && !ours)
    for (const auto& [code, name] : kTypes)
      if (type == code)
        return UserError(fmt::format(
            "IDX file '{}' holds {} values of {} dimension(s) (magic {}); dtrain reads "
            "unsigned-byte {} of {} dimension(s) (magic {}): convert it, or use data.format "
            "csv",
            path, name, dims, hex32(got), what, magic & 0xff, hex32(magic)));
  return UserError("bad IDX magic " + hex32(got) + " in '" + path + "': expected " + hex32(magic) +
                   " (unsigned-byte " + what + ")");
}

// What the header's first bytes and the file's size already tell, refused before the file is
// read or inflated (an 8 MB gzip of zeros inflated to 2 GB before its magic was looked at):
// for any file a wrong magic or a shape past 2^40 bytes; for a plain file also a file too short
// for its header, or a shape its size does not hold. (A file that cannot be opened is left to
// the reader, which says why.)
void check_promise(const std::string& path, const Promise& p, uint32_t magic, const char* what) {
  const size_t head_len = 4 + 4 * (magic & 0xff);
  if (p.got >= 4 && p.magic != magic) throw bad_magic(path, p.magic, magic, what);
  if (p.huge)
    throw UserError("IDX file '" + path + "' size mismatch: header says " + p.shape +
                    ", more than 2^40 bytes of data, which no file here holds");
  if (p.got < 0 || p.gzip) return;  // (gzip: its size is known once inflated)
  if (p.got < 4)
    throw UserError("IDX " + std::string(what) + " file '" + path + "' is too short (" +
                    std::to_string(p.got) + " bytes) to hold a header");
  if (static_cast<size_t>(p.got) < head_len)
    throw UserError("IDX file '" + path + "' is truncated: the header needs " +
                    std::to_string(head_len) + " bytes, the file has " + std::to_string(p.got));
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (!ec && p.total != SIZE_MAX && size != p.total)
    throw UserError("IDX file '" + path + "' size mismatch: header says " + p.shape + " (" +
                    std::to_string(p.total) + " bytes with the header) but the file has " +
                    std::to_string(size) + " bytes");
}

// Images of 0 pixels, which no model can be built for.
void check_idx_pixels(const std::string& images_path, uint64_t rows, uint64_t cols) {
  if (rows == 0 || cols == 0)
    throw UserError("IDX images file '" + images_path + "' has images of 0 pixels (" +
                    std::to_string(rows) + "x" + std::to_string(cols) + ")");
  // (each count < 2^32: the product fits in 64 bits) BLAS takes a GEMM's sizes as 32-bit ints,
  // and `dtrain validate` skipped its model checks for such images and said "ok".
  if (rows * cols > static_cast<uint64_t>(INT32_MAX))
    throw UserError("IDX images file '" + images_path + "' has images of " + std::to_string(rows) +
                    "x" + std::to_string(cols) + " pixels, " + std::to_string(rows * cols) +
                    " each: more than dtrain takes in one sample (2147483647; its matrix products "
                    "count in 32-bit integers)");
}

// load_idx's refusals of an images header's counts: no images, or images of 0 pixels.
void check_idx_images(const std::string& images_path, uint64_t n, uint64_t rows, uint64_t cols) {
  if (n == 0) throw UserError("empty data set: IDX images file '" + images_path + "' has 0 images");
  check_idx_pixels(images_path, rows, cols);
}

// Whether this process can hold an images file whose header is `img` (whole, 3 dims) as load_idx
// reads it: the file's bytes (inflated) and the float32 inputs, 4 per pixel, at once. A small
// .gz claiming millions of images otherwise ran out of memory in the middle of the read, said as
// a bare out-of-memory; validate says it from the header too.
void check_idx_fits(const std::string& images_path, const Promise& img) {
  const size_t budget = allocation_budget();
  if (budget == SIZE_MAX || img.dims.size() != 3 || img.total == SIZE_MAX) return;
  const double pixels = static_cast<double>(img.dims[0]) * static_cast<double>(img.dims[1]) *
                        static_cast<double>(img.dims[2]);
  const double need = static_cast<double>(img.total) + pixels * sizeof(float);
  if (need <= static_cast<double>(budget)) return;
  constexpr double kMiB = 1024.0 * 1024.0;
  throw UserError(fmt::format(
      "cannot load IDX images file '{}': its {} images of {}x{} pixels need {:.0f} MiB read and "
      "{:.0f} MiB as float32 inputs, more than the {:.0f} MiB this process can allocate "
      "(available memory, or the address-space limit ulimit -v); use fewer images or free memory",
      images_path, img.dims[0], img.dims[1], img.dims[2], static_cast<double>(img.total) / kMiB,
      pixels * sizeof(float) / kMiB, static_cast<double>(budget) / kMiB));
}

// load_idx's refusal of a labels file whose count is not the images file's.
void check_idx_label_count(const std::string& images_path, uint64_t n,
                           const std::string& labels_path, uint64_t labels) {
  if (labels != n)
    throw UserError("IDX images file '" + images_path + "' has " + std::to_string(n) +
                    " images but labels file '" + labels_path + "' has " + std::to_string(labels) +
                    " labels");
}

// Reads and validates an IDX file: magic, header length and payload size == product of dims.
// A header whose size disagrees with the file is caught before the file is read: from the file
// size (uncompressed), or as soon as inflating passes the promised size (gzip).
IdxFile read_idx(const std::string& path, uint32_t magic, const char* what) {
  refuse_unread_compression(path);  // (before its bytes are read as an IDX header)
  IdxFile f;
  const Promise promise = idx_promised_size(path, magic);
  const size_t promised = promise.total;
  check_promise(path, promise, magic, what);
  if (magic == kImagesMagic) check_idx_fits(path, promise);
  {
    const bool gz = promise.gzip;
    // Inflating stops at the header's size, and at what this process can allocate.
    const size_t budget = allocation_budget();
    const size_t cap = std::min(promised, budget);
    f.bytes = gz ? gunzip(
                       read_whole_file(path), path, cap,
                       [&] {
                         if (cap < promised)
                           return fmt::format(
                               "cannot read IDX file '{}': it inflates to more than the {:.0f} "
                               "MiB this process can allocate (header: {})",
                               path, static_cast<double>(budget) / (1024.0 * 1024.0),
                               promise.shape.empty() ? "unread" : promise.shape);
                         return "IDX file '" + path + "' size mismatch: header says " +
                                promise.shape + " (" + std::to_string(promised) +
                                " bytes with the header) but the compressed data holds more";
                       },
                       // (an images header is held to the budget, check_idx_fits; a labels
                       // count is not, so its claim sizes no buffer)
                       nullptr, magic == kImagesMagic ? promised : 0)
                 : read_whole_file(path);
  }
  const std::string& b = f.bytes;
  if (b.size() < 4) {
    throw UserError("IDX " + std::string(what) + " file '" + path + "' is too short (" +
                    std::to_string(b.size()) + " bytes) to hold a header");
  }
  if (const uint32_t got = read_be32(b, 0); got != magic) throw bad_magic(path, got, magic, what);
  const size_t ndims = magic & 0xff;
  f.data_offset = 4 + 4 * ndims;
  if (b.size() < f.data_offset) {
    throw UserError("IDX file '" + path + "' is truncated: the header needs " +
                    std::to_string(f.data_offset) + " bytes, the file has " +
                    std::to_string(b.size()));
  }
  const uint64_t payload = b.size() - f.data_offset;
  std::string shape;
  bool any_zero = false;
  for (size_t i = 0; i < ndims; ++i) {
    const uint64_t d = read_be32(b, 4 + 4 * i);
    f.dims.push_back(d);
    any_zero = any_zero || d == 0;
    if (i > 0) shape += 'x';
    shape += std::to_string(d);
  }
  // The header's data size (dims are below 2^32 each: at most 255 of them overflow 64 bits, which
  // the message then says instead of a number).
  uint64_t product = any_zero ? 0 : 1;
  bool overflow = false;
  for (size_t i = 0; i < ndims && !any_zero && !overflow; ++i)
    overflow = __builtin_mul_overflow(product, f.dims[i], &product);
  if (overflow || product != payload) {
    throw UserError("IDX file '" + path + "' size mismatch: header says " + shape + " (" +
                    (overflow ? std::string("over 2^64") : std::to_string(product)) +
                    " bytes of data) but the file has " + std::to_string(payload) +
                    " bytes after the header");
  }
  return f;
}

// "cannot read PATH: WHAT more than the N MiB this process can allocate ...".
std::string too_big(const std::string& path, size_t budget, const std::string& what) {
  constexpr double kMiB = 1024.0 * 1024.0;
  return fmt::format(
      "cannot read '{}': {} more than the {:.0f} MiB this process can allocate (available "
      "memory, or the address-space limit ulimit -v); use a smaller file or free memory",
      path, what, static_cast<double>(budget) / kMiB);
}

// read_maybe_gzip's contents of `bytes` (read whole from `path`): as they are, or inflated.
std::string gunzip_if_gzip(std::string bytes, const std::string& path, size_t budget) {
  if (!is_gzip(bytes)) {
    refuse_unread_compression(path, std::string_view(bytes).substr(0, kFormatMagicBytes));
    return bytes;
  }
  const size_t left = budget == SIZE_MAX ? SIZE_MAX : budget - std::min(budget, bytes.size());
  auto over = [&] {
    return too_big(path, budget, fmt::format("its {} compressed bytes inflate to", bytes.size()));
  };
  try {
    std::string out = gunzip(bytes, path, left, over);
    // (gzip inside gzip, xz inside gzip, a .tar.gz: refused, not read as their packed bytes)
    refuse_unread_inside_gzip(path, std::string_view(out).substr(0, kFormatMagicBytes));
    return out;
  } catch (const std::bad_alloc&) {  // the budget is an estimate; the allocator has the last word
    // The buffer is gone: count what the file inflates to, streamed, to say which it was -- more
    // than the budget (over(), at once when the count passes it), or a size that fits it but
    // whose buffer could not be had (its growth holds the old and the new copy at once).
    int64_t n = 0;
    gunzip(bytes, path, left, over, &n);
    constexpr double kMiB = 1024.0 * 1024.0;
    throw UserError(fmt::format(
        "cannot read '{}': its {} compressed bytes inflate to {} bytes, which this process could "
        "not hold ({}available memory, or the address-space limit ulimit -v, with the copies "
        "reading takes); use a smaller file or free memory",
        path, bytes.size(), n,
        budget == SIZE_MAX
            ? std::string()
            : fmt::format("{:.0f} MiB by its estimate: ", static_cast<double>(budget) / kMiB)));
  }
}

}  // namespace

std::string read_maybe_gzip(const std::string& path) {
  // What this process can allocate bounds the file (checked from its size, before reading) and
  // its decompressed contents (checked while inflating): a file past it is a clear user error,
  // not a std::bad_alloc from somewhere in the reader.
  const size_t budget = allocation_budget();
  std::error_code ec;
  if (const auto size = fs::file_size(path, ec); !ec && size > budget)
    throw UserError(too_big(path, budget, fmt::format("its {} bytes are", size)));
  return gunzip_if_gzip(read_whole_file(path), path, budget);
}

std::string read_stdin_maybe_gzip(const std::string& name) {
  // A stream has no size to check before reading (`yes 1,2 | ...`, /dev/zero): it may fill a
  // quarter of what this process can allocate, the rest being for its rows parsed and predicted.
  const size_t budget = allocation_budget();
  return gunzip_if_gzip(
      read_whole_fd(STDIN_FILENO, name, budget / 4,
                    [&] {
                      return UserError(too_big(
                          name, budget,
                          fmt::format("its first {} bytes, with the rows they hold parsed and "
                                      "predicted, are",
                                      budget / 4 + 1)));
                    }),
      name, budget);
}

int64_t size_once_read(const std::string& bytes, const std::string& path) {
  if (!is_gzip(bytes)) return static_cast<int64_t>(bytes.size());
  int64_t n = 0;
  gunzip(
      bytes, path, SIZE_MAX, [] { return std::string(); }, &n);
  return n;
}

int64_t idx_label_count(const std::string& labels_path) {
  // gzread reads a file without the gzip magic as it is.
  gzFile f = gzopen(labels_path.c_str(), "rb");
  if (f == nullptr) return -1;
  std::string head(8, '\0');
  const int got = gzread(f, head.data(), 8);
  gzclose(f);
  if (got != 8 || read_be32(head, 0) != kLabelsMagic) return -1;
  return static_cast<int64_t>(read_be32(head, 4));
}

int64_t idx_label_classes(const std::string& labels_path) {
  const IdxFile lab = read_idx(labels_path, kLabelsMagic, "labels");
  int64_t classes = 0;
  for (size_t i = lab.data_offset; i < lab.bytes.size(); ++i)
    classes = std::max<int64_t>(classes, static_cast<unsigned char>(lab.bytes[i]) + 1);
  return classes;
}

void check_idx_headers(const std::string& images_path, const std::string& labels_path) {
  refuse_unread_compression(images_path);
  refuse_unread_compression(labels_path);
  const Promise img = idx_promised_size(images_path, kImagesMagic);
  check_promise(images_path, img, kImagesMagic, "images");
  const Promise lab = idx_promised_size(labels_path, kLabelsMagic);
  check_promise(labels_path, lab, kLabelsMagic, "labels");
  // The counts, as load_idx refuses them, where the headers are whole.
  if (img.dims.size() != 3) return;
  check_idx_images(images_path, img.dims[0], img.dims[1], img.dims[2]);
  check_idx_fits(images_path, img);
  if (lab.dims.size() == 1)
    check_idx_label_count(images_path, img.dims[0], labels_path, lab.dims[0]);
}

void check_idx_test_shape(const std::string& train_images, const std::string& test_images) {
  const Shape train = idx_image_shape(train_images), test = idx_image_shape(test_images);
  if (train.empty() || test.empty()) return;  // (unreadable: the loader says what is wrong)
  const auto pixels = [](const Shape& s) { return s[1] * s[2]; };
  const auto shown = [](const Shape& s) {
    return "[" + std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " + std::to_string(s[2]) +
           "]";
  };
  // The messages of the loader's checks (data/dataset.cc), in its order.
  if (pixels(test) != pixels(train))
    throw UserError("test set '" + test_images + "' has " + std::to_string(pixels(test)) +
                    " features but the training set has " + std::to_string(pixels(train)));
  if (test != train)
    throw UserError("test images '" + test_images + "' are " + shown(test) +
                    ", the training images " + shown(train));
}

Shape idx_image_shape(const std::string& images_path) {
  gzFile f = gzopen(images_path.c_str(), "rb");  // reads a file without the gzip magic as it is
  if (f == nullptr) return {};
  std::string head(16, '\0');
  const int got = gzread(f, head.data(), 16);
  gzclose(f);
  if (got != 16 || read_be32(head, 0) != kImagesMagic) return {};
  const uint64_t rows = read_be32(head, 8), cols = read_be32(head, 12);
  // As load_idx refuses it (a model cannot be built for it).
  check_idx_pixels(images_path, rows, cols);
  return {1, static_cast<int64_t>(rows), static_cast<int64_t>(cols)};
}

Dataset load_idx(const std::string& images_path, const std::string& labels_path) {
  const IdxFile img = read_idx(images_path, kImagesMagic, "images");
  const uint64_t n = img.dims[0];
  const uint64_t features = img.dims[1] * img.dims[2];  // <= payload, checked by read_idx
  check_idx_images(images_path, n, img.dims[1], img.dims[2]);
  const IdxFile lab = read_idx(labels_path, kLabelsMagic, "labels");
  check_idx_label_count(images_path, n, labels_path, lab.dims[0]);

  Dataset d;
  d.rows = static_cast<int64_t>(n);
  d.features = static_cast<int64_t>(features);
  d.sample = {1, static_cast<int64_t>(img.dims[1]), static_cast<int64_t>(img.dims[2])};
  resize_fresh(d.x, n * features);
  const auto* px = reinterpret_cast<const unsigned char*>(img.bytes.data() + img.data_offset);
  float* out = d.x.data();
  for (size_t i = 0, e = d.x.size(); i < e; ++i) out[i] = static_cast<float>(px[i]);
  d.y.resize(n);
  const auto* py = reinterpret_cast<const unsigned char*>(lab.bytes.data() + lab.data_offset);
  int32_t max_label = 0;
  for (size_t i = 0; i < n; ++i) {
    d.y[i] = py[i];
    max_label = std::max<int32_t>(max_label, py[i]);
  }
  d.num_classes = max_label + 1;
  return d;
}

}  // namespace dtrain
