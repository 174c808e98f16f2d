#include "comm/shm_ring.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/futex.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <signal.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "comm/transport.h"
#include "util/check.h"
#include "util/interrupt.h"
#include "util/rng.h"

namespace dtrain {

namespace {

constexpr uint64_t kMagic = 0x6d68732d6e696172ULL;  // "rain-shm"
constexpr uint64_t kAlign = 64;

static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

uint64_t round_up(uint64_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

// Shared (not FUTEX_PRIVATE) futex operations: the word lives in a mapping of two processes.
void futex_wait(std::atomic<uint32_t>* word, uint32_t seen, std::chrono::microseconds max) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(max.count() / 1000000);
  ts.tv_nsec = static_cast<long>(max.count() % 1000000) * 1000;
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}
void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

struct alignas(64) ShmSegment::Ctl {
  std::atomic<uint32_t> attached{0};
  alignas(64) std::atomic<uint64_t> head{0};  // written by the sender only
  alignas(64) std::atomic<uint64_t> tail{0};  // written by the owner only
  std::atomic<uint32_t> space_bell{0};
  std::atomic<uint32_t> space_waiters{0};
};

struct alignas(64) ShmSegment::Layout {
  uint64_t magic;
  int32_t owner, world;
  uint64_t ring_bytes;
  char nonce[40];  // the name's random part, NUL-terminated
  alignas(64) std::atomic<uint32_t> bell{0};
  std::atomic<uint32_t> sleepers{0};
  // Followed by Ctl[world], then world rings of ring_bytes.
};

ShmSegment::Ctl& ShmSegment::ctl(int src) const {
  auto* first = reinterpret_cast<Ctl*>(static_cast<char*>(base_) + sizeof(Layout));
  return first[src];
}

char* ShmSegment::ring(int src) const {
  return static_cast<char*>(base_) + sizeof(Layout) + sizeof(Ctl) * static_cast<size_t>(world_) +
         ring_bytes_ * static_cast<uint64_t>(src);
}

namespace {

// A segment's name: dtrain-<pid>.<ns>-<nonce>, ns the creator's PID namespace (the inode number
// of /proc/self/ns/pid, 0 where unknown), or dtrain-<pid>-<nonce> as dtrain named them before
// 2026-12-08 (legacy). Containers that share /dev/shm (`--ipc=host`, a shared volume) each number
// their processes from 1: a pid alone names no process outside its namespace.
struct SegmentName {
  pid_t pid = -1;  // -1: not a dtrain segment's name
  uint64_t ns = 0;
  bool legacy = false;
};

SegmentName parse_segment_name(const std::string& name) {
  SegmentName out;
  if (name.rfind("dtrain-", 0) != 0) return out;
  const size_t dash = name.find('-', 7);
  if (dash == std::string::npos || dash + 1 == name.size()) return out;
  const std::string id = name.substr(7, dash - 7);
  const size_t dot = id.find('.');
  const std::string digits = id.substr(0, dot);
  const std::string ns = dot == std::string::npos ? "" : id.substr(dot + 1);
  const auto all_digits = [](const std::string& d, size_t most) {
    return !d.empty() && d.size() <= most && d.find_first_not_of("0123456789") == std::string::npos;
  };
  if (!all_digits(digits, 9) || (dot != std::string::npos && !all_digits(ns, 19))) return out;
  const pid_t pid = static_cast<pid_t>(std::stol(digits));
  if (pid <= 0) return out;
  out.pid = pid;
  out.legacy = dot == std::string::npos;
  out.ns = out.legacy ? 0 : std::stoull(ns);
  return out;
}

// This process's PID namespace (0 where /proc is not mounted). Async-signal-safe (stat).
uint64_t pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

bool pid_gone(pid_t pid) {
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

// Whether the segment `path`, made in another PID namespace, is abandoned: its creator holds a
// lock on it (flock) while it maps it, so a lock this process can take means no creator
// once the segment is older than grace_s (its creator takes the lock right after creating it:
// ShmSegment::create). Another user's segment cannot be opened: kept (nor could it be removed).
bool abandoned(const std::filesystem::path& path, int grace_s) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  // The age first: a young segment's creator may be about to take its lock, which a lock held
  // here even for a moment would make it miss for good.
  struct stat st {};
  const bool free = ::fstat(fd, &st) == 0 && ::time(nullptr) - st.st_ctime >= grace_s &&
                    ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);  // (releases the lock)
  return free;
}

// Removes every segment in dir for which `gone` holds; returns their paths.
template <class Gone>
std::vector<std::string> remove_segments(const std::string& dir, Gone gone) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const SegmentName n = parse_segment_name(e.path().filename().string());
    if (n.pid < 0) continue;
    // On Linux a POSIX shared-memory name is the file /dev/shm/<name>: removing the file is
    // shm_unlink (and lets tests use another folder).
    std::error_code rec;
    if (gone(n, e.path()) && std::filesystem::remove(e.path(), rec))
      removed.push_back(e.path().string());
  }
  return removed;
}

}  // namespace

int sweep_orphaned_segments(const std::string& dir, int foreign_grace_s) {
  const uint64_t ns = pid_namespace();
  // Of this namespace (or named before namespaces were): its pid says; alive, or not ours
  // (EPERM): left alone. Of another namespace: its lock says.
  return static_cast<int>(
      remove_segments(dir, [&](const SegmentName& n, const std::filesystem::path& path) {
        return n.legacy || n.ns == ns ? pid_gone(n.pid) : abandoned(path, foreign_grace_s);
      }).size());
}

namespace {

// The decimal digits of v into out (no terminator); returns how many. Async-signal-safe.
int put_decimal(char* out, unsigned long v) {
  char rev[24];
  int n = 0;
  do {
    rev[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  for (int i = 0; i < n; ++i) out[i] = rev[n - 1 - i];
  return n;
}

// getdents64's record (linux/dirent.h has no userspace definition of it).
struct Dirent64 {
  uint64_t ino;
  int64_t off;
  unsigned short reclen;
  unsigned char type;
  char name[1];
};

}  // namespace

void remove_own_segments_signal_safe() {
  char prefix[48] = "dtrain-";
  int len = 7;
  len += put_decimal(prefix + len, static_cast<unsigned long>(::getpid()));
  prefix[len++] = '.';
  len += put_decimal(prefix + len, static_cast<unsigned long>(pid_namespace()));
  prefix[len++] = '-';
  const int dir = ::open("/dev/shm", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return;
  alignas(8) char buf[4096];
  for (;;) {
    const long n = ::syscall(SYS_getdents64, dir, buf, sizeof buf);
    if (n <= 0) break;
    for (long at = 0; at < n;) {
      const auto* d = reinterpret_cast<const Dirent64*>(buf + at);
      int i = 0;
      while (i < len && d->name[i] == prefix[i]) ++i;
      if (i == len) ::unlinkat(dir, d->name, 0);
      at += d->reclen;
    }
  }
  ::close(dir);
}

std::vector<std::string> remove_segments_of(pid_t pid, const std::string& dir) {
  const uint64_t ns = pid_namespace();
  return remove_segments(dir, [pid, ns](const SegmentName& n, const std::filesystem::path&) {
    return n.pid == pid && (n.legacy || n.ns == ns);
  });
}

std::unique_ptr<ShmSegment> ShmSegment::create(int owner, int world, uint64_t ring_bytes) {
  DT_CHECK(world >= 1 && owner >= 0 && owner < world);
  DT_CHECK(ring_bytes % kAlign == 0 && ring_bytes >= 4 * kAlign);
  std::unique_ptr<ShmSegment> s(new ShmSegment());
  const std::string nonce = random_hex();
  s->name_ = fmt::format("/dtrain-{}.{}-{}", getpid(), pid_namespace(), nonce);
  s->world_ = world;
  s->ring_bytes_ = ring_bytes;
  s->bytes_ =
      sizeof(Layout) + sizeof(Ctl) * static_cast<uint64_t>(world) + ring_bytes * uint64_t(world);
  // A signal that ends this process at once (at the rendezvous, or a second one) skips the
  // destructor that unlinks the segment: the handler removes it then.
  set_abrupt_exit_cleanup(&remove_own_segments_signal_safe);
  const int fd = shm_open(s->name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0)
    throw CommError(fmt::format("cannot create shared memory {}: {}", s->name_, strerror(errno)));
  s->owner_ = true;  // from here on the destructor unlinks the name
  // What tells a rank in another PID namespace (a container sharing /dev/shm) that this
  // segment's creator lives (sweep_orphaned_segments): held while the creator maps the segment
  // (the mapping keeps the open file the lock belongs to), so until it ends.
  ::flock(fd, LOCK_EX);  // (a new file: no one else locks it before it is grace_s old)
  bool sized = ftruncate(fd, static_cast<off_t>(s->bytes_)) == 0;
  int err = errno;
  // The identity and control blocks, which the owner and every sender touch, are allocated now
  // (the rings by their senders, reserve_ring): a full /dev/shm is a CommError here, which
  // leaves the gRPC streams to carry the data, not a SIGBUS at the first write.
  if (sized) {
    const uint64_t head = sizeof(Layout) + sizeof(Ctl) * static_cast<uint64_t>(world);
    err = posix_fallocate(fd, 0, static_cast<off_t>(head));
    sized = err == 0;
  }
  if (sized) s->base_ = mmap(nullptr, s->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (!sized || s->base_ == MAP_FAILED) {
    s->base_ = nullptr;
    throw CommError(fmt::format("cannot size or map shared memory {} ({} bytes): {}", s->name_,
                                s->bytes_, strerror(sized ? errno : err)));
  }
  // The file reads as zeros: every atomic starts at 0. Only the identity is written.
  auto* l = static_cast<Layout*>(s->base_);
  l->owner = owner;
  l->world = world;
  l->ring_bytes = ring_bytes;
  std::snprintf(l->nonce, sizeof(l->nonce), "%s", nonce.c_str());
  std::atomic_thread_fence(std::memory_order_release);
  l->magic = kMagic;
  return s;
}

std::unique_ptr<ShmSegment> ShmSegment::open(const std::string& name, int owner, int world,
                                             std::string* why) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    *why = fmt::format("cannot open {}: {}", name, strerror(errno));
    return nullptr;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < sizeof(Layout)) {
    close(fd);
    *why = fmt::format("{} is too small", name);
    return nullptr;
  }
  std::unique_ptr<ShmSegment> s(new ShmSegment());
  s->name_ = name;
  s->bytes_ = static_cast<uint64_t>(st.st_size);
  s->base_ = mmap(nullptr, s->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (s->base_ == MAP_FAILED) {
    s->base_ = nullptr;
    *why = fmt::format("cannot map {}: {}", name, strerror(errno));
    return nullptr;
  }
  const auto* l = static_cast<const Layout*>(s->base_);
  const std::string nonce(l->nonce, strnlen(l->nonce, sizeof(l->nonce)));
  const uint64_t rb = l->ring_bytes;
  const uint64_t need = sizeof(Layout) + sizeof(Ctl) * static_cast<uint64_t>(world) +
                        rb * static_cast<uint64_t>(world);
  if (l->magic != kMagic || l->owner != owner || l->world != world || rb % kAlign != 0 ||
      rb < 4 * kAlign || need != s->bytes_ || name.size() < nonce.size() + 1 || nonce.empty() ||
      name.compare(name.size() - nonce.size(), nonce.size(), nonce) != 0) {
    *why = fmt::format("{} is not rank {}'s segment of this job", name, owner);
    return nullptr;
  }
  s->world_ = world;
  s->ring_bytes_ = rb;
  return s;
}

ShmSegment::~ShmSegment() {
  if (owner_) unlink();
  if (base_) munmap(base_, bytes_);
}

void ShmSegment::unlink() {
  if (!owner_ || unlinked_) return;
  unlinked_ = true;
  shm_unlink(name_.c_str());
}

bool ShmSegment::reserve_ring(int src, std::string* why) {
  const int fd = shm_open(name_.c_str(), O_RDWR, 0);
  if (fd < 0) {
    *why = fmt::format("cannot open {}: {}", name_, strerror(errno));
    return false;
  }
  const uint64_t at = sizeof(Layout) + sizeof(Ctl) * static_cast<uint64_t>(world_) +
                      ring_bytes_ * static_cast<uint64_t>(src);
  const int err = posix_fallocate(fd, static_cast<off_t>(at), static_cast<off_t>(ring_bytes_));
  close(fd);
  if (err == 0) return true;
  *why = fmt::format(
      "no room in {} for a ring of {} MiB ({}): free space there, or set "
      "distributed.shm: false",
      "/dev/shm" + name_, ring_bytes_ >> 20, strerror(err));
  return false;
}

void ShmSegment::attach(int src) {
  ctl(src).attached.store(1, std::memory_order_release);
}

bool ShmSegment::attached(int src) const {
  return ctl(src).attached.load(std::memory_order_acquire) != 0;
}

bool ShmSegment::try_write(int src, const ShmRecord& hdr, const void* payload) {
  DT_CHECK_LE(hdr.len, max_payload());
  Ctl& c = ctl(src);
  char* r = ring(src);
  uint64_t head = c.head.load(std::memory_order_relaxed);
  const uint64_t tail = c.tail.load(std::memory_order_acquire);
  const uint64_t need = sizeof(ShmRecord) + round_up(hdr.len);
  uint64_t pos = head % ring_bytes_;
  const uint64_t contiguous = ring_bytes_ - pos;
  if (need > contiguous) {  // fill the end with a skip record and start again at 0
    if (head - tail + contiguous + need > ring_bytes_) return false;
    ShmRecord skip;
    skip.kind = ShmRecord::kSkip;
    skip.len = contiguous - sizeof(ShmRecord);
    std::memcpy(r + pos, &skip, sizeof(skip));
    head += contiguous;
    pos = 0;
    c.head.store(head, std::memory_order_release);
  }
  if (head - tail + need > ring_bytes_) return false;
  std::memcpy(r + pos, &hdr, sizeof(hdr));
  if (hdr.len) std::memcpy(r + pos + sizeof(hdr), payload, hdr.len);
  c.head.store(head + need, std::memory_order_release);
  return true;
}

void ShmSegment::ring_owner() {
  auto* l = static_cast<Layout*>(base_);
  l->bell.fetch_add(1, std::memory_order_seq_cst);
  if (l->sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(&l->bell);
}

uint32_t ShmSegment::space_bell(int src) const {
  return ctl(src).space_bell.load(std::memory_order_seq_cst);
}

void ShmSegment::wait_space(int src, uint32_t seen, std::chrono::microseconds max) {
  Ctl& c = ctl(src);
  c.space_waiters.fetch_add(1, std::memory_order_seq_cst);
  if (c.space_bell.load(std::memory_order_seq_cst) == seen) futex_wait(&c.space_bell, seen, max);
  c.space_waiters.fetch_sub(1, std::memory_order_seq_cst);
}

bool ShmSegment::peek(int src, ShmRecord* hdr, const char** payload, std::string* err) {
  Ctl& c = ctl(src);
  const char* r = ring(src);
  for (;;) {
    const uint64_t tail = c.tail.load(std::memory_order_relaxed);
    const uint64_t head = c.head.load(std::memory_order_acquire);
    if (head == tail) return false;
    const uint64_t avail = head - tail;
    const uint64_t pos = tail % ring_bytes_;
    if (avail > ring_bytes_ || avail < sizeof(ShmRecord) || avail % kAlign != 0) {
      *err = fmt::format("ring indices out of range (head {}, tail {})", head, tail);
      return false;
    }
    std::memcpy(hdr, r + pos, sizeof(ShmRecord));
    const uint64_t size = sizeof(ShmRecord) + round_up(hdr->len);
    if ((hdr->kind != ShmRecord::kData && hdr->kind != ShmRecord::kSkip) ||
        hdr->len > ring_bytes_ || size > avail || size > ring_bytes_ - pos) {
      *err = fmt::format("corrupt record (kind {}, {} bytes at ring offset {})", hdr->kind,
                         hdr->len, pos);
      return false;
    }
    if (hdr->kind == ShmRecord::kSkip) {
      pop(src, *hdr);
      continue;
    }
    *payload = r + pos + sizeof(ShmRecord);
    return true;
  }
}

void ShmSegment::pop(int src, const ShmRecord& hdr) {
  Ctl& c = ctl(src);
  const uint64_t tail = c.tail.load(std::memory_order_relaxed);
  c.tail.store(tail + sizeof(ShmRecord) + round_up(hdr.len), std::memory_order_release);
  c.space_bell.fetch_add(1, std::memory_order_seq_cst);
  if (c.space_waiters.load(std::memory_order_seq_cst) > 0) futex_wake_all(&c.space_bell);
}

uint32_t ShmSegment::bell() const {
  return static_cast<const Layout*>(base_)->bell.load(std::memory_order_seq_cst);
}

void ShmSegment::wait_bell(uint32_t seen, std::chrono::microseconds max) {
  auto* l = static_cast<Layout*>(base_);
  l->sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (l->bell.load(std::memory_order_seq_cst) == seen) futex_wait(&l->bell, seen, max);
  l->sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace dtrain
