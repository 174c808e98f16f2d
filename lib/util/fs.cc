#include "util/fs.h"

#include <fcntl.h>
#include <limits.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string_view>

#include "util/cgroup_limits.h"
#include "util/check.h"

namespace dtrain {

namespace {

// Where write_file_atomic puts `path`'s bytes. A symlink is followed (the file it names is
// replaced, as a shell's `>` would; renaming over the link would replace the link itself), and
// a path that names something other than a regular file or folder (a character device such as
// /dev/null or a terminal, a FIFO, a socket) is written into in place: renaming a temp file over
// it would replace the device node itself (as root, /dev/null).
struct OutputTarget {
  std::string path;
  bool in_place = false;
};

OutputTarget output_target(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
    return {path, true};
  // Follows links one by one (a dangling one names the file to create), at most 40 as the kernel.
  namespace fs = std::filesystem;
  fs::path p(path);
  std::error_code ec;
  for (int hops = 0; hops < 40 && fs::is_symlink(fs::symlink_status(p, ec)); ++hops) {
    const fs::path next = fs::read_symlink(p, ec);
    if (ec) break;
    p = next.is_absolute() ? next : p.parent_path() / next;
  }
  return {p.string(), false};
}

void write_in_place(const std::string& path, const std::function<void(int fd)>& writer) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open '" + path + "': " + std::strerror(errno));
  try {
    writer(fd);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw std::runtime_error("close '" + path + "': " + std::strerror(errno));
}

// write_file_atomic's temp file: "." + the target's name (shortened to fit) + this; mkstemp
// fills in the X's.
constexpr std::string_view kTempSuffix = ".tmp.XXXXXX";

// The longest file name `dir` takes (NAME_MAX where the file system does not say), and never
// too short for a temp file's dot, suffix and one byte of name.
size_t name_max_in(const std::string& dir) {
  const long n = ::pathconf(dir.c_str(), _PC_NAME_MAX);
  const size_t name_max = n > 0 ? static_cast<size_t>(n) : NAME_MAX;
  return std::max(name_max, kTempSuffix.size() + 2);
}
}  // namespace

std::string output_file_target(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p = fs::absolute(output_target(path).path, ec);
  const fs::path parent = fs::weakly_canonical(p.parent_path(), ec);
  return ec ? p.lexically_normal().string() : (parent / p.filename()).string();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("cannot read '" + path + "': " + std::strerror(errno));
  std::ostringstream os;
  os << in.rdbuf();
  if (in.bad()) throw UserError("error reading '" + path + "'");
  return os.str();
}

std::string read_regular_file(const std::string& path, uint64_t max_bytes) {
  // O_NONBLOCK: a FIFO is refused at once instead of blocking the open until a writer comes.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw UserError("cannot read '" + path + "': " + std::strerror(errno));
  std::string out;
  std::string problem;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    problem = std::string("cannot be read: ") + std::strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    problem = "is not a regular file";
  } else {
    char buf[65536];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        problem = std::string("cannot be read: ") + std::strerror(errno);
        break;
      }
      if (n == 0) break;
      out.append(buf, static_cast<size_t>(n));
      if (out.size() > max_bytes) {
        problem = "is larger than the " + std::to_string(max_bytes) + " bytes such a file holds";
        break;
      }
    }
  }
  ::close(fd);
  if (!problem.empty()) throw UserError("'" + path + "' " + problem);
  return out;
}

std::string file_identity(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "path:" + path;
  return "inode:" + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
}

std::string input_file_problem(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return "does not exist";
    return std::string("cannot be accessed: ") + std::strerror(errno);
  }
  if (S_ISDIR(st.st_mode)) return "is a directory, not a file";
  if (!S_ISREG(st.st_mode)) return "is not a regular file";
  // procfs and sysfs files report size 0 and may yield without end (/proc/self/pagemap: hundreds
  // of GB): no data a run reads lives there.
  struct statfs fs {};
  if (::statfs(path.c_str(), &fs) == 0 &&
      (fs.f_type == PROC_SUPER_MAGIC || fs.f_type == SYSFS_MAGIC))
    return "is a kernel interface file (/proc, /sys), not data";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::string("cannot be opened: ") + std::strerror(errno);
  ::close(fd);
  return "";
}

std::string output_file_problem(const std::string& path) {
  if (path.empty()) return "is empty";
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    return "is a directory (give a file name)";
  const OutputTarget out = output_target(path);
  if (out.in_place)  // a device, FIFO or socket: written into, so it must take writes
    return ::access(out.path.c_str(), W_OK) == 0
               ? ""
               : std::string("cannot be written: ") + std::strerror(errno);
  const std::filesystem::path real(out.path);
  const std::string parent = real.has_parent_path() ? real.parent_path().string() : ".";
  const size_t name_bytes = real.filename().string().size();
  if (const size_t name_max = name_max_in(parent); name_bytes > name_max)
    return "has a file name of " + std::to_string(name_bytes) + " bytes, longer than the " +
           std::to_string(name_max) + " its folder allows";
  if (::stat(parent.c_str(), &st) != 0) {
    if (errno == ENAMETOOLONG) return "is a path too long for this system";
    if (errno == ELOOP) return "is in a folder whose symbolic links loop";
    return "is in '" + parent + "', which does not exist";
  }
  if (!S_ISDIR(st.st_mode)) return "is in '" + parent + "', which is not a directory";
  if (::access(parent.c_str(), W_OK | X_OK) != 0)
    return "is in '" + parent + "', which this user cannot write to";
  return "";
}

void write_all(int fd, const void* data, size_t len, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    const ssize_t n = ::write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("write to " + what + " failed: " + std::strerror(errno));
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
}

namespace {

// The temp files of writes in progress, for remove_temp_files_in_flight: fixed slots, since a
// signal handler can neither lock nor allocate. A slot is 0 (free), 1 (its path being written),
// 2 (holding a temp file's path) or 3 (the handler took it to unlink: nobody writes its path
// again, as the process is ending).
struct InFlightTemp {
  std::atomic<int> state{0};
  char path[PATH_MAX] = {};
};
InFlightTemp g_in_flight[16];
static_assert(std::atomic<int>::is_always_lock_free);

// Claims a slot for `path`; -1 when all are taken or the path is too long (then untracked).
int track_temp(const std::string& path) {
  if (path.size() >= PATH_MAX) return -1;
  for (size_t i = 0; i < std::size(g_in_flight); ++i) {
    int free = 0;
    if (!g_in_flight[i].state.compare_exchange_strong(free, 1)) continue;
    std::memcpy(g_in_flight[i].path, path.c_str(), path.size() + 1);
    g_in_flight[i].state.store(2);
    return static_cast<int>(i);
  }
  return -1;
}

void untrack_temp(int slot) {
  int ready = 2;  // (3: a handler is unlinking it; the slot stays its own)
  if (slot >= 0) g_in_flight[slot].state.compare_exchange_strong(ready, 0);
}

// The process's umask, read from /proc (umask(2) can only read it by setting it, which races
// with other threads creating files); 022 where /proc does not say.
mode_t current_umask() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("Umask:", 0) == 0) {
      try {
        return static_cast<mode_t>(std::stoul(line.substr(6), nullptr, 8) & 0777);
      } catch (const std::exception&) {
        break;
      }
    }
  return 022;
}

// The mode a file written in place of `path` gets: the replaced file's, else what open(2) with
// 0666 would give under the umask (a private umask 077 keeps checkpoints private).
mode_t replacement_mode(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return st.st_mode & 07777;
  return 0666 & ~current_umask();
}

}  // namespace

void write_file_atomic_with(const std::string& requested, const std::function<void(int fd)>& writer,
                            Links links) {
  namespace fs = std::filesystem;
  const OutputTarget out =
      links == Links::kFollow ? output_target(requested) : OutputTarget{requested, false};
  if (out.in_place) return write_in_place(out.path, writer);
  const std::string& path = out.path;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  // The temp file's name: "." + the target's + kTempSuffix, the target's shortened so that it
  // fits where the target's does (a name of up to NAME_MAX bytes must be writable; mkstemp makes
  // it unique).
  const std::string name = target.filename().string();
  const size_t room = name_max_in(dir.string()) - 1 - kTempSuffix.size();
  std::string base = ".";
  base.append(name, 0, std::min(name.size(), room)).append(kTempSuffix);
  std::string tmpl = (dir / base).string();
  const int fd = ::mkstemp(tmpl.data());
  if (fd < 0)
    throw std::runtime_error("cannot create temp file in '" + dir.string() +
                             "': " + std::strerror(errno));
  struct Tracked {  // (untracked on every way out: renamed, or unlinked below)
    int slot;
    ~Tracked() { untrack_temp(slot); }
  } tracked{track_temp(tmpl)};
  try {
    writer(fd);
    if (::fsync(fd) != 0) throw std::runtime_error("fsync '" + tmpl + "': " + std::strerror(errno));
    if (::fchmod(fd, replacement_mode(path)) != 0)
      throw std::runtime_error("chmod '" + tmpl + "': " + std::strerror(errno));
    if (::close(fd) != 0) throw std::runtime_error("close '" + tmpl + "': " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmpl.c_str());
    throw;
  }
  if (::rename(tmpl.c_str(), path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    ::unlink(tmpl.c_str());
    throw std::runtime_error("rename to '" + path + "': " + err);
  }
  sync_directory(dir);
}

void sync_directory(const std::string& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::string temp_folder_template(const std::string& name) {
  std::error_code ec;
  std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
  if (ec) tmp = "/tmp";
  return (tmp / (name + "-XXXXXX")).string();
}

void make_temp_folder(std::string& tmpl, const std::string& what) {
  const std::string given = tmpl;  // (mkdtemp may leave the template changed on failure)
  if (::mkdtemp(tmpl.data()) == nullptr)
    throw UserError(what + " as '" + given + "': " + std::strerror(errno));
}

void remove_temp_files_in_flight() {
  for (InFlightTemp& t : g_in_flight) {
    int ready = 2;
    if (t.state.compare_exchange_strong(ready, 3)) ::unlink(t.path);  // (its path stays whole)
  }
}

void write_file_atomic(const std::string& path, std::string_view data, Links links) {
  write_file_atomic_with(
      path, [&](int fd) { write_all(fd, data.data(), data.size(), path); }, links);
}

void own_file_for_append(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;  // created by the append
  const bool link = S_ISLNK(st.st_mode);
  if (!link && !(S_ISREG(st.st_mode) && st.st_nlink > 1)) return;
  // (a dangling link: the append would create the file it names, elsewhere; it starts empty)
  const int in = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  struct stat target {};
  const bool readable = in >= 0 && ::fstat(in, &target) == 0 && S_ISREG(target.st_mode);
  try {
    // Streamed: a long run's log may be larger than memory.
    write_file_atomic_with(
        path,
        [&](int out) {
          char buf[1 << 16];
          for (ssize_t n; readable && (n = ::read(in, buf, sizeof buf)) != 0;) {
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) throw std::runtime_error("reading '" + path + "': " + std::strerror(errno));
            write_all(out, buf, static_cast<size_t>(n), path);
          }
        },
        Links::kReplace);
  } catch (...) {
    if (in >= 0) ::close(in);
    throw;
  }
  if (in >= 0) ::close(in);
}

namespace {

// Truncates `path` after its last '\n' when its last byte is not one (reading backwards from the
// end in blocks, not the whole file); returns the bytes cut. A missing or empty file: 0.
size_t cut_unfinished_line(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return 0;  // created by the append below
  const off_t size = ::lseek(fd, 0, SEEK_END);
  off_t keep = size;
  char block[4096];
  for (off_t end = size; end > 0 && keep == size;) {
    const off_t begin = std::max<off_t>(0, end - static_cast<off_t>(sizeof block));
    const ssize_t n = ::pread(fd, block, static_cast<size_t>(end - begin), begin);
    if (n != end - begin) break;  // unreadable: leave the file as it is
    if (end == size && block[n - 1] == '\n') break;
    for (ssize_t i = n - 1; i >= 0 && keep == size; --i)
      if (block[i] == '\n') keep = begin + i + 1;
    if (keep == size && begin == 0) keep = 0;  // no newline at all: one unfinished line
    end = begin;
  }
  const bool cut = keep < size && ::ftruncate(fd, keep) == 0;
  ::close(fd);
  return cut ? static_cast<size_t>(size - keep) : 0;
}

}  // namespace

LineWriter::LineWriter(const std::string& path, bool append) : path_(path) {
  own_file_for_append(path);  // (also for "w", which truncated through a link)
  if (append) dropped_ = cut_unfinished_line(path);
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!f_) throw std::runtime_error("cannot open '" + path + "': " + std::strerror(errno));
}

LineWriter::~LineWriter() {
  if (f_) std::fclose(static_cast<FILE*>(f_));
}

void LineWriter::write_line(std::string_view line) {
  DT_CHECK(f_ != nullptr);
  FILE* f = static_cast<FILE*>(f_);
  errno = 0;
  const bool ok = std::fwrite(line.data(), 1, line.size(), f) == line.size() &&
                  std::fputc('\n', f) != EOF && std::fflush(f) == 0;
  if (!ok) {
    const int err = errno != 0 ? errno : EIO;
    std::clearerr(f);
    throw std::runtime_error("writing '" + path_ + "' failed: " + std::strerror(err));
  }
}

double peak_rss_mb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0.0;
}

bool path_is_within(const std::string& path, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code pe, de;
  const fs::path p = fs::weakly_canonical(fs::absolute(path, pe), pe);
  const fs::path d = fs::weakly_canonical(fs::absolute(dir, de), de);
  // (unresolvable, a loop of symbolic links say: inside nothing -- an empty `d` held everything)
  if (pe || de || d.empty()) return false;
  auto pi = p.begin();
  for (auto di = d.begin(); di != d.end(); ++di, ++pi) {
    if (di->empty() && std::next(di) == d.end()) break;  // a trailing separator
    if (pi == p.end() || *pi != *di) return false;
  }
  return true;
}

std::string fnv1a_hex(std::string_view data) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a 64-bit offset basis
  for (unsigned char c : data) {
    h ^= c;
    h *= 0x100000001b3ULL;  // FNV prime
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace dtrain

namespace dtrain {

namespace {

// A "Key:   N kB" field of a /proc file, in bytes; -1 when absent.
int64_t kb_field(const char* file, const char* key) {
  std::ifstream in(file);
  std::string line;
  const std::string k = key;
  while (std::getline(in, line))
    if (line.rfind(k, 0) == 0) return std::stoll(line.substr(k.size())) * 1024;
  return -1;
}

}  // namespace

int64_t address_space_limit_bytes() {
  struct rlimit rl {};
  if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return -1;
  return static_cast<int64_t>(std::min<rlim_t>(rl.rlim_cur, INT64_MAX));
}

int64_t address_space_used_bytes() {
  return kb_field("/proc/self/status", "VmSize:");
}

namespace {
void take_smallest(int64_t& best, int64_t v) {
  if (v >= 0 && (best < 0 || v < best)) best = v;
}
}  // namespace

int64_t machine_memory_available_bytes() {
  int64_t best = -1;
  take_smallest(best, kb_field("/proc/meminfo", "MemAvailable:"));
  take_smallest(best, cgroup_memory_left());  // (a container's limit: MemAvailable is the host's)
  return best;
}

int64_t available_memory_bytes() {
  int64_t best = machine_memory_available_bytes();
  if (const int64_t limit = address_space_limit_bytes(); limit >= 0)
    take_smallest(best, limit - std::max<int64_t>(0, address_space_used_bytes()));
  return best;
}

bool address_space_allows(int64_t bytes) {
  if (bytes <= 0 || address_space_limit_bytes() < 0) return true;
  const auto n = static_cast<size_t>(bytes);
  void* p = ::mmap(nullptr, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  ::munmap(p, n);
  return true;
}

OwnBinary own_binary() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0 || n == static_cast<ssize_t>(sizeof buf - 1)) return {};
  OwnBinary b{std::string(buf, static_cast<size_t>(n))};
  static constexpr std::string_view kDeleted = " (deleted)";
  b.removed = b.path.size() > kDeleted.size() && b.path.ends_with(kDeleted);
  if (b.removed) b.path.resize(b.path.size() - kDeleted.size());
  return b;
}

}  // namespace dtrain
