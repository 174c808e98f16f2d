// Same-host data path of the gRPC transport: a POSIX shared-memory segment per receiving rank,
// holding one single-producer single-consumer byte ring per sender. The gRPC transport
// negotiates it through the rendezvous (each rank advertises its segment's random name; a peer
// that can open it and finds the matching nonce is on this host) and keeps its gRPC streams
// for everything else: failure detection (a dead peer's stream ends), refusals and peers on
// other hosts. This file knows nothing about messages beyond the record header.
//
// Records. A record is a 64-byte RecordHeader followed by its payload, padded to 64 bytes; it
// never wraps (a kSkip record fills the end of the ring instead). `head` counts bytes the sender
// published, `tail` bytes the owner consumed; both only grow.
//
// Waking. Nothing polls in the background. A sender bumps the owner's `bell` after each record
// and the owner bumps a ring's `space_bell` after consuming; each side sleeps on the word with a
// futex only after a short spin, and wakers make a system call only when someone sleeps (the
// `sleepers` / `space_waiters` counts), since system calls are what a 2-core VM pays most for.
//
// Trust. The peer is another rank of the same job (it learnt the segment's name through the
// token-checked rendezvous), but the owner still validates every index and length it reads
// from shared memory: a corrupt ring is reported, never followed out of bounds.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dtrain {

struct ShmRecord {
  static constexpr uint32_t kData = 1, kSkip = 2;
  uint32_t kind = kData;
  uint32_t op = 0;
  uint64_t channel = 0, part = 0;
  uint64_t total = 0;   // bytes of the whole message
  uint64_t offset = 0;  // of this payload within the message
  uint64_t len = 0;     // payload bytes following the header
  uint64_t pad[2] = {};
};
static_assert(sizeof(ShmRecord) == 64);

// Removes the shared-memory segments (/dev/shm/dtrain-<pid>.<ns>-<nonce>, ns the creator's PID
// namespace) whose creating process no longer exists: segments of ranks killed before their
// peers attached and the name was unlinked. Of this PID namespace (or named dtrain-<pid>-<nonce>,
// before 2026-12-08): a segment whose pid is alive (this process's, or another job's) is never
// touched. Of another namespace (a container sharing /dev/shm, whose pids mean other processes):
// only one whose creator's lock is free (ShmSegment::create takes it; the mapping holds it) and
// that is at least 10 s old. Never one of another user (it cannot be opened or removed). Returns
// how many were removed. `dir` and `foreign_grace_s` are for tests.
int sweep_orphaned_segments(const std::string& dir = "/dev/shm", int foreign_grace_s = 10);

// Removes the segments of process `pid` of this PID namespace, which must have exited and not
// yet been reaped: a zombie's pid cannot be reused by a new process meanwhile. For a launcher
// that saw its rank die, so that nothing is left in /dev/shm after it returns, whoever starts
// next. Returns the names removed.
std::vector<std::string> remove_segments_of(pid_t pid, const std::string& dir = "/dev/shm");

// Removes this process's segments (/dev/shm/dtrain-<getpid()>.<ns>-*) with raw system calls only
// (stat, open, getdents64, unlinkat): async-signal-safe, for a signal that ends the process at once
// (util/interrupt.h set_abrupt_exit_cleanup; ShmSegment::create installs it). Peers that have
// mapped a segment keep their mapping: only its name goes.
void remove_own_segments_signal_safe();

class ShmSegment {
 public:
  // Creates this rank's inbound segment with one ring of ring_bytes (a multiple of 64) per
  // possible sender. Throws CommError if shared memory is unavailable.
  static std::unique_ptr<ShmSegment> create(int owner, int world, uint64_t ring_bytes);
  // Maps a peer's segment by name; null (and *why) if it cannot be opened or is not the segment
  // of rank `owner` of a world of `world` ranks (another host's name, another job's).
  static std::unique_ptr<ShmSegment> open(const std::string& name, int owner, int world,
                                          std::string* why);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  const std::string& name() const { return name_; }
  // Removes the name (the mappings stay valid). Idempotent; the creator's destructor calls it.
  void unlink();
  // Largest payload of one record.
  uint64_t max_payload() const { return ring_bytes_ / 2 - sizeof(ShmRecord); }

  // ---- sender side (rank src, on the receiver's segment) ----
  // Allocates the pages of src's ring in the segment's filesystem (/dev/shm) before anything is
  // written there: a full /dev/shm then refuses here (false, *why) instead of killing the
  // writer with SIGBUS at its first touch of an unbacked page. Call before attach.
  bool reserve_ring(int src, std::string* why);
  // Marks src's ring as in use; the owner reads it once all senders are known to have started.
  void attach(int src);
  // Appends one record with its payload (hdr.len bytes, <= max_payload()) to src's ring if it
  // fits; false if the ring is too full (the caller waits for space_bell to change).
  bool try_write(int src, const ShmRecord& hdr, const void* payload);
  // Wakes the owner (after try_write).
  void ring_owner();
  uint32_t space_bell(int src) const;
  // Sleeps until src's space_bell differs from `seen` or `max` passed.
  void wait_space(int src, uint32_t seen, std::chrono::microseconds max);

  // ---- owner side ----
  bool attached(int src) const;
  // The next data record from src, with a pointer to its payload, or false if the ring is
  // empty. Skip records are consumed on the way. Returns an error text in *err (and false) if
  // the ring's indices or the record are corrupt. The header is copied out of shared memory.
  bool peek(int src, ShmRecord* hdr, const char** payload, std::string* err);
  // Consumes the record peek returned and wakes the sender if it waits for space.
  void pop(int src, const ShmRecord& hdr);
  uint32_t bell() const;
  // Sleeps until bell() differs from `seen` or `max` passed.
  void wait_bell(uint32_t seen, std::chrono::microseconds max);

 private:
  ShmSegment() = default;
  struct Layout;
  struct Ctl;
  Ctl& ctl(int src) const;
  char* ring(int src) const;

  std::string name_;
  bool owner_ = false, unlinked_ = false;
  void* base_ = nullptr;
  uint64_t bytes_ = 0, ring_bytes_ = 0;
  int world_ = 0;
};

}  // namespace dtrain
