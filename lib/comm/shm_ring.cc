#include "comm/shm_ring.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <signal.h>

#include <cerrno>
#include <climits>
#include <cstring>
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

// The creator's pid of a segment named dtrain-<pid>-<nonce>, or -1 for any other name.
pid_t segment_pid(const std::string& name) {
  if (name.rfind("dtrain-", 0) != 0) return -1;
  const size_t dash = name.find('-', 7);
  if (dash == std::string::npos || dash == 7) return -1;
  const std::string digits = name.substr(7, dash - 7);
  if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) return -1;
  const pid_t pid = static_cast<pid_t>(std::stol(digits));
  return pid > 0 ? pid : -1;
}

// Removes every segment in dir whose creator's pid satisfies `gone`; returns their names.
template <class Gone>
std::vector<std::string> remove_segments(const std::string& dir, Gone gone) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const pid_t pid = segment_pid(name);
    if (pid < 0 || !gone(pid)) continue;
    // On Linux a POSIX shared-memory name is the file /dev/shm/<name>: removing the file is
    // shm_unlink (and lets tests use another folder).
    std::error_code rec;
    if (std::filesystem::remove(e.path(), rec)) removed.push_back(e.path().string());
  }
  return removed;
}

}  // namespace

int sweep_orphaned_segments(const std::string& dir) {
  // Alive, or not ours (EPERM): left alone.
  return static_cast<int>(
      remove_segments(dir, [](pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }).size());
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
  char prefix[40] = "dtrain-";
  int len = 7;
  len += put_decimal(prefix + len, static_cast<unsigned long>(::getpid()));
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
  return remove_segments(dir, [pid](pid_t p) { return p == pid; });
}

std::unique_ptr<ShmSegment> ShmSegment::create(int owner, int world, uint64_t ring_bytes) {
  DT_CHECK(world >= 1 && owner >= 0 && owner < world);
  DT_CHECK(ring_bytes % kAlign == 0 && ring_bytes >= 4 * kAlign);
  std::unique_ptr<ShmSegment> s(new ShmSegment());
  const std::string nonce = random_hex();
  s->name_ = fmt::format("/dtrain-{}-{}", getpid(), nonce);
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
